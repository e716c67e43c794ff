package baton

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// acquireFake acquires k from a fake that grants it with token 5.
func acquireFake(t *testing.T, c *Client) *Grant {
	t.Helper()
	g, err := c.Acquire(context.Background(), "k", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if g.Token() != 5 {
		t.Fatalf("token %d", g.Token())
	}
	return g
}

func TestAReleaseWhoseConnectionDropsIsSentAgainOnAnotherAndNCountsAsReleased(t *testing.T) {
	var releases atomic.Int32
	f := newFake(t, func(fc *fakeConn, line string) {
		switch {
		case strings.HasPrefix(line, "A "):
			fc.send("A 5 k")
		case strings.HasPrefix(line, "R "):
			if releases.Add(1) == 1 {
				fc.drop() // the release may have got through: no answer
				return
			}
			fc.send("N k")
		}
	})
	c, err := Dial(context.Background(), []string{f.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	allUp(t, c)
	g := acquireFake(t, c)
	if err := g.Release(context.Background()); err != nil {
		t.Fatalf("N after a retry counts as released: %v", err)
	}
	rs := f.seen("R ")
	if len(rs) != 2 || rs[0].conn == rs[1].conn {
		t.Fatalf("the retry goes at once to the other connection: %v", rs)
	}
	if !errors.Is(g.Err(), ErrClosed) {
		t.Fatalf("a released grant: %v", g.Err())
	}
	if err := g.Release(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("a second release: %v", err)
	}
}

func TestNToTheFirstReleaseMeansTheGrantWasLost(t *testing.T) {
	f := newFake(t, func(fc *fakeConn, line string) {
		switch line[0] {
		case 'A':
			fc.send("A 5 k")
		case 'R':
			fc.send("N k")
		case 'K':
			fc.send("E K k not-held")
		}
	})
	c, _ := New([]string{f.addr()})
	defer c.Close()
	g := acquireFake(t, c)
	if err := g.Keep(context.Background(), time.Second); !errors.Is(err, ErrLost) {
		t.Fatalf("keep answered not-held: %v", err)
	}
	g = acquireFake(t, c)
	if err := g.Release(context.Background()); !errors.Is(err, ErrLost) {
		t.Fatalf("N to the first attempt: %v", err)
	}
	if err := g.Keep(context.Background(), time.Second); !errors.Is(err, ErrLost) {
		t.Fatalf("keep after lost: %v", err)
	}
}

func TestARedirectIsFollowedToTheNodeItNames(t *testing.T) {
	active := newFake(t, func(fc *fakeConn, line string) {
		if line[0] == 'A' {
			fc.send("A 5 k")
		}
	})
	standby := newFake(t, func(fc *fakeConn, line string) {
		if line[0] == 'A' {
			fc.send("M " + active.addr() + " A k")
		}
	})
	c, _ := New([]string{standby.addr()})
	defer c.Close()
	acquireFake(t, c)
	if s := c.Servers(); len(s) != 2 || s[1] != active.addr() {
		t.Fatalf("the active node is registered: %v", s)
	}
	acquireFake(t, c) // the preferred node now
	if n := len(standby.seen("A ")); n != 1 {
		t.Fatalf("later requests go to the active node first: %d to the standby", n)
	}
}

func TestMDashIsRetriedUntilAnActiveNodeIsKnown(t *testing.T) {
	var n atomic.Int32
	f := newFake(t, func(fc *fakeConn, line string) {
		if line[0] == 'A' {
			if n.Add(1) < 3 {
				fc.send("M - A k")
				return
			}
			fc.send("A 5 k")
		}
	})
	c, _ := New([]string{f.addr()})
	defer c.Close()
	acquireFake(t, c)
}

func TestAnAcquireWhoseConnectionDropsMovesToTheNext(t *testing.T) {
	var n atomic.Int32
	f := newFake(t, func(fc *fakeConn, line string) {
		if line[0] == 'A' {
			if n.Add(1) == 1 {
				fc.drop()
				return
			}
			fc.send("A 5 k")
		}
	})
	c, _ := Dial(context.Background(), []string{f.addr()})
	defer c.Close()
	allUp(t, c)
	acquireFake(t, c)
	as := f.seen("A ")
	if len(as) != 2 || as[0].conn == as[1].conn {
		t.Fatalf("the second attempt on the other connection: %v", as)
	}
}

func TestAnAcquireFailsAfterAsManyAttemptsAsConnections(t *testing.T) {
	f := newFake(t, func(fc *fakeConn, line string) {
		if line[0] == 'A' {
			fc.drop()
		}
	})
	c, _ := Dial(context.Background(), []string{f.addr()})
	defer c.Close()
	allUp(t, c)
	_, err := c.Acquire(context.Background(), "k", time.Second)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("%v", err)
	}
	if n := len(f.seen("A ")); n != 2 {
		t.Fatalf("%d attempts for 2 connections", n)
	}
}

func TestAGrantThatArrivesAfterItsCallerGaveUpIsReleased(t *testing.T) {
	var mu sync.Mutex
	var held *fakeConn
	f := newFake(t, func(fc *fakeConn, line string) {
		if line[0] == 'A' {
			mu.Lock()
			held = fc
			mu.Unlock()
		}
	})
	c, _ := New([]string{f.addr()})
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := c.Acquire(ctx, "k", 30*time.Second)
		done <- err
	}()
	eventually(t, 5*time.Second, "the acquire reached the server", func() bool { return len(f.seen("A ")) == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("%v", err)
	}
	mu.Lock()
	held.send("A 5 k")
	mu.Unlock()
	eventually(t, 5*time.Second, "the late grant released", func() bool { return len(f.seen("R k 5")) == 1 })
}

func TestASilentServerIsProbedAndDroppedWhenTheProbeGoesUnanswered(t *testing.T) {
	f := newFake(t, func(fc *fakeConn, line string) {})
	c, _ := New([]string{f.addr()}, WithRequestTimeout(200*time.Millisecond))
	defer c.Close()
	start := time.Now()
	_, err := c.Acquire(context.Background(), "k", time.Second) // no wait limit: no deadline of its own
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("%v", err)
	}
	if len(f.seen("I")) == 0 {
		t.Fatal("no I probe")
	}
	t.Logf("gave up after %v", time.Since(start))
}

func TestARefusedSecretIsTheServersReason(t *testing.T) {
	f := newFake(t, func(fc *fakeConn, line string) {
		if strings.HasPrefix(line, "U ") {
			fc.send("E - - bad-auth")
			fc.drop()
		}
	})
	c, _ := New([]string{f.addr()}, WithAuth("0123456789abcdef-wrong"))
	defer c.Close()
	_, err := c.Query(context.Background(), "k")
	var refused *RefusedError
	if !errors.As(err, &refused) || refused.Reason != "bad-auth" {
		t.Fatalf("%v", err)
	}
}

func TestAuthDisabledStillLetsTheConnectionThrough(t *testing.T) {
	f := newFake(t, func(fc *fakeConn, line string) {
		switch line[0] {
		case 'U':
			fc.send("E U - auth-disabled")
		case 'Q':
			fc.send("Q k 0 0 0")
		}
	})
	c, _ := New([]string{f.addr()}, WithAuth("0123456789abcdef-right"))
	defer c.Close()
	if s, err := c.Query(context.Background(), "k"); err != nil || !s.Free() {
		t.Fatalf("%v %v", s, err)
	}
}

func TestAnswersForOtherKeysMayComeFirst(t *testing.T) {
	var mu sync.Mutex
	var first *fakeConn
	f := newFake(t, func(fc *fakeConn, line string) {
		switch {
		case line == "A slow 1 0":
			mu.Lock()
			first = fc
			mu.Unlock()
		case line[0] == 'A':
			fc.send("A 7 " + strings.Fields(line)[1])
			mu.Lock()
			if first == fc {
				fc.send("A 6 slow")
			}
			mu.Unlock()
		}
	})
	c, _ := New([]string{f.addr()})
	defer c.Close()
	slow := make(chan *Grant)
	go func() {
		g, _ := c.Acquire(context.Background(), "slow", time.Second)
		slow <- g
	}()
	eventually(t, 5*time.Second, "the slow acquire sent", func() bool { return len(f.seen("A slow")) == 1 })
	for i := 0; i < 2; i++ { // one of the two goes on the slow one's connection
		if g, err := c.Acquire(context.Background(), "fast", time.Second); err != nil || g.Token() != 7 {
			t.Fatalf("%v %v", g, err)
		}
	}
	if g := <-slow; g == nil || g.Token() != 6 {
		t.Fatalf("%v", g)
	}
}

// secondUpLate is a fake whose first connection is let through U at once
// and whose second is held (sent on held, for the test to answer or not);
// an acquire with a 30 s lease (the waiter) is answered only when one with
// a 20 s lease (the try) comes on its connection: granted, before that
// one's T.
func secondUpLate(t *testing.T, held chan<- *fakeConn) *fake {
	var us atomic.Int32
	var waiterConn atomic.Pointer[fakeConn]
	return newFake(t, func(fc *fakeConn, line string) {
		switch {
		case strings.HasPrefix(line, "U "):
			if us.Add(1) == 1 {
				fc.send("U ok")
				return
			}
			select {
			case held <- fc:
			default: // a later reconnection: left unanswered too
			}
		case strings.HasPrefix(line, "A k 30 "):
			waiterConn.Store(fc)
		case strings.HasPrefix(line, "A k 20 "):
			if waiterConn.Load() == fc {
				// As the server would: the answer behind the waiter's.
				fc.send("A 5 k")
			}
			fc.send("T k")
		}
	})
}

// waiterSent starts an acquire of k that the fake leaves waiting and
// returns when it is sent, with its error's channel.
func waiterSent(t *testing.T, c *Client, f *fake) <-chan error {
	t.Helper()
	waiter := make(chan error, 1)
	go func() {
		_, err := c.Acquire(context.Background(), "k", 30*time.Second, Wait(30*time.Second))
		waiter <- err
	}()
	eventually(t, 5*time.Second, "the waiter sent", func() bool { return len(f.seen("A k 30 ")) == 1 })
	return waiter
}

func TestATryAcquireWaitsForTheSecondConnectionRatherThanQueueBehindItsOwnWaiter(t *testing.T) {
	held := make(chan *fakeConn, 1)
	f := secondUpLate(t, held)
	// Timeouts a loaded machine cannot outlast: the second connection stays
	// connecting, and the try-acquire waits, until the test lets it through.
	c, _ := New([]string{f.addr()}, WithAuth("0123456789abcdef-right"),
		WithConnectTimeout(time.Minute), WithRequestTimeout(time.Minute))
	waiter := waiterSent(t, c, f)
	defer func() {
		c.Close()
		if err := <-waiter; !errors.Is(err, ErrClosed) {
			t.Errorf("the waiter: %v", err)
		}
	}()
	var second *fakeConn
	select {
	case second = <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the second connection never sent U")
	}
	tried := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(context.Background(), "k", 20*time.Second)
		tried <- err
	}()
	// Its only connection up is busy with k and the other is connecting:
	// the try-acquire waits in the pool for a connection (without the
	// rule it would be sent behind the waiter at once, and never wait).
	eventually(t, 5*time.Second, "the try-acquire waits for a connection", func() bool {
		buf := make([]byte, 1<<20)
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, " [select") && strings.Contains(g, ".(*pool).pick(") {
				return true
			}
		}
		return false
	})
	second.send("U ok")
	if err := <-tried; !errors.Is(err, ErrTimeout) {
		t.Fatalf("the try-acquire: %v", err)
	}
	tries, waits := f.seen("A k 20 "), f.seen("A k 30 ")
	if len(tries) != 1 || tries[0].conn != second.n || waits[0].conn == second.n {
		t.Fatalf("the try-acquire goes on the connection that came up: tries %v, waiter %v", tries, waits)
	}
}

