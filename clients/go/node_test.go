package baton

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

func single(t *testing.T) (*server, *Client) {
	t.Helper()
	n := startNode(t, freeAddr(t))
	c, err := New([]string{n.addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return n, c
}

func TestAReleasedKeyGoesToTheNextInLineWithAGreaterToken(t *testing.T) {
	n, c := single(t)
	ctx := context.Background()
	first, err := c.Acquire(ctx, "job", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	next := make(chan *Grant)
	go func() {
		g, err := c.Acquire(ctx, "job", 30*time.Second, Wait(20*time.Second))
		if err != nil {
			t.Error(err)
		}
		next <- g
	}()
	eventually(t, 5*time.Second, "the second acquire waits", func() bool {
		s, err := c.Query(ctx, "job")
		return err == nil && s.Waiting == 1
	})
	// Another client: on a connection where an acquire of the key waits,
	// the server holds a later acquire's T back until the earlier one is
	// answered (answers to one (op, key) come in request order).
	other, _ := New([]string{n.addr})
	defer other.Close()
	if _, err := other.TryAcquire(ctx, "job", time.Second); !errors.Is(err, ErrTimeout) {
		t.Fatalf("try-acquire of a held key: %v", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-next
	if second == nil || second.Token() <= first.Token() {
		t.Fatalf("tokens %d then %v", first.Token(), second)
	}
	if s, _ := c.Query(ctx, "job"); s.Token != second.Token() || s.Left <= 0 {
		t.Fatalf("query: %+v", s)
	}
	if err := second.Keep(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if s, _ := c.Query(ctx, "job"); !s.Free() {
		t.Fatalf("free after release: %+v", s)
	}
	if _, err := c.Acquire(ctx, "job", 30*time.Second, Limit(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "job", 30*time.Second, Limit(3)); !isRefused(err, "limit-mismatch") {
		t.Fatalf("another limit meanwhile: %v", err)
	}
	if _, err := c.Acquire(ctx, "other", 1000*24*time.Hour); !isRefused(err, "lease-too-long") {
		t.Fatalf("a lease too long: %v", err)
	}
}

func isRefused(err error, reason string) bool {
	var r *RefusedError
	return errors.As(err, &r) && r.Reason == reason
}

func TestAWaitThatRunsOutIsATimeoutAndGrantsNothing(t *testing.T) {
	_, c := single(t)
	ctx := context.Background()
	g, err := c.Acquire(ctx, "k", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "k", time.Second, Wait(100*time.Millisecond)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("%v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.Acquire(cctx, "k", time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a context that ends: %v", err)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The abandoned request got the key and released it at once.
	eventually(t, 5*time.Second, "the key free again", func() bool {
		s, err := c.Query(ctx, "k")
		return err == nil && s.Free() && s.Waiting == 0
	})
}

func TestASemaphoreGivesEachHolderItsOwnSlot(t *testing.T) {
	_, c := single(t)
	ctx := context.Background()
	slots := map[int]bool{}
	var grants []*Grant
	for i := 0; i < 3; i++ {
		g, err := c.Acquire(ctx, "encoders", 30*time.Second, Limit(3), Value("host-a"))
		if err != nil {
			t.Fatal(err)
		}
		slots[g.Slot()] = true
		grants = append(grants, g)
	}
	if len(slots) != 3 || !slots[0] || !slots[1] || !slots[2] {
		t.Fatalf("slots %v", slots)
	}
	if _, err := c.TryAcquire(ctx, "encoders", time.Second, Limit(3)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("a full semaphore: %v", err)
	}
	freed := grants[1].Slot()
	grants[1].Release(ctx)
	g, err := c.TryAcquire(ctx, "encoders", time.Second, Limit(3))
	if err != nil || g.Slot() != freed {
		t.Fatalf("the freed slot: %v %v", g, err)
	}
}

func TestAHeldGrantIsKeptAliveAndSaysWhenItIsLost(t *testing.T) {
	n, c := single(t)
	ctx := context.Background()
	g, err := c.Hold(ctx, "leader", 600*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	// Three leases later it is still held, by the same token.
	time.Sleep(1800 * time.Millisecond)
	select {
	case <-g.Done():
		t.Fatalf("lost while kept: %v", g.Err())
	default:
	}
	if s, err := c.Query(ctx, "leader"); err != nil || s.Token != g.Token() {
		t.Fatalf("%+v %v", s, err)
	}
	n.kill()
	select {
	case <-g.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("not lost with its only node gone")
	}
	if !errors.Is(g.Err(), ErrLost) {
		t.Fatalf("why: %v", g.Err())
	}
	if err := g.Release(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("release of a lost grant: %v", err)
	}
	if err := g.Keep(ctx, time.Second); !errors.Is(err, ErrLost) {
		t.Fatalf("keep of a lost grant: %v", err)
	}
}

func TestWatchesElectionsAndLeaders(t *testing.T) {
	_, c := single(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	states, err := c.Watch(ctx, "svc")
	if err != nil {
		t.Fatal(err)
	}
	leaders, err := c.Observe(ctx, "svc")
	if err != nil {
		t.Fatal(err)
	}
	next := func(ch <-chan WatchState) WatchState {
		t.Helper()
		select {
		case s, ok := <-ch:
			if !ok {
				t.Fatal("the watch ended")
			}
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no state")
		}
		return WatchState{}
	}
	if s := next(states); s.Token != 0 || s.Holders != 0 || s.Value != "" {
		t.Fatalf("first state: %+v", s)
	}
	if s := next(leaders); s.Token != 0 {
		t.Fatalf("first leader: %+v", s)
	}
	if s, err := c.Leader(ctx, "svc"); err != nil || s.Token != 0 {
		t.Fatalf("nobody leads: %+v %v", s, err)
	}
	a, err := c.Campaign(ctx, "svc", "10.0.0.1:8080", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for {
		s := next(states)
		if s.Token == a.Token() {
			if s.Value != "10.0.0.1:8080" || s.Holders != 1 {
				t.Fatalf("%+v", s)
			}
			break
		}
	}
	if s := next(leaders); s.Token != a.Token() || s.Value != "10.0.0.1:8080" {
		t.Fatalf("leader: %+v", s)
	}
	if s, err := c.Leader(ctx, "svc"); err != nil || s.Token != a.Token() || s.Value != "10.0.0.1:8080" {
		t.Fatalf("leader now: %+v %v", s, err)
	}
	second := make(chan *Grant)
	go func() {
		g, err := c.Campaign(ctx, "svc", "10.0.0.2:8080", 5*time.Second)
		if err != nil {
			t.Error(err)
		}
		second <- g
	}()
	eventually(t, 5*time.Second, "the second candidate waits", func() bool {
		s, err := c.Query(ctx, "svc")
		return err == nil && s.Waiting == 1
	})
	if err := a.Release(ctx); err != nil { // resign
		t.Fatal(err)
	}
	b := <-second
	if s := next(leaders); s.Token != b.Token() || s.Value != "10.0.0.2:8080" {
		t.Fatalf("the next leader: %+v", s)
	}
	cancel()
	for range states {
	}
	for range leaders {
	}
	b.Release(context.Background())
}

func TestCloseStopsEveryGoroutineAndReleasesHeldGrants(t *testing.T) {
	n := startNode(t, freeAddr(t))
	before := runtime.NumGoroutine()
	c, err := New([]string{n.addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h, err := c.Hold(ctx, "held", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "plain", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	states, err := c.Watch(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	<-states
	blocked := make(chan error)
	go func() {
		_, err := c.Acquire(ctx, "held", 30*time.Second) // waits in line
		blocked <- err
	}()
	eventually(t, 5*time.Second, "the acquire waits", func() bool {
		s, err := c.Query(ctx, "held")
		return err == nil && s.Waiting == 1
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-blocked; !errors.Is(err, ErrClosed) {
		t.Fatalf("a call in progress: %v", err)
	}
	for range states {
	}
	<-h.Done()
	if !errors.Is(h.Err(), ErrClosed) {
		t.Fatalf("a held grant of a closed client: %v", h.Err())
	}
	noGoroutineLeft(t, before)
	if _, err := c.Query(ctx, "held"); !errors.Is(err, ErrClosed) {
		t.Fatalf("a call after close: %v", err)
	}
	if err := h.Release(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("a release after close: %v", err)
	}
	other, _ := New([]string{n.addr})
	defer other.Close()
	if s, err := other.Query(ctx, "held"); err != nil || !s.Free() {
		t.Fatalf("the held grant was released by close: %+v %v", s, err)
	}
}

func TestWithAuthTheServerChecksTheSecret(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "secrets")
	if err := os.WriteFile(file, []byte("right-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, freeAddr(t), "--auth-file", file)
	ctx := context.Background()
	good, _ := New([]string{n.addr}, WithAuth("right-secret-0123456789"))
	defer good.Close()
	if _, err := good.Query(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	bad, _ := New([]string{n.addr}, WithAuth("wrong-secret-0123456789"))
	defer bad.Close()
	if _, err := bad.Query(ctx, "k"); !isRefused(err, "bad-auth") {
		t.Fatalf("%v", err)
	}
	none, _ := New([]string{n.addr}, WithConnectTimeout(500*time.Millisecond))
	defer none.Close()
	if _, err := none.Query(ctx, "k"); err == nil {
		t.Fatal("no secret, yet served")
	}
}

// A two-node cluster: the client keeps working when the active node dies.
func TestTheClientKeepsWorkingWhenTheActiveNodeDies(t *testing.T) {
	a, b := freeAddr(t), freeAddr(t)
	peers := a + "," + b
	na := startNode(t, a, "--peers", peers, "--insecure-peers")
	startNode(t, b, "--peers", peers, "--insecure-peers")
	c, err := New([]string{b, a}) // the standby first: the client follows M
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	var g *Grant
	eventually(t, 15*time.Second, "the cluster serves", func() bool {
		g, err = c.Acquire(ctx, "before", 30*time.Second, Wait(time.Second))
		return err == nil
	})
	held, err := c.Hold(ctx, "held", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	states, err := c.Watch(wctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	if s := <-states; s.Token != held.Token() {
		t.Fatalf("watch: %+v", s)
	}
	// Let the standby catch up with the active's state, then kill the
	// active.
	time.Sleep(500 * time.Millisecond)
	na.kill()
	after, err := c.Acquire(ctx, "after", 30*time.Second, Wait(10*time.Second))
	if err != nil {
		t.Fatalf("after the failover: %v", err)
	}
	if after.Token() <= g.Token() {
		t.Fatalf("tokens go up across failover: %d then %d", g.Token(), after.Token())
	}
	// The watch follows to the new active and says its state again.
	select {
	case s, ok := <-states:
		if !ok {
			t.Fatal("the watch ended")
		}
		t.Logf("the watch after failover: %+v", s)
	case <-time.After(15 * time.Second):
		t.Fatal("no state after the failover")
	}
	// The held grant was replicated and is still kept on the new active.
	time.Sleep(3 * time.Second)
	select {
	case <-held.Done():
		t.Fatalf("the held grant was lost: %v", held.Err())
	default:
	}
	if err := g.Release(ctx); err != nil {
		t.Fatalf("a release of a grant of the old active: %v", err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := c.Acquire(ctx, "many", 10*time.Second, Wait(10*time.Second))
			if err != nil {
				t.Error(err)
				return
			}
			g.Release(ctx)
		}()
	}
	wg.Wait()
}

// granted is a grant, tagged with whose acquire it answers.
type granted struct {
	name string
	g    *Grant
}

// waitInLine: c asks for key without a wait limit on its own goroutine;
// the grant comes on out, tagged name, once waiting are in line.
func waitInLine(t *testing.T, c *Client, key, name string, out chan<- granted, watcher *Client, waiting int) {
	t.Helper()
	ctx := context.Background()
	go func() {
		g, err := c.Acquire(ctx, key, 30*time.Second)
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		out <- granted{name, g}
	}()
	eventually(t, 10*time.Second, name+" waits in line", func() bool {
		s, err := watcher.Query(ctx, key)
		return err == nil && s.Waiting == waiting
	})
}

// nextGrant is the next grant to come; its acquire must be want's.
func nextGrant(t *testing.T, in <-chan granted, want string, after uint64) *Grant {
	t.Helper()
	select {
	case got := <-in:
		if got.name != want || got.g == nil || got.g.Token() <= after {
			t.Fatalf("granted %s (%v), want %s above token %d", got.name, got.g, want, after)
		}
		return got.g
	case <-time.After(10 * time.Second):
		t.Fatalf("no grant for %s", want)
	}
	return nil
}

// Close releases a held key this same client waits for: the server hands
// it to the client's own waiter, a grant that comes to a call close ended.
// It is released before the sockets close, so the key is free as soon as
// Close returns, every time (not held for its lease).
func TestCloseLeavesNoGrantItsOwnReleaseHandedToItsOwnWaiter(t *testing.T) {
	n := startNode(t, freeAddr(t))
	ctx := context.Background()
	observer, _ := New([]string{n.addr})
	defer observer.Close()
	for i := 0; i < 20; i++ {
		key := fmt.Sprintf("handed-%d", i)
		c, err := New([]string{n.addr})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Hold(ctx, key, time.Minute); err != nil {
			t.Fatal(err)
		}
		waiter := make(chan error, 1)
		go func() {
			_, err := c.Acquire(ctx, key, time.Minute)
			waiter <- err
		}()
		eventually(t, 5*time.Second, "the waiter in line", func() bool {
			s, err := observer.Query(ctx, key)
			return err == nil && s.Waiting == 1
		})
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-waiter; !errors.Is(err, ErrClosed) {
			t.Fatalf("close %d: the waiter: %v", i, err)
		}
		if s, err := observer.Query(ctx, key); err != nil || !s.Free() {
			t.Fatalf("close %d: the key is free right after close: %+v %v", i, s, err)
		}
	}
}

// The same, when the waiter's goroutine has not run since Close began (a
// busy machine): its acquire has not given up, so nothing marked it
// abandoned when its grant comes. Close must still release that grant
// before the sockets close (the waiter is modelled by a ticket nobody waits
// on); its caller finds only the news that the call ended.
func TestCloseReleasesAGrantToAWaiterThatHasNotGivenUpYet(t *testing.T) {
	n := startNode(t, freeAddr(t))
	ctx := context.Background()
	observer, _ := New([]string{n.addr})
	defer observer.Close()
	c, err := New([]string{n.addr})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Hold(ctx, "handed", time.Minute); err != nil {
		t.Fatal(err)
	}
	var waiter *ticket
	for _, cn := range c.pool.allConns() {
		if waiter = cn.send(&request{op: opAcquire, key: "handed", leaseMS: 60_000}); waiter != nil {
			break
		}
	}
	if waiter == nil {
		t.Fatal("no connection is up")
	}
	eventually(t, 5*time.Second, "the waiter in line", func() bool {
		s, err := observer.Query(ctx, "handed")
		return err == nil && s.Waiting == 1
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err := observer.Query(ctx, "handed"); err != nil || !s.Free() {
		t.Fatalf("the key is free right after close: %+v %v", s, err)
	}
	select {
	case a := <-waiter.call.ch:
		if a.kind != 0 {
			t.Fatalf("the waiter's caller was answered %q (token %d) on a closed client", string(a.kind), a.token)
		}
	default:
		t.Fatal("the waiter's caller was never told that its call ended")
	}
}

func TestATryAcquireBehindTheClientsOwnWaiterTimesOutAndTheWaiterKeepsItsPlace(t *testing.T) {
	n, c := single(t)
	ctx := context.Background()
	other, _ := New([]string{n.addr})
	defer other.Close()
	holder, err := other.Acquire(ctx, "own", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	grants := make(chan granted, 2)
	waitInLine(t, c, "own", "first", grants, other, 1)
	// Two in a row: round-robin alone would put one of them behind the
	// waiter, where the server holds its T back until the waiter is
	// answered (and the connection, deemed dead, would be closed).
	for i := 0; i < 2; i++ {
		if _, err := c.TryAcquire(ctx, "own", 30*time.Second); !errors.Is(err, ErrTimeout) {
			t.Fatalf("try-acquire %d: %v", i, err)
		}
	}
	waitInLine(t, other, "own", "second", grants, other, 2)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := nextGrant(t, grants, "first", holder.Token())
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := nextGrant(t, grants, "second", first.Token())
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestATryAcquireHeldBackOnEveryConnectionTimesOutWithoutClosingOne(t *testing.T) {
	n := startNode(t, freeAddr(t))
	ctx := context.Background()
	// A short request timeout: the try-acquire's answer is due within it
	// (plus its wait), by which time the server still holds it back.
	c, err := New([]string{n.addr}, WithRequestTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	other, _ := New([]string{n.addr})
	defer other.Close()
	holder, err := other.Acquire(ctx, "full", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	grants := make(chan granted, 3)
	// One waiter of c on each of its two connections, another client's
	// behind them.
	waitInLine(t, c, "full", "first", grants, other, 1)
	waitInLine(t, c, "full", "second", grants, other, 2)
	waitInLine(t, other, "full", "third", grants, other, 3)
	if _, err := c.TryAcquire(ctx, "full", 30*time.Second); !errors.Is(err, ErrTimeout) {
		t.Fatalf("try-acquire: %v", err)
	}
	// Had a connection been closed, its waiter would have been sent again,
	// behind the third.
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	last := holder.Token()
	for _, want := range []string{"first", "second", "third"} {
		g := nextGrant(t, grants, want, last)
		if err := g.Release(ctx); err != nil {
			t.Fatal(err)
		}
		last = g.Token()
	}
}
