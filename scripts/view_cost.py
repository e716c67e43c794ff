#!/usr/bin/env python3
"""What the contention view (GET /keys) costs: the two measurements of
docs/performance.md, "The contention view's cost". Standard library only.

  view_cost.py pairs BATOND [BATOND ...]
      Instructions per pipelined acquire + release pair in each batond,
      counted by valgrind's callgrind (the whole process, --threads 1,
      --busy-poll-us 0): each runs a fixed workload of SMALL and then LARGE
      pairs (depth 16, one connection), and the difference of the two
      totals over the difference of pairs is the cost per pair (start-up
      and shutdown cancel out). Also the same difference for the lock
      table's two handlers alone (LockTable::handle_acquire and
      handle_release, inclusive, by callgrind_annotate): the hot path's
      table work, which the batching of rounds (how many requests one read
      brings, which varies with timing) does not move.

  view_cost.py keys BATOND
      Latency of GET /keys?top=20 and GET /keys/<key> on a node with 10
      keys (all contended), then with 1,000,000 held keys of which 10 are
      contended: requests spaced 150 ms apart (the owner is asked at most
      every 100 ms, so each request costs one view), median and p99.
"""

import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SMALL, LARGE = 10_000, 110_000
DEPTH = 16


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_listening(port, proc, what):
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited: {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} never listened on {port}")


class Lines:
    """A pipelining line client."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data)

    def read(self, n):
        lines = []
        while len(lines) < n:
            while b"\n" not in self.buf:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    sys.exit("the server closed the connection")
                self.buf += chunk
            head, self.buf = self.buf.split(b"\n", 1)
            lines.append(head)
        return lines


def pairs(port, n):
    c = Lines(port)
    done = 0
    while done < n:
        batch = min(DEPTH, n - done)
        keys = [b"p%d" % ((done + i) % 4096) for i in range(batch)]
        c.send(b"".join(b"A %s 30 0\n" % k for k in keys))
        grants = c.read(batch)
        tokens = [g.split(b" ")[1] for g in grants]
        c.send(b"".join(b"R %s %s\n" % (k, t) for k, t in zip(keys, tokens)))
        c.read(batch)
        done += batch


def callgrind_total(batond, n):
    port = free_port()
    out = tempfile.mktemp(prefix="callgrind.", suffix=".out")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
         batond, "--bind", "127.0.0.1", "--port", str(port),
         "--threads", "1", "--busy-poll-us", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, proc, "batond under callgrind")
    pairs(port, n)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    total = None
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                total = int(line.split()[1])
    table = table_handlers(out)
    os.unlink(out)
    return total, table


# The inclusive cost of the table's request handlers, as callgrind_annotate
# prints it: "10,475,067 (13.93%)  ???:baton::...LockTable>::handle_acquire [...]".
HANDLER = re.compile(r"^\s*([\d,]+) .*LockTable>::handle_(acquire|release) ")


def table_handlers(out):
    annotated = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", out],
        capture_output=True, text=True, check=True).stdout
    return sum(int(m.group(1).replace(",", ""))
               for m in map(HANDLER.match, annotated.splitlines()) if m)


def measure_pairs(batonds):
    for batond in batonds:
        small, small_table = callgrind_total(batond, SMALL)
        large, large_table = callgrind_total(batond, LARGE)
        per = (large - small) / (LARGE - SMALL)
        table = (large_table - small_table) / (LARGE - SMALL)
        print(f"{batond}: {small} Ir for {SMALL} pairs, {large} Ir for {LARGE}: "
              f"{per:.0f} instructions per pair, {table:.1f} of them in the "
              f"table's handle_acquire + handle_release")


def http_get(port, target):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    while True:
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    s.close()
    return int(data[9:12])


def latencies(port, target, n=60):
    out = []
    for _ in range(n):
        time.sleep(0.15)
        start = time.perf_counter()
        code = http_get(port, target)
        out.append((time.perf_counter() - start) * 1000)
        assert code == 200, (target, code)
    out.sort()
    return statistics.median(out), out[int(len(out) * 0.99) - 1]


def measure_keys(batond):
    for held in (0, 1_000_000):
        port, mport = free_port(), free_port()
        proc = subprocess.Popen(
            [batond, "--bind", "127.0.0.1", "--port", str(port),
             "--metrics", f"127.0.0.1:{mport}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_listening(port, proc, "batond")
            loader = Lines(port)
            for start in range(0, held, 10_000):
                end = min(held, start + 10_000)
                loader.send(b"".join(b"A held%d 3600 0\n" % i for i in range(start, end)))
                loader.read(end - start)
            holder = Lines(port)
            holder.send(b"".join(b"A hot%d 3600 0 1 worker-%d\n" % (i, i) for i in range(10)))
            holder.read(10)
            waiters = []
            for i in range(10):
                w = Lines(port)
                w.send(b"A hot%d 3600 0 1\n" % i)
                waiters.append(w)
            time.sleep(0.5)
            keys = f"held keys {held + 10:>9}, 10 contended"
            med, p99 = latencies(mport, "/keys?top=20")
            print(f"{keys}: GET /keys?top=20   median {med:.2f} ms, p99 {p99:.2f} ms")
            med, p99 = latencies(mport, "/keys/hot3")
            print(f"{keys}: GET /keys/hot3     median {med:.2f} ms, p99 {p99:.2f} ms")
        finally:
            proc.kill()
            proc.wait()


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "pairs":
        measure_pairs(sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "keys":
        measure_keys(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
