package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// The driver, built and run as the conformance runner does: a ready line
// first, connect answered at once even with nothing listening, a bad line
// skipped, an unknown command refused, and an exit within 2 s at the end
// of its input.
func TestTheDriverSpeaksTheProtocol(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "baton-driver")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nobody := l.Addr().String()
	l.Close()

	cmd := exec.Command(bin)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan map[string]any, 16)
	go func() {
		r := bufio.NewScanner(stdout)
		for r.Scan() {
			var m map[string]any
			if err := json.Unmarshal(r.Bytes(), &m); err != nil {
				t.Errorf("not JSON: %q", r.Text())
			}
			lines <- m
		}
		close(lines)
	}()
	next := func() map[string]any {
		t.Helper()
		select {
		case m := <-lines:
			return m
		case <-time.After(5 * time.Second):
			t.Fatal("no line from the driver")
		}
		return nil
	}
	if m := next(); m["ready"] != true || m["client"] != "go" || m["version"] == nil {
		t.Fatalf("ready line: %v", m)
	}
	send := func(s string) { io.WriteString(stdin, s+"\n") }
	send(`{"id":1,"cmd":"connect","addrs":["` + nobody + `"]}`)
	if m := next(); m["id"] != 1.0 || m["ok"].(map[string]any)["client"] == nil {
		t.Fatalf("connect: %v", m)
	}
	send(`not json`)
	send(`{"id":2,"cmd":"no-such-cmd"}`)
	if m := next(); m["id"] != 2.0 || m["error"].(map[string]any)["kind"] != "bad-argument" {
		t.Fatalf("unknown cmd: %v", m)
	}
	send(`{"id":3,"cmd":"acquire","client":"c1","key":"k","lease_ms":0}`)
	if m := next(); m["id"] != 3.0 || m["error"].(map[string]any)["kind"] != "bad-argument" {
		t.Fatalf("lease 0: %v", m)
	}
	stdin.Close()
	exited := make(chan error)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the driver did not exit within 2 s of the end of its input")
	}
}
