"""Free loopback ports for nodes that must know their ports before they start.

Ports are taken below the kernel's ephemeral range (32768 and up by
default), so no outgoing connection can take one between this check and
the node's bind; each runner process walks its own stretch of the range
(from its PID), and every port handed out is checked to bind.
"""

from __future__ import annotations

import os
import socket
import threading

FIRST = 20_000
SPAN = 12_000

_lock = threading.Lock()
_next = (os.getpid() * 1031) % SPAN


def _binds(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """``n`` consecutive free ports on 127.0.0.1."""
    global _next
    with _lock:
        for _ in range(SPAN):
            offset = _next % SPAN
            _next += n
            if offset + n > SPAN:
                continue
            ports = [FIRST + offset + i for i in range(n)]
            if all(_binds(p) for p in ports):
                return ports
    raise RuntimeError("no free run of loopback ports")
