"""The connections of an ``AsyncClient``: native asyncio, on the loop's own
sockets (``loop.create_connection`` with an ``asyncio.Protocol``, asyncio
TLS), one task per connection and no thread.

Owns: per connection, its protocol (the transport, the bytes read and not
yet a line), its phase and generation, its ``Pending`` table (shared with
the blocking connections: answers matched by (op, key) in send order,
watches per key), the bytes waiting to be written (flushed once per loop
turn, so many requests sent in one turn go out in one write), the
liveness timer; per client, the same servers, round-robin and
preference as ``_pool.Pool`` (it is one, with other connections), so the
same rule for a key's acquires: each to a connection with none of that key
outstanding when one is up.

The task of a connection connects (TLS, then ``U <secret>`` and its
answer, all within the connect timeout), serves until the connection
ends, waits 3 s and connects again, until the client closes. Liveness:
when requests wait or keys are watched and the server has been silent for
the request timeout, ``I`` is sent; no answer within another request
timeout closes the connection.

Never does: block the loop, touch the loop from another thread (except
``close_nowait``, through ``call_soon_threadsafe``), or trust a line from
the network (as ``_pool.py``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import List, Optional

from . import _wire
from ._pending import AUTH_REASONS, ServerClosing, Slot, WatchSink, hand_over
from ._pool import (
    CONNECTING,
    DOWN,
    RECONNECT_INTERVAL,
    UP,
    AuthRejected,
    ConnBase,
    Pool,
    Settings,
    _plain,
    check_auth,
    split_server,
)
from ._wire import Answer

log = logging.getLogger("baton_locks")


def _resolve(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


class _Proto(asyncio.Protocol):
    """One TCP (or TLS) connection of an ``AsyncConn``."""

    def __init__(self, conn: "AsyncConn") -> None:
        self.conn = conn
        self.transport: Optional[asyncio.Transport] = None
        self.inbuf = bytearray()
        self.auth: Optional["asyncio.Future[bytes]"] = None
        self.closed: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        self.tick: Optional["asyncio.Future[None]"] = None
        self.serving = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.inbuf += data
        if self.auth is not None and not self.auth.done():
            end = self.inbuf.find(b"\n")
            if end < 0:
                if len(self.inbuf) > _wire.MAX_LINE:
                    self.auth.set_exception(_wire.WireError("the answer to U is too long"))
                return
            line = bytes(self.inbuf[:end])
            del self.inbuf[: end + 1]
            self.auth.set_result(line)
            return
        if self.serving:
            self.conn._received(self)

    def eof_received(self) -> Optional[bool]:
        return False  # close the transport

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.auth is not None and not self.auth.done():
            self.auth.set_exception(OSError("closed by the server during authentication"))
        _resolve(self.closed)
        if self.serving:
            self.conn._lost(self, "closed by the server" if exc is None else _plain(exc))

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class AsyncConn(ConnBase):
    """One persistent connection to one server, kept by a task."""

    def __init__(self, node: int, addr: str, settings: Settings) -> None:
        super().__init__(node, addr, settings)
        self._proto: Optional[_Proto] = None
        self._out = bytearray()
        self._flush_scheduled = False
        self._silent_since = 0.0
        self._probing = False
        self._pause_wake: Optional["asyncio.Future[None]"] = None
        self.task: Optional["asyncio.Task[None]"] = None

    def start(self) -> None:
        """Start the connection's task on the running loop (again on a new
        loop when the old one is gone)."""
        self.phase = CONNECTING
        self._proto = None
        self._out = bytearray()
        self._flush_scheduled = False
        self._table.drain()
        self.task = asyncio.get_running_loop().create_task(self._run())

    # --- what calls use (on the loop) -----------------------------------

    def _write(self, data: bytes) -> None:
        self._out += data
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        proto = self._proto
        if self._out and proto is not None and proto.transport is not None:
            proto.transport.write(bytes(self._out))
        self._out = bytearray()

    def send(self, line: bytes, op: str, key: Optional[bytes], slot: Optional[Slot]) -> Optional[int]:
        if self.phase != UP or self._table.full() or self._settings.stopping:
            return None
        self._table.add(op, key, slot)
        self._write(line)
        return self.generation

    def watch(self, key: bytes, sink: WatchSink) -> Optional[int]:
        if self.phase != UP or self._settings.stopping:
            return None
        self._table.add_watch(key, sink)
        self._write(_wire.watch_line(key))
        return self.generation

    def unwatch(self, key: bytes, sink: WatchSink, generation: int) -> bool:
        if (
            self.generation != generation
            or self.phase != UP
            or self._settings.stopping
            or not self._table.watching(key, sink)
        ):
            return False
        self._write(_wire.unwatch_line(key))
        return True

    def kill(self, generation: int, why: str) -> None:
        if self.generation != generation or self.phase != UP or self._proto is None:
            return
        log.warning("%s: %s; closing the connection", self.addr, why)
        self._kill_reason = why
        self._proto.abort()

    def poke(self) -> None:
        """Close: end the connection and the task's pause."""
        if self._proto is not None:
            self._proto.abort()
        if self._pause_wake is not None:
            _resolve(self._pause_wake)

    # --- the connection's task ------------------------------------------

    def _set_phase(self, phase: str, error: Optional[str] = None) -> None:
        self.phase = phase
        if error is not None:
            self.last_error = error
        self._settings.notifier.bump()

    async def _run(self) -> None:
        settings = self._settings
        try:
            while not settings.stopping:
                self._set_phase(CONNECTING)
                try:
                    proto = await asyncio.wait_for(self._open(), settings.connect_timeout)
                except AuthRejected as e:
                    self.auth_refused = e.reason
                    self._set_phase(DOWN, str(e))
                except asyncio.TimeoutError:
                    self._set_phase(DOWN, "timed out")
                except (OSError, ssl.SSLError, _wire.WireError, ValueError) as e:
                    self._set_phase(DOWN, _plain(e))
                else:
                    await self._serve(proto)
                if settings.stopping:
                    break
                await self._pause(RECONNECT_INTERVAL)
        finally:
            current = self._proto
            if current is not None and current.serving:
                current.abort()
                self._go_down(current, "the client is closed")
            self.phase = DOWN
            self.last_error = "the client is closed" if settings.stopping else self.last_error
            self._settings.notifier.bump()

    async def _pause(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        self._pause_wake = wake = loop.create_future()
        timer = loop.call_later(seconds, _resolve, wake)
        try:
            await wake
        finally:
            timer.cancel()
            self._pause_wake = None

    async def _open(self) -> _Proto:
        settings = self._settings
        loop = asyncio.get_running_loop()
        host, port = split_server(self.addr)
        proto = _Proto(self)
        try:
            await loop.create_connection(
                lambda: proto,
                host,
                port,
                ssl=settings.tls,
                server_hostname=host if settings.tls is not None else None,
            )
            if settings.auth_line is not None and proto.transport is not None:
                proto.auth = loop.create_future()
                proto.transport.write(settings.auth_line)
                line = await proto.auth
                check_auth(self.addr, _wire.parse_answer(line))
            return proto
        except BaseException:
            proto.abort()
            raise

    async def _serve(self, proto: _Proto) -> None:
        self._proto = proto
        self.generation += 1
        self.last_error = None
        self._kill_reason = None
        self.auth_refused = None
        self._silent_since = time.monotonic()
        self._probing = False
        proto.serving = True
        self._set_phase(UP)
        log.debug("%s: connected", self.addr)
        if proto.inbuf:
            self._received(proto)
        loop = asyncio.get_running_loop()
        rt = self._settings.request_timeout
        while proto.serving:
            # The liveness timer: wake at the end of the silence allowed
            # (or when the connection ends), then look again.
            left = self._silent_since + rt - time.monotonic()
            if left > 0:
                proto.tick = tick = loop.create_future()
                timer = loop.call_later(left, _resolve, tick)
                try:
                    await tick
                finally:
                    timer.cancel()
                    proto.tick = None
                continue
            busy = self._table.busy()
            if busy and self._probing:
                self.kill(self.generation, "no answer to a probe within %.1fs" % rt)
                await asyncio.shield(proto.closed)
                break
            if busy:
                self._table.add("I", None, None)
                self._write(_wire.INFO_LINE)
            self._probing = busy
            self._silent_since = time.monotonic()

    def _received(self, proto: _Proto) -> None:
        if proto is not self._proto or not proto.serving:
            return
        self._silent_since = time.monotonic()
        self._probing = False
        inbuf = proto.inbuf
        try:
            while True:
                end = inbuf.find(b"\n")
                if end < 0:
                    if len(inbuf) >= _wire.MAX_LINE:
                        raise _wire.WireError("a line longer than %d bytes" % _wire.MAX_LINE)
                    return
                if end + 1 > _wire.MAX_LINE:
                    raise _wire.WireError("a line longer than %d bytes" % _wire.MAX_LINE)
                line = bytes(inbuf[:end])
                del inbuf[: end + 1]
                if not line.strip(b"\r"):
                    continue
                self._dispatch(_wire.parse_answer(line))
                if not proto.serving:
                    return
        except _wire.WireError as e:
            self._kill_reason = "the server sent a line that does not parse (%s)" % e
            proto.abort()
        except ServerClosing as e:
            if e.reason in AUTH_REASONS:
                self.auth_refused = e.reason
            self._kill_reason = str(e)
            proto.abort()

    def _dispatch(self, answer: Answer) -> None:
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
            self._table.add("R", answer[2], None)
            self._write(release)

    def _lost(self, proto: _Proto, why: str) -> None:
        if proto is self._proto and proto.serving:
            self._go_down(proto, "the client is closed" if self._settings.stopping else why)

    def _go_down(self, proto: _Proto, why: str) -> None:
        proto.serving = False
        _resolve(proto.closed)
        if proto.tick is not None:
            _resolve(proto.tick)
        why = self._kill_reason or why
        self._kill_reason = None
        self.phase = DOWN
        self.last_error = why
        self._out = bytearray()
        slots, sinks = self._table.drain()
        log.info("%s: connection lost: %s", self.addr, why)
        for slot in slots:
            slot.fail()
        for sink in sinks:
            sink.on_end(None, why)
        self._settings.notifier.bump()


class AsyncPool(Pool):
    """A ``Pool`` whose connections are ``AsyncConn``s on one event loop
    (the loop of the first call; started at once when made inside a
    running loop)."""

    def __init__(
        self,
        servers: List[str],
        connect_timeout: float,
        request_timeout: float,
        auth_line: Optional[bytes],
        tls: Optional[ssl.SSLContext],
    ) -> None:
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        super().__init__(servers, connect_timeout, request_timeout, auth_line, tls)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # started by the first call
        self.ensure()

    def _make_conn(self, index: int, addr: str) -> ConnBase:
        return AsyncConn(index, addr, self.settings)

    def _start(self, conns: List[ConnBase]) -> None:
        if self.loop is not None:
            for conn in conns:
                conn.start()

    def ensure(self) -> None:
        """Bind to the running loop (start the connections' tasks) unless
        bound to it already. A client's loop is the loop of its first call;
        after that loop has closed, the next loop's call binds again."""
        loop = asyncio.get_running_loop()
        if self.loop is loop:
            return
        if self.loop is not None and not self.loop.is_closed():
            raise RuntimeError("an AsyncClient is used from one event loop only")
        self.loop = loop
        self._start(self.conns())

    def tasks(self) -> "List[asyncio.Task[None]]":
        return [c.task for c in self.conns() if isinstance(c, AsyncConn) and c.task is not None]

    def close_nowait(self) -> None:
        """Tell the connections to end: at once on the loop's thread, else
        through ``call_soon_threadsafe`` (no lock taken; nothing when the
        loop is gone)."""
        self.settings.closing = True
        self.settings.stopping = True
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._poke_all()
        else:
            try:
                loop.call_soon_threadsafe(self._poke_all)
            except RuntimeError:
                pass  # closed meanwhile

    def _poke_all(self) -> None:
        for conn in self.conns():
            conn.poke()
        self.settings.notifier.bump()

    async def asettle(self) -> None:
        """``Pool.settle`` on the loop: two ``I`` round trips on each
        connection with an acquire or a release outstanding, bounded by
        the request timeout in all."""
        loop = asyncio.get_running_loop()
        end = time.monotonic() + self.settings.request_timeout
        for conn in self.conns():
            if not conn.unsettled():
                continue
            for _ in range(2):
                slot = Slot()
                if conn.send(_wire.INFO_LINE, "I", None, slot) is None:
                    break
                answered: "asyncio.Future[None]" = loop.create_future()
                slot.add_callback(lambda answered=answered: _resolve(answered))  # type: ignore[misc]
                await asyncio.wait([answered], timeout=max(0.0, end - time.monotonic()))
                if slot.answer is None:
                    break

    async def aclose(self) -> None:
        """End every connection and wait for their tasks (they end at once:
        a connect in progress is cancelled)."""
        self.settings.stopping = True
        self._poke_all()
        tasks = [t for t in self.tasks() if not t.done()]
        for task in tasks:
            if not task.done():
                task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
