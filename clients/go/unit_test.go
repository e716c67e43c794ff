package baton

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestAnswersForOneOpAndKeyAreMatchedInSendOrder(t *testing.T) {
	p := newPending[int]()
	p.push(opAcquire, "a", 1)
	p.push(opAcquire, "b", 2)
	p.push(opAcquire, "a", 3)
	p.push(opRelease, "a", 4)
	if p.len() != 4 {
		t.Fatalf("len %d", p.len())
	}
	for _, want := range []struct {
		op   byte
		key  string
		slot int
		ok   bool
	}{
		{opRelease, "a", 4, true},
		{opAcquire, "a", 1, true},
		{opAcquire, "a", 3, true},
		{opAcquire, "a", 0, false},
		{opAcquire, "b", 2, true},
		{opQuery, "b", 0, false},
	} {
		got, ok := p.take(want.op, want.key)
		if got != want.slot || ok != want.ok {
			t.Fatalf("take(%c, %s) = %d %v, want %d %v", want.op, want.key, got, ok, want.slot, want.ok)
		}
	}
	if p.len() != 0 {
		t.Fatalf("len %d after taking all", p.len())
	}
	p.push(opQuery, "a", 1)
	p.push(opInfo, "", 2)
	if all := p.drain(); len(all) != 2 || p.len() != 0 {
		t.Fatalf("drain %v", all)
	}
}

