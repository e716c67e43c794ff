"""The calls: how one request becomes one result, across dropped
connections, redirects and deadlines.

Each call is written once, as a generator that yields what it waits for
(``WaitSlot``, ``WaitChange``, ``Sleep`` from ``_pool.py``) and returns
its result; ``drive`` runs it by blocking the calling thread, and
``drive_async`` runs it in an asyncio task, woken by the asyncio
connections on the same loop. So the blocking and the asyncio client make
the same decisions, written once (the keep-alive of a held grant too:
``hold_loop``).

Policies:
- an attempt whose connection drops moves to the next connection; the call
  fails only after as many failed attempts as there are connections (an
  ``E <op> <key> shutting-down`` answer counts as a failed attempt);
- ``M host:port``: prefer that node from now on (registering it if new) and
  send again; ``M -``, or a redirect to a node that is down: wait 100 ms
  and send again, for up to the request timeout; at most 8 redirects;
- a grant answered after more than a third of its lease (it waited in
  line) is confirmed at once with ``K``, so that its lease, counted from
  when the acquire was sent, does not look spent on arrival; while it is,
  the call counts its grant in hand (``InHand``), and if the client
  begins to close it releases the grant itself and fails ``Closed`` (close
  waits for it);
- a release is retried for 5 s at 200 ms intervals while no connection can
  carry it; ``N`` after an attempt that may have reached the server counts
  as released;
- deadlines: a connection has the request timeout to answer (an acquire:
  its wait plus the request timeout; without a wait limit: no limit),
  else it is closed.

Never does: touch sockets (that is ``_pool.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Generator, List, NamedTuple, Optional, Protocol, Tuple, TypeVar, Union

from . import _wire
from ._pending import Slot
from ._pool import InHand, Notifier, Sleep, WaitChange, WaitSlot, Waiting
from ._wire import Answer, Key
from .errors import AuthRefused, Closed, Error, Expired, NotHeld, Refused, Timeout, Unavailable


class ConnLike(Protocol):
    """What a call needs of a connection (``_pool.Conn``, ``_apool.AsyncConn``)."""

    addr: str

    def send(self, line: bytes, op: str, key: Optional[bytes], slot: Optional[Slot]) -> Optional[int]: ...

    def kill(self, generation: int, why: str) -> None: ...

    def is_live(self, generation: int) -> bool: ...


class PoolLike(Protocol):
    """What a call needs of a client's connections (``_pool.Pool`` on
    threads, ``_apool.AsyncPool`` on an asyncio loop)."""

    @property
    def request_timeout(self) -> float: ...

    @property
    def closed(self) -> bool: ...

    @property
    def closing(self) -> bool: ...

    @property
    def in_hand(self) -> InHand: ...

    def pick(
        self, due: Optional[float], acquire_key: Optional[bytes] = None
    ) -> Generator[WaitChange, None, ConnLike]: ...

    def choose(self, acquire_key: Optional[bytes] = None) -> Optional[ConnLike]: ...

    def node_for(self, addr: str) -> int: ...

    def prefer(self, node: int) -> None: ...

    def is_reachable(self, node: int) -> bool: ...

    def connection_count(self) -> int: ...

    def describe(self) -> str: ...

    def auth_refusal(self) -> Optional[str]: ...

    @property
    def notifier(self) -> Notifier: ...


Pool = PoolLike

T = TypeVar("T")

#: A call: a generator that yields what it waits for and returns its result.
Call = Generator[Waiting, None, T]

RELEASE_RETRY_WINDOW = 5.0
RELEASE_RETRY_INTERVAL = 0.2
NO_ACTIVE_RETRY = 0.1
MAX_REDIRECTS = 8
ACQUIRE_ROUNDS = 3
#: How long a call that closed an overdue connection waits for it to close.
KILL_WAIT = 1.0

log = logging.getLogger("baton_locks")


class Grant:
    """A key granted to this client.

    ``key`` (str when it is valid UTF-8, else bytes), ``token`` (the
    fencing token: hand it to the resource you protect), ``lease``
    (seconds) and ``expires_at``: when the lease runs out by the client's
    clock, in ``time.monotonic()`` seconds, counted from when the request
    that started the lease was sent, so it errs early. ``slot``: which of
    a semaphore's ``limit`` places the grant holds, 0 to limit - 1 (always
    0 for a plain lock); a protected resource fences per (key, slot).
    """

    __slots__ = ("key", "token", "lease", "expires_at", "slot", "released", "_raw_key")

    key: Union[str, bytes]
    token: int
    lease: float
    expires_at: float
    slot: int

    def __init__(
        self,
        key: Key,
        token: int,
        lease: float = 0.0,
        expires_at: Optional[float] = None,
        slot: int = 0,
    ) -> None:
        raw = _wire.check_key(key)
        self._raw_key = raw
        self.key = _display(raw)
        self.token = _wire.check_token(token)
        self.lease = float(lease)
        self.expires_at = time.monotonic() if expires_at is None else float(expires_at)
        self.slot = int(slot)
        #: True once a release of it was answered (a second release sends
        #: ``R`` again and returns False, as it always has).
        self.released = False

    def time_left(self) -> float:
        """Seconds left on the lease (0 once it has run out)."""
        return max(0.0, self.expires_at - time.monotonic())

    @property
    def expired(self) -> bool:
        """True once the lease has run out by the client's clock."""
        return time.monotonic() >= self.expires_at

    def __repr__(self) -> str:
        return "Grant(key=%r, token=%d, slot=%d, time_left=%.3f)" % (
            self.key,
            self.token,
            self.slot,
            self.time_left(),
        )


