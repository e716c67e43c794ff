package baton

import (
	"context"
	"crypto/tls"
	"log"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Version is the version of this library.
const Version = "0.1.0"

// Defaults of the client's timeouts, and the port of an address without one.
const (
	// DefaultConnectTimeout is the time to establish a connection (TCP, TLS
	// and authentication).
	DefaultConnectTimeout = 2 * time.Second
	// DefaultRequestTimeout is the time a server has to answer a request
	// that does not wait in line; a connection that leaves one unanswered
	// that long is closed and reconnected.
	DefaultRequestTimeout = 5 * time.Second
	// DefaultPort is the port used when an address has none.
	DefaultPort = 7373
)

// closeReleaseWait bounds how long Close waits for the releases of its
// held grants.
const closeReleaseWait = time.Second

// Option is a setting of a Client beyond its servers.
type Option func(*config)

type config struct {
	connectTimeout time.Duration
	requestTimeout time.Duration
	secret         string
	tls            *tls.Config
	logger         *log.Logger
}

// WithLogger logs what the client does on its own (a connection closed or
// lost, a grant released because its caller gave up, a held grant lost, a
// watch subscribing again) to l. Without it the client logs nothing.
func WithLogger(l *log.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithAuth authenticates with this secret (the servers' --auth-file):
// every connection, and every reconnection, sends U first and carries
// requests only once the server answered "U ok" (within the connect
// timeout). A server without --auth-file answers auth-disabled, and the
// connection is used all the same. A server that refuses the secret makes
// calls fail with a *RefusedError whose Reason is "bad-auth". The secret
// must be 16 to 128 bytes of printable ASCII without spaces.
func WithAuth(secret string) Option {
	return func(c *config) { c.secret = secret }
}

// WithTLS speaks TLS to every server: each connection, and each
// reconnection, does a full handshake within the connect timeout. The
// server name checked is the host part of the address unless cfg sets
// ServerName. Set cfg.RootCAs for a private CA and cfg.Certificates for
// mutual TLS.
func WithTLS(cfg *tls.Config) Option {
	return func(c *config) { c.tls = cfg }
}

// WithConnectTimeout sets how long one connection attempt may take
// (default DefaultConnectTimeout).
func WithConnectTimeout(d time.Duration) Option {
	return func(c *config) { c.connectTimeout = d }
}

// WithRequestTimeout sets how long a server has to answer a request that
// does not wait in line (default DefaultRequestTimeout).
func WithRequestTimeout(d time.Duration) Option {
	return func(c *config) { c.requestTimeout = d }
}

// Client is a connection to a baton service: one or more servers, each
// reached through persistent connections kept up in the background (two
// when one address is given, one per address otherwise), used round-robin
// and pipelined. Safe for concurrent use by many goroutines. Close stops
// every goroutine it started.
type Client struct {
	connectTimeout time.Duration
	requestTimeout time.Duration
	secret         string
	tls            *tls.Config
	logger         *log.Logger

	ctx      context.Context // cancelled by Close once held grants are released: connections end
	cancel   func()
	calls    context.Context // cancelled first thing in Close: calls in progress return ErrClosed
	stop     func()
	closed   atomic.Bool
	wg       sync.WaitGroup
	notifier notifier
	pool     *pool
	// hands counts the grants in hand: delivered to an acquire call that
	// has not returned it yet (confirming it with K, say), or being
	// released because nobody will get it. Close waits until it is zero
	// before it settles and closes the connections.
	hands atomic.Int64

	mu   sync.Mutex
	held map[*Grant]struct{}
}

// New starts a client for these servers (host:port; a host alone gets
// DefaultPort) and returns at once: the connections are made in the
// background, and the first call waits for one (bounded by its
// deadline). It fails only on bad arguments: no address or a malformed
// one, a malformed secret, a timeout that is not above 0.
func New(addrs []string, opts ...Option) (*Client, error) {
	cfg := config{connectTimeout: DefaultConnectTimeout, requestTimeout: DefaultRequestTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	servers, err := parseServers(addrs)
	if err != nil {
		return nil, err
	}
	if cfg.secret != "" {
		if err := checkSecret(cfg.secret); err != nil {
			return nil, err
		}
	}
	if cfg.connectTimeout <= 0 || cfg.requestTimeout <= 0 {
		return nil, badArgument("the timeouts must be above 0")
	}
	c := &Client{
		connectTimeout: cfg.connectTimeout,
		requestTimeout: cfg.requestTimeout,
		secret:         cfg.secret,
		tls:            cfg.tls,
		logger:         cfg.logger,
		held:           make(map[*Grant]struct{}),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.calls, c.stop = context.WithCancel(c.ctx)
	c.pool = newPool(c, servers)
	return c, nil
}

// Dial is New, then waits until a connection is up, or ctx ends (then
// the client is closed and the error says why no server could be
// reached).
func Dial(ctx context.Context, addrs []string, opts ...Option) (*Client, error) {
	c, err := New(addrs, opts...)
	if err != nil {
		return nil, err
	}
	for {
		seen := c.notifier.wait()
		for _, cn := range c.pool.allConns() {
			if ph, _ := cn.status(); ph == phaseUp {
				return c, nil
			}
		}
		select {
		case <-seen:
		case <-ctx.Done():
			err := c.pool.noConnection(anyNode, "")
			c.Close()
			return nil, err
		}
	}
}

// parseServers checks and normalises addresses: host:port, trimmed,
// duplicates dropped, at least one.
func parseServers(addrs []string) ([]string, error) {
	if len(addrs) > maxServers {
		return nil, badArgument("%d servers given; at most %d are supported", len(addrs), maxServers)
	}
	var out []string
	seen := map[string]bool{}
	for _, a := range addrs {
		a = strings.TrimSpace(a)
		addr, err := normaliseServer(a)
		if err != nil {
			return nil, err
		}
		if !seen[addr] {
			seen[addr] = true
			out = append(out, addr)
		}
	}
	if len(out) == 0 {
		return nil, badArgument("no server address given")
	}
	return out, nil
}

func normaliseServer(a string) (string, error) {
	bad := badArgument("%q is not host:port", a)
	if a == "" || strings.ContainsAny(a, " \t\r\n") {
		return "", bad
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		// No port: a host alone, or a bracketed IPv6 address.
		if strings.Count(a, ":") > 0 && !(strings.HasPrefix(a, "[") && strings.HasSuffix(a, "]")) {
			return "", bad
		}
		return net.JoinHostPort(strings.Trim(a, "[]"), strconv.Itoa(DefaultPort)), nil
	}
	if host == "" {
		return "", bad
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", bad
	}
	return a, nil
}

// Servers lists the servers the client knows: those given, then those
// learned from redirects.
func (c *Client) Servers() []string {
	c.pool.mu.RLock()
	defer c.pool.mu.RUnlock()
	var out []string
	for _, n := range c.pool.nodes {
		out = append(out, n.addr)
	}
	return out
}

// Close stops the client: held grants stop being kept and are released
// (once, best effort, waiting at most a second), watches end, calls in
// progress return ErrClosed, a grant that comes to a call Close ended (the
// key a held grant's release hands to this client's own waiter, say) is
// released before the connections close, as is a grant an acquire had
// already been given but not yet returned (one it was confirming with a
// keep: Close waits for that call, at most the request timeout), the
// connections close, and every goroutine the client started has returned
// when Close returns. Later calls on the client or its grants return
// ErrClosed. Close is idempotent.
func (c *Client) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	c.stop()
	c.mu.Lock()
	held := make([]*Grant, 0, len(c.held))
	for g := range c.held {
		held = append(held, g)
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(c.closingCtx(), closeReleaseWait)
	var releases sync.WaitGroup
	for _, g := range held {
		if !g.closeHeld() {
			continue
		}
		releases.Add(1)
		go func(g *Grant) {
			defer releases.Done()
			if _, err := c.release(ctx, g.key, g.token); err != nil {
				c.logf("closing: could not release %s (token %d): %v", g.key, g.token, err)
			}
		}(g)
	}
	releases.Wait()
	cancel()
	// The calls with a grant in hand see that the client is closing and
	// release it themselves, on connections still open.
	c.waitHandsFree(time.Now().Add(c.requestTimeout))
	// The grants already made to this client's connections (the key a
	// release just handed to its own waiter, say) come in and are released
	// before the sockets close.
	settleBy := time.Now().Add(c.requestTimeout)
	for _, cn := range c.pool.allConns() {
		cn.settle(settleBy)
	}
	c.cancel()
	c.pool.closeAll()
	c.notifier.bump()
	c.wg.Wait()
	return nil
}

// closingCtx is the context of the requests Close waits for (the releases
// of held grants and of grants in hand), which the stopping of calls does
// not stop; c.ctx ends them once Close is done waiting.
func (c *Client) closingCtx() context.Context {
	return context.WithValue(c.ctx, closingKey{}, true)
}

// takeInHand counts a grant the reader is about to deliver to its acquire
// call; false when the client is closing (then the grant goes to nobody).
// The count comes first, so Close, which marks the client closed before it
// reads the count, either sees the grant counted or has been seen here.
func (c *Client) takeInHand() bool {
	c.hands.Add(1)
	if c.closed.Load() {
		c.handOut()
		return false
	}
	return true
}

// handOut: a grant in hand was returned to its caller or released.
func (c *Client) handOut() {
	if c.hands.Add(-1) == 0 {
		c.notifier.bump()
	}
}

// waitHandsFree waits until no grant is in hand, or until deadline.
func (c *Client) waitHandsFree(deadline time.Time) {
	tm := time.NewTimer(time.Until(deadline))
	defer tm.Stop()
	for {
		seen := c.notifier.wait()
		n := c.hands.Load()
		if n == 0 {
			return
		}
		select {
		case <-seen:
		case <-tm.C:
			c.logf("closing: %d grant(s) in hand still unreleased", n)
			return
		}
	}
}

// logf logs through the client's logger, if it has one.
func (c *Client) logf(format string, args ...any) {
	if c.logger != nil {
		c.logger.Printf("baton: "+format, args...)
	}
}

// closingKey marks the context of Close's own releases, which the
// stopping of calls does not stop.
type closingKey struct{}

// stopped is closed when calls in progress are to return ErrClosed.
func (c *Client) stopped(ctx context.Context) <-chan struct{} {
	if ctx.Value(closingKey{}) != nil {
		return c.ctx.Done()
	}
	return c.calls.Done()
}

func (c *Client) isStopped(ctx context.Context) bool {
	select {
	case <-c.stopped(ctx):
		return true
	default:
		return false
	}
}

func (c *Client) forget(g *Grant) {
	c.mu.Lock()
	delete(c.held, g)
	c.mu.Unlock()
}

// AcquireOption is a setting of one acquire.
type AcquireOption func(*acquireOpts)

type acquireOpts struct {
	wait     time.Duration
	hasWait  bool
	limit    int
	hasLimit bool
	value    string
	hasVal   bool
}

// Wait bounds the time the request waits in line: the server answers
// ErrTimeout when the key was not granted within d (and nothing is
// granted). Without it an acquire waits without limit (its context still
// bounds the caller's wait; a grant that arrives after the context ended
// is released at once). Wait(0) is TryAcquire.
func Wait(d time.Duration) AcquireOption {
	return func(o *acquireOpts) { o.wait, o.hasWait = d, true }
}

// Limit makes the key a semaphore that up to n grants (1 to 10000) hold
// at once, each in its own slot. The key's limit is set by the acquire
// that registers it; one naming another limit meanwhile is refused
// (*RefusedError "limit-mismatch").
func Limit(n int) AcquireOption {
	return func(o *acquireOpts) { o.limit, o.hasLimit = n, true }
}

// Value says who holds the key (an address, a host name): 1 to 250 bytes,
// no spaces or control characters, not "-". Watches show the value of the
// newest holder. A value without a Limit asks for limit 1.
func Value(v string) AcquireOption {
	return func(o *acquireOpts) { o.value, o.hasVal = v, true }
}

// checked arguments of an acquire
type acquireArgs struct {
	leaseMS, waitMS uint64
	limit           int
	value           string
}

func (c *Client) checkAcquire(key string, lease time.Duration, opts []AcquireOption) (acquireArgs, error) {
	var o acquireOpts
	for _, f := range opts {
		f(&o)
	}
	var a acquireArgs
	if err := checkKey(key); err != nil {
		return a, err
	}
	leaseMS, err := checkLease(lease)
	if err != nil {
		return a, err
	}
	a.leaseMS = leaseMS
	if o.hasWait {
		if o.wait < 0 {
			return a, badArgument("the wait must not be negative")
		}
		a.waitMS = max(millisCeil(o.wait), 1)
	}
	if o.hasLimit && (o.limit < 1 || o.limit > maxLimit) {
		return a, badArgument("bad limit %d: 1 to %d", o.limit, maxLimit)
	}
	a.limit = o.limit
	if o.hasVal {
		if err := checkValue(o.value); err != nil {
			return a, err
		}
		a.value = o.value
	}
	if c.closed.Load() {
		return a, ErrClosed
	}
	return a, nil
}

// Acquire asks for key with this lease (how long the grant lasts if it is
// never released or kept) and waits in line for it: without limit, or at
// most the Wait option's time (then ErrTimeout), and never past ctx (then
// ctx.Err(); a grant that arrives later is released at once). Limit and
// Value make it a semaphore slot with a holder's value.
//
// Errors: ErrTimeout, a *RefusedError (the server refused: its reason
// word), ErrUnavailable (no server answered after every attempt),
// ErrBadArgument (refused before sending), ErrClosed.
func (c *Client) Acquire(ctx context.Context, key string, lease time.Duration, opts ...AcquireOption) (*Grant, error) {
	g, err := c.acquireInHand(ctx, key, lease, opts)
	if err != nil {
		return nil, err
	}
	c.handOut()
	return g, nil
}

// acquireInHand is Acquire whose grant is still in hand (counted): the
// caller ends that with c.handOut().
func (c *Client) acquireInHand(ctx context.Context, key string, lease time.Duration, opts []AcquireOption) (*Grant, error) {
	a, err := c.checkAcquire(key, lease, opts)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.acquire(ctx, key, a.leaseMS, a.waitMS, a.limit, a.value)
}

// TryAcquire is Acquire that does not wait in line: the key is granted now
// or the call returns ErrTimeout.
func (c *Client) TryAcquire(ctx context.Context, key string, lease time.Duration, opts ...AcquireOption) (*Grant, error) {
	return c.Acquire(ctx, key, lease, append(opts, Wait(0))...)
}

// Hold is Acquire, and then keeps the grant alive in the background: a
// keep every third of its lease (retried every KeepRetry while no server
// answers) until it is released or its client is closed. If the grant is
// lost (a keep answered not-held, or the lease ran out by the client's
// clock before a keep got through), its Done channel is closed at once and
// Err tells why (errors.Is(err, ErrLost)); it is never acquired again
// silently. The lease is the safety net if this process dies: a few
// seconds to a minute suits most uses.
func (c *Client) Hold(ctx context.Context, key string, lease time.Duration, opts ...AcquireOption) (*Grant, error) {
	g, err := c.acquireInHand(ctx, key, lease, opts)
	if err != nil {
		return nil, err
	}
	// Under the client's lock, so that Close either sees this grant (and
	// releases it) or has begun already (and the grant, still in hand, is
	// released here before Close closes the connections).
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		c.releaseInHand(g)
		return nil, ErrClosed
	}
	c.held[g] = struct{}{}
	g.startKeeping()
	c.mu.Unlock()
	c.handOut()
	return g, nil
}

// Campaign runs for leader of an election named key: it holds key with
// limit 1 and this value (the candidate's address, say) as Hold does,
// waiting in line behind the current leader (at most the Wait option's
// time). The grant returned is leadership: Done is closed when it is lost;
// Release resigns.
func (c *Client) Campaign(ctx context.Context, key, value string, lease time.Duration, opts ...AcquireOption) (*Grant, error) {
	opts = append(opts, Limit(1), Value(value))
	return c.Hold(ctx, key, lease, opts...)
}

// KeyStatus is what Query tells about a key.
type KeyStatus struct {
	// Token of the newest live grant (the largest); 0 when nobody holds it.
	Token uint64
	// Left is the time left on that grant's lease.
	Left time.Duration
	// Waiting is the number of requests in line.
	Waiting int
}

// Free is true when nobody holds the key.
func (s KeyStatus) Free() bool { return s.Token == 0 }

// Query tells who holds key (the newest grant's token and time left) and
// how many wait.
func (c *Client) Query(ctx context.Context, key string) (KeyStatus, error) {
	if err := checkKey(key); err != nil {
		return KeyStatus{}, err
	}
	if c.closed.Load() {
		return KeyStatus{}, ErrClosed
	}
	return c.query(ctx, key)
}
