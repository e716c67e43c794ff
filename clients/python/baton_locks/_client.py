"""The public clients: ``Client`` (blocking, thread-safe) and
``AsyncClient`` (native asyncio), over one shared implementation.

Owns: arguments (servers, ``auth``, ``tls``, timeouts), the pool's and
the watches' life (``close``, context managers), the held grants made by
the client (to stop and release them at close), and the ``lock`` context
managers. Each call runs the generator of ``_calls.py``: on the caller's
thread for ``Client`` (its connections are ``_pool.py``'s, a thread
each), in the caller's task for ``AsyncClient`` (its connections are
``_apool.py``'s, on the loop); watches are ``_watch.py``'s, held grants
and campaigns ``_hold.py``'s.

Closing: ``close`` first marks the pool closing (a grant that comes from
then on reaches no caller: it is released at once, and its call fails
``Closed``), stops the keepers (no ``lost`` for them) and the
watches, releases the held grants once (best effort, bounded by the
request timeout; ``AsyncClient.close`` also waits, as bounded, for the
releases of ``AsyncHeld`` grants the program dropped) and, as bounded,
for the acquires confirming their grant with ``K`` (each releases its
grant itself and fails ``Closed``: ``_calls.py``), settles the
connections with an acquire or a release outstanding (two ``I`` round
trips, bounded by the request timeout: the grants made to them so far,
such as the key a held key's release hands to this client's own waiter,
come in and their releases reach the server), closes the connections
and joins every thread (awaits every task) of the client, all bounded;
again, it does nothing. A finaliser (``__del__``) only sets a flag and
pokes the connections: it may run at interpreter exit while a frozen
daemon thread holds any lock, so it takes none.

Never does: I/O on the caller's thread (the blocking connections live on
their own threads), or block an asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
import weakref
from typing import AsyncIterator, Iterable, Iterator, List, Optional, Set, Tuple, TypeVar, Union

from . import _calls, _wire
from ._calls import Grant, KeyStatus
from ._hold import AsyncCampaign, AsyncHeld, Campaign, Held, _AsyncKeeper, take_dropped
from ._apool import AsyncPool, _resolve
from ._pending import Slot
from ._pool import MAX_SERVERS, Pool, normalise_server
from ._watch import AsyncWatch, Watch, WatchHub, WatchState, first_state_timeout, no_state
from ._wire import Key
from .errors import BadArgument, BadArgumentType, Closed

#: What ``value=`` takes: a holder's value (1 to 250 bytes, no spaces or
#: control characters), or None for none.
Value = Union[str, bytes, None]

DEFAULT_CONNECT_TIMEOUT = 2.0
DEFAULT_REQUEST_TIMEOUT = 5.0

#: What ``tls=`` takes: a context, the path of a CA file, True for the
#: system's roots, or None / False for plain TCP.
TlsArg = Union[ssl.SSLContext, str, "os.PathLike[str]", bool, None]

#: What ``servers`` takes: ``host:port`` strings, or one comma-separated str.
ServersArg = Union[str, Iterable[str]]

_C = TypeVar("_C", bound="Client")
_A = TypeVar("_A", bound="AsyncClient")


def _parse_servers(servers: ServersArg) -> List[str]:
    if isinstance(servers, (bytes, bytearray)):
        raise BadArgumentType("servers are 'host:port' strs, not bytes")
    given = servers.split(",") if isinstance(servers, str) else list(servers)
    if len(given) > MAX_SERVERS:
        raise BadArgument("at most %d servers are supported" % MAX_SERVERS)
    out: List[str] = []
    for server in given:
        addr = normalise_server(server)
        if addr not in out:
            out.append(addr)
    if not out:
        raise BadArgument("no server address given")
    return out


def _tls_context(tls: TlsArg) -> Optional[ssl.SSLContext]:
    if tls is None or tls is False:
        return None
    if isinstance(tls, ssl.SSLContext):
        return tls
    if tls is True:
        return ssl.create_default_context()
    if isinstance(tls, (str, os.PathLike)):
        return ssl.create_default_context(cafile=os.fspath(tls))
    raise BadArgumentType(
        "tls is an ssl.SSLContext, the path of a CA file, True or None, not %s"
        % type(tls).__name__
    )


class _Base:
    _pool: Pool

    def __init__(
        self,
        servers: ServersArg,
        auth: Union[str, bytes, None] = None,
        tls: TlsArg = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> None:
        addrs = _parse_servers(servers)
        connect = _wire.check_timeout("connect_timeout", connect_timeout)
        request = _wire.check_timeout("request_timeout", request_timeout)
        auth_line = None if auth is None else _wire.auth_line(auth)
        self._closed = False
        self._helds: "weakref.WeakSet[Union[Held, AsyncHeld]]" = weakref.WeakSet()
        # AsyncHeld grants dropped unreleased whose release is pending.
        self._dropped: "Set[_AsyncKeeper]" = set()
        native = isinstance(self, AsyncClient)
        pool_type = AsyncPool if native else Pool
        self._pool = pool_type(addrs, connect, request, auth_line, _tls_context(tls))
        self._watches = WatchHub(self._pool, native_async=native)

    @property
    def servers(self) -> List[str]:
        """The servers this client knows (given, then learned from
        redirects)."""
        return self._pool.servers()

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def connections(self) -> List[Tuple[str, bool, Optional[str]]]:
        """``(server, connected, last_error)`` for every connection."""
        out = []
        for conn in self._pool.conns():
            phase, error = conn.status()
            out.append((conn.addr, phase == "up", error))
        return out

    def _check_open(self) -> None:
        if self._closed or self._pool.closed:
            raise Closed()

    def _track(self, held: Union[Held, AsyncHeld]) -> None:
        self._helds.add(held)

    def _begin_close(self) -> Optional[List[Grant]]:
        """The first close: stop the held grants' keepers (no lost event)
        and the watches; the grants to release once. None when closed
        already."""
        if self._closed:
            return None
        # Closing first: once ``closed`` says so, every call sees it.
        self._pool.begin_close()
        self._closed = True
        grants = []
        for held in list(self._helds):
            grant = held._close_out()
            if grant is not None:
                grants.append(grant)
        self._watches.close()
        return grants

    def _send_releases(self, grants: List[Grant]) -> List[Slot]:
        slots = []
        for grant in grants:
            slot = _calls.send_release(self._pool, grant._raw_key, grant.token)
            if slot is not None:
                slots.append(slot)
        return slots

    @staticmethod
    def _campaign_value(value: object) -> Union[str, bytes]:
        """A candidate's value, required: str or bytes."""
        if not isinstance(value, (str, bytes, bytearray)):
            raise BadArgumentType("value must be %s, not %s" % (_wire.VALUE_RULE, type(value).__name__))
        _wire.check_value(value)
        return value if isinstance(value, str) else bytes(value)

    def __del__(self) -> None:
        # A finaliser may run at interpreter exit, when a frozen daemon
        # thread can hold any lock: take none (a flag and a byte down each
        # connection's wake pipe), and nothing at all once closed.
        pool = getattr(self, "_pool", None)
        if pool is not None and not pool.closed:
            pool.close_nowait()