class KeyStatus(NamedTuple):
    """Who holds a key: ``token`` (None when free), ``time_left`` (seconds,
    by the server's clock) and ``waiting`` (requests in line)."""

    token: Optional[int]
    time_left: float
    waiting: int

    @property
    def free(self) -> bool:
        """True when nobody holds the key."""
        return self.token is None

    def __repr__(self) -> str:
        return "KeyStatus(token=%r, time_left=%.3f, waiting=%d)" % (
            self.token,
            self.time_left,
            self.waiting,
        )


def display(raw: bytes) -> Union[str, bytes]:
    """A key or value as the user sees it: str when it is UTF-8."""
    return _display(raw)


def _display(raw: bytes) -> Union[str, bytes]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


# --- driving a call -----------------------------------------------------


def drive(call: Call[T]) -> T:
    """Run a call generator on this thread. When the wait is cut short by
    an exception (a KeyboardInterrupt, or another signal handler raising),
    the generator is closed at once, which gives up its request as a
    cancelled async call does: a grant that still arrives is released
    rather than left held until its lease runs out."""
    try:
        waiting = next(call)
        while True:
            waiting.block()
            waiting = call.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        call.close()


async def drive_async(call: Call[T]) -> T:
    """Run a call generator in the running asyncio loop, whose own
    connections (``_apool.py``) wake it from the loop itself. Cancelling the
    task closes the generator, which gives up its request (a grant that
    still arrives is released)."""
    loop = asyncio.get_running_loop()
    try:
        waiting = next(call)
        while True:
            if isinstance(waiting, Sleep):
                await asyncio.sleep(waiting.timeout)
            else:
                future: asyncio.Future[None] = loop.create_future()
                waiting.subscribe(lambda future=future: _resolve(future))  # type: ignore[misc]
                if waiting.timeout is None:
                    await future
                elif not future.done():
                    timer = loop.call_later(max(0.0, waiting.timeout), _resolve, future)
                    try:
                        await future
                    finally:
                        timer.cancel()
            waiting = call.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        call.close()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# --- one request ---------------------------------------------------------


class _Exchanged:
    __slots__ = ("answer", "sent_at", "earlier_maybe_delivered")

    def __init__(self, answer: Answer, sent_at: float, earlier: bool) -> None:
        self.answer = answer
        self.sent_at = sent_at
        self.earlier_maybe_delivered = earlier


def _budget(op: str, wait_ms: int, request_timeout: float) -> Optional[float]:
    if op == "A":
        return None if wait_ms == 0 else wait_ms / 1000.0 + request_timeout
    return request_timeout


#: Which deadline of a request still unanswered has passed (see
#: ``past_deadline``).
CONN_OVERDUE = "conn-overdue"
CALLER_OVERDUE = "caller-overdue"
HELD_BACK = "held-back"


def past_deadline(
    now: float, budget: Optional[float], front_at: Optional[float], due: Optional[float]
) -> Optional[str]:
    """At ``now``, for a request that reached the front of its (op, key)
    line on its connection at ``front_at`` (None: not yet, it is held back
    behind an earlier one), with the connection's ``budget`` (None: no
    limit) and the caller's deadline ``due``: ``CONN_OVERDUE`` (the
    connection is deemed dead: ``budget`` since ``front_at``),
    ``CALLER_OVERDUE``, ``HELD_BACK`` (the caller's deadline, while the
    server was entitled to hold the answer back), or None. Pure."""
    if budget is not None and front_at is not None and now >= front_at + budget:
        return CONN_OVERDUE
    if due is not None and now >= due:
        return HELD_BACK if front_at is None else CALLER_OVERDUE
    return None