func TestAnswersNameTheRequestTheyAnswer(t *testing.T) {
	for _, c := range []struct {
		line string
		op   byte
		key  string
	}{
		{"A 7 job", opAcquire, "job"},
		{"A 7 job 2", opAcquire, "job"},
		{"T job", opAcquire, "job"},
		{"R job", opRelease, "job"},
		{"N job", opRelease, "job"},
		{"K job", opKeep, "job"},
		{"Q job 7 100 2", opQuery, "job"},
		{"W job 7 1 0 me", opWatch, "job"},
		{"X job", opUnwatch, "job"},
		{"M 10.0.0.2:7373 K job", opKeep, "job"},
		{"M - A job", opAcquire, "job"},
		{"E A job limit-mismatch", opAcquire, "job"},
		{"E - - unknown-op", '-', "-"},
		{"I role=active node=a:1", opInfo, ""},
		{"U ok", opAuth, ""},
	} {
		a, ok := parseAnswer(c.line)
		if !ok || a.op != c.op || a.key != c.key {
			t.Errorf("%q: ok %v op %c key %q", c.line, ok, a.op, a.key)
		}
	}
	a, _ := parseAnswer("A 18446744073709551615 job 3")
	if a.token != 18446744073709551615 || a.slot != 3 {
		t.Errorf("token %d slot %d", a.token, a.slot)
	}
	a, _ = parseAnswer("A 9 job")
	if a.slot != -1 {
		t.Errorf("no slot: %d", a.slot)
	}
	a, _ = parseAnswer("W job 0 0 0 -")
	if a.value != "" {
		t.Errorf("value %q", a.value)
	}
	a, _ = parseAnswer("M - A job")
	if a.addr != "" {
		t.Errorf("addr %q", a.addr)
	}
	for _, bad := range []string{"A x job", "Z job", "Q job 1 2", "AA 1 k", "W job 1 1 1", "U nope"} {
		if _, ok := parseAnswer(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestRequestsAreWrittenAsTheProtocolSays(t *testing.T) {
	for _, c := range []struct {
		r    request
		want string
	}{
		{request{op: opAcquire, key: "k", leaseMS: 30000, waitMS: 0}, "A k 30 0\n"},
		{request{op: opAcquire, key: "k", leaseMS: 1500, waitMS: 1}, "A k 1.5 0.001\n"},
		{request{op: opAcquire, key: "k", leaseMS: 2125, waitMS: 10, limit: 3}, "A k 2.125 0.01 3\n"},
		{request{op: opAcquire, key: "k", leaseMS: 1000, value: "me"}, "A k 1 0 1 me\n"},
		{request{op: opAcquire, key: "k", leaseMS: 1000, limit: 4, value: "me"}, "A k 1 0 4 me\n"},
		{request{op: opRelease, key: "k", token: 18446744073709551615}, "R k 18446744073709551615\n"},
		{request{op: opKeep, key: "k", token: 5, leaseMS: 900}, "K k 5 0.9\n"},
		{request{op: opQuery, key: "k"}, "Q k\n"},
		{request{op: opWatch, key: "k"}, "W k\n"},
		{request{op: opUnwatch, key: "k"}, "X k\n"},
		{request{op: opInfo}, "I\n"},
		{request{op: opAuth, secret: "s3cret-s3cret-s3cret"}, "U s3cret-s3cret-s3cret\n"},
	} {
		if got := string(c.r.appendTo(nil)); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
	if millisCeil(1500*time.Microsecond) != 2 || millisCeil(time.Nanosecond) != 1 || millisCeil(0) != 0 {
		t.Error("millisCeil rounds up")
	}
}

func TestUpConnectionsAreUsedInTurn(t *testing.T) {
	conns := []connInfo{{0, phaseUp, false}, {0, phaseUp, false}, {1, phaseUp, false}}
	for turn, want := range []int{0, 1, 2, 0} {
		if i, ch := choose(conns, anyNode, anyNode, uint64(turn), false); ch != chooseUse || i != want {
			t.Errorf("turn %d: %d %v, want %d", turn, i, ch, want)
		}
	}
	conns = []connInfo{{0, phaseDown, false}, {1, phaseUp, false}, {2, phaseConnecting, false}}
	for turn := 0; turn < 5; turn++ {
		if i, _ := choose(conns, anyNode, anyNode, uint64(turn), false); i != 1 {
			t.Errorf("a down or connecting connection is left out: %d", i)
		}
	}
	if _, ch := choose([]connInfo{{0, phaseDown, false}, {1, phaseConnecting, false}}, anyNode, anyNode, 0, false); ch != chooseWait {
		t.Error("with none up, wait for one connecting")
	}
	if _, ch := choose([]connInfo{{0, phaseDown, false}}, anyNode, anyNode, 0, false); ch != chooseNothing {
		t.Error("none up or connecting")
	}
	conns = []connInfo{{0, phaseUp, false}, {1, phaseUp, false}, {1, phaseUp, false}}
	if i, _ := choose(conns, anyNode, 1, 0, false); i != 1 {
		t.Error("the preferred node comes first")
	}
	if i, _ := choose(conns, anyNode, 1, 1, false); i != 2 {
		t.Error("round-robin within the preferred node")
	}
	if _, ch := choose([]connInfo{{0, phaseUp, false}, {1, phaseConnecting, false}}, anyNode, 1, 0, false); ch != chooseWait {
		t.Error("a connecting preferred node is waited for")
	}
	if i, _ := choose([]connInfo{{0, phaseUp, false}, {1, phaseDown, false}}, anyNode, 1, 0, false); i != 0 {
		t.Error("a preferred node that is down is skipped")
	}
	if _, ch := choose([]connInfo{{0, phaseUp, false}, {1, phaseDown, false}}, 1, anyNode, 0, false); ch != chooseNothing {
		t.Error("a request for one node uses only that node")
	}
}

func TestAnAcquireGoesWhereNoneOfItsKeyIsOutstanding(t *testing.T) {
	conns := []connInfo{{0, phaseUp, true}, {0, phaseUp, false}, {0, phaseDown, false}}
	for turn := 0; turn < 4; turn++ {
		if i, ch := choose(conns, anyNode, anyNode, uint64(turn), false); ch != chooseUse || i != 1 {
			t.Errorf("turn %d: %d %v, want the free connection", turn, i, ch)
		}
	}
	conns = []connInfo{{0, phaseUp, true}, {0, phaseUp, true}}
	for turn, want := range []int{0, 1} {
		if i, _ := choose(conns, anyNode, anyNode, uint64(turn), false); i != want {
			t.Errorf("every one busy: still round-robin: %d, want %d", i, want)
		}
	}
	// The other node would only redirect back to the preferred one.
	if i, _ := choose([]connInfo{{0, phaseUp, false}, {1, phaseUp, true}}, anyNode, 1, 0, false); i != 1 {
		t.Error("a free connection elsewhere does not beat the preferred node")
	}
}

func TestAnAcquireWhoseKeyEveryUpConnectionIsBusyWithWaitsForOneConnecting(t *testing.T) {
	// A new client's second connection is not up yet and the first has
	// this client's acquire of the key waiting: wait for the second.
	conns := []connInfo{{0, phaseUp, true}, {0, phaseConnecting, false}}
	if _, ch := choose(conns, anyNode, anyNode, 0, false); ch != chooseWait {
		t.Errorf("one up and busy, one connecting: %v, want wait", ch)
	}
	if _, ch := choose(conns, 0, anyNode, 0, false); ch != chooseWait {
		t.Errorf("the same for a target node: %v, want wait", ch)
	}
	if _, ch := choose(conns, anyNode, 0, 1, false); ch != chooseWait {
		t.Errorf("the same within the preferred node: %v, want wait", ch)
	}
	// The wait is over (settle) and it is still connecting: the busy one.
	if i, ch := choose(conns, anyNode, anyNode, 0, true); ch != chooseUse || i != 0 {
		t.Errorf("settled: %d %v, want the busy one", i, ch)
	}
	// None connecting: the busy one at once.
	conns = []connInfo{{0, phaseUp, true}, {0, phaseDown, false}}
	if i, ch := choose(conns, anyNode, anyNode, 0, false); ch != chooseUse || i != 0 {
		t.Errorf("one up and busy, one down: %d %v, want the busy one", i, ch)
	}
	// The one connecting came up: it is used, waiting or settled.
	conns = []connInfo{{0, phaseUp, true}, {0, phaseUp, false}}
	for _, settle := range []bool{false, true} {
		for turn := 0; turn < 2; turn++ {
			if i, ch := choose(conns, anyNode, anyNode, uint64(turn), settle); ch != chooseUse || i != 1 {
				t.Errorf("settle %v turn %d: %d %v, want the one that came up", settle, turn, i, ch)
			}
		}
	}
	// One connecting on another node does not hold back a request for
	// this one (it would not fit).
	conns = []connInfo{{0, phaseUp, true}, {1, phaseConnecting, false}}
	if i, ch := choose(conns, 0, anyNode, 0, false); ch != chooseUse || i != 0 {
		t.Errorf("target node 0, node 1 connecting: %d %v, want the busy one", i, ch)
	}
	// Not busy (any other op): used at once whatever is connecting.
	conns = []connInfo{{0, phaseUp, false}, {0, phaseConnecting, false}}
	if i, ch := choose(conns, anyNode, anyNode, 0, false); ch != chooseUse || i != 0 {
		t.Errorf("a free one up: %d %v, want it", i, ch)
	}
}

func TestARequestHeldBackNeverMakesItsConnectionOverdue(t *testing.T) {
	t0 := time.Now()
	s := time.Second
	at := func(n int) time.Time { return t0.Add(time.Duration(n) * s) }
	for _, c := range []struct {
		now              int
		budget           time.Duration
		front, callerDue time.Time
		want             verdict
	}{
		{60, 5 * s, time.Time{}, time.Time{}, notYet},
		{6, 5 * s, time.Time{}, at(5), heldBack},
		{14, 5 * s, at(10), time.Time{}, notYet},
		{15, 5 * s, at(10), time.Time{}, connOverdue},
		{14, 5 * s, at(10), at(12), callerOverdue},
		{99, 0, t0, time.Time{}, notYet},
	} {
		if got := pastDeadline(at(c.now), c.budget, c.front, c.callerDue); got != c.want {
			t.Errorf("%+v: got %v", c, got)
		}
	}
}

func TestPendingSaysWhoIsAtTheFront(t *testing.T) {
	p := newPending[int]()
	if !p.push(opAcquire, "a", 1) || !p.push(opAcquire, "b", 2) || p.push(opAcquire, "a", 3) {
		t.Fatal("the first of an (op, key) is at the front, a later one not")
	}
	if !p.has(opAcquire, "a") || p.has(opRelease, "a") {
		t.Error("has")
	}
	if f, _ := p.front(opAcquire, "a"); f != 1 {
		t.Errorf("front %d", f)
	}
	p.take(opAcquire, "a")
	if f, _ := p.front(opAcquire, "a"); f != 3 {
		t.Errorf("front after take %d", f)
	}
	p.take(opAcquire, "a")
	if p.has(opAcquire, "a") {
		t.Error("none left")
	}
}

func TestArgumentsAreCheckedBeforeAnythingIsSent(t *testing.T) {
	for _, addrs := range [][]string{nil, {""}, {"a:x"}, {":1"}, {"a:70000"}, {"a b:1"}, {"::1"}} {
		if _, err := New(addrs); !errors.Is(err, ErrBadArgument) {
			t.Errorf("%q: %v", addrs, err)
		}
	}
	if s, err := parseServers([]string{" a:1", "b", "a:1", "[::1]:9", "[::1]"}); err != nil ||
		len(s) != 4 || s[0] != "a:1" || s[1] != "b:7373" || s[2] != "[::1]:9" || s[3] != "[::1]:7373" {
		t.Errorf("normalised: %v %v", s, err)
	}
	if _, err := New([]string{"127.0.0.1:1"}, WithAuth("too short")); !errors.Is(err, ErrBadArgument) {
		t.Errorf("short secret: %v", err)
	}
	c, err := New([]string{freeAddr(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"empty key":   func() error { _, err := c.Acquire(ctx, "", time.Second); return err },
		"key space":   func() error { _, err := c.Acquire(ctx, "a b", time.Second); return err },
		"long key":    func() error { _, err := c.Query(ctx, string(make([]byte, 251))); return err },
		"zero lease":  func() error { _, err := c.Acquire(ctx, "k", 0); return err },
		"limit 0":     func() error { _, err := c.Acquire(ctx, "k", time.Second, Limit(0)); return err },
		"limit 10001": func() error { _, err := c.Acquire(ctx, "k", time.Second, Limit(10001)); return err },
		"value -":     func() error { _, err := c.Acquire(ctx, "k", time.Second, Value("-")); return err },
		"value space": func() error { _, err := c.Campaign(ctx, "k", "a b", time.Second); return err },
		"watch key":   func() error { _, err := c.Watch(ctx, "a\nb"); return err },
	} {
		if err := call(); !errors.Is(err, ErrBadArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