func TestATryAcquireWhoseOtherConnectionNeverComesUpUsesTheBusyOne(t *testing.T) {
	held := make(chan *fakeConn, 1)
	f := secondUpLate(t, held)
	c, _ := New([]string{f.addr()}, WithAuth("0123456789abcdef-right"), WithConnectTimeout(200*time.Millisecond))
	waiter := waiterSent(t, c, f)
	defer c.Close()
	// The second connection's U is never answered: once it gives up, the
	// busy one serves (the fake answers T at once; the server would
	// answer it after the waiter).
	if _, err := c.TryAcquire(context.Background(), "k", 20*time.Second); !errors.Is(err, ErrTimeout) {
		t.Fatalf("the try-acquire: %v", err)
	}
	tries, waits := f.seen("A k 20 "), f.seen("A k 30 ")
	if len(tries) != 1 || tries[0].conn != waits[0].conn {
		t.Fatalf("the try-acquire goes on the busy connection: tries %v, waiter %v", tries, waits)
	}
	if err := <-waiter; err != nil {
		t.Fatalf("the waiter, answered first: %v", err)
	}
}

func TestAGrantThatWaitedPastAThirdOfItsLeaseIsConfirmedWithK(t *testing.T) {
	f := newFake(t, func(fc *fakeConn, line string) {
		switch line[0] {
		case 'A':
			time.Sleep(400 * time.Millisecond) // it waited in line
			fc.send("A 5 k")
		case 'K':
			fc.send("K k")
		}
	})
	c, _ := New([]string{f.addr()})
	defer c.Close()
	start := time.Now()
	g, err := c.Acquire(context.Background(), "k", 900*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	ks := f.seen("K ")
	if len(ks) != 1 || ks[0].line != "K k 5 0.9" {
		t.Fatalf("the confirming keep: %v", ks)
	}
	if !g.ExpiresAt().After(start.Add(1200 * time.Millisecond)) {
		t.Fatalf("the lease counts from the keep: %v", g.ExpiresAt().Sub(start))
	}
}

// Close begins while an acquire confirms its grant with K (it came after
// more than a third of its lease): the call releases the grant itself
// before the sockets close and fails ErrClosed, rather than hand a grant
// nobody can release any more to its caller.
func TestCloseWhileAGrantIsConfirmedReleasesItAndTheCallFailsClosed(t *testing.T) {
	kSent := make(chan struct{}, 1)
	answerK := make(chan struct{})
	f := newFake(t, func(fc *fakeConn, line string) {
		switch line[0] {
		case 'A':
			time.Sleep(150 * time.Millisecond) // it waited in line: half its lease
			fc.send("A 5 k")
		case 'K':
			kSent <- struct{}{}
			<-answerK
			fc.send("K k")
		case 'R':
			fc.send("R k")
		}
	})
	defer close(answerK) // answers the K if the test fails before
	c, _ := New([]string{f.addr()})
	acquired := make(chan error, 1)
	go func() {
		g, err := c.Acquire(context.Background(), "k", 300*time.Millisecond)
		if g != nil {
			err = fmt.Errorf("granted %d on a closed client (err %v)", g.Token(), err)
		}
		acquired <- err
	}()
	select {
	case <-kSent:
	case <-time.After(10 * time.Second):
		t.Fatal("no confirming K")
	}
	closed := make(chan struct{})
	go func() {
		c.Close()
		close(closed)
	}()
	eventually(t, 5*time.Second, "close began", c.closed.Load)
	answerK <- struct{}{}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("close did not return")
	}
	if err := <-acquired; !errors.Is(err, ErrClosed) {
		t.Fatalf("the acquire: %v", err)
	}
	if rs := f.seen("R "); len(rs) != 1 || rs[0].line != "R k 5" {
		t.Fatalf("the grant released before the sockets closed: %v", rs)
	}
}
