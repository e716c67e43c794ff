"""Test support: real ``batond`` processes on 127.0.0.1, ephemeral ports.

The binary is ``$BATON_BATOND``, else ``target/release/batond`` of the
repository (``cargo test --release`` or ``cargo build --release`` builds
it). The package under test is ``baton_locks`` as installed (see
``INSTALLED``). Every process started here is killed by its PID when its test ends.
``cluster_flags`` is the one place that decides the extra flags a cluster
node needs (peer authentication arrived after these tests were written).
"""

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE.parent
REPO = SOURCE.parent.parent

#: ``BATON_PY_INSTALLED=1`` (as CI sets it): the tests must run against the
#: package installed in this virtual environment (the built wheel), never
#: the source tree; ``test_installed.py`` checks it. Otherwise an
#: uninstalled checkout falls back to the source directory.
INSTALLED = os.environ.get("BATON_PY_INSTALLED") == "1"
try:
    import baton_locks  # noqa: F401  (installed: test what pip installed)
except ImportError:
    if INSTALLED:
        raise
    sys.path.insert(0, str(SOURCE))

DEADLINE = 10.0


def batond_path():
    path = os.environ.get("BATON_BATOND") or str(REPO / "target" / "release" / "batond")
    if not os.access(path, os.X_OK):
        pytest.fail("no batond at %s: build it with cargo build --release, or set BATON_BATOND" % path)
    return path


_HELP = None


def batond_help():
    global _HELP
    if _HELP is None:
        out = subprocess.run([batond_path(), "--help"], capture_output=True, text=True, timeout=DEADLINE)
        _HELP = out.stdout + out.stderr
    return _HELP


def cluster_flags(tmp_path):
    """The extra flags every cluster node gets: a shared cluster key when
    batond knows ``--cluster-key-file``, else ``--insecure-peers`` when it
    knows that, else none."""
    if "--cluster-key-file" in batond_help():
        key = tmp_path / "cluster.key"
        if not key.exists():
            key.write_text("k" * 48 + "\n")
            key.chmod(0o600)
        return ["--cluster-key-file", str(key)]
    if "--insecure-peers" in batond_help():
        return ["--insecure-peers"]
    return []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, check, deadline=DEADLINE):
    """Poll ``check`` until it returns something true, or fail the test."""
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail("timed out waiting for %s" % what)
        time.sleep(0.01)


class Node:
    """A running batond, killed when its test ends."""

    def __init__(self, args, port):
        self.port = port
        self.addr = "127.0.0.1:%d" % port
        env = dict(os.environ, RUST_LOG=os.environ.get("BATON_TEST_LOG", "info"))
        self.proc = subprocess.Popen(
            [batond_path(), "--bind", "127.0.0.1", "--port", str(port), "--threads", "1"] + args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.log = []
        listening = threading.Event()

        def read():
            for line in iter(self.proc.stderr.readline, b""):
                text = line.decode("utf-8", "replace")
                self.log.append(text)
                if "listening on" in text:
                    listening.set()

        threading.Thread(target=read, daemon=True).start()
        if not listening.wait(DEADLINE):
            self.kill()
            pytest.fail("batond did not start: %s" % "".join(self.log))

    def kill(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(DEADLINE)

    def info(self):
        """The node's ``I`` answer as a dict, or None if it does not answer."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"I\n")
                data = b""
                while not data.endswith(b"\n"):
                    chunk = s.recv(4096)
                    if not chunk:
                        return None
                    data += chunk
        except OSError:
            return None
        fields = data.decode().split()[1:]
        return dict(f.split("=", 1) for f in fields if "=" in f)


@pytest.fixture
def nodes():
    started = []

    def start(args=(), port=None):
        node = Node(list(args), port or free_port())
        started.append(node)
        return node

    yield start
    for node in started:
        node.kill()


@pytest.fixture
def node(nodes):
    return nodes()


@pytest.fixture
def pair(nodes, tmp_path):
    """A 2-node cluster: node 0 active, node 1 its synced standby."""
    ports = [free_port(), free_port()]
    while ports[1] == ports[0]:
        ports[1] = free_port()
    peers = ",".join("127.0.0.1:%d" % p for p in ports)
    flags = ["--peers", peers, "--detect", "0.5"] + cluster_flags(tmp_path)
    started = [nodes(flags, port) for port in ports]

    def settled():
        info = started[0].info()
        return info and info.get("state") == "active" and info.get("standbys") == "1"

    wait_for("node 0 active with a synced standby", settled)
    return started


def client_of(*nodes_, **kwargs):
    import baton_locks

    return baton_locks.Client([n.addr for n in nodes_], **kwargs)


@pytest.fixture
def closing():
    """Clients made by the test, closed when it ends."""
    made = []

    def track(client):
        made.append(client)
        return client

    yield track
    for client in made:
        client._close()


def has_flag(flag):
    return re.search(re.escape(flag) + r"\b", batond_help()) is not None


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of a node that can cut every
    connection through it at once (both sides see it close)."""

    def __init__(self, target_port):
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.addr = "127.0.0.1:%d" % self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                self.accepted += 1
            try:
                server = socket.create_connection(self._target, timeout=DEADLINE)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._links.append((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def wait_linked(self, count):
        """Wait until ``count`` connections are relayed (a client counts
        as connected before the proxy has linked it to the node)."""

        def linked():
            with self._lock:
                return len(self._links) == count

        wait_for("%d connections through the proxy" % count, linked)

    def cut(self):
        with self._lock:
            links, self._links = self._links, []
        for pair in links:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self.cut()


@pytest.fixture
def proxy():
    """``proxy(node)``: a ``Proxy`` in front of ``node``, closed when the
    test ends."""
    made = []

    def start(node):
        p = Proxy(node.port)
        made.append(p)
        return p

    yield start
    for p in made:
        p.close()
