"""Real ``batond`` processes on loopback ports, for a scenario's setup.

Owns: a set of nodes (one, or a cluster of two or three sharing a
``--peers`` list and a cluster key), their processes (started with
``--bind 127.0.0.1``, killed by PID), their logs, and the polls that say
when a node serves: ``I`` on a fresh connection, until a deadline.

Node actions a scenario names: ``kill`` (SIGKILL), ``stop`` (SIGSTOP: the
process lives but says nothing, as a hung machine), ``cont`` (SIGCONT),
``term`` (SIGTERM: the graceful handover of the contract's section 5) and
``start`` (again, on the same port, after a kill or a term).

Never does: bind or connect anywhere but 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from typing import Any

from .ports import free_ports

CLUSTER_KEY = "conformance-cluster-key-not-a-secret-0123456789\n"
DETECT_S = "1"
START_TIMEOUT_S = 20.0


class NodeError(Exception):
    """A node would not start, or did not reach the state asked for in time."""


class Node:
    def __init__(self, name: str, port: int, argv: list[str], log_dir: str) -> None:
        self.name = name
        self.port = port
        self.argv = argv
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise NodeError(f"{self.name} is already running")
        self.starts += 1
        log = open(os.path.join(self.log_dir, f"{self.name}.{self.starts}.log"), "wb")
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NodeError(f"{self.name} exited at start (code {self.proc.returncode})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.02)
        raise NodeError(f"{self.name} did not listen within {START_TIMEOUT_S} s")

    def signal(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise NodeError(f"{self.name} is not running")
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def term(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, and wait for the exit (the graceful handover)."""
        self.signal(signal.SIGTERM)
        assert self.proc is not None
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired as e:
            raise NodeError(f"{self.name} did not exit within {timeout_s} s of SIGTERM") from e

    def info(self, timeout_s: float = 1.0) -> dict[str, str] | None:
        """This node's ``I`` fields, or None when it does not answer."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s) as s:
                s.settimeout(timeout_s)
                s.sendall(b"I\n")
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = s.recv(2048)
                    if not chunk:
                        return None
                    buf += chunk
        except OSError:
            return None
        parts = buf.decode(errors="replace").split()
        if not parts or parts[0] != "I":
            return None
        return dict(p.split("=", 1) for p in parts[1:] if "=" in p)

    def logs(self) -> str:
        out = []
        for i in range(1, self.starts + 1):
            path = os.path.join(self.log_dir, f"{self.name}.{i}.log")
            try:
                with open(path, "rb") as f:
                    data = f.read()[-3000:].decode(errors="replace")
            except OSError:
                continue
            out.append(f"--- {self.name} (start {i}) ---\n{data}")
        return "\n".join(out)


class Nodes:
    """The real nodes of one scenario run."""

    def __init__(self, batond: str, log_dir: str) -> None:
        self.batond = batond
        self.log_dir = log_dir
        self.nodes: dict[str, Node] = {}

    def make(self, setup: dict[str, Any], secrets: dict[str, str]) -> None:
        """Create (not start) the nodes a scenario's ``nodes`` setup names.

        ``setup``: ``{"count": N, "auth": bool, "tls": "tls"|"mtls", "flags": [...],
        "start": [names]}``; node names are ``n0``, ``n1``...
        """
        count = int(setup.get("count", 1))
        ports = free_ports(count)
        flags: list[str] = [str(f) for f in setup.get("flags", [])]
        if setup.get("auth"):
            path = os.path.join(self.log_dir, "auth-secrets")
            with open(path, "w") as f:
                f.write("# conformance suite\n" + secrets["auth"] + "\n")
            flags += ["--auth-file", path]
        tls = setup.get("tls")
        if tls:
            flags += ["--tls-cert", secrets["server_cert"], "--tls-key", secrets["server_key"]]
            flags += ["--tls-ca", secrets["ca"]]
            if tls == "mtls":
                flags += ["--tls-client-ca", secrets["ca"]]
        peers = ",".join(f"127.0.0.1:{p}" for p in ports)
        if count > 1:
            key_path = os.path.join(self.log_dir, "cluster.key")
            with open(key_path, "w") as f:
                f.write(CLUSTER_KEY)
            flags += ["--peers", peers, "--cluster-key-file", key_path, "--detect", DETECT_S]
        for i, port in enumerate(ports):
            argv = [self.batond, "--bind", "127.0.0.1", "--port", str(port)]
            if count > 1:
                argv += ["--advertise", f"127.0.0.1:{port}"]
            self.nodes[f"n{i}"] = Node(f"n{i}", port, argv + flags, self.log_dir)

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def wait_role(self, name: str, role: str, timeout_s: float, standbys: int | None = None) -> None:
        """Poll ``I`` until the node has ``role`` (and, on an active, that many synced standbys)."""
        node = self.nodes[name]
        deadline = time.monotonic() + timeout_s
        last: dict[str, str] | None = None
        while time.monotonic() < deadline:
            last = node.info()
            if last is not None and last.get("role") == role:
                if standbys is None or int(last.get("standbys", "0")) >= standbys:
                    return
            time.sleep(0.05)
        raise NodeError(f"{name} did not become {role} (standbys {standbys}) in {timeout_s} s: {last}")

    def stop_all(self) -> None:
        for node in self.nodes.values():
            node.kill()

    def logs(self) -> str:
        return "\n".join(n.logs() for n in self.nodes.values())
