package baton

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The rules of a call, the same as the Rust reference client's.
const (
	// ReleaseRetryWindow is how long a release keeps trying while no
	// connection can carry it.
	ReleaseRetryWindow = 5 * time.Second
	// ReleaseRetryInterval is the time between two release attempts.
	ReleaseRetryInterval = 200 * time.Millisecond
	// noActiveRetry is the pause before sending again after "M -" (no
	// active node known right now) or a redirect to a node that is down.
	noActiveRetry = 100 * time.Millisecond
	// maxRedirects is the most redirects to a named node one call follows.
	maxRedirects = 8
	// acquireRounds is how many times a grant that ran out before it
	// arrived is asked for, at most.
	acquireRounds = 3
)

// attemptKind is how one attempt on one connection ended.
type attemptKind int

const (
	attAnswered    attemptKind = iota
	attLost                    // the connection dropped (sent: the line may have gone out)
	attOverdue                 // no answer within the connection's budget
	attHeldBack                // an acquire's caller's deadline passed while the server held its answer (a T) back
	attUnreachable             // no connection could be chosen
	attStopped                 // the caller's context ended or the client closed
)

type attemptResult struct {
	kind   attemptKind
	ans    answer
	sentAt time.Time
	sent   bool
	err    error
}

// answerBudget is the time a connection has to answer r before it is
// deemed dead; zero: no limit (an acquire without a wait limit).
func answerBudget(r *request, requestTimeout time.Duration) time.Duration {
	if r.op == opAcquire {
		if r.waitMS == 0 {
			return 0
		}
		return time.Duration(r.waitMS)*time.Millisecond + requestTimeout
	}
	return requestTimeout
}

func (c *Client) attempt(ctx context.Context, target int, r *request, due time.Time) attemptResult {
	cn, err := c.pool.pick(ctx, target, r, due)
	if err != nil {
		if isUnreachable(err) {
			return attemptResult{kind: attUnreachable, err: err}
		}
		var refused *RefusedError
		if errors.As(err, &refused) {
			return attemptResult{kind: attUnreachable, err: err}
		}
		return attemptResult{kind: attStopped, err: err}
	}
	t := cn.send(r)
	if t == nil {
		return attemptResult{kind: attLost}
	}
	a, out, err := t.wait(ctx, answerBudget(r, c.requestTimeout), due)
	switch out {
	case outAnswer:
		return attemptResult{kind: attAnswered, ans: a, sentAt: t.sentAt}
	case outLost:
		return attemptResult{kind: attLost, sent: true}
	case outHeldBack:
		if r.op == opAcquire {
			return attemptResult{kind: attHeldBack}
		}
		fallthrough
	case outOverdue:
		return attemptResult{kind: attOverdue, err: unavailable("%s did not answer within %v", cn.addr, time.Since(t.sentAt).Round(time.Millisecond))}
	}
	return attemptResult{kind: attStopped, err: err}
}

// exchanged is a final answer (not M), with when its request was sent and
// whether an earlier attempt of the same call may have reached the server.
type exchanged struct {
	ans                   answer
	sentAt                time.Time
	earlierMaybeDelivered bool
}

// failure is a call that got no final answer.
type failure struct {
	err            error
	maybeDelivered bool
}

// exchange sends the request build makes (again on each attempt) until a
// final answer comes, following redirects and moving on from dropped
// connections: an attempt whose connection drops moves to the next
// connection, and the call fails only after as many failed attempts as
// there are registered connections (an answer "E <op> <key>
// shutting-down" counts as a failed attempt).
func (c *Client) exchange(ctx context.Context, target int, due time.Time, build func() (*request, error)) (exchanged, *failure) {
	failures := 0
	delivered := false
	rd := redirects{patience: c.requestTimeout}
	for {
		r, err := build()
		if err != nil {
			return exchanged{}, &failure{err, delivered}
		}
		res := c.attempt(ctx, target, r, due)
		switch res.kind {
		case attAnswered:
			if res.ans.kind == 'M' {
				pause, err := rd.follow(c, res.ans.addr, due)
				if err != nil {
					return exchanged{}, &failure{err, delivered}
				}
				if pause > 0 && !c.sleep(ctx, pause) {
					return exchanged{}, &failure{stopErr(ctx), delivered}
				}
				continue
			}
			if !(res.ans.kind == 'E' && res.ans.reason == "shutting-down") {
				return exchanged{res.ans, res.sentAt, delivered}, nil
			}
			failures++
		case attLost:
			delivered = delivered || res.sent
			failures++
		case attOverdue:
			return exchanged{}, &failure{res.err, true}
		case attHeldBack:
			// Its wait ran out long ago: the answer held back is a T (a
			// grant that comes instead is released, its caller gone).
			return exchanged{}, &failure{ErrTimeout, true}
		default:
			return exchanged{}, &failure{res.err, delivered}
		}
		if failures < c.pool.connectionCount(target) {
			continue
		}
		return exchanged{}, &failure{c.pool.noConnection(target, fmt.Sprintf("the connection failed on each of %d attempts: ", failures)), delivered}
	}
}