class Client(_Base):
    """A blocking client, safe to share between threads.

    ``servers``: ``"host:port"`` strings (a list, or one comma-separated
    string); one connection per server, two when only one is given.
    ``auth``: a shared secret, sent as ``U <secret>`` first on every
    connection. ``tls``: an ``ssl.SSLContext``, or the path of a CA file
    to check the servers' certificates against, or True for the system's
    roots. ``connect_timeout`` and ``request_timeout``: seconds above 0.

    Durations (``lease``, ``wait``, the timeouts) are ``int`` or ``float``
    seconds, at most a year; a lease or wait is rounded up to whole
    milliseconds, the wire's resolution. A value of the wrong type raises
    ``TypeError``, one out of range (``inf``, ``nan``, below the least
    allowed, past a year) ``ValueError``, before anything is sent.
    """

    def acquire(
        self,
        key: Key,
        lease: float,
        wait: Optional[float] = None,
        *,
        limit: Optional[int] = None,
        value: Value = None,
    ) -> Grant:
        """Acquire ``key`` for ``lease`` seconds (above 0), waiting in line
        up to ``wait`` seconds (None: without limit; 0: only if it is free
        now). ``limit`` (1 to 10000) makes the key a semaphore that many
        grants may hold at once (``grant.slot`` says which place this one
        has); ``value`` (1 to 250 bytes, no spaces or control characters)
        is shown to watchers while this grant is the newest holder. A
        ``Grant``; raises ``Timeout`` when the wait runs out, ``Refused``
        (``reason`` ``limit-mismatch`` when the key is held or waited for
        under another limit), or ``Unavailable``."""
        self._check_open()
        return _calls.drive(_calls.acquire(self._pool, key, lease, wait, limit, value))

    def release(self, grant: Grant) -> bool:
        """Release a grant (retried for 5 s while no connection can carry
        it). True when released, False when the grant no longer held the
        key."""
        self._check_open()
        return _calls.drive(_calls.release_grant(self._pool, grant))

    def release_token(self, key: Key, token: int) -> bool:
        """Release the grant that ``token`` names (say from another
        process), as ``release`` does."""
        self._check_open()
        return _calls.drive(_calls.release(self._pool, key, token))

    def keep(self, grant: Grant, lease: float) -> None:
        """Extend ``grant``'s lease to now + ``lease`` seconds (it updates
        ``grant.expires_at``). Raises ``NotHeld`` when the key was lost,
        ``Expired`` (a ``NotHeld``) when the lease ran out first."""
        self._check_open()
        _calls.drive(_calls.keep(self._pool, grant, lease))

    def query(self, key: Key) -> KeyStatus:
        """Who holds ``key``: a ``KeyStatus`` (token or None, seconds left,
        requests waiting)."""
        self._check_open()
        return _calls.drive(_calls.query(self._pool, key))

    @contextlib.contextmanager
    def lock(
        self,
        key: Key,
        lease: float,
        wait: Optional[float] = None,
        *,
        limit: Optional[int] = None,
        value: Value = None,
    ) -> Iterator[Grant]:
        """``with client.lock(key, lease) as grant:`` — acquired on entry
        (the arguments of ``acquire``), released on exit (also on an
        exception)."""
        grant = self.acquire(key, lease, wait, limit=limit, value=value)
        try:
            yield grant
        finally:
            self.release(grant)

    def hold(
        self,
        key: Key,
        lease: float,
        wait: Optional[float] = None,
        *,
        limit: Optional[int] = None,
        value: Value = None,
    ) -> Held:
        """Acquire as ``acquire`` does, then keep the lease alive in the
        background (``K`` every third of it) until released: a ``Held``
        whose ``lost`` event is set if the key is lost anyway."""
        grant = self.acquire(key, lease, wait, limit=limit, value=value)
        return Held(self, grant, value)

    def campaign(self, key: Key, value: Value, lease: float, wait: Optional[float] = None) -> Campaign:
        """Stand for leader of ``key``: wait in line (up to ``wait``
        seconds; None: until elected) to hold it with limit 1 and
        ``value`` (say this candidate's address), then keep it in the
        background. A ``Campaign``: ``is_leader()``, ``lost``,
        ``resign()``, a ``with`` block."""
        checked = self._campaign_value(value)
        grant = self.acquire(key, lease, wait, limit=1, value=checked)
        return Campaign(self, grant, checked)

    def watch(self, key: Key) -> Watch:
        """The states of ``key``'s holders: an iterator whose first state
        is the state now and each later one a change (a grant, a release,
        an expiry), until closed (``close()``, a ``with`` block). It
        watches again on the active node after a dropped connection or a
        failover, and yields that node's state."""
        self._check_open()
        return Watch(self._watches, key, distinct=False)

    def observe(self, key: Key) -> Watch:
        """The leaders of ``key``: ``watch`` without consecutive states of
        the same token (a state seen again after a failover, or a change
        of ``waiting`` alone, is skipped). ``state.token == 0``: nobody
        leads."""
        self._check_open()
        return Watch(self._watches, key, distinct=True)

    def leader(self, key: Key) -> WatchState:
        """The state of ``key`` now: ``token`` 0 when nobody leads, else
        the leader's token and ``value``. Raises ``Unavailable`` when no
        server gave it in time."""
        self._check_open()
        timeout = first_state_timeout(self._pool)
        with Watch(self._watches, key, distinct=False) as watch:
            state = watch.get(timeout)
        if state is None:
            raise no_state(watch.key, timeout)
        return state

    def close(self) -> None:
        """Close the client: watches end, held grants stop being kept and
        are released once (best effort, waiting at most the request
        timeout for the answers; no ``lost`` for them), calls under way
        fail ``Closed``, and a grant that comes to a call close ended (the
        key a held key's release hands to this client's own waiter, say)
        is released before the connections close (two ``I`` round trips
        on each connection with an acquire outstanding, bounded by the
        request timeout); an acquire whose grant came but is still being
        confirmed with ``K`` releases it itself and raises ``Closed``
        (close waits for that, within the same request timeout as the
        held grants' releases); then the connections close and every thread of
        the client has ended when it returns (bounded: a connect in
        progress ends within the connect timeout). Later calls raise
        ``Closed``. Safe to call again, from any thread, and never blocks
        at interpreter exit."""
        self._close()

    def _close(self) -> None:
        grants = self._begin_close()
        if grants is None:
            return
        settings = self._pool.settings
        slots = self._send_releases(grants)
        end = time.monotonic() + settings.request_timeout
        for slot in slots:
            slot.wait(max(0.0, end - time.monotonic()))
        # An acquire confirming its grant with K releases it and fails
        # Closed: its K and its R need the connections open.
        self._pool.in_hand.wait_none(max(0.0, end - time.monotonic()))
        self._pool.settle()
        self._pool.close(settings.connect_timeout + 1.0)
        end = time.monotonic() + 1.0
        for held in list(self._helds):
            if isinstance(held, Held):
                held._keeper.join(end - time.monotonic())
        self._watches.join(max(0.0, end - time.monotonic()))

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Base):
    """The same client for asyncio, native: its connections are the
    loop's own sockets (asyncio TLS), each kept by a task, and held grants
    and watches are tasks too; no thread. Every call is a coroutine;
    nothing blocks the event loop. Same arguments as ``Client``. A client
    belongs to the loop of its first call (made inside a running loop, it
    connects at once). Cancelling a call gives up its request; a grant
    that still arrives is released at once."""

    async def acquire(
        self,
        key: Key,
        lease: float,
        wait: Optional[float] = None,
        *,
        limit: Optional[int] = None,
        value: Value = None,
    ) -> Grant:
        """``Client.acquire`` as a coroutine."""
        self._enter()
        return await _calls.drive_async(
            _calls.acquire(self._pool, key, lease, wait, limit, value)
        )

    async def release(self, grant: Grant) -> bool:
        """``Client.release`` as a coroutine."""
        self._enter()
        return await _calls.drive_async(_calls.release_grant(self._pool, grant))

    async def release_token(self, key: Key, token: int) -> bool:
        """``Client.release_token`` as a coroutine."""
        self._enter()
        return await _calls.drive_async(_calls.release(self._pool, key, token))

    async def keep(self, grant: Grant, lease: float) -> None:
        """``Client.keep`` as a coroutine."""
        self._enter()
        await _calls.drive_async(_calls.keep(self._pool, grant, lease))

    async def query(self, key: Key) -> KeyStatus:
        """``Client.query`` as a coroutine."""
        self._enter()
        return await _calls.drive_async(_calls.query(self._pool, key))

    @contextlib.asynccontextmanager
    async def lock(
        self,
        key: Key,
        lease: float,
        wait: Optional[float] = None,
        *,
        limit: Optional[int] = None,
        value: Value = None,
    ) -> AsyncIterator[Grant]:
        """``async with client.lock(key, lease) as grant:``."""
        grant = await self.acquire(key, lease, wait, limit=limit, value=value)
        try:
            yield grant
        finally:
            await self.release(grant)

    async def hold(
        self,
        key: Key,
        lease: float,
        wait: Optional[float] = None,
        *,
        limit: Optional[int] = None,
        value: Value = None,
    ) -> AsyncHeld:
        """``Client.hold`` as a coroutine: an ``AsyncHeld``."""
        grant = await self.acquire(key, lease, wait, limit=limit, value=value)
        return AsyncHeld(self, grant, value)

    async def campaign(
        self, key: Key, value: Value, lease: float, wait: Optional[float] = None
    ) -> AsyncCampaign:
        """``Client.campaign`` as a coroutine: an ``AsyncCampaign``
        (``await resign()``, ``async with``)."""
        checked = self._campaign_value(value)
        grant = await self.acquire(key, lease, wait, limit=1, value=checked)
        return AsyncCampaign(self, grant, checked)

    def watch(self, key: Key) -> AsyncWatch:
        """``Client.watch`` as an async iterator (``async for``, ``async
        with``)."""
        self._enter()
        return AsyncWatch(self._watches, key, distinct=False)

    def observe(self, key: Key) -> AsyncWatch:
        """``Client.observe`` as an async iterator."""
        self._enter()
        return AsyncWatch(self._watches, key, distinct=True)

    async def leader(self, key: Key) -> WatchState:
        """``Client.leader`` as a coroutine."""
        self._enter()
        timeout = first_state_timeout(self._pool)
        async with AsyncWatch(self._watches, key, distinct=False) as watch:
            state = await watch.get(timeout)
        if state is None:
            raise no_state(watch.key, timeout)
        return state

    def _enter(self) -> None:
        self._check_open()
        pool = self._pool
        assert isinstance(pool, AsyncPool)
        pool.ensure()

    async def close(self) -> None:
        """Close the client: watches end, held grants stop being kept and
        are released once (best effort, waiting at most the request
        timeout for the answers; no ``lost`` for them), calls under way
        fail ``Closed``, and a grant that comes to a call close ended, or
        that an acquire is still confirming with ``K``, is released before
        the connections close (as ``Client.close``);
        then the connections close; every task of the client has ended
        when it returns. Later calls raise ``Closed``. Safe to call
        again."""
        grants = self._begin_close()
        if grants is None:
            return
        pool = self._pool
        assert isinstance(pool, AsyncPool)
        if pool.loop is not asyncio.get_running_loop():
            pool.close_nowait()
            return
        # Grants dropped without release just before: their releases are
        # waited for like the others (else closing cancels them).
        dropped, releasing = take_dropped(self._dropped)
        slots = self._send_releases(grants + dropped)
        waits: "List[asyncio.Future[None]]" = list(releasing)
        loop = asyncio.get_running_loop()
        for slot in slots:
            future: asyncio.Future[None] = loop.create_future()
            slot.add_callback(lambda future=future: _resolve(future))  # type: ignore[misc]
            waits.append(future)
        # Acquires confirming their grant with K (tasks on this loop)
        # release it and fail Closed: wait for them too.
        none_in_hand: asyncio.Future[None] = loop.create_future()
        pool.in_hand.add_callback(lambda: _resolve(none_in_hand))
        if not none_in_hand.done():
            waits.append(none_in_hand)
        if waits:
            await asyncio.wait(waits, timeout=pool.request_timeout)
        await pool.asettle()
        await pool.aclose()
        for task in releasing:
            task.cancel()  # still under way after the request timeout
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for held in list(self._helds):
            if isinstance(held, AsyncHeld):
                await held._keeper.join()
        await self._watches.ajoin()

    def _close(self) -> None:
        """Close without awaiting (from outside the loop, or a finaliser):
        nothing is released; the connections end."""
        self._closed = True
        pool = self._pool
        assert isinstance(pool, AsyncPool)
        loop = pool.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._watches.close)
            except RuntimeError:
                pass
        pool.close_nowait()

    async def __aenter__(self: _A) -> _A:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
