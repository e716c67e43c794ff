"""The connections of one client: each kept up by its own I/O thread, and
the choice of a connection for each request.

Owns: per connection, the socket (plain or TLS), its phase (connecting, up,
down), the requests sent on it that wait for their answer, per (op, key) in
send order, the watches on it (per key, the sinks that ``W`` state lines
and the answers to ``W`` and ``X`` go to, oldest first), and the outgoing
bytes; per client, the servers (one connection
each, two when only one server is given, one for a server first learned
from a redirect, at most 64 servers), the round-robin turn, the node
preferred after a redirect, and a notifier of phase changes.

Threads: one ``baton-conn`` thread per connection, for the client's whole
life. It connects (TLS and ``U <secret>`` first when asked), then does all
the socket's I/O itself in a selector loop: callers only append a line and
register its slot under the connection's lock, then wake the thread through
a pipe, so no two threads ever touch one socket (which TLS would not
allow). After a failed attempt or a drop it waits 3 s before the next.

Liveness: when requests wait or keys are watched and the server has been
silent for the request timeout, the thread sends an ``I`` probe; no answer within another
request timeout closes the connection. A caller whose request is overdue
closes it too, counted from when its answer can come: the server answers
one (op, key) on a connection in request order, so a request's clock
starts when it reaches the front of its (op, key) line (``Slot.front_at``),
never earlier; a connection is never closed for an answer the server is
entitled to hold back. And so an acquire of a key goes to a connection with
no acquire of that key outstanding, when one is up (``choose``): a
try-acquire behind the same client's acquire of the key waiting in line
would otherwise wait for it. When every connection that is up has one and
another is still connecting (a new client's second), the acquire waits for
a connection to change (``pick``: within the caller's deadline and the
connect timeout), then takes a free one if one came up, else the busy one
after all; with none connecting, the busy one at once.

Never does: retry or decide anything about a call (that is ``_calls.py``),
trust a line from the network (a line that does not parse, longer than
1024 bytes, or answering no request closes the connection), or grow
without bound (at most 65536 requests waiting per connection).
"""

from __future__ import annotations

import logging
import os
import select
import selectors
import socket
import ssl
import threading
import time
import weakref
from typing import (
    Callable,
    Dict,
    Generator,
    List,
    Literal,
    Optional,
    Tuple,
    Union,
)

from . import _wire
from ._pending import AUTH_REASONS, Pending, ServerClosing, Slot, WatchSink, hand_over
from ._wire import Answer
from .errors import AuthRefused, BadArgument, BadArgumentType, Closed, Unavailable

log = logging.getLogger("baton_locks")

RECONNECT_INTERVAL = 3.0
CONNECTIONS_FOR_ONE_SERVER = 2
MAX_SERVERS = 64
CONNECT_SLACK = 1.0
DEFAULT_PORT = 7373

CONNECTING = "connecting"
UP = "up"
DOWN = "down"


def normalise_server(server: object) -> str:
    """``host:port`` (a missing port is 7373); TypeError when not a str,
    ValueError when malformed."""
    if not isinstance(server, str):
        raise BadArgumentType("a server is a 'host:port' str, not %s" % type(server).__name__)
    server = server.strip()
    if not server or any(c.isspace() for c in server):
        raise BadArgument("%r is not host:port" % server)
    if server.startswith("["):
        host, sep, after = server[1:].partition("]")
        if not sep or not host:
            raise BadArgument("%r is not host:port" % server)
        if not after:
            return "%s:%d" % (server, DEFAULT_PORT)
        if not after.startswith(":"):
            raise BadArgument("%r is not host:port" % server)
        port = after[1:]
    else:
        host, sep, port = server.partition(":")
        if not host or ":" in port:
            raise BadArgument("%r is not host:port" % server)
        if not sep:
            return "%s:%d" % (server, DEFAULT_PORT)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise BadArgument("%r is not host:port" % server)
    return server


def split_server(addr: str) -> Tuple[str, int]:
    if addr.startswith("["):
        host, _, port = addr[1:].partition("]:")
    else:
        host, _, port = addr.rpartition(":")
    return host, int(port)


