"""The rules every official client keeps (the contract's section on the
client family), each for the blocking ``Client`` and the asyncio
``AsyncClient``:

- a held grant that is lost says so at once, every later call on it fails
  ``Lost``, and it is never acquired again silently;
- a grant that arrives after its caller gave up is released at once, and
  one that comes to a call close ended (the key close's release of a held
  key hands to the client's own waiter) before close returns;
- nothing keeps running after ``close`` (no thread of the client for the
  blocking one, no task for asyncio), held grants are released once and
  no ``lost`` is said for them;
- errors are typed and distinct;
- an acquire goes to a connection with none of its key outstanding, and a
  request held back behind an earlier one of its (op, key) never makes its
  connection overdue.
"""

import asyncio
import signal
import socket
import threading
import time

import pytest

import baton_locks
from conftest import DEADLINE, wait_for
from fake_server import FakeServer


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE))


@pytest.fixture
def fake():
    made = []

    def start(handle):
        server = FakeServer(handle)
        made.append(server)
        return server

    yield start
    for server in made:
        server.close()


def client_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("baton-")]


def other_tasks(before=()):
    """The tasks of the loop but this one and those in ``before``."""
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and t not in before]


# --- lost at once, every later call lost, never re-acquired ---------------


def losing_server(fake, answer_keep):
    """Grants ``k`` (token 11) to every A; answers each K with
    ``answer_keep(n)`` (n counts from 1; None: no answer)."""
    keeps = []

    def handle(index, line):
        if line.startswith(b"A k "):
            return b"A 11 k"
        if line.startswith(b"K k "):
            keeps.append(line)
            answer = answer_keep(len(keeps))
            return b"" if answer is None else answer
        if line.startswith(b"R k 11"):
            return b"N k"
        if line == b"I":
            return b"I role=active"
        return b"E - - unknown-op"

    return fake(handle), keeps


def test_a_held_grant_lost_says_so_at_once_and_later_calls_fail_lost(fake, closing):
    server, keeps = losing_server(fake, lambda n: b"K k" if n < 2 else b"E K k not-held")
    c = closing(baton_locks.Client(server.addr))
    held = c.hold("k", lease=0.3)
    assert held.lost.wait(DEADLINE)
    lost_at = time.monotonic()
    assert isinstance(held.error, baton_locks.NotHeld)
    assert isinstance(held.error, baton_locks.Lost)
    assert not held.is_held()
    with pytest.raises(baton_locks.Lost):
        held.keep()
    assert held.release() is False, "a lost grant's release reports it not held"
    time.sleep(0.3)  # a keeper still running would have sent K or A by now
    assert len(keeps) == 2, "no keep after the loss"
    assert len(server.sent(b"A ")) == 1, "never acquired again"
    assert lost_at - time.monotonic() < 1


def test_a_held_grant_whose_lease_runs_out_unanswered_is_lost(fake, closing):
    # No keep is ever answered: lost when the lease runs out by the
    # client's clock, not later.
    server, keeps = losing_server(fake, lambda n: None)
    c = closing(baton_locks.Client(server.addr, request_timeout=5))
    held = c.hold("k", lease=0.4)
    assert held.wait_lost(DEADLINE) is not None
    assert isinstance(held.error, baton_locks.Expired)
    assert time.monotonic() >= held.grant.expires_at
    with pytest.raises(baton_locks.Lost):
        held.keep()
    assert len(server.sent(b"A ")) == 1


def test_an_async_held_grant_lost_says_so_at_once_and_later_calls_fail_lost(fake, closing):
    server, keeps = losing_server(fake, lambda n: b"K k" if n < 2 else b"E K k not-held")

    async def main():
        async with baton_locks.AsyncClient(server.addr) as c:
            held = await c.hold("k", lease=0.3)
            assert isinstance(held.lost, asyncio.Event)
            await asyncio.wait_for(held.lost.wait(), DEADLINE)  # awaitable
            assert isinstance(held.error, baton_locks.NotHeld)
            assert await held.wait_lost(0) is held.error
            with pytest.raises(baton_locks.Lost):
                await held.keep()
            assert await held.release() is False
            await asyncio.sleep(0.3)
            assert len(keeps) == 2
            assert len(server.sent(b"A ")) == 1

    run(main())


