package baton

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// connectionsForOneServer: with a single address the client keeps two
	// connections to it, so that a brief drop of one does not interrupt
	// service.
	connectionsForOneServer = 2
	// maxServers is the most servers a client knows (given or learned
	// from redirects).
	maxServers = 64
	// connectSlack is added to the connect timeout when a caller waits for
	// a connection that is being made.
	connectSlack = time.Second
)

// target is the node a request must go to; anyNode: whichever.
const anyNode = -1

// choice is what choose decides.
type choice int

const (
	chooseUse     choice = iota // use the connection at the index
	chooseWait                  // none is up, but one is connecting: wait for it
	chooseNothing               // none is up or connecting
)

// connInfo is a connection's node and phase, for choosing, and busy: a
// request of the same (op, key) as the one to send waits for its answer
// there (only acquires ask).
type connInfo struct {
	node  int
	phase phase
	busy  bool
}

// choose picks a connection, round-robin (turn) among those that are up
// (the ones not busy first: the server would hold back the answer to an
// acquire of a key behind an earlier one of that key on its connection,
// even a try-acquire's T): of the target node, or of the preferred node
// (the active one named by a redirect) when it has one up or connecting,
// else of any node. When every one up is busy and another that fits is
// still connecting (a new client's second), it says wait for that one
// rather than queue behind the client's own waiter; when none is
// connecting, or settle (that wait is over), a busy one all the same.
// Pure.
func choose(conns []connInfo, target, preferred int, turn uint64, settle bool) (int, choice) {
	among := func(node int) (int, choice) {
		fits := func(n int) bool { return node == anyNode || n == node }
		pickUp := func(free bool) (int, bool) {
			up := 0
			for _, c := range conns {
				if fits(c.node) && c.phase == phaseUp && !(free && c.busy) {
					up++
				}
			}
			if up == 0 {
				return -1, false
			}
			k := int(turn % uint64(up))
			for i, c := range conns {
				if fits(c.node) && c.phase == phaseUp && !(free && c.busy) {
					if k == 0 {
						return i, true
					}
					k--
				}
			}
			return -1, false
		}
		connecting := false
		for _, c := range conns {
			if fits(c.node) && c.phase == phaseConnecting {
				connecting = true
			}
		}
		if i, ok := pickUp(true); ok {
			return i, chooseUse
		}
		// Every one up is busy with this key: one still connecting will
		// be free, so wait for it (pick bounds the wait, then settles).
		if connecting && !settle {
			return -1, chooseWait
		}
		if i, ok := pickUp(false); ok {
			return i, chooseUse
		}
		if connecting {
			return -1, chooseWait
		}
		return -1, chooseNothing
	}
	if target != anyNode {
		return among(target)
	}
	if preferred != anyNode {
		if i, ch := among(preferred); ch != chooseNothing {
			return i, ch
		}
	}
	return among(anyNode)
}

// node is one server and its connections.
type node struct {
	addr  string
	conns []*conn
}

// pool holds the servers and their connections, chooses one for each
// attempt, and lets callers wait for one to come up.
type pool struct {
	c         *Client
	mu        sync.RWMutex
	nodes     []*node
	preferred atomic.Int64
	turn      atomic.Uint64
}

func newPool(c *Client, servers []string) *pool {
	p := &pool{c: c}
	p.preferred.Store(anyNode)
	per := 1
	if len(servers) == 1 {
		per = connectionsForOneServer
	}
	for _, addr := range servers {
		p.addNodeLocked(addr, per)
	}
	return p
}

func (p *pool) addNodeLocked(addr string, count int) int {
	index := len(p.nodes)
	n := &node{addr: addr}
	for i := 0; i < count; i++ {
		cn := newConn(p.c, index, addr)
		n.conns = append(n.conns, cn)
		p.c.wg.Add(1)
		go cn.run()
	}
	p.nodes = append(p.nodes, n)
	p.c.notifier.bump()
	return index
}

// nodeFor is the index of the server at addr, registered (with one
// connection) if it is new: a redirect named it.
func (p *pool) nodeFor(addr string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, n := range p.nodes {
		if n.addr == addr {
			return i, nil
		}
	}
	if len(p.nodes) >= maxServers {
		return 0, unavailable("redirected to %s, but this client already knows %d servers", addr, maxServers)
	}
	if p.c.closed.Load() {
		return 0, ErrClosed
	}
	return p.addNodeLocked(addr, 1), nil
}