class Notifier:
    """A version bumped on every phase change of a connection."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.version = 0
        self._callbacks: List[Callable[[], None]] = []

    def bump(self) -> None:
        with self._cond:
            self.version += 1
            callbacks, self._callbacks = self._callbacks, []
            self._cond.notify_all()
        for callback in callbacks:
            callback()

    def wait_change(self, seen: int, timeout: Optional[float]) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.version != seen, timeout)

    def add_callback(self, seen: int, callback: Callable[[], None]) -> None:
        with self._cond:
            if self.version == seen:
                self._callbacks.append(callback)
                return
        callback()


class InHand:
    """How many acquire calls hold a grant they have not returned yet (it
    is being confirmed with ``K``): the client's close waits for none to be
    left before the connections close, so that each such call's ``K`` and
    the release it then sends itself travel on open connections. A call
    counts itself (``enter``) before it looks whether the client is
    closing, and close marks closing before it looks at the count: so a
    call that did not see closing is waited for."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.count = 0
        self._callbacks: List[Callable[[], None]] = []

    def enter(self) -> None:
        with self._cond:
            self.count += 1

    def leave(self) -> None:
        with self._cond:
            self.count -= 1
            if self.count > 0:
                return
            callbacks, self._callbacks = self._callbacks, []
            self._cond.notify_all()
        for callback in callbacks:
            callback()

    def wait_none(self, timeout: float) -> bool:
        """Block until no call has a grant in hand, or ``timeout`` seconds
        pass; True when none has."""
        with self._cond:
            return self._cond.wait_for(lambda: self.count == 0, timeout)

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once no call has a grant in hand (now, if none
        has)."""
        with self._cond:
            if self.count > 0:
                self._callbacks.append(callback)
                return
        callback()


class Settings:
    """What every connection of one client reads: set once, then only
    ``closed`` changes."""

    def __init__(
        self,
        connect_timeout: float,
        request_timeout: float,
        auth_line: Optional[bytes],
        tls: Optional[ssl.SSLContext],
    ) -> None:
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.auth_line = auth_line
        self.tls = tls
        self.notifier = Notifier()
        #: Set (a plain attribute: no lock) when the client begins to
        #: close: from then on a grant goes to no caller (``hand_over``).
        self.closing = False
        #: Set (a plain attribute: no lock) once the client closes.
        self.stopping = False
        #: Acquire calls confirming their grant: close waits for them.
        self.in_hand = InHand()


class ConnBase:
    """What every connection has, on threads or on an asyncio loop."""

    def __init__(self, node: int, addr: str, settings: Settings) -> None:
        self.node = node
        self.addr = addr
        self._settings = settings
        self._lock = threading.Lock()
        self.phase = CONNECTING
        self.generation = 0
        self.last_error: Optional[str] = None
        self._kill_reason: Optional[str] = None
        #: The reason word of the last refusal of this client's secret.
        self.auth_refused: Optional[str] = None
        self._table = Pending()

    def status(self) -> Tuple[str, Optional[str]]:
        with self._lock:
            return self.phase, self.last_error

    def status_for(self, op: str, key: Optional[bytes]) -> Tuple[str, bool]:
        """The phase, and whether a request with this (op, key) waits for
        its answer here (a later one would be answered only after it)."""
        with self._lock:
            return self.phase, self._table.has(op, key)

    def unsettled(self) -> bool:
        """An acquire or a release waits for its answer here: a grant may
        still come (or its release be under way) when the client closes."""
        with self._lock:
            return self._table.has_op("A", "R")

    def is_live(self, generation: int) -> bool:
        """The connection made in ``generation`` is still up."""
        with self._lock:
            return self.generation == generation and self.phase == UP

    def start(self) -> None:
        raise NotImplementedError

    def send(self, line: bytes, op: str, key: Optional[bytes], slot: Optional[Slot]) -> Optional[int]:
        raise NotImplementedError

    def watch(self, key: bytes, sink: WatchSink) -> Optional[int]:
        raise NotImplementedError

    def unwatch(self, key: bytes, sink: WatchSink, generation: int) -> bool:
        raise NotImplementedError

    def kill(self, generation: int, why: str) -> None:
        raise NotImplementedError

    def poke(self) -> None:
        pass


class Conn(ConnBase):
    """One persistent connection to one server, on its own thread."""

    def __init__(self, node: int, addr: str, settings: Settings) -> None:
        super().__init__(node, addr, settings)
        self._out = bytearray()
        self._poked = False
        # The thread is woken through this pipe. Both ends stay open until
        # the thread has ended and the Conn is collected (or the client
        # joined the thread in close()), so writing to it never needs a
        # lock and never hits a reused descriptor.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._fds = weakref.finalize(self, _close_fds, self._wake_r, self._wake_w)
        self._fds.atexit = False
        self._thread = threading.Thread(
            target=self._run, name="baton-conn %s" % addr, daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        """Wake the thread. Takes no lock: safe from a finaliser at exit,
        when a frozen daemon thread may hold any lock."""
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # the pipe is full: the thread is awake anyway

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the thread to end (after close); True
        when it has, and the wake pipe is closed."""
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, timeout))
        if self._thread.is_alive():
            return False
        self._fds()
        return True

    def send(self, line: bytes, op: str, key: Optional[bytes], slot: Optional[Slot]) -> Optional[int]:
        """Queue ``line`` with its slot; the connection's generation, or None
        when the connection is not up (or full)."""
        with self._lock:
            if self.phase != UP or self._table.full() or self._settings.stopping:
                return None
            self._out += line
            self._table.add(op, key, slot)
            generation = self.generation
            # One wake-up for every line queued until the thread looks.
            wake, self._poked = not self._poked, True
        if wake:
            self.poke()
        return generation

    def watch(self, key: bytes, sink: WatchSink) -> Optional[int]:
        """Send ``W <key>``, its lines going to ``sink``; the connection's
        generation, or None when it is not up."""
        with self._lock:
            if self.phase != UP or self._settings.stopping:
                return None
            self._out += _wire.watch_line(key)
            self._table.add_watch(key, sink)
            generation = self.generation
        self.poke()
        return generation

    def unwatch(self, key: bytes, sink: WatchSink, generation: int) -> bool:
        """Send ``X <key>`` for the watch ``sink`` stands for, when it is
        still on: lines until the ``X`` answer still go to ``sink``. False
        when the watch had already ended (nothing to send)."""
        with self._lock:
            if (
                self.generation != generation
                or self.phase != UP
                or self._settings.stopping
                or not self._table.watching(key, sink)
            ):
                return False
            self._out += _wire.unwatch_line(key)
        self.poke()
        return True

    def kill(self, generation: int, why: str) -> None:
        """Close the connection made in ``generation`` (a request on it is
        overdue); it reconnects later."""
        with self._lock:
            if self.generation != generation or self.phase != UP:
                return
            log.warning("%s: %s; closing the connection", self.addr, why)
            self._kill_reason = why
        self.poke()

    # --- the connection's thread -----------------------------------------

    def _set_phase(self, phase: str, error: Optional[str] = None) -> None:
        with self._lock:
            self.phase = phase
            if error is not None:
                self.last_error = error
        self._settings.notifier.bump()

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or until poked (by close)."""
        end = time.monotonic() + seconds
        while not self._settings.stopping:
            left = end - time.monotonic()
            if left <= 0:
                return
            ready, _, _ = select.select([self._wake_r], [], [], left)
            if ready:
                self._drain_wake()

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _run(self) -> None:
        settings = self._settings
        try:
            while not settings.stopping:
                self._set_phase(CONNECTING)
                try:
                    sock, leftover = self._open()
                except AuthRejected as e:
                    self.auth_refused = e.reason
                    self._set_phase(DOWN, str(e))
                except (OSError, ssl.SSLError, _wire.WireError, ValueError) as e:
                    self._set_phase(DOWN, _plain(e))
                else:
                    self._serve(sock, leftover)
                self._pause(RECONNECT_INTERVAL)
        finally:
            self._set_phase(DOWN, "the client is closed")

    def _open(self) -> Tuple[socket.socket, bytes]:
        """Connect, wrap in TLS and authenticate, bounded by the connect
        timeout; the socket and any bytes read past the auth answer."""
        settings = self._settings
        host, port = split_server(self.addr)
        sock = socket.create_connection((host, port), timeout=settings.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if settings.tls is not None:
                sock = settings.tls.wrap_socket(sock, server_hostname=host)
            leftover = b""
            if settings.auth_line is not None:
                leftover = self._authenticate(sock, settings.auth_line)
            return sock, leftover
        except BaseException:
            sock.close()
            raise

    def _authenticate(self, sock: socket.socket, line: bytes) -> bytes:
        sock.sendall(line)
        data = b""
        while b"\n" not in data:
            if len(data) > _wire.MAX_LINE:
                raise _wire.WireError("the answer to U is too long")
            chunk = sock.recv(4096)
            if not chunk:
                raise OSError("closed by the server during authentication")
            data += chunk
        first, _, leftover = data.partition(b"\n")
        check_auth(self.addr, _wire.parse_answer(first))
        return leftover

    def _serve(self, sock: socket.socket, leftover: bytes) -> None:
        with self._lock:
            self.phase = UP
            self.generation += 1
            self.last_error = None
            self._kill_reason = None
            self.auth_refused = None
        log.debug("%s: connected", self.addr)
        self._settings.notifier.bump()
        try:
            why = self._io_loop(sock, bytearray(leftover))
        except ServerClosing as e:
            if e.reason in AUTH_REASONS:
                self.auth_refused = e.reason
            why = str(e)
        except (OSError, ssl.SSLError) as e:
            why = _plain(e)
        except _wire.WireError as e:
            why = "the server sent a line that does not parse (%s)" % e
        finally:
            try:
                sock.close()
            except OSError:
                pass
        self._go_down(why)

    def _go_down(self, why: str) -> None:
        with self._lock:
            self.phase = DOWN
            why = self._kill_reason or why
            self._kill_reason = None
            self.last_error = why
            slots, sinks = self._table.drain()
            self._out = bytearray()
        log.info("%s: connection lost: %s", self.addr, why)
        for slot in slots:
            slot.fail()
        for sink in sinks:
            sink.on_end(None, why)
        self._settings.notifier.bump()

    def _io_loop(self, sock: socket.socket, inbuf: bytearray) -> str:
        settings = self._settings
        rt = settings.request_timeout
        sock.setblocking(False)
        sel = selectors.DefaultSelector()
        try:
            sel.register(sock, selectors.EVENT_READ, "sock")
            registered = selectors.EVENT_READ
            sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            silent_since = time.monotonic()
            probing = False
            if inbuf:
                self._take_answers(inbuf)
            while True:
                if settings.stopping:
                    return "the client is closed"
                with self._lock:
                    if self._kill_reason is not None:
                        return self._kill_reason
                    # A line queued after this wakes the thread again.
                    self._poked = False
                    want_write = bool(self._out)
                if want_write:
                    # Send now (the socket is nearly always writable), and
                    # wait for writability only for what is left.
                    self._flush(sock)
                    with self._lock:
                        want_write = bool(self._out)
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0)
                if events != registered:
                    sel.modify(sock, events, "sock")
                    registered = events
                buffered = isinstance(sock, ssl.SSLSocket) and sock.pending() > 0
                timeout = 0 if buffered else max(0.0, silent_since + rt - time.monotonic())
                ready = sel.select(timeout)
                readable = buffered
                for key, mask in ready:
                    if key.data == "wake":
                        self._drain_wake()
                    elif mask & selectors.EVENT_READ:
                        readable = True
                if want_write:
                    self._flush(sock)
                if readable:
                    data = self._recv(sock)
                    if data == b"":
                        return "closed by the server"
                    if data:
                        silent_since = time.monotonic()
                        probing = False
                        inbuf += data
                        self._take_answers(inbuf)
                        if len(inbuf) >= _wire.MAX_LINE:
                            return "the server sent a line longer than %d bytes" % _wire.MAX_LINE
                if time.monotonic() >= silent_since + rt:
                    with self._lock:
                        waiting = self._table.busy()
                        if waiting and not probing:
                            self._out += _wire.INFO_LINE
                            self._table.add("I", None, None)
                    if waiting and probing:
                        return "no answer to a probe within %.1fs" % rt
                    probing = waiting
                    silent_since = time.monotonic()
        finally:
            sel.close()

    def _flush(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._out:
                return
            try:
                sent = sock.send(self._out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return
            del self._out[:sent]

    @staticmethod
    def _recv(sock: socket.socket) -> Optional[bytes]:
        try:
            return sock.recv(65536)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return None

    def _take_answers(self, inbuf: bytearray) -> None:
        while True:
            end = inbuf.find(b"\n")
            if end < 0:
                return
            line = bytes(inbuf[:end])
            del inbuf[: end + 1]
            if len(line) + 1 > _wire.MAX_LINE:
                raise _wire.WireError("a line longer than %d bytes" % _wire.MAX_LINE)
            if not line.strip(b"\r"):
                continue
            self._dispatch(_wire.parse_answer(line))

    def _dispatch(self, answer: Answer) -> None:
        with self._lock:
            slot, sink, ends = self._table.match(answer)
        if sink is not None:
            if ends:
                sink.on_end(answer, "answered %s" % answer[0])
            else:
                sink.on_state(answer)
            return
        release = hand_over(slot, answer, self._settings.closing)
        if release is not None:
            log.info("%s: releasing %r (token %d): its caller gave up", self.addr, answer[2], answer[1])
            with self._lock:
                self._out += release
                self._table.add("R", answer[2], None)


def _close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def check_auth(addr: str, answer: Answer) -> None:
    """The answer to ``U <secret>``: ``U ok`` or ``E U - auth-disabled``
    (usable, with a warning); raises ``AuthRejected`` for a refusal."""
    if answer[0] == _wire.AUTH and answer[1] == "ok":
        return
    if answer[0] == _wire.REFUSED and answer[1] == "U" and answer[3] == "auth-disabled":
        log.warning("%s: the server does not ask for authentication", addr)
        return
    if answer[0] == _wire.REFUSED:
        raise AuthRejected(answer[3])
    raise _wire.WireError("unexpected answer to U")


class AuthRejected(OSError):
    """A server refused this client's secret (``reason``: ``bad-auth``,
    ``auth-required``)."""

    def __init__(self, reason: str) -> None:
        super().__init__("authentication refused: %s" % reason)
        self.reason = reason


def _plain(e: BaseException) -> str:
    if isinstance(e, socket.timeout):
        return "timed out"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror[:1].lower() + e.strerror[1:]
    text = str(e) or type(e).__name__
    return text


class Pool:
    """The client's servers and connections."""

    def __init__(
        self,
        servers: List[str],
        connect_timeout: float,
        request_timeout: float,
        auth_line: Optional[bytes],
        tls: Optional[ssl.SSLContext],
    ) -> None:
        self.settings = Settings(connect_timeout, request_timeout, auth_line, tls)
        self._lock = threading.Lock()
        self._nodes: List[Tuple[str, List[ConnBase]]] = []
        self._preferred: Optional[int] = None
        self._turn = 0
        per_node = CONNECTIONS_FOR_ONE_SERVER if len(servers) == 1 else 1
        for addr in servers:
            self._add_node(addr, per_node)

    @property
    def request_timeout(self) -> float:
        return self.settings.request_timeout

    @property
    def notifier(self) -> Notifier:
        return self.settings.notifier

    def _add_node(self, addr: str, count: int) -> int:
        index = len(self._nodes)
        conns = [self._make_conn(index, addr) for _ in range(count)]
        self._nodes.append((addr, conns))
        self._start(conns)
        self.settings.notifier.bump()
        return index

    def _make_conn(self, index: int, addr: str) -> ConnBase:
        return Conn(index, addr, self.settings)

    def _start(self, conns: List[ConnBase]) -> None:
        for conn in conns:
            conn.start()

    def node_for(self, addr: str) -> int:
        """The node with this address, registered (one connection) if new."""
        with self._lock:
            for index, (known, _) in enumerate(self._nodes):
                if known == addr:
                    return index
            if len(self._nodes) >= MAX_SERVERS:
                raise Unavailable(
                    "redirected to %s, but this client already knows %d servers"
                    % (addr, MAX_SERVERS)
                )
            log.info("learned of server %s from a redirect", addr)
            return self._add_node(addr, 1)

    def prefer(self, node: int) -> None:
        self._preferred = node

    def is_reachable(self, node: int) -> bool:
        with self._lock:
            conns = self._nodes[node][1] if node < len(self._nodes) else []
        return any(c.status()[0] != DOWN for c in conns)

    def connection_count(self) -> int:
        with self._lock:
            return sum(len(conns) for _, conns in self._nodes)

    def conns(self) -> List[ConnBase]:
        with self._lock:
            return [c for _, conns in self._nodes for c in conns]

    def servers(self) -> List[str]:
        with self._lock:
            return [addr for addr, _ in self._nodes]

    def choose(self, acquire_key: Optional[bytes] = None) -> Optional[ConnBase]:
        """A connection that is up (for an acquire of ``acquire_key``, one
        with no acquire of it outstanding if one is up); ``None`` while one
        is connecting; raises Unavailable when none is up or connecting."""
        conns = self.conns()
        if acquire_key is None:
            phases = [(c.node, c.status()[0], False) for c in conns]
        else:
            phases = [(c.node,) + c.status_for("A", acquire_key) for c in conns]
        with self._lock:
            turn = self._turn
            self._turn += 1
        index = choose(phases, self._preferred, turn)
        if index == "wait":
            return None
        if index is None:
            if self.settings.stopping:
                raise Closed()
            refused = self.auth_refusal()
            if refused:
                raise AuthRefused(refused)
            raise Unavailable("no connection: %s" % self.describe())
        return conns[index]

    def pick(
        self, due: Optional[float], acquire_key: Optional[bytes] = None
    ) -> Generator[WaitChange, None, ConnBase]:
        """A generator: a connection that is up (see ``choose``), waiting
        (until ``due`` at the latest) while one is connecting. An acquire
        waited on for a free connection (every one up busy with its key)
        takes a busy one when the wait ends."""
        now = time.monotonic()
        until = now + self.settings.connect_timeout + CONNECT_SLACK
        if due is not None:
            until = min(until, due)
        while True:
            if self.settings.stopping:
                raise Closed()
            seen = self.notifier.version
            conn = self.choose(acquire_key)
            if conn is not None:
                return conn
            left = until - time.monotonic()
            if left <= 0:
                # Up but busy with this key, if one is: it serves after all.
                conn = self.choose() if acquire_key is not None else None
                if conn is not None:
                    return conn
                raise Unavailable("no connection: still connecting: %s" % self.describe())
            yield WaitChange(self.notifier, seen, left)

    def auth_refusal(self) -> Optional[str]:
        """The reason a server last refused this client's secret
        (``auth-required``, ``bad-auth``), if one did."""
        for conn in self.conns():
            if conn.auth_refused:
                return conn.auth_refused
        return None

    def describe(self) -> str:
        with self._lock:
            nodes = list(self._nodes)
        parts = []
        for addr, conns in nodes:
            why = next((c.status()[1] for c in conns if c.status()[1]), None)
            parts.append("%s (%s)" % (addr, why or "not connected yet"))
        return "; ".join(parts)

    @property
    def closed(self) -> bool:
        return self.settings.stopping

    @property
    def closing(self) -> bool:
        """True once the client began to close (``begin_close``)."""
        return self.settings.closing

    @property
    def in_hand(self) -> InHand:
        return self.settings.in_hand

    def begin_close(self) -> None:
        """The client is closing: a grant that comes from now on goes to
        no caller; it is released at once (its call fails ``Closed``)."""
        self.settings.closing = True

    def settle(self) -> None:
        """The client is closing (``begin_close``): every connection with
        an acquire or a release outstanding takes in (and releases) the
        grants already made to it, and those releases reach the server,
        before the sockets close: two ``I`` round trips on it. The server
        writes a connection's answers in the order of its rounds, so the
        first ``I``'s answer comes after every grant made before the ``I``
        was read, and the second's after the releases of those grants.
        Bounded by the request timeout in all."""
        end = time.monotonic() + self.settings.request_timeout
        for conn in self.conns():
            if not conn.unsettled():
                continue
            for _ in range(2):
                slot = Slot()
                if conn.send(_wire.INFO_LINE, "I", None, slot) is None:
                    break
                if not slot.wait(max(0.0, end - time.monotonic())) or slot.answer is None:
                    break

    def close_nowait(self) -> None:
        """Tell every connection thread to end, taking no lock (a
        finaliser at exit may run while a frozen daemon thread holds any
        lock): a flag, then a byte down each thread's wake pipe."""
        self.settings.closing = True
        self.settings.stopping = True
        for _, conns in list(self._nodes):
            for conn in conns:
                conn.poke()

    def close(self, timeout: float) -> bool:
        """End every connection thread and wait up to ``timeout`` seconds
        for them (a thread in the middle of a connect ends within the
        connect timeout); True when all have ended."""
        self.close_nowait()
        self.settings.notifier.bump()
        end = time.monotonic() + timeout
        done = True
        for conn in self.conns():
            if isinstance(conn, Conn):
                done = conn.join(end - time.monotonic()) and done
        return done