# --- a late grant is released at once ------------------------------------


def test_a_grant_that_arrives_after_the_caller_gave_up_is_released(node, closing):
    # The blocking caller gives up (an exception from a signal handler, as
    # Ctrl+C does) while its acquire waits in line; the grant the server
    # makes later is released by the client at once.
    c = closing(baton_locks.Client(node.addr))
    holder = c.acquire("late", lease=30)

    class GaveUp(Exception):
        pass

    def give_up(signum, frame):
        raise GaveUp()

    previous = signal.signal(signal.SIGALRM, give_up)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(GaveUp):
            c.acquire("late", lease=30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert c.query("late").waiting == 1, "still in line on the server"
    assert c.release(holder)
    wait_for("the late grant released", lambda: c.query("late").free)


def test_an_async_grant_that_arrives_after_a_timeout_is_released(node, closing):
    async def main():
        async with baton_locks.AsyncClient(node.addr) as c:
            holder = await c.acquire("late", lease=30)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.acquire("late", lease=30), 0.3)
            assert (await c.query("late")).waiting == 1
            assert await c.release(holder)
            while not (await c.query("late")).free:
                await asyncio.sleep(0.01)

    run(main())


def test_a_grant_answered_to_an_abandoned_request_is_released_on_the_wire(fake, closing):
    # The server answers the grant only once the caller has gone: the
    # client sends R for it at once.
    grant_now = threading.Event()

    def handle(index, line):
        if line.startswith(b"A k "):
            grant_now.wait(DEADLINE)
            return b"A 77 k"
        if line.startswith(b"R k 77"):
            return b"R k"
        return b"E - - unknown-op"

    server = fake(handle)

    async def main():
        async with baton_locks.AsyncClient(server.addr) as c:
            task = asyncio.ensure_future(c.acquire("k", lease=30))
            while not server.sent(b"A k "):
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            grant_now.set()
            while not server.sent(b"R k 77"):
                await asyncio.sleep(0.01)

    run(main())


# --- nothing runs after close ---------------------------------------------


def test_nothing_runs_after_close_and_held_grants_are_released_once(node):
    before = client_threads()
    c = baton_locks.Client(node.addr)
    held = c.hold("closing", lease=0.6)
    campaign = c.campaign("leader", "me", lease=0.6)
    watch = c.watch("closing")
    assert watch.get(DEADLINE).token == held.token
    assert client_threads() != before
    c.close()
    assert client_threads() == before, "no thread of the client left"
    assert not held.lost.is_set() and not campaign.lost.is_set(), "no lost at close"
    other = baton_locks.Client(node.addr)
    try:
        assert other.query("closing").free, "released at close"
        assert other.query("leader").free
    finally:
        other.close()
    assert watch.closed
    for call in (lambda: c.acquire("x", lease=1), lambda: c.query("x"), held.release, held.keep):
        with pytest.raises(baton_locks.Closed):
            call()
    c.close()  # again: nothing to do


def test_nothing_runs_after_an_async_close(node):
    async def main():
        before = set(asyncio.all_tasks())
        c = baton_locks.AsyncClient(node.addr)
        held = await c.hold("closing", lease=0.6)
        watch = c.watch("closing")
        assert (await watch.get(DEADLINE)).token == held.token
        busy = baton_locks.Client(node.addr)  # holds the key c waits for
        busy.acquire("busy", lease=2)
        busy.close()
        waiter = asyncio.ensure_future(c.acquire("busy", lease=1))
        while (await c.query("busy")).waiting != 1:
            await asyncio.sleep(0.01)
        assert other_tasks(before) != [waiter]
        await c.close()
        with pytest.raises(baton_locks.Closed):
            await waiter
        assert other_tasks(before) == [], "no task of the client left"
        assert [t.name for t in threading.enumerate()] == ["MainThread"] or not client_threads()
        assert not held.lost.is_set()
        with pytest.raises(baton_locks.Closed):
            await held.release()
        with pytest.raises(baton_locks.Closed):
            await c.query("closing")
        async with baton_locks.AsyncClient(node.addr) as other:
            assert (await other.query("closing")).free, "released at close"
        await c.close()

    run(main())


