// Command baton-driver lets the conformance suite drive the Go client: it
// reads requests as JSON objects, one per line, on stdin, runs each
// concurrently, and writes one JSON object per line on stdout (answers
// with the request's id, and events). Logs go to stderr. See the
// repository's conformance/ directory for the protocol.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"sync"
	"time"

	baton "github.com/baton-lock/baton/clients/go"
)

// exitBudget bounds how long closing the clients may take at exit.
const exitBudget = 1500 * time.Millisecond

type tlsReq struct {
	CA   *string `json:"ca"`
	Cert *string `json:"cert"`
	Key  *string `json:"key"`
}

type req struct {
	ID      int64    `json:"id"`
	Cmd     string   `json:"cmd"`
	Addrs   []string `json:"addrs"`
	Auth    *string  `json:"auth"`
	TLS     *tlsReq  `json:"tls"`
	Client  string   `json:"client"`
	Key     *string  `json:"key"`
	LeaseMS *int64   `json:"lease_ms"`
	WaitMS  *int64   `json:"wait_ms"`
	Limit   *int64   `json:"limit"`
	Value   *string  `json:"value"`
	Grant   string   `json:"grant"`
	Watch   string   `json:"watch"`
	// CancelMS gives an acquire, hold or campaign up that long after it
	// was sent, by cancelling its context.
	CancelMS *int64 `json:"cancel_after_ms"`
}

type driverError struct {
	kind, detail string
}

func (e *driverError) Error() string { return e.kind + ": " + e.detail }

func bad(format string, args ...any) error {
	return &driverError{"bad-argument", fmt.Sprintf(format, args...)}
}

var closedErr = &driverError{"closed", "the client is closed"}

type clientEntry struct {
	c      *baton.Client
	closed bool
}

type watchEntry struct {
	cancel func()
	done   chan struct{}
}

type driver struct {
	outMu sync.Mutex
	out   *bufio.Writer

	mu      sync.Mutex
	next    int
	clients map[string]*clientEntry
	grants  map[string]*baton.Grant
	owner   map[string]string // grant -> client
	watches map[string]*watchEntry
	running sync.WaitGroup
}

func (d *driver) write(v any) {
	line, err := json.Marshal(v)
	if err != nil {
		log.Printf("cannot encode %v: %v", v, err)
		return
	}
	d.outMu.Lock()
	defer d.outMu.Unlock()
	d.out.Write(line)
	d.out.WriteByte('\n')
	d.out.Flush()
}

func (d *driver) id(prefix string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next++
	return prefix + strconv.Itoa(d.next)
}

func kindOf(err error) (string, string) {
	var de *driverError
	var re *baton.RefusedError
	switch {
	case errors.As(err, &de):
		return de.kind, de.detail
	case errors.As(err, &re):
		return "refused", re.Reason
	case errors.Is(err, baton.ErrTimeout):
		return "timeout", err.Error()
	case errors.Is(err, baton.ErrLost):
		return "lost", err.Error()
	case errors.Is(err, baton.ErrClosed):
		return "closed", err.Error()
	case errors.Is(err, baton.ErrBadArgument):
		return "bad-argument", err.Error()
	case errors.Is(err, context.Canceled):
		return "timeout", "given up: " + err.Error()
	}
	return "unavailable", err.Error()
}

func (d *driver) answer(id int64, ok any, err error) {
	if err != nil {
		kind, detail := kindOf(err)
		d.write(map[string]any{"id": id, "error": map[string]string{"kind": kind, "detail": detail}})
		return
	}
	d.write(map[string]any{"id": id, "ok": ok})
}

func (d *driver) client(name string) (*baton.Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.clients[name]
	if e == nil {
		return nil, bad("no client %q", name)
	}
	if e.closed {
		return nil, closedErr
	}
	return e.c, nil
}

func (d *driver) grant(name string) (*baton.Grant, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.grants[name]
	if g == nil {
		return nil, bad("no grant %q", name)
	}
	if e := d.clients[d.owner[name]]; e != nil && e.closed {
		return nil, closedErr
	}
	return g, nil
}

func needKey(r *req) (string, error) {
	if r.Key == nil {
		return "", bad("key missing")
	}
	return *r.Key, nil
}

func needLease(r *req) (time.Duration, error) {
	if r.LeaseMS == nil {
		return 0, bad("lease_ms missing")
	}
	return time.Duration(*r.LeaseMS) * time.Millisecond, nil
}