def choose(
    phases: List[Tuple[int, str, bool]], preferred: Optional[int], turn: int
) -> Union[int, Literal["wait"], None]:
    """Pick from ``(node, phase, busy)`` triples: the preferred node's up
    connections first (waiting for it while it is connecting), else any up
    one, round-robin; among them the ones not ``busy`` (an acquire of the
    same key outstanding there) first. When every one up is busy and
    another is connecting, "wait" (it will be free: rather that than queue
    behind this client's own waiter). An index, "wait", or None."""

    def among(node: Optional[int]) -> Union[int, Literal["wait"], None]:
        fits = [i for i, (n, _, _) in enumerate(phases) if node is None or n == node]
        up = [i for i in fits if phases[i][1] == UP]
        free = [i for i in up if not phases[i][2]]
        if free:
            return free[turn % len(free)]
        if any(phases[i][1] == CONNECTING for i in fits):
            return "wait"
        if up:
            return up[turn % len(up)]
        return None

    if preferred is not None:
        choice = among(preferred)
        if choice is not None:
            return choice
    return among(None)


# --- what a call waits for (see _calls.py) ---------------------------------


class WaitSlot:
    """Wait until the slot is done or ``timeout`` seconds pass (None: no
    limit)."""

    __slots__ = ("slot", "timeout")

    def __init__(self, slot: Slot, timeout: Optional[float]) -> None:
        self.slot = slot
        self.timeout = timeout

    def block(self) -> None:
        self.slot.wait(self.timeout)

    def subscribe(self, callback: Callable[[], None]) -> None:
        self.slot.add_callback(callback)


class WaitChange:
    """Wait until the notifier moves past ``seen`` or ``timeout`` passes."""

    __slots__ = ("notifier", "seen", "timeout")

    def __init__(self, notifier: Notifier, seen: int, timeout: Optional[float]) -> None:
        self.notifier = notifier
        self.seen = seen
        self.timeout = timeout

    def block(self) -> None:
        self.notifier.wait_change(self.seen, self.timeout)

    def subscribe(self, callback: Callable[[], None]) -> None:
        self.notifier.add_callback(self.seen, callback)


class Sleep:
    """Wait ``timeout`` seconds (``_calls.drive_async`` sleeps in the loop
    instead)."""

    __slots__ = ("timeout",)

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    def block(self) -> None:
        time.sleep(self.timeout)

    def subscribe(self, callback: Callable[[], None]) -> None:
        pass


#: What a call generator of ``_calls.py`` yields.
Waiting = Union[WaitSlot, WaitChange, Sleep]
