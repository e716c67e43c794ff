package baton

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// ReconnectInterval is the time between two connection attempts to a
// server that is down (or after a connection drops).
const ReconnectInterval = 3 * time.Second

// maxInFlight is the most requests waiting for an answer on one
// connection; past it the connection takes no more and callers use
// another.
const maxInFlight = 65536

// readChunk is the size of a connection's read buffer.
const readChunk = 64 * 1024

// phase is where a connection stands.
type phase int

const (
	phaseConnecting phase = iota // an attempt to connect is under way
	phaseUp                      // connected: requests may be sent
	phaseDown                    // not connected; the next attempt comes within ReconnectInterval
)

// call is one request waiting for its answer: the answer, or (kind 0) the
// news that the connection ended, arrives once on ch.
type call struct {
	op byte
	ch chan answer
	// abandoned: the caller stopped waiting (its deadline, a cancelled
	// context); a grant that arrives for it is released at once.
	// Guarded by the connection's lock.
	abandoned bool
	// frontAt is when the request reached the front of its (op, key) line
	// on the connection (its answer can come from then on); zero while it
	// is held back behind an earlier one. Guarded by the connection's lock.
	frontAt time.Time
}

// link is one lifetime of a connection: its socket and what its writer
// goroutine sends.
type link struct {
	nc   net.Conn // plain, or TLS over raw
	raw  net.Conn // the TCP socket, closed to end the connection from anywhere
	out  []byte   // lines queued for the writer
	wake chan struct{}
	stop chan struct{} // closed when the connection ends
	done chan struct{} // closed when the writer has returned
	// writing: the writer holds lines it has not finished writing.
	// Guarded by the connection's lock.
	writing bool
}

// conn is one registered connection to one server, kept up in the
// background by its manager goroutine (connect, TLS, U, read and dispatch
// answers, reconnect every ReconnectInterval) and, while up, a writer
// goroutine, so that a caller never blocks on a socket write.
//
// Callers register a request in the pending table and queue its line under
// the same lock, so answers are matched in the order the lines go out.
//
// The server answers one (op, key) on a connection in request order, so a
// request sent behind an earlier one of its (op, key) (an acquire behind an
// acquire of the same key waiting in line) cannot be answered before it,
// even when its own wait has run out: its overdue clock (ticket.wait)
// starts only when it reaches the front of that line, and a connection is
// never closed for an answer the server is entitled to hold back. The pool
// avoids the case where it can (statusFor: an acquire goes to a connection
// with no acquire of its key outstanding, when one is up).
type conn struct {
	c    *Client
	node int
	addr string

	mu          sync.Mutex
	phase       phase
	gen         uint64 // counts connections made; a ticket names its own
	link        *link  // non-nil while up
	raw         net.Conn
	pending     pending[*call]
	watches     map[string]*watchers
	lastErr     string
	killReason  string
	authRefused string // the server's reason when it refused the secret
}

func newConn(c *Client, node int, addr string) *conn {
	return &conn{
		c:       c,
		node:    node,
		addr:    addr,
		pending: newPending[*call](),
		watches: make(map[string]*watchers),
	}
}

// status is the phase and why the last attempt failed or connection ended.
func (cn *conn) status() (phase, string) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.phase, cn.lastErr
}

// statusFor is the phase, and whether a request with this (op, key) waits
// for its answer here (a later one would be answered only after it).
func (cn *conn) statusFor(op byte, key string) (phase, bool) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.phase, cn.pending.has(op, key)
}

func (cn *conn) refusedReason() string {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.authRefused
}

// ticket is a request sent on a connection, waiting for its answer.
type ticket struct {
	cn     *conn
	gen    uint64
	call   *call
	sentAt time.Time
}

// send queues r and registers for its answer; nil when the connection is
// not up (or full).
func (cn *conn) send(r *request) *ticket {
	cl := &call{op: r.op, ch: make(chan answer, 1)}
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if !cn.sendLocked(r, cl) {
		return nil
	}
	now := time.Now()
	if !cn.pendingBehind(r, cl) {
		cl.frontAt = now
	}
	return &ticket{cn: cn, gen: cn.gen, call: cl, sentAt: now}
}

// pendingBehind: cl, just queued, waits behind an earlier request of r's
// (op, key). Under the lock.
func (cn *conn) pendingBehind(r *request, cl *call) bool {
	first, ok := cn.pending.front(r.op, r.key)
	return ok && first != cl
}

