package baton

import (
	"context"
	"fmt"
	"time"
)

// maxWatchPause is the longest pause between two subscriptions of a watch
// while no state comes (it grows from 100 ms).
const maxWatchPause = time.Second

// WatchState is a key's holders at one moment, as a watch sees them.
type WatchState struct {
	// Token is the largest token holding the key; 0 when nobody does.
	Token uint64
	// Holders is the number of live grants.
	Holders int
	// Waiting is the number of requests in line when the change happened.
	Waiting int
	// Value is the value of the grant with Token; "" when none.
	Value string
	// Err is set only in the last state a watch's channel carries before
	// it is closed, when the server refused the watch (such as a
	// *RefusedError "too-many-watches"); the other fields are zero then.
	Err error
}

// Watch follows key's holders: the channel carries the key's state now,
// then one state after each change (a grant, a release, an expiry). It
// survives failover: when its connection ends or the node stops being
// active, it watches again on another connection or the new active, and
// the first state of each new subscription comes again. A reader that is
// slow skips intermediate states but always gets the latest one. The
// channel is closed when ctx ends, the client closes, or the server
// refuses the watch (the last state then carries Err).
func (c *Client) Watch(ctx context.Context, key string) (<-chan WatchState, error) {
	return c.startWatch(ctx, key, false)
}

// Observe follows the leader of an election named key: like Watch, but a
// state comes only when the leader changes (its token differs from the
// last one seen), and when nobody leads (Token 0).
func (c *Client) Observe(ctx context.Context, key string) (<-chan WatchState, error) {
	return c.startWatch(ctx, key, true)
}

// Leader tells who leads an election named key now: the holder's token
// and value (Token 0 when nobody leads). It waits at most the connect
// timeout plus the request timeout for a server to answer.
func (c *Client) Leader(ctx context.Context, key string) (WatchState, error) {
	if err := checkKey(key); err != nil {
		return WatchState{}, err
	}
	if c.closed.Load() {
		return WatchState{}, ErrClosed
	}
	budget := c.connectTimeout + c.requestTimeout
	wctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	var first *WatchState
	trouble, err := c.runWatch(wctx, key, false, func(s WatchState) bool {
		first = &s
		return false
	})
	if first != nil {
		return *first, nil
	}
	if err == nil || wctx.Err() != nil && ctx.Err() == nil {
		if trouble != nil {
			return WatchState{}, trouble
		}
		return WatchState{}, unavailable("no state of %s within %v", key, budget)
	}
	return WatchState{}, err
}

func (c *Client) startWatch(ctx context.Context, key string, leadersOnly bool) (<-chan WatchState, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	out := make(chan WatchState)
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		defer close(out)
		_, err := c.runWatch(ctx, key, leadersOnly, func(s WatchState) bool {
			select {
			case out <- s:
				return true
			case <-ctx.Done():
			case <-c.calls.Done():
			}
			return false
		})
		if _, refused := err.(*RefusedError); refused {
			select {
			case out <- WatchState{Err: err}:
			case <-ctx.Done():
			case <-c.calls.Done():
			}
		}
	}()
	return out, nil
}

// runWatch subscribes to key and hands each state to emit until emit
// returns false (then nil), ctx ends or the client closes (the context's
// error, or ErrClosed), or the server refuses the watch (a
// *RefusedError). trouble is why the last subscription failed, if it did.
func (c *Client) runWatch(ctx context.Context, key string, leadersOnly bool, emit func(WatchState) bool) (trouble, err error) {
	f := newFeed()
	var (
		epoch     uint64
		failures  int
		hops      int
		lastToken uint64
		seenAny   bool
		notBefore time.Time
	)
	failedTry := func(why error) {
		c.logf("watch of %s: %v; watching again", key, why)
		trouble = why
		failures++
		pause := time.Duration(0)
		if failures >= 2 {
			pause = noActiveRetry << min(failures-2, 8)
			if pause > maxWatchPause {
				pause = maxWatchPause
			}
		}
		notBefore = time.Now().Add(pause)
	}
	for {
		if err := ctx.Err(); err != nil {
			return trouble, err
		}
		if c.calls.Err() != nil {
			return trouble, ErrClosed
		}
		if d := time.Until(notBefore); d > 0 {
			if !c.sleep(ctx, d) {
				continue
			}
		}
		seen := c.notifier.wait()
		cn, perr := c.pool.chooseNow(anyNode, nil, false)
		if perr != nil {
			if isUnreachable(perr) {
				failedTry(perr)
				continue
			}
			return trouble, perr
		}
		if cn == nil {
			select {
			case <-seen:
			case <-ctx.Done():
			case <-c.calls.Done():
			}
			continue
		}
		epoch++
		f.begin(epoch)
		gen, ok := cn.watch(key, f, epoch)
		if !ok {
			failedTry(unavailable("%s went down", cn.addr))
			continue
		}
		sentAt := time.Now()
		answered := false
		giveUp := func() {
			cn.unwatch(key, gen, f, epoch)
			f.begin(0)
		}
	subscription:
		for {
			ev, got := f.take(epoch)
			if !got {
				var timeout <-chan time.Time
				var tm *time.Timer
				if !answered {
					tm = time.NewTimer(time.Until(sentAt.Add(c.requestTimeout)))
					timeout = tm.C
				}
				select {
				case <-f.wake:
				case <-timeout:
					why := fmt.Sprintf("%s did not answer W %s within %v", cn.addr, key, time.Since(sentAt).Round(time.Millisecond))
					cn.kill(gen, why)
					giveUp()
					failedTry(unavailable("%s", why))
					break subscription
				case <-ctx.Done():
					giveUp()
					return trouble, ctx.Err()
				case <-c.calls.Done():
					giveUp()
					return trouble, ErrClosed
				}
				if tm != nil {
					tm.Stop()
				}
				continue
			}
			switch ev.kind {
			case evState:
				answered = true
				failures, hops, trouble = 0, 0, nil
				if leadersOnly && seenAny && lastToken == ev.state.Token {
					continue
				}
				seenAny, lastToken = true, ev.state.Token
				if !emit(ev.state) {
					giveUp()
					if err := ctx.Err(); err != nil {
						return trouble, err
					}
					if c.calls.Err() != nil {
						return trouble, ErrClosed
					}
					return trouble, nil
				}
			case evMoved:
				giveUp()
				if ev.addr == "" {
					failedTry(unavailable("the servers know no active node"))
					break subscription
				}
				node, err := c.pool.nodeFor(ev.addr)
				switch {
				case err != nil:
					failedTry(err)
				case c.pool.isReachable(node) && hops < maxRedirects:
					hops++
					c.pool.prefer(node)
				default:
					failedTry(unavailable("redirected to %s, which cannot be reached", ev.addr))
				}
				break subscription
			case evRefused:
				giveUp()
				if ev.reason == "shutting-down" {
					failedTry(unavailable("the node is shutting down"))
					break subscription
				}
				return trouble, &RefusedError{Reason: ev.reason}
			case evEnded:
				giveUp()
				failedTry(unavailable("the connection to %s ended", cn.addr))
				break subscription
			}
		}
	}
}
