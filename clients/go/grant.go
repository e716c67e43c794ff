package baton

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// KeepRetry is the time between two keeps of a held grant while no server
// answers them.
const KeepRetry = 200 * time.Millisecond

type grantState int

const (
	grantLive grantState = iota
	grantReleasing
	grantReleased
	grantLost
)

// Grant is one grant of a key: its fencing token, its key and its slot,
// and its lease as the client's clock counts it (from when the acquire was
// sent, so it errs early). Safe for concurrent use.
//
// A grant from Acquire lasts until it is released or its lease runs out;
// Keep extends it. A grant from Hold or Campaign is also kept alive in the
// background, every third of its lease, until it is released, lost or its
// client is closed; Done and Err tell when and why it ended.
type Grant struct {
	c     *Client
	key   string
	token uint64
	slot  int
	held  bool

	mu      sync.Mutex
	lease   time.Duration
	leaseMS uint64
	start   time.Time // the lease's start by the client's clock
	state   grantState
	err     error
	done    chan struct{}
	renewed chan struct{}   // a Keep moved the lease: the keeper looks again
	cancel  func()          // stops the keeper's calls (held grants)
	stopCtx context.Context // cancelled when the grant ends (held grants)
}

func newGrant(c *Client, key string, token uint64, slot int, leaseMS uint64, start time.Time) *Grant {
	return &Grant{
		c:       c,
		key:     key,
		token:   token,
		slot:    slot,
		lease:   time.Duration(leaseMS) * time.Millisecond,
		leaseMS: leaseMS,
		start:   start,
		done:    make(chan struct{}),
		renewed: make(chan struct{}, 1),
	}
}

// Token is the grant's fencing token: hand it to the protected resource,
// which rejects any token not greater than the last it accepted for this
// key (for a semaphore, for this key and slot).
func (g *Grant) Token() uint64 { return g.token }

// Key is the key granted.
func (g *Grant) Key() string { return g.key }

// Slot is the grant's slot in a semaphore: 0 to limit-1 (always 0 for a
// plain lock).
func (g *Grant) Slot() int { return g.slot }

// ExpiresAt is when the lease runs out by the client's clock (counted from
// when the acquire, or the last keep, was sent).
func (g *Grant) ExpiresAt() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.start.Add(g.lease)
}

// Done is closed when the grant ends: released, lost, or its client
// closed. For a grant from Acquire, it does not watch the lease by itself
// (Hold does): it is closed by Release, or by a Keep that finds the grant
// lost.
func (g *Grant) Done() <-chan struct{} { return g.done }

// Err is nil while the grant lives; once Done is closed it says why it
// ended: an error for which errors.Is(err, ErrLost) holds when the key was
// lost (a keep answered not-held, or the lease ran out by the client's
// clock before a keep got through), ErrClosed when it was released or its
// client closed.
func (g *Grant) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// endLocked marks the grant ended (under g.mu): lost or released, unless
// it ended already.
func (g *Grant) endLocked(state grantState, why error) {
	if g.state == grantLost || g.state == grantReleased {
		return
	}
	g.state = state
	g.err = why
	close(g.done)
	if g.cancel != nil {
		g.cancel()
	}
	if g.held {
		g.c.forget(g)
	}
}

func (g *Grant) markLost(why error) {
	if !errors.Is(why, ErrLost) {
		why = fmt.Errorf("%w: %v", ErrLost, why)
	}
	g.mu.Lock()
	g.endLocked(grantLost, why)
	g.mu.Unlock()
}

// renew restarts the lease from sentAt (a keep sent then got through).
func (g *Grant) renew(leaseMS uint64, sentAt time.Time) {
	g.mu.Lock()
	g.leaseMS = leaseMS
	g.lease = time.Duration(leaseMS) * time.Millisecond
	g.start = sentAt
	g.mu.Unlock()
	select {
	case g.renewed <- struct{}{}:
	default:
	}
}

