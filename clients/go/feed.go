package baton

import "sync"

// maxBuffered is the most states one watch keeps undelivered; past it the
// oldest is dropped (a slow reader skips states, but ends on the latest).
const maxBuffered = 1024

type evKind int

const (
	evState   evKind = iota // a W line: the key's state
	evMoved                 // M ... W key: watch again on addr ("" none known)
	evRefused               // E W key reason
	evEnded                 // the connection ended
)

// feedEvent is what a connection tells one watch.
type feedEvent struct {
	kind   evKind
	state  WatchState
	addr   string
	reason string
}

// feed is the mailbox between the connection that carries a watch's
// subscription and the watch's goroutine. Each subscription has an epoch;
// events of an older one are dropped.
type feed struct {
	mu      sync.Mutex
	epoch   uint64
	events  []feedEvent
	settled bool // the subscription ended: nothing more is taken
	wake    chan struct{}
}

func newFeed() *feed {
	return &feed{wake: make(chan struct{}, 1)}
}

// begin starts a new subscription (0: none).
func (f *feed) begin(epoch uint64) {
	f.mu.Lock()
	f.epoch = epoch
	f.events = f.events[:0]
	f.settled = false
	f.mu.Unlock()
}

// push adds an event of subscription epoch.
func (f *feed) push(epoch uint64, ev feedEvent) {
	f.mu.Lock()
	if f.epoch != epoch || f.settled {
		f.mu.Unlock()
		return
	}
	f.settled = ev.kind != evState
	if !f.settled && len(f.events) >= maxBuffered {
		f.events = append(f.events[:0], f.events[1:]...)
	}
	f.events = append(f.events, ev)
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// take removes the oldest event of subscription epoch.
func (f *feed) take(epoch uint64) (feedEvent, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.epoch != epoch || len(f.events) == 0 {
		return feedEvent{}, false
	}
	ev := f.events[0]
	f.events = f.events[1:]
	return ev, true
}

// sub is one watch's subscription on a connection.
type sub struct {
	feed  *feed
	epoch uint64
}

// watchers are the watches of one key on one connection.
type watchers struct {
	awaiting []*sub // their W awaits its first line, in send order; nil: given up
	live     []*sub
}

func (w *watchers) noneLeft() bool {
	if len(w.live) > 0 {
		return false
	}
	for _, s := range w.awaiting {
		if s != nil {
			return false
		}
	}
	return true
}

func (w *watchers) every() []*sub {
	var all []*sub
	for _, s := range w.awaiting {
		if s != nil {
			all = append(all, s)
		}
	}
	return append(all, w.live...)
}

// watch subscribes f (epoch) to key's states on this connection: sends
// W key. The connection's generation; false when not up.
func (cn *conn) watch(key string, f *feed, epoch uint64) (uint64, bool) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	l := cn.link
	if l == nil {
		return 0, false
	}
	r := request{op: opWatch, key: key}
	l.out = r.appendTo(l.out)
	select {
	case l.wake <- struct{}{}:
	default:
	}
	w := cn.watches[key]
	if w == nil {
		w = &watchers{}
		cn.watches[key] = w
	}
	w.awaiting = append(w.awaiting, &sub{f, epoch})
	return cn.gen, true
}

// unwatch gives up the watch of f (epoch) on key subscribed in generation
// gen; the key's last watch here sends X key, its answer unawaited.
func (cn *conn) unwatch(key string, gen uint64, f *feed, epoch uint64) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.gen != gen || cn.link == nil {
		return
	}
	w := cn.watches[key]
	if w == nil {
		return
	}
	is := func(s *sub) bool { return s != nil && s.feed == f && s.epoch == epoch }
	for i, s := range w.awaiting {
		if is(s) {
			w.awaiting[i] = nil
		}
	}
	live := w.live[:0]
	for _, s := range w.live {
		if !is(s) {
			live = append(live, s)
		}
	}
	w.live = live
	if !w.noneLeft() {
		return
	}
	if len(w.awaiting) == 0 {
		delete(cn.watches, key)
	}
	cn.sendLocked(&request{op: opUnwatch, key: key}, nil)
}

// dispatchWatchLocked hands a W line, or an M or E about a W, to the
// watches of its key; false for any other answer.
func (cn *conn) dispatchWatchLocked(a answer) bool {
	switch {
	case a.kind == 'W':
		w := cn.watches[a.key]
		if w == nil {
			return true // no longer watched
		}
		if len(w.awaiting) > 0 {
			if first := w.awaiting[0]; first != nil {
				w.live = append(w.live, first)
			}
			w.awaiting = w.awaiting[1:]
		}
		st := WatchState{Token: a.token, Holders: int(a.holders), Waiting: int(a.waiting), Value: a.value}
		for _, s := range w.live {
			s.feed.push(s.epoch, feedEvent{kind: evState, state: st})
		}
		if len(w.awaiting) == 0 && len(w.live) == 0 {
			delete(cn.watches, a.key)
		}
		return true
	case a.kind == 'M' && a.op == opWatch:
		if w := cn.watches[a.key]; w != nil {
			for _, s := range w.every() {
				s.feed.push(s.epoch, feedEvent{kind: evMoved, addr: a.addr})
			}
			delete(cn.watches, a.key)
		}
		return true
	case a.kind == 'E' && a.op == opWatch:
		w := cn.watches[a.key]
		if w == nil {
			return true
		}
		if len(w.awaiting) > 0 {
			if first := w.awaiting[0]; first != nil {
				first.feed.push(first.epoch, feedEvent{kind: evRefused, reason: a.reason})
			}
			w.awaiting = w.awaiting[1:]
		}
		if len(w.awaiting) == 0 && len(w.live) == 0 {
			delete(cn.watches, a.key)
		}
		return true
	}
	return false
}
