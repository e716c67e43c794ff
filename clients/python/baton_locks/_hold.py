"""Held grants: a grant whose lease is kept alive in the background, and
the election helper built on it.

Owns: per held grant, a keeper that runs ``_calls.hold_loop`` (the keep
rules, written once): for ``Held`` on a ``baton-hold`` thread, for
``AsyncHeld`` in a task of the client's loop. The moment the key is lost
(a server says the token no longer holds it, another refusal, or no
server answered before the lease ran out) the keeper records why, sets
``lost`` (a ``threading.Event``; an ``asyncio.Event`` for ``AsyncHeld``)
and wakes everyone waiting. After that every call on the grant fails
``Lost`` (``release`` sends ``R`` anyway, best effort, and returns False:
the grant was not held). Released by the owner (``release``/``resign``
or leaving a ``with`` block); a held grant the program drops without
releasing is released by its keeper (for ``AsyncHeld``, by a task the
client's ``close`` waits for, or sends itself when it has not started:
``take_dropped``). When the client closes, keepers stop without a
``lost`` event and the client releases their grants once.

Never does: tell the owner the key is lost after the owner let go of it,
keep renewing after a loss (a lost key is not asked for again: the owner
decides), or block an asyncio loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Set, Tuple, TypeVar, Union

from . import _calls
from ._calls import Grant, Pool
from ._pool import Sleep
from .errors import Closed, Error, Lost, NotHeld, Unavailable

if TYPE_CHECKING:
    from ._client import AsyncClient, Client

log = logging.getLogger("baton_locks")

#: Time between two tries to renew a lease while no server answers.
KEEP_RETRY = _calls.KEEP_RETRY

_H = TypeVar("_H", bound="Held")
_AH = TypeVar("_AH", bound="AsyncHeld")

RUNNING, LOST, LET_GO = "running", "lost", "let go"


class _Keeper:
    """The renewal of one grant, on its own thread."""

    def __init__(self, pool: Pool, grant: Grant) -> None:
        self._pool = pool
        self.grant = grant
        self._lease = grant.lease
        self._cond = threading.Condition()
        self._stop = False
        self._release_on_stop = False
        self.state = RUNNING
        self.lost = threading.Event()
        self.error: Optional[Error] = None
        self._callbacks: List[Callable[[], None]] = []
        self._thread = threading.Thread(
            target=self._run, name="baton-hold %r" % (grant.key,), daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, release: bool = False) -> bool:
        """Stop renewing; with ``release``, the thread releases the grant
        (the owner dropped it). True when it was still running (not lost,
        not let go before)."""
        with self._cond:
            was = self.state == RUNNING
            if was:
                self.state = LET_GO
            self._stop = True
            self._release_on_stop = release and was
            self._cond.notify_all()
        return was

    def join(self, timeout: float) -> None:
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, timeout))

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the grant is lost (at once if it is)."""
        with self._cond:
            if self.error is None:
                self._callbacks.append(callback)
                return
        callback()

    def mark_lost(self, why: Error) -> bool:
        """Record the loss (unless let go first); True when recorded now."""
        with self._cond:
            if self.state != RUNNING:
                return False
            self.state = LOST
            self._stop = True
            self.error = why
            self.lost.set()
            callbacks, self._callbacks = self._callbacks, []
            self._cond.notify_all()
        log.warning("lost %r (token %d): %s", self.grant.key, self.grant.token, why)
        for callback in callbacks:
            callback()
        return True

    def _wait(self, seconds: float) -> bool:
        """Wait ``seconds`` unless stopped; True when stopped."""
        until = time.monotonic() + seconds
        with self._cond:
            while not self._stop:
                left = until - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._stop

    def _run(self) -> None:
        call = _calls.hold_loop(self._pool, self.grant, self._lease)
        why: Optional[Error] = None
        try:
            waiting = next(call)
            while True:
                if isinstance(waiting, Sleep):
                    if self._wait(waiting.timeout):
                        return
                else:
                    waiting.block()
                    if self._stop:
                        return
                waiting = call.send(None)
        except StopIteration as done:
            why = done.value
        except Closed:
            return
        except Error as e:
            why = e
        finally:
            call.close()
            if why is not None:
                self.mark_lost(why)
            self._finish()

    def _finish(self) -> None:
        with self._cond:
            release = self._release_on_stop
        if not release or self._pool.closed:
            return
        grant = self.grant
        try:
            if not _calls.drive(_calls.release(self._pool, grant._raw_key, grant.token)):
                log.debug("%r (token %d) was no longer held when dropped", grant.key, grant.token)
        except Error as e:
            log.warning("could not release %r (token %d): %s; its lease will run out", grant.key, grant.token, e)