@pytest.mark.parametrize("loop_turns", [0, 1, 2])
def test_an_async_close_waits_for_the_release_of_a_held_grant_dropped_just_before(node, loop_turns):
    # An AsyncHeld dropped without release() is released by a task of the
    # loop; close() right after must not cancel that release nor return
    # before it: the key is free the moment close() returns (a lease of 30
    # seconds would keep it taken for the rest of this test otherwise).
    # With loop_turns the loop runs a little first: the release task is
    # created (1), then under way (2), when close starts.
    async def main():
        async with baton_locks.AsyncClient(node.addr) as other:
            assert (await other.query("dropped")).free
            before = set(asyncio.all_tasks())  # other's tasks too
            c = baton_locks.AsyncClient(node.addr)
            held = await c.hold("dropped", lease=30)
            assert (await other.query("dropped")).token == held.token
            del held  # the last reference: its finaliser starts the release
            for _ in range(loop_turns):
                await asyncio.sleep(0)
            await c.close()
            assert other_tasks(before) == [], "no task of the client left"
            assert (await other.query("dropped")).free, "released before close returned"

    run(main())


def raw_query(line, key):
    """``Q key`` on a raw connection of its own (a file from
    ``socket.makefile``): the answer line."""
    line.write(b"Q %s\n" % key.encode())
    line.flush()
    return line.readline().decode().strip()


@pytest.fixture
def raw_line(node):
    with socket.create_connection(("127.0.0.1", node.port), timeout=DEADLINE) as s:
        with s.makefile("rwb") as line:
            yield line


CLOSES = 20


def test_close_releases_a_grant_its_own_release_handed_to_its_own_waiter(node, raw_line, closing):
    # close releases the held key, and the server hands it at once to this
    # same client's waiter (on its other connection): that grant must not
    # reach the waiter (its call fails Closed) and must be released before
    # the connections close, else the key stays held for its whole lease.
    # A race (the grant against the socket's close): 20 closes.
    for i in range(CLOSES):
        key = "handed-%d" % i
        c = closing(baton_locks.Client(node.addr))
        held = c.hold(key, lease=60)  # kept: a Held dropped is released
        outcome = []

        def wait(c=c, key=key, outcome=outcome):
            try:
                outcome.append(c.acquire(key, lease=60))
            except baton_locks.Error as e:
                outcome.append(e)

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        wait_for("the waiter in line", lambda: c.query(key).waiting == 1)
        c.close()
        waiter.join(DEADLINE)
        assert not waiter.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], baton_locks.Closed), outcome
        assert raw_query(raw_line, key) == "Q %s 0 0 0" % key, "close %d" % i
        assert not held.lost.is_set()


def test_an_async_close_releases_a_grant_its_own_release_handed_to_its_own_waiter(node, raw_line):
    async def close_once(key):
        c = baton_locks.AsyncClient(node.addr)
        try:
            held = await c.hold(key, lease=60)  # kept: one dropped is released
            waiter = asyncio.ensure_future(c.acquire(key, lease=60))
            while (await c.query(key)).waiting != 1:
                await asyncio.sleep(0.01)
            await c.close()
        finally:
            await c.close()
        with pytest.raises(baton_locks.Closed):
            await waiter
        assert not held.lost.is_set()

    for i in range(CLOSES):
        key = "handed-%d" % i
        run(close_once(key))
        assert raw_query(raw_line, key) == "Q %s 0 0 0" % key, "close %d" % i


def test_the_async_client_runs_no_thread(node):
    async def main():
        before = set(threading.enumerate())
        async with baton_locks.AsyncClient(node.addr) as c:
            held = await c.hold("k", lease=5)
            async with c.watch("k") as watch:
                assert (await watch.get(DEADLINE)).token == held.token
                assert set(threading.enumerate()) == before, "no thread per connection, lock or watch"
            await held.release()

    run(main())


# --- typed, distinct errors -----------------------------------------------