def exchange(
    pool: Pool,
    op: str,
    key: bytes,
    due: Optional[float],
    make: Callable[[], Tuple[bytes, int]],
) -> Call[_Exchanged]:
    """Generator: send the line ``make()`` builds (again on each attempt)
    until a final answer comes; an ``_Exchanged``. Raises Unavailable
    (with ``maybe_delivered``) when no server answers."""
    failures = 0
    delivered = False
    hops = 0
    waiting_since: Optional[float] = None
    while True:
        if pool.closed:
            raise Closed()
        line, wait_ms = make()
        try:
            conn = yield from pool.pick(due, key if op == "A" else None)
        except Unavailable as e:
            e.maybe_delivered = delivered
            raise
        slot = Slot()
        sent_at = slot.sent_at
        generation = conn.send(line, op, key, slot)
        answer = None
        if generation is None:
            failures += 1
        else:
            budget = _budget(op, wait_ms, pool.request_timeout)
            verdict = None
            try:
                # The connection's clock runs from when the request reached
                # the front of its (op, key) line; while it is held back,
                # look again every budget.
                while True:
                    front_at = slot.front_at
                    check = None
                    if budget is not None:
                        check = (time.monotonic() if front_at is None else front_at) + budget
                    until = check if due is None else (due if check is None else min(due, check))
                    yield WaitSlot(slot, None if until is None else max(0.0, until - time.monotonic()))
                    if slot.done:
                        break
                    verdict = past_deadline(time.monotonic(), budget, slot.front_at, due)
                    if verdict is not None:
                        break
            except GeneratorExit:
                # The caller is gone (a cancelled task): a grant that came
                # just now is released; one still to come is released by
                # the connection thread.
                got = slot.abandon()
                if got is not None and got[0] == _wire.GRANTED:
                    conn.send(_wire.release_line(got[2], got[1]), "R", got[2], None)
                raise
            if not slot.done:
                answer = slot.abandon()
            if (pool.closed or slot.closed) and answer is None:
                raise Closed()
            if slot.done and not slot.lost:
                answer = slot.answer
            if answer is None and slot.lost:
                delivered = True
                failures += 1
            elif answer is None and verdict == HELD_BACK and op == "A":
                # Its wait ran out long ago: the answer held back is a T (a
                # grant that comes instead is released, its caller gone).
                raise Timeout("the key was not granted within the wait")
            elif answer is None:
                waited = time.monotonic() - sent_at
                if verdict == CONN_OVERDUE:
                    conn.kill(generation, "no answer within %.1fs" % waited)
                    # The connection is closed before the call fails: no
                    # later call can take it, and no late answer comes.
                    closed_by = time.monotonic() + KILL_WAIT
                    while conn.is_live(generation) and time.monotonic() < closed_by:
                        seen = pool.notifier.version
                        if not conn.is_live(generation):
                            break
                        yield WaitChange(pool.notifier, seen, closed_by - time.monotonic())
                raise Unavailable(
                    "no answer: %s did not answer within %.1fs" % (conn.addr, waited),
                    maybe_delivered=True,
                )
        if answer is not None:
            tag = answer[0]
            if tag == _wire.MOVED:
                active = answer[1]
                if active is not None:
                    node = pool.node_for(active)
                    if pool.is_reachable(node):
                        hops += 1
                        if hops > MAX_REDIRECTS:
                            raise Unavailable(
                                "no active node: redirected %d times without reaching it (last: %s)"
                                % (MAX_REDIRECTS, active),
                                maybe_delivered=delivered,
                            )
                        pool.prefer(node)
                        waiting_since = None
                        continue
                now = time.monotonic()
                if waiting_since is None:
                    waiting_since = now
                if now - waiting_since >= pool.request_timeout or (
                    due is not None and now + NO_ACTIVE_RETRY >= due
                ):
                    if active is None:
                        why = "the servers know no active node (waited %.1fs)" % (now - waiting_since)
                    else:
                        why = "redirected to %s, which cannot be reached" % active
                    raise Unavailable("no active node: " + why, maybe_delivered=delivered)
                yield Sleep(NO_ACTIVE_RETRY)
                continue
            if tag == _wire.REFUSED and answer[3] == "shutting-down":
                failures += 1
            else:
                return _Exchanged(answer, sent_at, delivered)
        if pool.closed:
            raise Closed()
        if failures >= pool.connection_count():
            refused = pool.auth_refusal()
            if refused:
                raise AuthRefused(refused)
            raise Unavailable(
                "no connection: the connection failed on each of %d attempts: %s"
                % (failures, pool.describe()),
                maybe_delivered=delivered,
            )