class _AsyncKeeper:
    """The renewal of one grant, in a task of the client's loop."""

    def __init__(self, pool: Pool, grant: Grant, dropped: "Set[_AsyncKeeper]") -> None:
        self._pool = pool
        self.grant = grant
        self._lease = grant.lease
        self.state = RUNNING
        self.lost = asyncio.Event()
        self.error: Optional[Error] = None
        self.task: Optional["asyncio.Task[None]"] = None
        # The client's keepers whose grant was dropped and is not released
        # yet (this one from ``stop(release=True)`` to the end of its
        # release), so that ``close`` waits for that release.
        self._dropped = dropped
        self._release_task: Optional["asyncio.Task[None]"] = None
        self._release_taken = False

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            why: Error = await _calls.drive_async(_calls.hold_loop(self._pool, self.grant, self._lease))
        except Closed:
            return
        except Error as e:
            why = e
        self.mark_lost(why)

    def mark_lost(self, why: Error) -> bool:
        if self.state != RUNNING:
            return False
        self.state = LOST
        self.error = why
        self.lost.set()
        log.warning("lost %r (token %d): %s", self.grant.key, self.grant.token, why)
        return True

    def stop(self, release: bool = False) -> bool:
        """Stop renewing (cancel the task); with ``release``, release the
        grant in a task of its own (the owner dropped it). True when it was
        still running."""
        was = self.state == RUNNING
        if was:
            self.state = LET_GO
        task = self.task
        if task is not None and not task.done():
            try:
                task.cancel()
            except RuntimeError:
                return was  # its loop is closed
        if release and was and not self._pool.closed:
            # A finaliser may run on any thread: a set's add is atomic.
            self._dropped.add(self)
            try:
                loop = task.get_loop() if task is not None else asyncio.get_running_loop()
                loop.call_soon_threadsafe(self._release_soon)
            except RuntimeError:
                self._dropped.discard(self)  # no loop any more: the lease runs out
        return was

    def _release_soon(self) -> None:
        if self._release_taken or self._pool.closed:
            self._dropped.discard(self)  # close sends it, or could not any more
            return
        self._release_task = asyncio.get_running_loop().create_task(self._release())

    async def _release(self) -> None:
        grant = self.grant
        try:
            await _calls.drive_async(_calls.release(self._pool, grant._raw_key, grant.token))
        except Error as e:
            log.warning("could not release %r (token %d): %s", grant.key, grant.token, e)
        finally:
            self._dropped.discard(self)

    async def join(self) -> None:
        task = self.task
        if task is not None and task is not asyncio.current_task():
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass


def take_dropped(dropped: Set[_AsyncKeeper]) -> Tuple[List[Grant], List["asyncio.Task[None]"]]:
    """For ``AsyncClient.close``, on the client's loop: the releases of
    dropped grants, as the grants whose release task has not started yet
    (close sends those with its own, and their task will not start) and
    the release tasks under way (close waits for those)."""
    grants: List[Grant] = []
    tasks: List["asyncio.Task[None]"] = []
    for keeper in list(dropped):
        task = keeper._release_task
        if task is None:
            keeper._release_taken = True
            dropped.discard(keeper)
            grants.append(keeper.grant)
        elif not task.done():
            tasks.append(task)
    return grants, tasks


class _HeldBase:
    _keeper: Union[_Keeper, _AsyncKeeper]

    def __init__(self, pool: Pool, grant: Grant, value: Union[str, bytes, None]) -> None:
        self._pool = pool
        #: The grant (its ``expires_at`` moves on with each renewal).
        self.grant = grant
        #: The value the grant was acquired with (None: none).
        self.value = value
        self._released = False

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
    def error(self) -> Optional[Error]:
        """Why the key was lost: ``NotHeld`` (the server says the token no
        longer holds it), ``Expired`` (no server renewed it in time), or
        ``Refused``; None while held."""
        return self._keeper.error

    def is_held(self) -> bool:
        """False once the key is lost or let go."""
        return self._keeper.state == RUNNING

    def _check(self) -> None:
        """Every call on a grant lost, released or of a closed client
        fails: ``Lost``, ``Closed``."""
        if self._keeper.state == LOST:
            raise Lost("the grant was lost: %s" % self._keeper.error)
        if self._pool.closed or self._released:
            raise Closed("the client is closed" if self._pool.closed else "the grant was released")

    def _begin_release(self) -> bool:
        """Before a release: False when the grant was lost (the release is
        sent anyway, best effort, and reports not held)."""
        if self._pool.closed or self._released:
            raise Closed("the client is closed" if self._pool.closed else "the grant was released")
        self._released = True
        self._finalizer.detach()
        return self._keeper.stop() or self._keeper.state != LOST

    def _keep_failed(self, e: Error) -> None:
        if isinstance(e, NotHeld):
            self._keeper.mark_lost(e)

    def _close_out(self) -> Optional[Grant]:
        """The client closes: stop without a lost event; the grant to
        release when it was still held."""
        self._finalizer.detach()
        return self.grant if self._keeper.stop() else None

    _finalizer: Any

    def __repr__(self) -> str:
        return "%s(key=%r, token=%d, slot=%d, %s)" % (
            type(self).__name__,
            self.key,
            self.token,
            self.slot,
            "held" if self.is_held() else "not held",
        )


