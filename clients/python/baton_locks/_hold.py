"""Held grants: a grant whose lease a background thread keeps alive, and
the election helper built on it.

Owns: per held grant, a ``_Keeper`` and its ``baton-hold`` thread. The
thread renews the lease with ``K`` every third of it; while no server
answers it tries again every ``KEEP_RETRY`` until the lease runs out by
the client's clock. The moment the key is lost (a server says the token
no longer holds it, another refusal, or no server answered before the
lease ran out) it records why, sets ``lost`` and wakes everyone waiting
(threads on the event, tasks through ``loop.call_soon_threadsafe``).
Released by the owner (``release``/``resign`` or leaving a ``with``
block); a held grant the program drops without releasing is released by
its thread.

Never does: tell the owner the key is lost after the owner let go of it,
keep renewing after a loss (a lost key is not asked for again: the owner
decides), or block an asyncio loop (the async calls only wait on futures).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from typing import Callable, List, Optional, TypeVar, Union

from . import _calls
from ._calls import Grant
from ._pool import Pool
from .errors import Error, Expired, NotHeld, Refused, Unavailable

log = logging.getLogger("baton_locks")

#: Time between two tries to renew a lease while no server answers.
KEEP_RETRY = 0.2

_H = TypeVar("_H", bound="_HeldBase")


class _Keeper:
    """The renewal of one grant, on its own thread."""

    def __init__(self, pool: Pool, grant: Grant) -> None:
        self._pool = pool
        self.grant = grant
        self._lease = grant.lease
        self._cond = threading.Condition()
        self._stop = False
        self._release_on_stop = False
        self.lost = threading.Event()
        self.error: Optional[Error] = None
        self._callbacks: List[Callable[[], None]] = []
        self._thread = threading.Thread(
            target=self._run, name="baton-hold %r" % (grant.key,), daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, release: bool = False) -> None:
        """Stop renewing; with ``release``, the thread releases the grant
        (the owner dropped it)."""
        with self._cond:
            self._stop = True
            self._release_on_stop = release
            self._cond.notify_all()

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the grant is lost (at once if it is)."""
        with self._cond:
            if self.error is None:
                self._callbacks.append(callback)
                return
        callback()

    def _wait(self, until: float) -> bool:
        """Wait until ``until`` (monotonic) unless stopped; True when stopped."""
        with self._cond:
            while not self._stop:
                left = until - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._stop

    def _run(self) -> None:
        grant = self.grant
        while True:
            lease_start = grant.expires_at - self._lease
            if self._wait(lease_start + self._lease / 3):
                return self._finish()
            why = self._renew()
            if why is None:
                continue
            with self._cond:
                if self._stop:
                    stopped = True
                else:
                    stopped = False
                    self.error = why
                    self.lost.set()
                    callbacks, self._callbacks = self._callbacks, []
            if stopped:
                return self._finish()
            log.warning("lost %r (token %d): %s", grant.key, grant.token, why)
            for callback in callbacks:
                callback()
            return

    def _renew(self) -> Optional[Error]:
        """Extend the lease, trying again every ``KEEP_RETRY`` while no
        server answers and the lease lasts; None when kept (or stopped)."""
        while True:
            try:
                _calls.drive(_calls.keep(self._pool, self.grant, self._lease))
                return None
            except (NotHeld, Refused) as e:  # Expired is a NotHeld
                return e
            except Unavailable as e:
                if self._pool.settings.closed.is_set():
                    return Unavailable("the client is closed")
                log.debug("keep of %r failed, trying again: %s", self.grant.key, e)
            if self._wait(time.monotonic() + KEEP_RETRY):
                return None
            if self.grant.expired:
                return Expired("the lease ran out before a server renewed it")

    def _finish(self) -> None:
        with self._cond:
            release = self._release_on_stop
        if not release:
            return
        grant = self.grant
        try:
            if not _calls.drive(_calls.release(self._pool, grant._raw_key, grant.token)):
                log.debug("%r (token %d) was no longer held when dropped", grant.key, grant.token)
        except Error as e:
            log.warning("could not release %r (token %d): %s; its lease will run out", grant.key, grant.token, e)


