"""Watches: the states of a key's holders, as iterators that survive a
failover.

Owns: per client, one subscription per watched key (``_Sub``) shared by
every iterator of that key (``Watch``, ``AsyncWatch``): one ``W <key>`` on
one connection at a time, its state lines fanned out to each iterator's
own queue. A second watch of a key this client already watches sends
nothing: it starts from the subscription's latest state. When the last
iterator of a key closes, ``X <key>`` is sent.

Threads and tasks: each subscription of a ``Client`` has a
``baton-watch`` thread, each of an ``AsyncClient`` a task of its loop
(``_AsyncSub``); both pick a connection, send ``W``, wait until that watch
ends, and on the end decide by the same rules (``_Sub._after``): the
connection ended, or the node answered ``M <addr>`` (it is not, or no
longer, the active one): watch again, on the node named (or, with ``M -``
or one that cannot be reached, after 100 ms); ``E`` (say
``too-many-watches``), or a connection closed by ``E - - unknown-op``
before the first state (a server older than watches): end the iterators
with ``Refused``. State lines are handed to the iterators by the
connections themselves; an iterator blocks its caller's thread
(``Watch``) or wakes its task (``AsyncWatch``, on the loop that delivers
the lines).

Never does: touch sockets (``_pool.py`` does), block a connection thread
(a state is appended to a queue), or grow without bound (an iterator
that falls more than ``MAX_BACKLOG`` states behind loses the oldest, as
the server itself keeps only the latest state for a slow watcher).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import weakref
from typing import Callable, Deque, Dict, List, NamedTuple, Optional, Tuple, Union

from . import _wire
from ._calls import display
from ._pending import WatchSink
from ._pool import MAX_SERVERS, ConnBase, Pool
from ._wire import Answer
from .errors import Closed, Error, Refused, Unavailable

log = logging.getLogger("baton_locks")

#: States an iterator may fall behind before the oldest are dropped.
MAX_BACKLOG = 1024
#: Time between two tries while no active node is known or reachable.
RETRY = 0.1
#: The longest a watch waits for a connection before looking again.
PICK_WAIT = 0.5
#: How a connection ends when its server does not know ``W``.
OLD_SERVER = "refused by the server: unknown-op"


class WatchState(NamedTuple):
    """One state of a watched key: ``token``, the largest token holding
    it now (0 when nobody holds it: for an election, nobody leads);
    ``holders``, its live grants; ``waiting``, the requests in line when
    the change happened; ``value``, the value of the grant with that token
    (str when it is UTF-8, else bytes; None when there is none)."""

    key: Union[str, bytes]
    token: int
    holders: int
    waiting: int
    value: Union[str, bytes, None]

    @property
    def free(self) -> bool:
        """True when nobody holds the key."""
        return self.token == 0


def _state(answer: Answer) -> WatchState:
    value = answer[5]
    return WatchState(
        display(answer[1]),
        answer[2],
        answer[3],
        answer[4],
        None if value is None else display(value),
    )


class _Reader:
    """One iterator's queue of states, filled by connection threads."""

    def __init__(self, distinct: bool) -> None:
        self._lock = threading.Condition()
        self._states: Deque[WatchState] = collections.deque(maxlen=MAX_BACKLOG)
        self._distinct = distinct
        self._last_token: Optional[int] = None
        self.ended = False
        self.error: Optional[Error] = None
        self._callbacks: List[Callable[[], None]] = []

    def push(self, state: WatchState) -> None:
        with self._lock:
            if self.ended:
                return
            if self._distinct and state.token == self._last_token:
                return
            self._last_token = state.token
            self._states.append(state)
            callbacks = self._wake()
        for callback in callbacks:
            callback()

    def end(self, error: Optional[Error] = None) -> None:
        with self._lock:
            if self.ended:
                return
            self.ended = True
            self.error = error
            callbacks = self._wake()
        for callback in callbacks:
            callback()

    def _wake(self) -> List[Callable[[], None]]:
        self._lock.notify_all()
        callbacks, self._callbacks = self._callbacks, []
        return callbacks

    def take(self) -> Tuple[Optional[WatchState], bool]:
        """The next state if one is queued, and whether the watch ended
        (raises the error that ended it, once the states before it are
        taken)."""
        with self._lock:
            return self._take()

    def _take(self) -> Tuple[Optional[WatchState], bool]:
        if self._states:
            return self._states.popleft(), False
        if self.ended and self.error is not None:
            error, self.error = self.error, None
            raise error
        return None, self.ended

    def get(self, timeout: Optional[float]) -> Tuple[Optional[WatchState], bool]:
        """``take``, waiting up to ``timeout`` seconds (None: no limit)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                state, ended = self._take()
                if state is not None or ended:
                    return state, ended
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return None, False
                self._lock.wait(left)

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once a state is queued or the watch ends (at
        once when one is, or it has)."""
        with self._lock:
            if not self._states and not self.ended:
                self._callbacks.append(callback)
                return
        callback()