// Release gives the key up: the next in line gets it at once. It is
// retried for ReleaseRetryWindow while no connection can carry it; N after
// an attempt that may have reached the server counts as released. It
// returns nil once released; an ErrLost error when the grant was lost (the
// first attempt was answered N: its lease had run out, and the key may
// have gone to someone else); ErrClosed when it was already released or
// its client is closed; an ErrUnavailable error when no server answered
// for ReleaseRetryWindow (the lease then runs out on its own).
//
// A held grant stops being kept first.
func (g *Grant) Release(ctx context.Context) error {
	g.mu.Lock()
	switch g.state {
	case grantReleasing, grantReleased:
		g.mu.Unlock()
		return ErrClosed
	case grantLost:
		err := g.err
		g.mu.Unlock()
		return err
	}
	if g.c.closed.Load() {
		g.mu.Unlock()
		return ErrClosed
	}
	g.state = grantReleasing
	if g.cancel != nil {
		g.cancel() // the keeper stops
	}
	g.mu.Unlock()
	released, err := g.c.release(ctx, g.key, g.token)
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case err == nil && released:
		g.endLocked(grantReleased, ErrClosed)
		return nil
	case err == nil:
		g.endLocked(grantLost, lost("the release was answered not-held"))
		return g.err // the keeper's reason, if it found the grant lost first
	case g.held:
		// Its keeper is stopped: the lease runs out on its own.
		g.endLocked(grantReleased, ErrClosed)
	case g.state == grantReleasing:
		g.state = grantLive // a plain grant may be released again
	}
	return err
}

// Keep extends the grant's lease to now + lease (the token stays the
// same). It returns an ErrLost error when the server no longer holds the
// grant, or its lease ran out by the client's clock before the keep got
// through; ErrClosed when it was released or its client is closed. It
// waits at most until the lease runs out.
func (g *Grant) Keep(ctx context.Context, lease time.Duration) error {
	leaseMS, err := checkLease(lease)
	if err != nil {
		return err
	}
	g.mu.Lock()
	switch g.state {
	case grantReleasing, grantReleased:
		g.mu.Unlock()
		return ErrClosed
	case grantLost:
		err := g.err
		g.mu.Unlock()
		return err
	}
	expires := g.start.Add(g.lease)
	g.mu.Unlock()
	if g.c.closed.Load() {
		return ErrClosed
	}
	if !time.Now().Before(expires) {
		g.markLost(lost("the lease ran out"))
		return g.Err()
	}
	sentAt, err := g.c.keepToken(ctx, g.key, g.token, leaseMS, expires)
	switch {
	case err == nil:
		g.renew(leaseMS, sentAt)
		return nil
	case errors.Is(err, ErrLost):
		g.markLost(err)
		return g.Err()
	case isUnreachable(err) && !time.Now().Before(expires):
		g.markLost(lost("the lease ran out before a keep got through"))
		return g.Err()
	}
	return err
}

// String shows the key, token and slot.
func (g *Grant) String() string {
	return fmt.Sprintf("%s token %d slot %d", g.key, g.token, g.slot)
}

// startKeeping makes g a held grant: a goroutine keeps it every third of
// its lease until it is released, lost, or its client closes.
func (g *Grant) startKeeping() {
	g.held = true
	g.stopCtx, g.cancel = context.WithCancel(g.c.calls)
	g.c.wg.Add(1)
	go g.keeper()
}

func (g *Grant) keeper() {
	defer g.c.wg.Done()
	stop := g.stopCtx.Done()
	for {
		g.mu.Lock()
		renewAt := g.start.Add(g.lease / 3)
		g.mu.Unlock()
		tm := time.NewTimer(time.Until(renewAt))
		select {
		case <-stop:
			tm.Stop()
			return
		case <-g.renewed:
			tm.Stop()
			continue
		case <-tm.C:
		}
		if !g.renewHeld() {
			return
		}
	}
}

// renewHeld keeps the grant, retrying every KeepRetry while no server
// answers, until its lease runs out by the client's clock; false when the
// grant ended (lost, or stopped).
func (g *Grant) renewHeld() bool {
	for {
		g.mu.Lock()
		if g.state != grantLive {
			g.mu.Unlock()
			return false
		}
		leaseMS, expires := g.leaseMS, g.start.Add(g.lease)
		g.mu.Unlock()
		if !time.Now().Before(expires) {
			g.lostHeld(lost("the lease ran out before a keep got through"))
			return false
		}
		sentAt, err := g.c.keepToken(g.stopCtx, g.key, g.token, leaseMS, expires)
		if g.stopCtx.Err() != nil {
			return false
		}
		switch {
		case err == nil:
			g.renew(leaseMS, sentAt)
			return true
		case !isUnreachable(err):
			g.lostHeld(err)
			return false
		}
		tm := time.NewTimer(KeepRetry)
		select {
		case <-g.stopCtx.Done():
			tm.Stop()
			return false
		case <-tm.C:
		}
	}
}

func (g *Grant) lostHeld(why error) {
	g.c.logf("lost %s (token %d): %v", g.key, g.token, why)
	g.markLost(why)
}

// closeHeld stops keeping a held grant because its client closes; true
// when it was live (and so is to be released).
func (g *Grant) closeHeld() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != grantLive {
		return false
	}
	g.endLocked(grantReleased, ErrClosed)
	return true
}