// sendLocked queues r's line and its slot (nil: nobody waits for the
// answer). False when not up or full.
func (cn *conn) sendLocked(r *request, cl *call) bool {
	l := cn.link
	if l == nil || cn.pending.len() >= maxInFlight {
		return false
	}
	l.out = r.appendTo(l.out)
	cn.pending.push(r.op, r.key, cl)
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return true
}

// releaseOrphanLocked: a grant arrived for a caller that had given up;
// release it at once so that the key is not blocked until its lease runs
// out.
func (cn *conn) releaseOrphanLocked(a answer) {
	if a.kind != 'A' {
		return
	}
	cn.c.logf("%s: releasing %s (token %d): its caller gave up", cn.addr, a.key, a.token)
	cn.sendLocked(&request{op: opRelease, key: a.key, token: a.token}, nil)
}

// kill closes the connection made in generation gen (if it is still the
// current one) because a request on it is overdue; it reconnects later.
func (cn *conn) kill(gen uint64, why string) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.gen != gen || cn.link == nil {
		return
	}
	cn.c.logf("%s: %s; closing the connection", cn.addr, why)
	cn.killReason = why
	cn.link.raw.Close()
}

// settle: the client is closing, and a grant that comes now goes to no
// caller (it is released at once). Make sure that every grant the server
// made to this connection so far has come, and that its release has
// reached the server, before the socket closes (the release of a key this
// client held hands it to this client's own waiter here, say): two I round
// trips while an acquire or a release is outstanding. The server writes a
// connection's answers in the order of its rounds, so the first I's answer
// comes after every grant made before the I was read, and the second's
// after the releases of those grants. Until deadline.
func (cn *conn) settle(deadline time.Time) {
	for i := 0; i < 2; i++ {
		cn.mu.Lock()
		outstanding := cn.pending.hasOp(opAcquire) || cn.pending.hasOp(opRelease)
		cn.mu.Unlock()
		if !outstanding {
			return
		}
		t := cn.send(&request{op: opInfo})
		if t == nil {
			return
		}
		tm := time.NewTimer(time.Until(deadline))
		select {
		case a := <-t.call.ch:
			tm.Stop()
			if a.kind == 0 {
				return
			}
		case <-tm.C:
			return
		}
	}
}

// close shuts the socket (the client is closing).
func (cn *conn) close() {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.raw != nil {
		cn.raw.Close()
	}
}

// outcome is how waiting for an answer ended.
type outcome int

const (
	outAnswer  outcome = iota
	outLost            // the connection dropped before the answer came
	outOverdue         // the deadline passed first
	outStopped         // the caller's context ended, or the client closed
	// outHeldBack: the caller's deadline passed while the server was
	// entitled to hold the answer back (an earlier request of the same
	// (op, key) on the connection is still unanswered).
	outHeldBack
)

// verdict is which deadline of a request still unanswered has passed.
type verdict int

const (
	notYet        verdict = iota
	connOverdue           // budget since it reached the front of its line: the connection is deemed dead
	callerOverdue         // the caller's, with the request at the front of its line
	heldBack              // the caller's, with the request still held back
)

// pastDeadline is the verdict at now for a request that reached the front
// of its (op, key) line at frontAt (zero: not yet), with the connection's
// budget (zero: no limit) and the caller's deadline (zero: none). Pure.
func pastDeadline(now time.Time, budget time.Duration, frontAt, callerDue time.Time) verdict {
	if budget > 0 && !frontAt.IsZero() && !now.Before(frontAt.Add(budget)) {
		return connOverdue
	}
	if !callerDue.IsZero() && !now.Before(callerDue) {
		if frontAt.IsZero() {
			return heldBack
		}
		return callerOverdue
	}
	return notYet
}

// frontAt is when the request reached the front of its line (zero: not yet).
func (t *ticket) frontAt() time.Time {
	t.cn.mu.Lock()
	defer t.cn.mu.Unlock()
	return t.call.frontAt
}