def test_the_errors_are_typed_and_distinct():
    kinds = [
        baton_locks.Timeout,
        baton_locks.Refused,
        baton_locks.Unavailable,
        baton_locks.Lost,
        baton_locks.Closed,
        baton_locks.BadArgument,
    ]
    for kind in kinds:
        assert issubclass(kind, baton_locks.Error)
    assert baton_locks.BatonError is baton_locks.Error
    assert issubclass(baton_locks.Timeout, TimeoutError)
    assert issubclass(baton_locks.NotHeld, baton_locks.Lost)
    assert issubclass(baton_locks.Expired, baton_locks.NotHeld)
    assert issubclass(baton_locks.BadArgument, ValueError)
    assert issubclass(baton_locks.BadArgumentType, TypeError)
    assert issubclass(baton_locks.Closed, baton_locks.Unavailable)  # what close() raised before
    distinct = [baton_locks.Timeout, baton_locks.Refused, baton_locks.Lost, baton_locks.Unavailable, baton_locks.BadArgument]
    for a in distinct:
        for b in distinct:
            assert a is b or not issubclass(a, b), (a, b)
    assert baton_locks.Refused("limit-mismatch").reason == "limit-mismatch"


def test_each_error_comes_from_its_cause(node, closing):
    c = closing(baton_locks.Client(node.addr))
    held = c.acquire("e", lease=30, limit=2)
    with pytest.raises(baton_locks.Refused) as refused:
        c.acquire("e", lease=30, wait=0)
    assert refused.value.reason == "limit-mismatch"
    c.acquire("e", lease=30, limit=2)
    with pytest.raises(TimeoutError):
        c.acquire("e", lease=30, wait=0, limit=2)
    with pytest.raises(baton_locks.BadArgument):
        c.acquire("e", lease=0)
    with pytest.raises(baton_locks.BadArgumentType):
        c.acquire("e", lease="30")
    with pytest.raises(baton_locks.Lost):
        c.keep(baton_locks.Grant("e", held.token + 1000), 5)
    down = closing(baton_locks.Client("127.0.0.1:1", connect_timeout=0.2))
    with pytest.raises(baton_locks.Unavailable) as unavailable:
        down.query("e")
    assert not isinstance(unavailable.value, baton_locks.Closed)


def test_each_async_error_comes_from_its_cause(node):
    async def main():
        async with baton_locks.AsyncClient(node.addr) as c:
            await c.acquire("e", lease=30, limit=2)
            with pytest.raises(baton_locks.Refused) as refused:
                await c.acquire("e", lease=30, wait=0)
            assert refused.value.reason == "limit-mismatch"
            await c.acquire("e", lease=30, limit=2)
            with pytest.raises(TimeoutError):
                await c.acquire("e", lease=30, wait=0, limit=2)
            with pytest.raises(baton_locks.BadArgument):
                await c.acquire("e", lease=-1)
        async with baton_locks.AsyncClient("127.0.0.1:1", connect_timeout=0.2) as down:
            with pytest.raises(baton_locks.Unavailable):
                await down.query("e")

    run(main())


# --- the asyncio connections keep the same liveness and matching rules ----


def test_async_liveness_probe_and_out_of_order_answers(fake):
    # A watched key and a silent server: I after the request timeout; no
    # answer to it: the connection is closed and the watch is sent again.
    # Answers to two keys come in reverse order and still match by key.
    where_a = []

    def handle(index, line):
        if line.startswith(b"W k"):
            return b"W k 0 0 0 -"
        if line == b"Q a":
            where_a.append(index)
            return b""  # answered after b
        if line == b"Q x":
            return b"Q x 0 0 0"
        if line == b"Q b":
            if where_a == [index]:
                return b"Q b 5 1000 0\nQ a 4 2000 1"
            threading.Timer(0.01, server.send, (where_a[0], b"Q a 4 2000 1")).start()
            return b"Q b 5 1000 0"
        return b""  # I: no answer

    server = fake(handle)

    async def main():
        async with baton_locks.AsyncClient(server.addr, request_timeout=0.3) as c:
            while not all(up for _, up, _ in c.connections()):
                await asyncio.sleep(0.01)
            a = asyncio.ensure_future(c.query("a"))
            await asyncio.sleep(0.05)
            await c.query("x")  # round-robin: b goes where a went
            b = await c.query("b")
            assert len(set(where_a)) == 1
            assert (b.token, (await a).token, (await a).waiting) == (5, 4, 1)
            watch = c.watch("k")
            assert (await watch.get(DEADLINE)).token == 0
            while not server.sent(b"I"):
                await asyncio.sleep(0.01)
            # no answer to the probe: closed, and watched again
            while len(server.sent(b"W k")) < 2:
                await asyncio.sleep(0.01)
            watch.close()

    run(main())


