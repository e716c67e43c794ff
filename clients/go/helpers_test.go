package baton

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// batond is the server binary the tests start: $BATON_BATOND, else the
// repository's target/release/batond.
func batond(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("BATON_BATOND"); p != "" {
		return p
	}
	p, _ := filepath.Abs("../../target/release/batond")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no batond at %s (build it with cargo build --release, or set BATON_BATOND)", p)
	}
	return p
}

// freeAddr is 127.0.0.1 and a port nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// server is a batond process started by a test.
type server struct {
	addr string
	cmd  *exec.Cmd
	once sync.Once
}

// startNode starts batond on addr with extra flags and waits until it
// accepts connections; it is killed when the test ends.
func startNode(t *testing.T, addr string, flags ...string) *server {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	args := append([]string{"--bind", "127.0.0.1", "--port", port, "--busy-poll-us", "0"}, flags...)
	cmd := exec.Command(batond(t), args...)
	cmd.Stderr = &prefixed{t: t, name: addr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := &server{addr: addr, cmd: cmd}
	t.Cleanup(n.kill)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("batond on %s did not start: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill stops the node at once (SIGKILL) and reaps it.
func (n *server) kill() {
	n.once.Do(func() {
		n.cmd.Process.Kill()
		n.cmd.Wait()
	})
}

// prefixed passes a node's log to the test's log, line by line.
type prefixed struct {
	t    *testing.T
	name string
	mu   sync.Mutex
	buf  []byte
}

func (p *prefixed) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if testing.Verbose() {
		p.buf = append(p.buf, b...)
		for {
			i := strings.IndexByte(string(p.buf), '\n')
			if i < 0 {
				break
			}
			fmt.Fprintf(os.Stderr, "[%s] %s\n", p.name, p.buf[:i])
			p.buf = p.buf[i+1:]
		}
	}
	return len(b), nil
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// noGoroutineLeft checks that the goroutines counted before are all that
// is left (the library's goroutines all stopped), printing the others.
func noGoroutineLeft(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("%d goroutines left, %d before:\n%s", runtime.NumGoroutine(), before, buf[:n])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fake is a scripted server in the test process: it accepts connections
// and hands each line to the script, which answers (or not) through the
// fakeConn.
type fake struct {
	l      net.Listener
	script func(fc *fakeConn, line string)
	mu     sync.Mutex
	conns  []*fakeConn
	lines  []fakeLine
	wg     sync.WaitGroup
}

type fakeLine struct {
	conn int
	line string
}

type fakeConn struct {
	f  *fake
	n  int
	nc net.Conn
	mu sync.Mutex
}

func newFake(t *testing.T, script func(fc *fakeConn, line string)) *fake {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fake{l: l, script: script}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *fake) addr() string { return f.l.Addr().String() }

func (f *fake) accept() {
	defer f.wg.Done()
	for {
		nc, err := f.l.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		fc := &fakeConn{f: f, n: len(f.conns), nc: nc}
		f.conns = append(f.conns, fc)
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			r := bufio.NewReader(nc)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				line = strings.TrimSuffix(line, "\n")
				f.mu.Lock()
				f.lines = append(f.lines, fakeLine{fc.n, line})
				f.mu.Unlock()
				f.script(fc, line)
			}
		}()
	}
}

// seen lists the lines received that start with prefix, with the index of
// the connection each came on.
func (f *fake) seen(prefix string) []fakeLine {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fakeLine
	for _, l := range f.lines {
		if strings.HasPrefix(l.line, prefix) {
			out = append(out, l)
		}
	}
	return out
}

func (f *fake) close() {
	f.l.Close()
	f.mu.Lock()
	for _, fc := range f.conns {
		fc.nc.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (fc *fakeConn) send(line string) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.nc.Write([]byte(line + "\n"))
}

func (fc *fakeConn) drop() { fc.nc.Close() }

// allUp waits until every connection of c is up.
func allUp(t *testing.T, c *Client) {
	t.Helper()
	eventually(t, 5*time.Second, "every connection up", func() bool {
		for _, cn := range c.pool.allConns() {
			if ph, _ := cn.status(); ph != phaseUp {
				return false
			}
		}
		return true
	})
}