// wait waits for the answer until the caller's deadline callerDue (zero:
// none), or until the connection is deemed dead and closed: budget (zero:
// no limit) after the request reached the front of its (op, key) line on
// the connection, since the server answers nothing behind an earlier
// request of its (op, key) before that one; a request held back is looked
// at again every budget until it gets there. Or until ctx ends or the
// client closes (outStopped, with the error to return).
func (t *ticket) wait(ctx context.Context, budget time.Duration, callerDue time.Time) (answer, outcome, error) {
	for {
		var check time.Time
		if budget > 0 {
			check = t.frontAt()
			if check.IsZero() {
				check = time.Now()
			}
			check = check.Add(budget)
		}
		due := earliest(check, callerDue)
		var timeout <-chan time.Time
		var tm *time.Timer
		if !due.IsZero() {
			tm = time.NewTimer(time.Until(due))
			timeout = tm.C
		}
		stop := func() {
			if tm != nil {
				tm.Stop()
			}
		}
		select {
		case a := <-t.call.ch:
			stop()
			if a.kind == 0 {
				return a, outLost, nil
			}
			return a, outAnswer, nil
		case <-timeout:
			switch pastDeadline(time.Now(), budget, t.frontAt(), callerDue) {
			case connOverdue:
				return t.giveUp(true, outOverdue, nil)
			case callerOverdue:
				return t.giveUp(false, outOverdue, nil)
			case heldBack:
				return t.giveUp(false, outHeldBack, nil)
			}
		case <-ctx.Done():
			stop()
			return t.giveUp(false, outStopped, ctx.Err())
		case <-t.cn.c.stopped(ctx):
			stop()
			return t.giveUp(false, outStopped, ErrClosed)
		}
	}
}

// giveUp stops waiting, with outcome out (kill: the connection is deemed
// dead and closed). Its slot stays in the pending table (answers are
// matched in order) but is marked abandoned under the lock, so a grant
// the reader dispatches either finds it abandoned (and is released) or was
// delivered already: then a deadline takes it, a cancelled caller
// releases it.
func (t *ticket) giveUp(kill bool, out outcome, stopped error) (answer, outcome, error) {
	cn := t.cn
	cn.mu.Lock()
	select {
	case a := <-t.call.ch:
		if stopped != nil {
			cn.releaseOrphanLocked(a)
			if a.kind == 'A' {
				cn.c.handOut() // it was in hand
			}
			cn.mu.Unlock()
			return a, outStopped, stopped
		}
		cn.mu.Unlock()
		if a.kind == 0 {
			return a, outLost, nil
		}
		return a, outAnswer, nil
	default:
	}
	t.call.abandoned = true
	cn.mu.Unlock()
	if stopped != nil {
		return answer{}, outStopped, stopped
	}
	if kill {
		cn.kill(t.gen, fmt.Sprintf("no answer within %v", time.Since(t.sentAt).Round(time.Millisecond)))
	}
	return answer{}, out, nil
}

func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}

// --- the manager goroutine ---------------------------------------------

func (cn *conn) run() {
	defer cn.c.wg.Done()
	ctx := cn.c.ctx
	for ctx.Err() == nil {
		cn.setPhase(phaseConnecting, "")
		l, leftover, err := cn.open()
		if err != nil {
			cn.setPhase(phaseDown, err.Error())
		} else {
			cn.serve(l, leftover)
		}
		tm := time.NewTimer(ReconnectInterval)
		select {
		case <-ctx.Done():
		case <-tm.C:
		}
		tm.Stop()
	}
	cn.setPhase(phaseDown, "the client is closed")
}

func (cn *conn) setPhase(p phase, why string) {
	cn.mu.Lock()
	cn.phase = p
	if why != "" {
		cn.lastErr = why
	}
	cn.mu.Unlock()
	cn.c.notifier.bump()
}

// open connects (within the connect timeout), does the TLS handshake when
// the client uses TLS, and authenticates when it has a secret: U first,
// "U ok" (or auth-disabled) awaited within the connect timeout.
func (cn *conn) open() (*link, []byte, error) {
	c := cn.c
	d := net.Dialer{Timeout: c.connectTimeout}
	raw, err := d.DialContext(c.ctx, "tcp", cn.addr)
	if err != nil {
		return nil, nil, errors.New(plain(err))
	}
	cn.mu.Lock()
	cn.raw = raw
	cn.mu.Unlock()
	if c.ctx.Err() != nil {
		raw.Close()
		return nil, nil, ErrClosed
	}
	fail := func(err error) (*link, []byte, error) {
		raw.Close()
		return nil, nil, err
	}
	var nc net.Conn = raw
	if c.tls != nil {
		cfg := c.tls.Clone()
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(cn.addr)
			cfg.ServerName = host
		}
		tc := tls.Client(raw, cfg)
		hctx, cancel := context.WithTimeout(c.ctx, c.connectTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			return fail(fmt.Errorf("TLS handshake: %s", plain(err)))
		}
		nc = tc
	}
	var leftover []byte
	if c.secret != "" {
		leftover, err = cn.authenticate(nc)
		if err != nil {
			return fail(err)
		}
	}
	l := &link{
		nc:   nc,
		raw:  raw,
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	return l, leftover, nil
}