def _dropped(keeper: _Keeper) -> None:
    keeper.stop(release=True)


class _HeldBase:
    def __init__(self, pool: Pool, grant: Grant, value: Union[str, bytes, None]) -> None:
        self._pool = pool
        self._keeper = _Keeper(pool, grant)
        #: The grant (its ``expires_at`` moves on with each renewal).
        self.grant = grant
        #: The value the grant was acquired with (None: none).
        self.value = value
        self._finalizer = weakref.finalize(self, _dropped, self._keeper)
        self._keeper.start()

    @property
    def key(self) -> Union[str, bytes]:
        return self.grant.key

    @property
    def token(self) -> int:
        return self.grant.token

    @property
    def slot(self) -> int:
        return self.grant.slot

    @property
    def lost(self) -> threading.Event:
        """Set once the key is lost (``error`` says why)."""
        return self._keeper.lost

    @property
    def error(self) -> Optional[Error]:
        """Why the key was lost: ``NotHeld`` (the server says the token no
        longer holds it), ``Expired`` (no server renewed it in time),
        ``Refused``, or ``Unavailable`` (the client was closed); None
        while held."""
        return self._keeper.error

    def is_held(self) -> bool:
        """False once the key is lost or let go."""
        return not self._keeper.lost.is_set() and self._finalizer.alive

    def _let_go(self) -> None:
        self._finalizer.detach()
        self._keeper.stop()

    def __repr__(self) -> str:
        return "%s(key=%r, token=%d, slot=%d, %s)" % (
            type(self).__name__,
            self.key,
            self.token,
            self.slot,
            "held" if self.is_held() else "not held",
        )


class Held(_HeldBase):
    """A grant kept alive in the background, from ``Client.hold``. Check
    ``lost`` (a ``threading.Event``) or ``is_held()`` before each step of
    the work it protects, and fence with ``token``; ``release()`` or the
    end of a ``with`` block lets go."""

    def wait_lost(self, timeout: Optional[float] = None) -> Optional[Error]:
        """Block until the key is lost (its error) or ``timeout`` seconds
        pass (None)."""
        self._keeper.lost.wait(timeout)
        return self._keeper.error

    def release(self) -> bool:
        """Stop renewing and release (True when released, False when the
        token no longer held the key)."""
        self._let_go()
        return _calls.drive(
            _calls.release(self._pool, self.grant._raw_key, self.grant.token)
        )

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class AsyncHeld(_HeldBase):
    """``Held`` for asyncio, from ``AsyncClient.hold``: ``await
    release()``, ``await wait_lost()``, ``async with``."""

    async def wait_lost(self, timeout: Optional[float] = None) -> Optional[Error]:
        """Wait until the key is lost (its error) or ``timeout`` seconds
        pass (None)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:
                pass  # the loop is closed

        self._keeper.add_callback(wake)
        try:
            await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            pass
        return self._keeper.error

    async def release(self) -> bool:
        """``Held.release`` as a coroutine."""
        self._let_go()
        return await _calls.drive_async(
            _calls.release(self._pool, self.grant._raw_key, self.grant.token)
        )

    async def __aenter__(self: _H) -> _H:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


class Campaign(Held):
    """Leadership of a key, from ``Client.campaign``: a ``Held`` grant of
    the key with limit 1 and this candidate's value. ``is_leader()``
    turns False (and ``lost`` is set) when leadership is lost; ``resign()``
    or the end of a ``with`` block gives it up, and the next candidate in
    line leads."""

    def is_leader(self) -> bool:
        return self.is_held()

    def resign(self) -> bool:
        """Give up leadership (``release``)."""
        return self.release()


class AsyncCampaign(AsyncHeld):
    """``Campaign`` for asyncio, from ``AsyncClient.campaign``."""

    def is_leader(self) -> bool:
        return self.is_held()

    async def resign(self) -> bool:
        """``Campaign.resign`` as a coroutine."""
        return await self.release()


def _resolve(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)