func (p *pool) prefer(node int) { p.preferred.Store(int64(node)) }

// isReachable: a connection of the node is up or connecting.
func (p *pool) isReachable(node int) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if node < 0 || node >= len(p.nodes) {
		return false
	}
	for _, cn := range p.nodes[node].conns {
		if ph, _ := cn.status(); ph != phaseDown {
			return true
		}
	}
	return false
}

// connectionCount is how many connections are registered (for target).
func (p *pool) connectionCount(target int) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	n := 0
	for i, nd := range p.nodes {
		if target == anyNode || target == i {
			n += len(nd.conns)
		}
	}
	return n
}

func (p *pool) allConns() []*conn {
	p.mu.RLock()
	defer p.mu.RUnlock()
	var all []*conn
	for _, n := range p.nodes {
		all = append(all, n.conns...)
	}
	return all
}

// chooseNow picks a connection that is up (for an acquire r, one with no
// acquire of its key outstanding if it can); nil and no error when one is
// connecting (wait for it: also when every one up is busy with r's key,
// unless settle); an error when none is up or connecting.
func (p *pool) chooseNow(target int, r *request, settle bool) (*conn, error) {
	conns := p.allConns()
	var arr [16]connInfo
	infos := arr[:0]
	for _, cn := range conns {
		if r != nil && r.op == opAcquire {
			ph, busy := cn.statusFor(r.op, r.key)
			infos = append(infos, connInfo{cn.node, ph, busy})
			continue
		}
		ph, _ := cn.status()
		infos = append(infos, connInfo{node: cn.node, phase: ph})
	}
	i, ch := choose(infos, target, int(p.preferred.Load()), p.turn.Add(1)-1, settle)
	switch ch {
	case chooseUse:
		return conns[i], nil
	case chooseWait:
		return nil, nil
	}
	return nil, p.noConnection(target, "")
}

// noConnection is the error when no connection can carry a request: the
// server's refusal of the secret if that is why, else unavailable.
func (p *pool) noConnection(target int, prefix string) error {
	if reason := p.authRefused(target); reason != "" {
		return &RefusedError{Reason: reason}
	}
	return unavailable("%s%s", prefix, p.describe(target))
}

// authRefused is the reason a server of target refused the secret ("" none).
func (p *pool) authRefused(target int) string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for i, n := range p.nodes {
		if target != anyNode && target != i {
			continue
		}
		for _, cn := range n.conns {
			if r := cn.refusedReason(); r != "" {
				return r
			}
		}
	}
	return ""
}

// pick waits for a connection (of target) to be up for r, at most until
// due (zero: no limit) and the connect timeout plus slack; when that wait
// ends with one up but busy with r's key (waited on for a free one still
// connecting), that one serves after all.
func (p *pool) pick(ctx context.Context, target int, r *request, due time.Time) (*conn, error) {
	until := time.Now().Add(p.c.connectTimeout + connectSlack)
	if !due.IsZero() && due.Before(until) {
		until = due
	}
	var tm *time.Timer
	defer func() {
		if tm != nil {
			tm.Stop()
		}
	}()
	for {
		seen := p.c.notifier.wait()
		if p.c.isStopped(ctx) {
			return nil, ErrClosed
		}
		cn, err := p.chooseNow(target, r, false)
		if cn != nil || err != nil {
			return cn, err
		}
		if tm == nil {
			tm = time.NewTimer(time.Until(until))
		}
		select {
		case <-seen:
		case <-tm.C:
			if cn, _ := p.chooseNow(target, r, true); cn != nil {
				return cn, nil
			}
			return nil, p.noConnection(target, "still connecting: ")
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.c.stopped(ctx):
			return nil, ErrClosed
		}
	}
}

// describe says, per server, why it cannot be used.
func (p *pool) describe(target int) string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	var parts []string
	for i, n := range p.nodes {
		if target != anyNode && target != i {
			continue
		}
		why := "not connected yet"
		for _, cn := range n.conns {
			if _, e := cn.status(); e != "" {
				why = e
				break
			}
		}
		parts = append(parts, n.addr+" ("+why+")")
	}
	return strings.Join(parts, "; ")
}

func (p *pool) closeAll() {
	for _, cn := range p.allConns() {
		cn.close()
	}
}

// notifier is bumped on every change of a connection's phase; waiters
// take the current channel, look, and wait for it to close.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func (n *notifier) wait() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

func (n *notifier) bump() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}