// stopErr is the error of a call whose wait was cut short.
func stopErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return ErrClosed
}

// sleep pauses for d; false when ctx ended or the client closed first.
func (c *Client) sleep(ctx context.Context, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	case <-c.stopped(ctx):
		return false
	}
}

// redirects follows the M answers of one call.
type redirects struct {
	hops         int
	waitingSince time.Time
	patience     time.Duration
}

// follow acts on "M <addr>": prefer that node and send again now (0), or
// pause a little when no usable active node is named ("M -", or a node
// that is down), for up to the request timeout; at most maxRedirects hops.
func (rd *redirects) follow(c *Client, addr string, due time.Time) (time.Duration, error) {
	if addr != "" {
		node, err := c.pool.nodeFor(addr)
		if err != nil {
			return 0, err
		}
		if c.pool.isReachable(node) {
			rd.hops++
			if rd.hops > maxRedirects {
				return 0, unavailable("redirected %d times without reaching the active node (last: %s)", maxRedirects, addr)
			}
			c.pool.prefer(node)
			rd.waitingSince = time.Time{}
			return 0, nil
		}
	}
	if rd.waitingSince.IsZero() {
		rd.waitingSince = time.Now()
	}
	wake := time.Now().Add(noActiveRetry)
	if time.Since(rd.waitingSince) >= rd.patience || (!due.IsZero() && !wake.Before(due)) {
		if addr != "" {
			return 0, unavailable("redirected to %s, which cannot be reached", addr)
		}
		return 0, unavailable("the servers know no active node (waited %v)", time.Since(rd.waitingSince).Round(time.Millisecond))
	}
	return noActiveRetry, nil
}

func unexpected(a answer) error {
	return unavailable("unexpected answer %q to a request", string(a.kind))
}

func refusal(a answer) error {
	return &RefusedError{Reason: a.reason}
}

// acquire sends "A key lease wait [limit [value]]"; waitMS 0 waits without
// limit. A re-sent acquire asks only for the wait that is left.
//
// A grant's lease is counted from when its acquire was sent; one that
// waited in line may have spent most of its lease that way by this count,
// though the server started it only at the hand-over. So a grant answered
// after more than a third of its lease is confirmed at once with K, whose
// send time becomes the lease start. A grant that ran out before it
// arrived is asked for again (at most acquireRounds times).
//
// The grant is in hand (counted, see Client.hands) from the moment the
// reader delivers it: the grant returned is still counted (the caller ends
// that with c.handOut()); on every other way out the count ends here. A
// call that finds the client closing, once it has the grant or once its K
// is answered, releases the grant itself (Close waits for it to) and fails
// ErrClosed.
func (c *Client) acquire(ctx context.Context, key string, leaseMS, waitMS uint64, limit int, value string) (*Grant, error) {
	var waitEnd time.Time
	if waitMS > 0 {
		waitEnd = time.Now().Add(time.Duration(waitMS) * time.Millisecond)
	}
	for round := 0; round < acquireRounds; round++ {
		build := func() (*request, error) {
			var left uint64
			if !waitEnd.IsZero() {
				left = millisCeil(time.Until(waitEnd))
				if left == 0 {
					return nil, ErrTimeout
				}
			}
			return &request{op: opAcquire, key: key, leaseMS: leaseMS, waitMS: left, limit: limit, value: value}, nil
		}
		var due time.Time
		if !waitEnd.IsZero() {
			due = waitEnd.Add(c.requestTimeout)
		}
		done, fail := c.exchange(ctx, anyNode, due, build)
		if fail != nil {
			return nil, fail.err
		}
		var g *Grant
		switch done.ans.kind {
		case 'A':
			slot := done.ans.slot
			if slot < 0 {
				slot = 0
			}
			g = newGrant(c, key, done.ans.token, slot, leaseMS, done.sentAt)
		case 'T':
			return nil, ErrTimeout
		case 'E':
			return nil, refusal(done.ans)
		default:
			return nil, unexpected(done.ans)
		}
		if c.closed.Load() {
			c.releaseInHand(g)
			return nil, ErrClosed
		}
		if time.Since(g.start) <= g.lease/3 {
			return g, nil
		}
		// Confirm at once: the grant is ours from here on, so a caller who
		// gives up meanwhile does not leak it, nor does Close (which waits
		// for this call: the K is not stopped by it).
		k := &request{op: opKeep, key: key, token: g.token, leaseMS: leaseMS}
		kctx := context.WithValue(context.WithoutCancel(ctx), closingKey{}, true)
		kdone, kfail := c.exchange(kctx, anyNode, time.Now().Add(c.requestTimeout), func() (*request, error) { return k, nil })
		switch {
		case kfail != nil:
			c.logf("confirming %s: %v", key, kfail.err)
		case kdone.ans.kind == 'K':
			g.renew(leaseMS, kdone.sentAt)
		case kdone.ans.kind == 'E' && kdone.ans.reason == "not-held":
			c.handOut()
			if c.closed.Load() {
				return nil, ErrClosed
			}
			c.logf("a grant of %s ran out before it arrived; asking again", key)
			continue
		default:
			c.logf("confirming %s: unexpected answer %q", key, string(kdone.ans.kind))
		}
		if c.closed.Load() {
			c.releaseInHand(g)
			return nil, ErrClosed
		}
		if err := ctx.Err(); err != nil {
			go c.releaseInHand(g)
			return nil, err
		}
		return g, nil
	}
	return nil, lost("the grant ran out before it arrived, " + fmt.Sprint(acquireRounds) + " times")
}

