// Package baton is the Go client of baton, a lock server: FIFO locks and
// semaphores with fencing tokens, held locks that say when they are lost,
// watches and leader elections, served by a single node or a small
// cluster that keeps serving when a node dies.
//
// A Client keeps persistent connections to the servers in the background
// (two when one address is given, one per address otherwise), picks them
// round-robin (an acquire of a key on one with no acquire of that key
// outstanding, when one is up: the server answers a later acquire of a key
// on a connection only after the earlier one, so a TryAcquire there would
// wait behind the client's own waiting Acquire; when every one up has one
// and another is still connecting, it waits for that one, within the
// connect timeout), pipelines requests on
// them, moves an acquire to the next connection when one drops, follows
// redirects to the active node, and retries a release for 5 s so that a
// connection that happens to be down does not leave a lock held until its
// lease runs out. Every call that may wait takes a context.Context and
// returns when it ends.
//
// Errors are the sentinels ErrTimeout, ErrLost, ErrUnavailable, ErrClosed
// and ErrBadArgument (test with errors.Is), a *RefusedError carrying the
// server's reason word, or the context's error.
//
// A lock around a job, fenced with its token:
//
//	c, err := baton.New([]string{"10.0.0.1:7373", "10.0.0.2:7373"})
//	if err != nil { ... }
//	defer c.Close()
//	g, err := c.Acquire(ctx, "nightly-report", 30*time.Second, baton.Wait(10*time.Second))
//	if err != nil { ... }
//	defer g.Release(ctx)
//	writeReport(g.Token()) // the resource rejects tokens not above the last it saw
package baton