class _Sink(WatchSink):
    """One ``W`` on one connection, reporting to its subscription."""

    def __init__(self, sub: "_Sub") -> None:
        self.sub = sub
        self.done = False
        self.end_answer: Optional[Answer] = None
        self.why = ""
        self.got_state = False

    def on_state(self, answer: Answer) -> None:
        self.sub._deliver(self, answer)

    def on_end(self, answer: Optional[Answer], why: str) -> None:
        self.sub._ended(self, answer, why)


class _Sub:
    """This client's subscription to one key, shared by its iterators."""

    def __init__(self, hub: "WatchHub", key: bytes) -> None:
        self.hub = hub
        self.key = key
        self._pool = hub.pool
        self._lock = threading.Condition()
        self._readers: List[_Reader] = []
        self._last: Optional[WatchState] = None
        # The watch on the wire now: its sink, connection and generation.
        self._current: Optional[Tuple[_Sink, ConnBase, int]] = None
        self._stopping = False
        self._hops = 0
        self._thread = threading.Thread(
            target=self._run, name="baton-watch %r" % display(key), daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def add(self, reader: _Reader) -> None:
        """Join: the reader starts from the latest state while a watch is
        on, else from the next watch's first line."""
        with self._lock:
            self._readers.append(reader)
            current = self._current
            live = current is not None and current[0].got_state and not current[0].done
            if live and self._last is not None:
                reader.push(self._last)

    def remove(self, reader: _Reader) -> bool:
        """Leave; True when no reader is left: the subscription stops, its
        ``X`` queued before this returns (the hub calls it under its lock,
        so a new subscription of the key sends its ``W`` after it)."""
        with self._lock:
            if reader in self._readers:
                self._readers.remove(reader)
            empty = not self._readers
            if empty:
                self._halt()
        reader.end()
        return empty

    def stop(self, error: Optional[Error] = None) -> None:
        with self._lock:
            self._halt()
            readers, self._readers = self._readers, []
        for reader in readers:
            reader.end(error)

    def _halt(self) -> None:
        """Under the lock: stop, unwatching the watch on the wire."""
        self._stopping = True
        if self._current is not None:
            sink, conn, generation = self._current
            if not sink.done:
                conn.unwatch(self.key, sink, generation)
            self._current = None
        self._lock.notify_all()
        self._signal()

    # --- called by connection threads ------------------------------------

    def _deliver(self, sink: _Sink, answer: Answer) -> None:
        state = _state(answer)
        with self._lock:
            if self._current is None or sink is not self._current[0]:
                return  # a watch ended or being ended: its lines are old
            sink.got_state = True
            self._last = state
            for reader in self._readers:
                reader.push(state)

    def _ended(self, sink: _Sink, answer: Optional[Answer], why: str) -> None:
        with self._lock:
            sink.done = True
            sink.end_answer = answer
            sink.why = why
            self._lock.notify_all()
        self._signal()

    # --- the subscription's thread ---------------------------------------

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` unless stopped; True when stopped."""
        with self._lock:
            return self._lock.wait_for(lambda: self._stopping, seconds)

    def _pick(self) -> Optional[ConnBase]:
        pool = self._pool
        seen = pool.notifier.version
        try:
            conn = pool.choose()
        except Unavailable:
            conn = None
        if conn is None:
            pool.notifier.wait_change(seen, PICK_WAIT)
        return conn

    def _signal(self) -> None:
        """Wake the subscription's loop (a task; the thread waits on the
        condition, notified already)."""

    def _send_watch(self, conn: ConnBase) -> Optional[_Sink]:
        """Send ``W`` on ``conn``; the sink, None when stopping or the
        connection went down just now (``self._current`` set otherwise)."""
        sink = _Sink(self)
        with self._lock:
            # Sent under the lock, so that a close in between either
            # comes first or sees the watch to unwatch.
            if self._stopping:
                return None
            generation = conn.watch(self.key, sink)
            if generation is None:
                return None
            self._current = (sink, conn, generation)
        return sink

    def _after(self, sink: _Sink, conn: ConnBase) -> str:
        """What to do once the watch on the wire ended: ``"again"`` (watch
        again now), ``"pause"`` (after ``RETRY``) or ``"stop"`` (the
        iterators have been ended). The rules, for both flavours."""
        pool = self._pool
        if sink.got_state:
            self._hops = 0
        answer = sink.end_answer
        if answer is None and not sink.got_state and sink.why == OLD_SERVER:
            # A server older than watches: asking again cannot help.
            self.hub._drop(self)
            self.stop(Refused("unknown-op", "W"))
            return "stop"
        if answer is None:
            log.info("watch of %r: %s: %s; watching again", display(self.key), conn.addr, sink.why)
            return "again"
        tag = answer[0]
        if tag == _wire.MOVED:
            active = answer[1]
            self._hops += 1
            if active is not None and self._hops <= MAX_SERVERS:
                try:
                    node = pool.node_for(active)
                except Unavailable as e:
                    log.warning("watch of %r: %s", display(self.key), e)
                else:
                    if pool.is_reachable(node):
                        pool.prefer(node)
                        return "again"
            return "pause"
        if tag == _wire.REFUSED and answer[3] != "shutting-down":
            self.hub._drop(self)
            self.stop(Refused(answer[3], "W"))
            return "stop"
        # shutting-down, or an X nobody sent: watch again shortly.
        return "pause"

    def _run(self) -> None:
        pool = self._pool
        while True:
            with self._lock:
                if self._stopping:
                    return
            if pool.settings.stopping:
                self.hub._drop(self)
                self.stop()
                return
            conn = self._pick()
            if conn is None:
                continue
            sink = self._send_watch(conn)
            if sink is None:
                if self._pause(RETRY):
                    return
                continue
            with self._lock:
                while not sink.done and not self._stopping:
                    self._lock.wait(1.0)
                if self._stopping:
                    return  # unwatched by whoever stopped it
                self._current = None
            action = self._after(sink, conn)
            if action == "stop":
                return
            if action == "pause" and self._pause(RETRY):
                return

    def join(self, timeout: float) -> None:
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, timeout))


class _AsyncSub(_Sub):
    """A subscription whose loop is a task of the client's event loop."""

    def __init__(self, hub: "WatchHub", key: bytes) -> None:
        super().__init__(hub, key)
        self._task: Optional["asyncio.Task[None]"] = None
        self._wake: Optional["asyncio.Future[None]"] = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._arun())

    def _signal(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _wait(self, seconds: Optional[float]) -> None:
        """Until ``_signal`` or ``seconds`` pass."""
        loop = asyncio.get_running_loop()
        self._wake = wake = loop.create_future()
        timer = None if seconds is None else loop.call_later(seconds, _resolve, wake)
        try:
            await wake
        finally:
            if timer is not None:
                timer.cancel()
            self._wake = None

    async def _apause(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < end:
            await self._wait(end - time.monotonic())
        return self._stopping

    async def _apick(self) -> Optional[ConnBase]:
        pool = self._pool
        seen = pool.notifier.version
        try:
            conn = pool.choose()
        except Unavailable:
            conn = None
        if conn is None:
            pool.notifier.add_callback(seen, self._signal)
            await self._wait(PICK_WAIT)
        return conn

    async def _arun(self) -> None:
        pool = self._pool
        while not self._stopping:
            if pool.settings.stopping:
                self.hub._drop(self)
                self.stop()
                return
            conn = await self._apick()
            if conn is None:
                continue
            sink = self._send_watch(conn)
            if sink is None:
                if await self._apause(RETRY):
                    return
                continue
            while not sink.done and not self._stopping:
                await self._wait(None)
            if self._stopping:
                return
            self._current = None
            action = self._after(sink, conn)
            if action == "stop":
                return
            if action == "pause" and await self._apause(RETRY):
                return

    async def ajoin(self) -> None:
        task = self._task
        if task is not None and task is not asyncio.current_task():
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass


class WatchHub:
    """The subscriptions of one client, by key."""

    def __init__(self, pool: Pool, native_async: bool = False) -> None:
        self.pool = pool
        self._lock = threading.Lock()
        self._subs: Dict[bytes, _Sub] = {}
        self._closed = False
        self._async = native_async
        # Every subscription started and maybe not ended, to join at close.
        self._started: "weakref.WeakSet[_Sub]" = weakref.WeakSet()

    def open(self, key: object, distinct: bool) -> Tuple[_Sub, _Reader]:
        raw = _wire.check_key(key)
        reader = _Reader(distinct)
        with self._lock:
            if self._closed or self.pool.settings.stopping:
                raise Closed()
            sub = self._subs.get(raw)
            fresh = sub is None
            if sub is None:
                sub = self._subs[raw] = (_AsyncSub if self._async else _Sub)(self, raw)
                self._started.add(sub)
            sub.add(reader)
        if fresh:
            sub.start()
        return sub, reader

    def leave(self, sub: _Sub, reader: _Reader) -> None:
        with self._lock:
            if sub.remove(reader) and self._subs.get(sub.key) is sub:
                del self._subs[sub.key]

    def _drop(self, sub: _Sub) -> None:
        with self._lock:
            if self._subs.get(sub.key) is sub:
                del self._subs[sub.key]

    def close(self) -> None:
        """Stop every subscription (their iterators end)."""
        with self._lock:
            self._closed = True
            subs, self._subs = list(self._subs.values()), {}
        for sub in subs:
            sub.stop()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the subscriptions' threads to end."""
        end = time.monotonic() + timeout
        for sub in list(self._started):
            sub.join(end - time.monotonic())

    async def ajoin(self) -> None:
        """Wait for the subscriptions' tasks to end."""
        for sub in list(self._started):
            if isinstance(sub, _AsyncSub):
                await sub.ajoin()


# --- the iterators --------------------------------------------------------


class _WatchBase:
    def __init__(self, hub: WatchHub, key: object, distinct: bool) -> None:
        self._hub = hub
        self._sub, self._reader = hub.open(key, distinct)
        self.key = display(self._sub.key)
        # A watch dropped without close() is closed when collected.
        self._finalizer = weakref.finalize(self, hub.leave, self._sub, self._reader)

    @property
    def closed(self) -> bool:
        """True once the watch ended: closed, its client closed, or
        refused by the server."""
        return self._reader.ended

    def close(self) -> None:
        """Stop watching (``X <key>`` goes out when no other watch of this
        client watches the key). States already queued are dropped."""
        self._finalizer()

    def __repr__(self) -> str:
        return "%s(key=%r%s)" % (type(self).__name__, self.key, ", closed" if self.closed else "")


class Watch(_WatchBase):
    """The states of one key, from ``Client.watch`` (or ``observe``): an
    iterator whose first state is the key's state now and each later one
    a change. It ends when closed (``close()`` or a ``with`` block) or
    when its client is closed; a refusal (``too-many-watches``) is raised
    as ``Refused``. Across a dropped connection or a failover it watches
    again on the active node and yields that node's state."""

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> WatchState:
        state, _ = self._reader.get(None)
        if state is None:
            raise StopIteration
        return state

    def get(self, timeout: Optional[float] = None) -> Optional[WatchState]:
        """The next state, waiting up to ``timeout`` seconds (None: no
        limit); None when the time passes first or the watch has ended
        (``closed`` tells which)."""
        seconds = None if timeout is None else _wire.check_timeout("timeout", timeout)
        state, _ = self._reader.get(seconds)
        return state

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncWatch(_WatchBase):
    """``Watch`` for asyncio, from ``AsyncClient.watch`` (or ``observe``):
    ``async for state in watch``, ``async with``; waiting never blocks
    the loop."""

    def __aiter__(self) -> "AsyncWatch":
        return self

    async def __anext__(self) -> WatchState:
        state = await self._next()
        if state is None:
            raise StopAsyncIteration
        return state

    async def _next(self) -> Optional[WatchState]:
        loop = asyncio.get_running_loop()
        while True:
            state, ended = self._reader.take()
            if state is not None or ended:
                return state
            future: asyncio.Future[None] = loop.create_future()
            self._reader.add_callback(lambda future=future: _resolve(future))  # type: ignore[misc]
            await future

    async def get(self, timeout: Optional[float] = None) -> Optional[WatchState]:
        """``Watch.get`` as a coroutine."""
        if timeout is None:
            return await self._next()
        seconds = _wire.check_timeout("timeout", timeout)
        try:
            return await asyncio.wait_for(self._next(), seconds)
        except asyncio.TimeoutError:
            return None

    async def aclose(self) -> None:
        """``close()`` as a coroutine."""
        self.close()

    async def __aenter__(self) -> "AsyncWatch":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


def _resolve(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


def first_state_timeout(pool: Pool) -> float:
    """How long ``leader`` waits for a state: a connection, a redirect and
    an answer."""
    return pool.settings.connect_timeout + 2 * pool.request_timeout


def no_state(key: Union[str, bytes], waited: float) -> Unavailable:
    return Unavailable("no state of %r from any server within %.1fs" % (key, waited))