def _refused(answer: Answer) -> Refused:
    return Refused(answer[3], answer[1])


def _unexpected(answer: Answer) -> Unavailable:
    return Unavailable("protocol error: unexpected answer %r" % (answer,))


# --- the calls -----------------------------------------------------------


def acquire(
    pool: Pool,
    key: object,
    lease: object,
    wait: object,
    limit: object = None,
    value: object = None,
) -> Call[Grant]:
    """Generator for ``Client.acquire``."""
    raw = _wire.check_key(key)
    lease_ms = _wire.check_lease(lease)
    wait_ms = _wire.wait_millis(wait)
    checked_limit = _wire.check_limit(limit)
    raw_value = _wire.check_value(value)
    wait_end = None if wait_ms == 0 else time.monotonic() + wait_ms / 1000.0

    def make() -> Tuple[bytes, int]:
        if wait_end is None:
            left = 0
        else:
            left = _wire.millis_ceil(max(0.0, wait_end - time.monotonic()))
            if left == 0:
                raise Timeout("the key was not granted within the wait")
        return _wire.acquire_line(raw, lease_ms, left, checked_limit, raw_value), left

    due = None if wait_end is None else wait_end + pool.request_timeout
    for _ in range(ACQUIRE_ROUNDS):
        done = yield from exchange(pool, "A", raw, due, make)
        answer = done.answer
        if answer[0] == _wire.TIMEOUT:
            raise Timeout("the key was not granted within the wait")
        if answer[0] == _wire.REFUSED:
            raise _refused(answer)
        if answer[0] != _wire.GRANTED:
            raise _unexpected(answer)
        lease_s = lease_ms / 1000.0
        grant = Grant(raw, answer[1], lease_s, done.sent_at + lease_s, answer[3] or 0)
        if time.monotonic() - done.sent_at <= lease_s / 3:
            return grant
        # It waited in line: restart its lease with K (see the module doc).
        # The grant is in hand until the call ends: a close that begins
        # meanwhile waits for it, and the call releases it itself.
        pool.in_hand.enter()
        try:
            confirmed = yield from _confirm(pool, grant, lease_s)
        finally:
            pool.in_hand.leave()
        if confirmed:
            return grant
        # it ran out before it arrived: ask again
    raise Expired("the lease ran out before the grant arrived")


def _confirm(pool: Pool, grant: Grant, lease_s: float) -> Call[bool]:
    """Generator: restart a grant's lease with ``K``; False when it had run
    out already. The client closing before the ``K`` goes out or while it
    is out: the grant is released here and the call fails ``Closed``."""
    try:
        if pool.closing:
            yield from _release_in_hand(pool, grant)
            raise Closed()
        try:
            yield from keep(pool, grant, lease_s, confirm=True)
        except NotHeld:
            if pool.closing:
                raise Closed() from None  # nothing left to release
            return False
        except (Unavailable, Refused):
            pass  # no server could say: the grant as it is
        if pool.closing:
            yield from _release_in_hand(pool, grant)
            raise Closed()
        return True
    except GeneratorExit:
        # The caller gave up while the K (or the release) was out. The
        # grant had arrived, so no connection thread will release it: do
        # it here.
        _release_unwanted(pool, grant)
        raise


def _release_in_hand(pool: Pool, grant: Grant) -> Call[None]:
    """Generator: the client began to close while an acquire had its grant
    in hand: release it (``R``, its answer awaited, bounded by the request
    timeout); close waits for this."""
    raw = grant._raw_key
    line = _wire.release_line(raw, grant.token)
    due = time.monotonic() + pool.request_timeout
    try:
        yield from exchange(pool, "R", raw, due, lambda: (line, 0))
    except Error as e:
        log.warning("could not release %r (token %d) as the client closed: %s", grant.key, grant.token, e)


def _release_unwanted(pool: Pool, grant: Grant) -> None:
    """Queue a release of a grant nobody will get, without waiting (the
    caller is gone); with no connection up, its lease runs out instead."""
    try:
        conn = pool.choose()
    except Unavailable:
        conn = None
    raw = grant._raw_key
    if conn is None or conn.send(_wire.release_line(raw, grant.token), "R", raw, None) is None:
        log.warning("could not release %r (token %d), whose caller gave up", grant.key, grant.token)


def release_grant(pool: Pool, grant: Grant) -> Call[bool]:
    """Generator for ``Client.release``: ``release``, then the grant
    knows it was released."""
    done = yield from release(pool, grant._raw_key, grant.token)
    grant.released = True
    return done