def _dropped(keeper: Union[_Keeper, _AsyncKeeper]) -> None:
    keeper.stop(release=True)


class Held(_HeldBase):
    """A grant kept alive in the background, from ``Client.hold``. Check
    ``lost`` (a ``threading.Event``) or ``is_held()`` before each step of
    the work it protects, and fence with ``token``; ``release()`` or the
    end of a ``with`` block lets go. Once lost, ``keep`` raises ``Lost``
    and ``release`` returns False; after a release or ``close()`` of the
    client, calls raise ``Closed``."""

    _keeper: _Keeper

    def __init__(self, client: "Client", grant: Grant, value: Union[str, bytes, None]) -> None:
        super().__init__(client._pool, grant, value)
        self._keeper = _Keeper(self._pool, grant)
        self._finalizer = weakref.finalize(self, _dropped, self._keeper)
        self._keeper.start()
        client._track(self)

    @property
    def lost(self) -> threading.Event:
        """Set once the key is lost (``error`` says why)."""
        return self._keeper.lost

    def wait_lost(self, timeout: Optional[float] = None) -> Optional[Error]:
        """Block until the key is lost (its error) or ``timeout`` seconds
        pass (None)."""
        self._keeper.lost.wait(timeout)
        return self._keeper.error

    def keep(self, lease: Optional[float] = None) -> None:
        """Extend the lease now (to now + ``lease``, by default the
        grant's lease) on top of the background keeping. ``Lost`` when the
        grant is lost (a ``NotHeld`` answer marks it lost)."""
        self._check()
        try:
            _calls.drive(_calls.keep(self._pool, self.grant, self.grant.lease if lease is None else lease))
        except NotHeld as e:
            self._keep_failed(e)
            raise

    def release(self) -> bool:
        """Stop renewing and release (True when released, False when the
        token no longer held the key, or the grant was lost). ``Closed``
        when released already or the client is closed."""
        held = self._begin_release()
        released = _calls.drive(_calls.release(self._pool, self.grant._raw_key, self.grant.token))
        return released and held

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._released and not self._pool.closed:
            self.release()


class AsyncHeld(_HeldBase):
    """``Held`` for asyncio, from ``AsyncClient.hold``: kept alive by a
    task of the client's loop; ``lost`` is an ``asyncio.Event`` (``await
    held.lost.wait()``), ``await wait_lost()``, ``await release()``,
    ``async with``."""

    _keeper: _AsyncKeeper

    def __init__(self, client: "AsyncClient", grant: Grant, value: Union[str, bytes, None]) -> None:
        super().__init__(client._pool, grant, value)
        self._keeper = _AsyncKeeper(self._pool, grant, client._dropped)
        self._finalizer = weakref.finalize(self, _dropped, self._keeper)
        self._keeper.start()
        client._track(self)

    @property
    def lost(self) -> asyncio.Event:
        """Set once the key is lost (``error`` says why): ``await
        held.lost.wait()``."""
        return self._keeper.lost

    async def wait_lost(self, timeout: Optional[float] = None) -> Optional[Error]:
        """Wait until the key is lost (its error) or ``timeout`` seconds
        pass (None)."""
        try:
            await asyncio.wait_for(self._keeper.lost.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return self._keeper.error

    async def keep(self, lease: Optional[float] = None) -> None:
        """``Held.keep`` as a coroutine."""
        self._check()
        try:
            await _calls.drive_async(
                _calls.keep(self._pool, self.grant, self.grant.lease if lease is None else lease)
            )
        except NotHeld as e:
            self._keep_failed(e)
            raise

    async def release(self) -> bool:
        """``Held.release`` as a coroutine (the keeping task has ended when
        it returns)."""
        held = self._begin_release()
        await self._keeper.join()
        released = await _calls.drive_async(
            _calls.release(self._pool, self.grant._raw_key, self.grant.token)
        )
        return released and held

    async def __aenter__(self: _AH) -> _AH:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._released and not self._pool.closed:
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


__all__ = ["AsyncCampaign", "AsyncHeld", "Campaign", "Held", "KEEP_RETRY", "Unavailable"]