func tlsConfig(t *tlsReq) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CA != nil {
		pem, err := os.ReadFile(*t.CA)
		if err != nil {
			return nil, bad("cannot read the CA: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, bad("no certificate in %s", *t.CA)
		}
		cfg.RootCAs = pool
	}
	if (t.Cert == nil) != (t.Key == nil) {
		return nil, bad("cert and key go together")
	}
	if t.Cert != nil {
		pair, err := tls.LoadX509KeyPair(*t.Cert, *t.Key)
		if err != nil {
			return nil, bad("cannot load the client certificate: %v", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

func (d *driver) handle(r *req) (any, error) {
	ctx := context.Background()
	switch r.Cmd {
	case "connect":
		opts := []baton.Option{baton.WithLogger(log.Default())}
		if r.Auth != nil {
			opts = append(opts, baton.WithAuth(*r.Auth))
		}
		if r.TLS != nil {
			cfg, err := tlsConfig(r.TLS)
			if err != nil {
				return nil, err
			}
			opts = append(opts, baton.WithTLS(cfg))
		}
		c, err := baton.New(r.Addrs, opts...)
		if err != nil {
			return nil, err
		}
		name := d.id("c")
		d.mu.Lock()
		d.clients[name] = &clientEntry{c: c}
		d.mu.Unlock()
		return map[string]any{"client": name}, nil

	case "acquire", "hold", "campaign":
		c, err := d.client(r.Client)
		if err != nil {
			return nil, err
		}
		key, err := needKey(r)
		if err != nil {
			return nil, err
		}
		lease, err := needLease(r)
		if err != nil {
			return nil, err
		}
		var opts []baton.AcquireOption
		if r.WaitMS != nil {
			if *r.WaitMS < 0 {
				return nil, bad("wait_ms below 0")
			}
			opts = append(opts, baton.Wait(time.Duration(*r.WaitMS)*time.Millisecond))
		}
		if r.Cmd != "campaign" {
			if r.Limit != nil {
				opts = append(opts, baton.Limit(int(*r.Limit)))
			}
			if r.Value != nil {
				opts = append(opts, baton.Value(*r.Value))
			}
		}
		if r.CancelMS != nil {
			var cancel func()
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
			stop := time.AfterFunc(time.Duration(*r.CancelMS)*time.Millisecond, cancel)
			defer stop.Stop()
		}
		var g *baton.Grant
		switch r.Cmd {
		case "acquire":
			g, err = c.Acquire(ctx, key, lease, opts...)
		case "hold":
			g, err = c.Hold(ctx, key, lease, opts...)
		default:
			if r.Value == nil {
				return nil, bad("value missing")
			}
			g, err = c.Campaign(ctx, key, *r.Value, lease, opts...)
		}
		if err != nil {
			return nil, err
		}
		name := d.id("g")
		d.mu.Lock()
		d.grants[name] = g
		d.owner[name] = r.Client
		d.mu.Unlock()
		ok := map[string]any{"grant": name, "token": strconv.FormatUint(g.Token(), 10), "slot": g.Slot()}
		if r.Cmd != "acquire" {
			d.answer(r.ID, ok, nil)
			go func() {
				<-g.Done()
				if errors.Is(g.Err(), baton.ErrLost) {
					d.write(map[string]any{"event": "lost", "grant": name})
				}
			}()
			return nil, errAnswered
		}
		return ok, nil

	case "release":
		g, err := d.grant(r.Grant)
		if err != nil {
			return nil, err
		}
		return map[string]any{}, g.Release(ctx)

	case "keep":
		g, err := d.grant(r.Grant)
		if err != nil {
			return nil, err
		}
		lease, err := needLease(r)
		if err != nil {
			return nil, err
		}
		return map[string]any{}, g.Keep(ctx, lease)

	case "query":
		c, err := d.client(r.Client)
		if err != nil {
			return nil, err
		}
		key, err := needKey(r)
		if err != nil {
			return nil, err
		}
		s, err := c.Query(ctx, key)
		if err != nil {
			return nil, err
		}
		return map[string]any{"token": strconv.FormatUint(s.Token, 10), "ms_left": s.Left.Milliseconds(), "waiting": s.Waiting}, nil

	case "leader":
		c, err := d.client(r.Client)
		if err != nil {
			return nil, err
		}
		key, err := needKey(r)
		if err != nil {
			return nil, err
		}
		s, err := c.Leader(ctx, key)
		if err != nil {
			return nil, err
		}
		return state(s), nil

	case "watch":
		c, err := d.client(r.Client)
		if err != nil {
			return nil, err
		}
		key, err := needKey(r)
		if err != nil {
			return nil, err
		}
		wctx, cancel := context.WithCancel(ctx)
		states, err := c.Watch(wctx, key)
		if err != nil {
			cancel()
			return nil, err
		}
		name := d.id("w")
		w := &watchEntry{cancel: cancel, done: make(chan struct{})}
		d.mu.Lock()
		d.watches[name] = w
		d.mu.Unlock()
		d.answer(r.ID, map[string]any{"watch": name}, nil)
		go func() {
			defer close(w.done)
			for s := range states {
				if s.Err != nil {
					log.Printf("watch %s ended: %v", name, s.Err)
					continue
				}
				ev := state(s)
				ev["event"] = "state"
				ev["watch"] = name
				d.write(ev)
			}
		}()
		return nil, errAnswered

	case "unwatch":
		d.mu.Lock()
		w := d.watches[r.Watch]
		delete(d.watches, r.Watch)
		d.mu.Unlock()
		if w == nil {
			return nil, bad("no watch %q", r.Watch)
		}
		w.cancel()
		<-w.done
		return map[string]any{}, nil

	case "close":
		d.mu.Lock()
		e := d.clients[r.Client]
		if e == nil {
			d.mu.Unlock()
			return nil, bad("no client %q", r.Client)
		}
		if e.closed {
			d.mu.Unlock()
			return nil, closedErr
		}
		e.closed = true
		d.mu.Unlock()
		e.c.Close()
		return map[string]any{}, nil
	}
	return nil, bad("unknown cmd %q", r.Cmd)
}

// errAnswered: the handler wrote its answer itself.
var errAnswered = errors.New("answered")

func state(s baton.WatchState) map[string]any {
	var value any
	if s.Value != "" {
		value = s.Value
	}
	return map[string]any{"token": strconv.FormatUint(s.Token, 10), "holders": s.Holders, "waiting": s.Waiting, "value": value}
}

// closeAll closes every client, in parallel, within exitBudget.
func (d *driver) closeAll() {
	d.mu.Lock()
	var open []*baton.Client
	for _, e := range d.clients {
		if !e.closed {
			e.closed = true
			open = append(open, e.c)
		}
	}
	d.mu.Unlock()
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		for _, c := range open {
			wg.Add(1)
			go func(c *baton.Client) {
				defer wg.Done()
				c.Close()
			}(c)
		}
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(exitBudget):
		log.Printf("closing the clients took too long; exiting")
	}
}

func main() {
	log.SetOutput(os.Stderr)
	log.SetFlags(log.Lmicroseconds)
	d := &driver{
		out:     bufio.NewWriter(os.Stdout),
		clients: map[string]*clientEntry{},
		grants:  map[string]*baton.Grant{},
		owner:   map[string]string{},
		watches: map[string]*watchEntry{},
	}
	d.write(map[string]any{"ready": true, "client": "go", "version": baton.Version})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for in.Scan() {
		line := in.Bytes()
		if len(line) == 0 {
			continue
		}
		var head struct {
			ID  *json.RawMessage `json:"id"`
			Cmd string           `json:"cmd"`
		}
		var r req
		if err := json.Unmarshal(line, &head); err != nil || head.ID == nil {
			log.Printf("skipped a line that is not a request: %q", line)
			continue
		}
		if err := json.Unmarshal(line, &r); err != nil {
			var id any
			json.Unmarshal(*head.ID, &id)
			d.write(map[string]any{"id": id, "error": map[string]string{"kind": "bad-argument", "detail": err.Error()}})
			continue
		}
		if r.Cmd == "exit" {
			d.answer(r.ID, map[string]any{}, nil)
			d.closeAll()
			os.Exit(0)
		}
		d.running.Add(1)
		go func(r *req) {
			defer d.running.Done()
			ok, err := d.handle(r)
			if err == errAnswered {
				return
			}
			d.answer(r.ID, ok, err)
		}(&r)
	}
	d.closeAll()
	os.Exit(0)
}
