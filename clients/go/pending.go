package baton

// pendingID names the request an answer belongs to: its op and key.
type pendingID struct {
	op  byte
	key string
}

// pending keeps, per (op, key), the requests sent on one connection that
// still wait for their answer, oldest first. The server answers requests
// with the same (op, key) on one connection in the order they arrived, so
// an answer belongs to the oldest waiting request of its (op, key), and
// only that one can be answered next: the server holds back the answer to
// a later acquire of a key (even a T whose wait ran out) until the earlier
// one on the same connection is answered. push says whether a request went
// to the front of its line, front names the one there, and has lets the
// pool send a key's acquires to a connection with none of it outstanding.
// T is whatever hands the answer over. Not safe for concurrent use: its
// connection's lock guards it.
type pending[T any] struct {
	queues map[pendingID][]T
	n      int
}

func newPending[T any]() pending[T] {
	return pending[T]{queues: make(map[pendingID][]T)}
}

// push remembers a request just sent, behind those with the same (op, key);
// true when none was waiting (it is at the front of its line).
func (p *pending[T]) push(op byte, key string, slot T) bool {
	id := pendingID{op, key}
	p.queues[id] = append(p.queues[id], slot)
	p.n++
	return len(p.queues[id]) == 1
}

// has: a request with this (op, key) waits for its answer (one map lookup).
func (p *pending[T]) has(op byte, key string) bool {
	_, found := p.queues[pendingID{op, key}]
	return found
}

// hasOp: a request of op (any key) waits for its answer (a scan of the
// lines: for closing, not for every call).
func (p *pending[T]) hasOp(op byte) bool {
	for id := range p.queues {
		if id.op == op {
			return true
		}
	}
	return false
}

// front is the oldest waiting request with this (op, key), left in place;
// ok false when none waits.
func (p *pending[T]) front(op byte, key string) (slot T, ok bool) {
	q, found := p.queues[pendingID{op, key}]
	if !found || len(q) == 0 {
		return slot, false
	}
	return q[0], true
}

// take removes and returns the oldest waiting request with this (op, key);
// ok false when none waits.
func (p *pending[T]) take(op byte, key string) (slot T, ok bool) {
	id := pendingID{op, key}
	q, found := p.queues[id]
	if !found || len(q) == 0 {
		return slot, false
	}
	slot = q[0]
	if len(q) == 1 {
		delete(p.queues, id)
	} else {
		var zero T
		q[0] = zero
		p.queues[id] = q[1:]
	}
	p.n--
	return slot, true
}

// len is how many requests wait.
func (p *pending[T]) len() int { return p.n }

// drain removes and returns every waiting request (the connection is gone).
func (p *pending[T]) drain() []T {
	var all []T
	for _, q := range p.queues {
		all = append(all, q...)
	}
	p.queues = make(map[pendingID][]T)
	p.n = 0
	return all
}