// releaseInHand releases a grant in hand that nobody will get (its caller
// gave up, or the client is closing), best effort, then ends its count.
// Close does not stop the release: it waits for it (at most the request
// timeout), and the connections stay open meanwhile.
func (c *Client) releaseInHand(g *Grant) {
	defer c.handOut()
	if _, err := c.release(c.closingCtx(), g.key, g.token); err != nil {
		c.logf("could not release %s (token %d): %v; its lease will run out", g.key, g.token, err)
	}
}

// release sends "R key token", retried for ReleaseRetryWindow at
// ReleaseRetryInterval while no connection can carry it (a failed attempt
// is sent again at once on another live connection if there is one).
// released is false when the first attempt was answered N: the grant had
// been lost. N after an attempt that may have reached the server counts
// as released.
func (c *Client) release(ctx context.Context, key string, token uint64) (released bool, err error) {
	r := &request{op: opRelease, key: key, token: token}
	retryEnd := time.Now().Add(ReleaseRetryWindow)
	due := retryEnd.Add(c.requestTimeout)
	delivered := false
	for {
		done, fail := c.exchange(ctx, anyNode, due, func() (*request, error) { return r, nil })
		if fail == nil {
			switch done.ans.kind {
			case 'R':
				return true, nil
			case 'N':
				return delivered || done.earlierMaybeDelivered, nil
			case 'E':
				return false, refusal(done.ans)
			}
			return false, unexpected(done.ans)
		}
		delivered = delivered || fail.maybeDelivered
		late := time.Now().Add(ReleaseRetryInterval).After(retryEnd)
		if late || !isUnreachable(fail.err) {
			return false, fail.err
		}
		if !c.sleep(ctx, ReleaseRetryInterval) {
			return false, stopErr(ctx)
		}
	}
}

// keepToken sends "K key token lease", waiting for an answer until due;
// when the keep that got through was sent.
func (c *Client) keepToken(ctx context.Context, key string, token, leaseMS uint64, due time.Time) (time.Time, error) {
	r := &request{op: opKeep, key: key, token: token, leaseMS: leaseMS}
	done, fail := c.exchange(ctx, anyNode, due, func() (*request, error) { return r, nil })
	if fail != nil {
		return time.Time{}, fail.err
	}
	switch {
	case done.ans.kind == 'K':
		return done.sentAt, nil
	case done.ans.kind == 'E' && done.ans.reason == "not-held":
		return time.Time{}, lost("the server no longer holds it")
	case done.ans.kind == 'E':
		return time.Time{}, refusal(done.ans)
	}
	return time.Time{}, unexpected(done.ans)
}

// query sends "Q key".
func (c *Client) query(ctx context.Context, key string) (KeyStatus, error) {
	r := &request{op: opQuery, key: key}
	done, fail := c.exchange(ctx, anyNode, time.Now().Add(c.requestTimeout), func() (*request, error) { return r, nil })
	if fail != nil {
		return KeyStatus{}, fail.err
	}
	switch done.ans.kind {
	case 'Q':
		return KeyStatus{Token: done.ans.token, Left: time.Duration(done.ans.msLeft) * time.Millisecond, Waiting: int(done.ans.waiting)}, nil
	case 'E':
		return KeyStatus{}, refusal(done.ans)
	}
	return KeyStatus{}, unexpected(done.ans)
}