// authenticate sends U and reads its answer; bytes read past it are
// handed back.
func (cn *conn) authenticate(nc net.Conn) ([]byte, error) {
	c := cn.c
	nc.SetDeadline(time.Now().Add(c.connectTimeout))
	defer nc.SetDeadline(time.Time{})
	r := request{op: opAuth, secret: c.secret}
	if _, err := nc.Write(r.appendTo(nil)); err != nil {
		return nil, fmt.Errorf("authenticating: %s", plain(err))
	}
	var in []byte
	buf := make([]byte, 256)
	for {
		if i := bytes.IndexByte(in, '\n'); i >= 0 {
			line := strings.TrimSuffix(string(in[:i]), "\r")
			return in[i+1:], cn.authAnswer(line)
		}
		if len(in) > maxLine {
			return nil, errors.New("the server's answer to U makes no sense")
		}
		n, err := nc.Read(buf)
		in = append(in, buf[:n]...)
		if err != nil && n == 0 {
			if err == io.EOF {
				return nil, errors.New("closed by the server while authenticating")
			}
			return nil, fmt.Errorf("authenticating: %s", plain(err))
		}
	}
}

// authAnswer: "U ok", or auth-disabled (the server needs no secret), let
// the connection through.
func (cn *conn) authAnswer(line string) error {
	a, ok := parseAnswer(line)
	switch {
	case ok && a.kind == 'U':
		return nil
	case ok && a.kind == 'E' && a.op == opAuth && a.reason == "auth-disabled":
		return nil
	case ok && a.kind == 'E' && a.op == '-' && (a.reason == "bad-auth" || a.reason == "auth-required"):
		cn.mu.Lock()
		cn.authRefused = a.reason
		cn.mu.Unlock()
		return fmt.Errorf("the server refused the secret: %s", a.reason)
	case ok && a.kind == 'E' && a.op == '-':
		return fmt.Errorf("refused by the server: %s", a.reason)
	}
	return errors.New("the server's answer to U makes no sense")
}

// serve runs one connection's life: start the writer, read until it ends,
// clean up.
func (cn *conn) serve(l *link, leftover []byte) {
	cn.mu.Lock()
	cn.phase = phaseUp
	cn.gen++
	cn.link = l
	cn.lastErr = ""
	cn.killReason = ""
	cn.authRefused = ""
	cn.mu.Unlock()
	cn.c.notifier.bump()
	go cn.writeLoop(l)
	if cn.c.ctx.Err() != nil {
		l.raw.Close() // the client closed while this connection was made
	}
	why := cn.readLoop(l, leftover)
	cn.goDown(why)
	<-l.done
}

// writeLoop sends the queued lines, as many at once as are queued; a
// failed write closes the socket so that the reader notices.
func (cn *conn) writeLoop(l *link) {
	defer close(l.done)
	var buf []byte
	for {
		select {
		case <-l.wake:
		case <-l.stop:
			return
		}
		cn.mu.Lock()
		buf, l.out = l.out, buf[:0]
		l.writing = len(buf) > 0
		cn.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		l.nc.SetWriteDeadline(time.Now().Add(cn.c.requestTimeout))
		_, err := l.nc.Write(buf)
		cn.mu.Lock()
		l.writing = false
		cn.mu.Unlock()
		if err != nil {
			l.raw.Close()
			return
		}
	}
}