def test_an_acquire_goes_where_none_of_its_key_is_outstanding():
    from baton_locks._pool import CONNECTING, DOWN, UP, choose

    phases = [(0, UP, True), (0, UP, False), (0, DOWN, False)]
    assert [choose(phases, None, turn) for turn in range(4)] == [1, 1, 1, 1]
    # Every one busy: still sent, round-robin.
    assert [choose([(0, UP, True), (0, UP, True)], None, turn) for turn in range(2)] == [0, 1]
    # A free connection elsewhere does not beat the preferred node (it
    # would only redirect back).
    assert choose([(0, UP, False), (1, UP, True)], 1, 0) == 1
    assert choose([(0, DOWN, False), (1, CONNECTING, False)], None, 0) == "wait"
    # The only one up is busy and the other still connecting (a new
    # client's second): wait for it; with none connecting, the busy one;
    # once the other is up, that one.
    assert choose([(0, UP, True), (0, CONNECTING, False)], None, 0) == "wait"
    assert choose([(0, UP, True), (0, DOWN, False)], None, 0) == 0
    assert choose([(0, UP, True), (0, UP, False)], None, 0) == 1
    # The preferred node's: waited for, not traded for a free one elsewhere.
    assert choose([(0, UP, False), (1, UP, True), (1, CONNECTING, False)], 1, 0) == "wait"


def test_an_acquire_waits_for_a_connection_still_connecting_then_takes_what_is_up():
    """``Pool.pick`` (what both clients' calls drive) on connections whose
    phases the test sets: no socket, no thread, no clock but the deadline
    ``due`` already past."""
    from baton_locks._pool import CONNECTING, DOWN, UP, ConnBase, Pool, WaitChange

    class FakeConn(ConnBase):
        busy = False

        def start(self):
            pass

        def status_for(self, op, key):
            return self.phase, self.busy

    class FakePool(Pool):
        def _make_conn(self, index, addr):
            return FakeConn(index, addr, self.settings)

        def _start(self, conns):
            pass

    def picked(picking, send=False):
        with pytest.raises(StopIteration) as done:
            picking.send(None) if send else next(picking)
        return done.value.value

    pool = FakePool(["127.0.0.1:7373"], 1.0, 1.0, None, None)
    busy, second = pool.conns()
    assert (busy.phase, second.phase) == (CONNECTING, CONNECTING)
    busy.phase, busy.busy = UP, True

    # The second comes up while the acquire waits: that one is used.
    picking = pool.pick(None, b"k")
    wait = next(picking)
    assert isinstance(wait, WaitChange)
    second.phase = UP
    pool.notifier.bump()
    assert picked(picking, send=True) is second

    # The wait ends (the caller's deadline) with the second still
    # connecting: the busy one after all, never a failure.
    second.phase = CONNECTING
    assert picked(pool.pick(time.monotonic() - 1, b"k")) is busy
    # Nothing connecting: the busy one at once.
    second.phase = DOWN
    assert picked(pool.pick(None, b"k")) is busy
    # Other requests are not held back: the one up, at once.
    second.phase = CONNECTING
    assert picked(pool.pick(None, None)) is busy
    # Nothing up: the deadline still fails the call.
    busy.phase = CONNECTING
    with pytest.raises(baton_locks.Unavailable, match="still connecting"):
        next(pool.pick(time.monotonic() - 1, b"k"))
    pool.close(DEADLINE)