def release(pool: Pool, key: object, token: object) -> Call[bool]:
    """Generator for ``Client.release``: True released, False not held."""
    raw = _wire.check_key(key)
    checked = _wire.check_token(token)
    line = _wire.release_line(raw, checked)
    retry_end = time.monotonic() + RELEASE_RETRY_WINDOW
    due = retry_end + pool.request_timeout
    delivered = False
    while True:
        try:
            done = yield from exchange(pool, "R", raw, due, lambda: (line, 0))
        except Unavailable as e:
            delivered = delivered or e.maybe_delivered
            if time.monotonic() + RELEASE_RETRY_INTERVAL > retry_end:
                raise
            yield Sleep(RELEASE_RETRY_INTERVAL)
            continue
        answer = done.answer
        if answer[0] == _wire.RELEASED:
            return True
        if answer[0] == _wire.NOT_HELD:
            return delivered or done.earlier_maybe_delivered
        if answer[0] == _wire.REFUSED:
            raise _refused(answer)
        raise _unexpected(answer)


def keep(pool: Pool, grant: Grant, lease: object, confirm: bool = False) -> Call[None]:
    """Generator for ``Client.keep``: extend ``grant`` to now + lease.
    ``confirm``: the grant just arrived after waiting in line, and its lease
    by the client's clock (counted from the acquire) may look spent though
    the server started it at the hand-over: ask the server anyway."""
    lease_ms = _wire.check_lease(lease)
    if grant.expired and not confirm:
        raise Expired("the lease ran out")
    raw = grant._raw_key
    line = _wire.keep_line(raw, grant.token, lease_ms)
    due = grant.expires_at if not confirm else time.monotonic() + pool.request_timeout
    try:
        done = yield from exchange(pool, "K", raw, due, lambda: (line, 0))
    except Unavailable:
        if grant.expired and not confirm:
            raise Expired("the lease ran out before a server answered") from None
        raise
    answer = done.answer
    if answer[0] == _wire.KEPT:
        grant.lease = lease_ms / 1000.0
        grant.expires_at = done.sent_at + grant.lease
        return None
    if answer[0] == _wire.REFUSED and answer[3] == "not-held":
        raise NotHeld("the key is no longer held by this token")
    if answer[0] == _wire.REFUSED:
        raise _refused(answer)
    raise _unexpected(answer)


def query(pool: Pool, key: object) -> Call[KeyStatus]:
    """Generator for ``Client.query``."""
    raw = _wire.check_key(key)
    line = _wire.query_line(raw)
    due = time.monotonic() + pool.request_timeout
    done = yield from exchange(pool, "Q", raw, due, lambda: (line, 0))
    answer = done.answer
    if answer[0] == _wire.QUERIED:
        token = answer[2]
        return KeyStatus(token or None, answer[3] / 1000.0, answer[4])
    if answer[0] == _wire.REFUSED:
        raise _refused(answer)
    raise _unexpected(answer)


# --- a held grant's keep-alive, and the release at close -------------------

#: Time between two tries to renew a lease while no server answers.
KEEP_RETRY = 0.2


def hold_loop(pool: Pool, grant: Grant, lease: float) -> Call[Error]:
    """Generator: keep ``grant`` alive (``K`` every third of ``lease``;
    while no server answers, again every ``KEEP_RETRY`` until the lease
    runs out by the client's clock) until it is lost; returns why (a
    ``NotHeld``, ``Expired`` or ``Refused``). Pauses are ``Sleep``s, so the
    driver can stop it at each (a thread's condition, a task's cancel).
    ``Closed`` is raised when the client closes."""
    while True:
        lease_start = grant.expires_at - lease
        pause = lease_start + lease / 3 - time.monotonic()
        if pause > 0:
            yield Sleep(pause)
        while True:
            try:
                yield from keep(pool, grant, lease)
                break
            except (NotHeld, Refused) as e:  # Expired is a NotHeld
                return e
            except Closed:
                raise
            except Unavailable as e:
                if pool.closed:
                    raise Closed() from None
                log.debug("keep of %r failed, trying again: %s", grant.key, e)
            yield Sleep(KEEP_RETRY)
            if grant.expired:
                return Expired("the lease ran out before a server renewed it")


def send_release(pool: Pool, key: bytes, token: int) -> Optional[Slot]:
    """Send ``R`` once on a live connection without waiting (the client is
    closing: best effort); the slot its answer goes to, or None when no
    connection could take it."""
    try:
        conn = pool.choose()
    except Unavailable:
        return None
    slot = Slot()
    if conn is None or conn.send(_wire.release_line(key, token), "R", key, slot) is None:
        return None
    return slot