// goDown: the connection ended. Every waiting request's caller is told,
// every watch on it ends, the writer stops.
func (cn *conn) goDown(why string) {
	cn.mu.Lock()
	cn.phase = phaseDown
	if l := cn.link; l != nil {
		close(l.stop)
		l.raw.Close()
	}
	cn.link = nil
	if cn.killReason != "" {
		why = cn.killReason
		cn.killReason = ""
	}
	cn.lastErr = why
	if cn.c.ctx.Err() == nil {
		cn.c.logf("%s: connection lost: %s", cn.addr, why)
	}
	for _, w := range cn.watches {
		for _, s := range w.every() {
			s.feed.push(s.epoch, feedEvent{kind: evEnded})
		}
	}
	cn.watches = make(map[string]*watchers)
	for _, cl := range cn.pending.drain() {
		if cl != nil && !cl.abandoned {
			cl.ch <- answer{}
		}
	}
	cn.mu.Unlock()
	cn.c.notifier.bump()
}

// readLoop reads and dispatches answers until the connection ends; why it
// ended. When the server says nothing for the request timeout while
// requests wait or keys are watched, it sends an I probe; no answer to it
// within another request timeout closes the connection.
func (cn *conn) readLoop(l *link, leftover []byte) string {
	buf := make([]byte, readChunk)
	end := copy(buf, leftover)
	start := 0
	probing := false
	rt := cn.c.requestTimeout
	for {
		// Lines already in the buffer (the leftover of U) first.
		for {
			i := bytes.IndexByte(buf[start:end], '\n')
			if i < 0 {
				break
			}
			line := buf[start : start+i]
			start += i + 1
			if i+1 > maxLine {
				return "the server sent a line that is too long"
			}
			if n := len(line); n > 0 && line[n-1] == '\r' {
				line = line[:n-1]
			}
			if len(line) == 0 {
				continue
			}
			if why := cn.dispatch(string(line)); why != "" {
				return why
			}
		}
		if end-start >= maxLine {
			return "the server sent a line that is too long"
		}
		if start > 0 {
			end = copy(buf, buf[start:end])
			start = 0
		}
		l.nc.SetReadDeadline(time.Now().Add(rt))
		n, err := l.nc.Read(buf[end:])
		if n > 0 {
			probing = false
			end += n
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && n == 0 {
				if why := cn.onSilence(&probing); why != "" {
					return why
				}
				continue
			}
			if n > 0 {
				continue // dispatch what came first
			}
			if err == io.EOF {
				return "closed by the server"
			}
			return plain(err)
		}
	}
}

// onSilence: the server said nothing for a request timeout. Probe it if
// requests wait or keys are watched; give up on it if an earlier probe got
// no answer.
func (cn *conn) onSilence(probing *bool) string {
	if cn.c.ctx.Err() != nil {
		return "the client is closed"
	}
	if *probing {
		return fmt.Sprintf("no answer to a probe within %v", cn.c.requestTimeout)
	}
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.pending.len() > 0 || len(cn.watches) > 0 {
		*probing = cn.sendLocked(&request{op: opInfo}, nil)
	}
	return ""
}

// dispatch hands one answer line to the request (or the watches) it
// belongs to; a reason to close the connection when it is out of step.
func (cn *conn) dispatch(line string) string {
	a, ok := parseAnswer(line)
	if !ok {
		return fmt.Sprintf("the server sent a line that does not parse: %q", line)
	}
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.dispatchWatchLocked(a) {
		return ""
	}
	if a.kind == 'E' && a.op == '-' {
		if a.reason == "bad-auth" || a.reason == "auth-required" {
			cn.authRefused = a.reason
			return "the server refused the secret: " + a.reason
		}
		return "refused by the server: " + a.reason
	}
	cl, found := cn.pending.take(a.op, a.key)
	if !found {
		return fmt.Sprintf("the server sent an answer for no request: %q", line)
	}
	if next, ok := cn.pending.front(a.op, a.key); ok && next != nil {
		next.frontAt = time.Now()
	}
	switch {
	case cl == nil:
	case cl.abandoned:
		cn.releaseOrphanLocked(a)
	case a.kind == 'A' && !cn.c.takeInHand():
		// The client is closing, and its caller may not have given up yet
		// (its goroutine has not run since): the grant goes to nobody and
		// is released at once, here, so that Close's settle waits for that
		// release; the caller learns only that its call ended (ErrClosed).
		cn.releaseOrphanLocked(a)
		cl.ch <- answer{}
	default:
		// A grant delivered here is in hand (takeInHand counted it): its
		// call ends the count once it returns or releases the grant.
		cl.ch <- a
	}
	return ""
}

// plain is an error as a short phrase.
func plain(err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}