def test_an_async_try_acquire_behind_its_own_waiter_goes_on_the_connection_still_connecting(fake):
    # The second connection's U is answered only when the test says: until
    # then it is connecting, and the first (up) has the waiter of k.
    from baton_locks._pool import UP

    second_up = threading.Event()

    def handle(index, line):
        if line.startswith(b"U "):
            if index == 1:
                second_up.wait(DEADLINE)
            return b"U ok"
        if line.startswith(b"A k 20."):
            return b"T k"  # the try-acquire; the waiter (lease 30) waits
        return b""

    server = fake(handle)

    async def main():
        async with baton_locks.AsyncClient(server.addr, auth="s" * 20, connect_timeout=DEADLINE) as c:
            pool = c._pool
            while len(server.sent(b"U ")) < 2 or not any(x.status()[0] == UP for x in pool.conns()):
                await asyncio.sleep(0.01)
            waiter = asyncio.ensure_future(c.acquire("k", lease=30, wait=60))
            while not server.sent(b"A k 30."):
                await asyncio.sleep(0.01)
            trying = asyncio.ensure_future(c.acquire("k", lease=20, wait=0))
            # Sent at once (on the busy one: the bug) or waiting for a
            # connection to change.
            while not (server.sent(b"A k 20.") or pool.notifier._callbacks):
                await asyncio.sleep(0.01)
            second_up.set()
            with pytest.raises(baton_locks.Timeout):
                await trying
            assert [(i, line.split()[2]) for i, line in server.sent(b"A ")] == [(0, b"30.000"), (1, b"20.000")]
            waiter.cancel()

    try:
        run(main())
    finally:
        second_up.set()


def test_a_request_held_back_never_makes_its_connection_overdue():
    from baton_locks._calls import CALLER_OVERDUE, CONN_OVERDUE, HELD_BACK, past_deadline

    assert past_deadline(60.0, 5.0, None, None) is None
    assert past_deadline(6.0, 5.0, None, 5.0) == HELD_BACK
    assert past_deadline(14.0, 5.0, 10.0, None) is None
    assert past_deadline(15.0, 5.0, 10.0, None) == CONN_OVERDUE
    assert past_deadline(14.0, 5.0, 10.0, 12.0) == CALLER_OVERDUE
    assert past_deadline(99.0, None, 0.0, None) is None


def test_a_slot_knows_when_it_reached_the_front_of_its_line():
    from baton_locks._pending import Pending, Slot
    from baton_locks._wire import parse_answer

    table = Pending()
    first, second, other = Slot(), Slot(), Slot()
    table.add("A", b"k", first)
    table.add("A", b"k", second)
    table.add("A", b"j", other)
    assert first.front_at is not None and other.front_at is not None
    assert second.front_at is None and table.has("A", b"k") and not table.has("R", b"k")
    assert table.match(parse_answer(b"T k"))[0] is first
    assert second.front_at is not None
    assert table.match(parse_answer(b"T k"))[0] is second and not table.has("A", b"k")


def test_a_grant_that_comes_while_the_client_closes_goes_to_no_caller():
    from baton_locks._pending import Pending, Slot, hand_over
    from baton_locks._wire import parse_answer

    table = Pending()
    table.add("A", b"k", None)
    table.add("Q", b"j", None)
    assert table.has_op("A", "R") and not table.has_op("R", "K")
    grant = parse_answer(b"A 7 k")
    # Open: the grant goes to its caller.
    slot = Slot()
    assert hand_over(slot, grant) is None and slot.answer == grant
    # Closing: it goes to nobody, is released, and its call ends closed.
    slot = Slot()
    assert hand_over(slot, grant, closing=True) == b"R k 7\n"
    assert slot.answer is None and slot.lost and slot.closed and slot.wait(0)
    # Closing, an answer that is no grant still goes to its caller.
    slot = Slot()
    timed_out = parse_answer(b"T k")
    assert hand_over(slot, timed_out, closing=True) is None and slot.answer == timed_out
    assert not slot.closed
    # A connection that drops is no close.
    slot = Slot()
    slot.fail()
    assert slot.lost and not slot.closed
