"""Semaphores, watches and campaigns at the wire level, against the fake
server of ``fake_server.py``: the exact lines the client sends and how it
reads the answers, re-watches after a dropped connection or a redirect,
and keeps a campaign alive. ``test_semaphores_watches.py`` runs the same
calls against a real batond."""

import asyncio
import threading

import pytest

import baton_locks
from conftest import DEADLINE, wait_for
from fake_server import FakeServer


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE))


def up(client):
    wait_for("every connection up", lambda: all(ok for _, ok, _ in client.connections()))


@pytest.fixture
def fake():
    """``fake(handle)``: a FakeServer, closed when the test ends."""
    made = []

    def start(handle):
        server = FakeServer(handle)
        made.append(server)
        return server

    yield start
    for server in made:
        server.close()


def watch_server(fake, first=b"0 0 0 -"):
    """A server answering ``W k`` with ``W k <first>`` and ``X k`` with
    ``X k``."""

    def handle(index, line):
        op, _, key = line.partition(b" ")
        if op == b"W":
            return b"W " + key + b" " + first
        if op == b"X":
            return b"X " + key
        return b"E - - unknown-op"

    return fake(handle)


# --- acquire with a limit and a value ---------------------------------------


def test_a_limit_and_a_value_are_sent_as_trailing_fields(fake, closing):
    def handle(index, line):
        if line.startswith(b"R "):
            return b"R k"
        # With a limit (a fifth field), a slot; else the plain answer.
        return b"A 7 k 2" if len(line.split(b" ")) > 4 else b"A 8 k"

    server = fake(handle)
    c = closing(baton_locks.Client(server.addr))
    grant = c.acquire("k", lease=30, limit=3, value="host-a")
    assert server.lines[-1][1] == b"A k 30.000 0.000 3 host-a"
    assert (grant.token, grant.slot) == (7, 2)
    grant = c.acquire("k", lease=30, wait=2, limit=3)
    assert server.lines[-1][1] == b"A k 30.000 2.000 3"
    assert grant.slot == 2
    # A value needs a limit before it: limit 1, a plain lock.
    grant = c.acquire("k", lease=30, value=b"host-b")
    assert server.lines[-1][1] == b"A k 30.000 0.000 1 host-b"
    assert grant.slot == 2  # what this fake answers
    # No limit: the line and the answer of a plain lock, slot 0.
    grant = c.acquire("k", lease=30)
    assert server.lines[-1][1] == b"A k 30.000 0.000"
    assert (grant.token, grant.slot) == (8, 0)
    with c.lock("k", lease=5, limit=3, value="v") as grant:
        assert grant.slot == 2
    assert server.sent(b"A k 5.000 0.000 3 v")


def test_limit_mismatch_is_refused(fake, closing):
    server = fake(lambda index, line: b"E A k limit-mismatch")
    c = closing(baton_locks.Client(server.addr))
    with pytest.raises(baton_locks.Refused) as e:
        c.acquire("k", lease=30, limit=2)
    assert (e.value.reason, e.value.op) == ("limit-mismatch", "A")


def test_a_slot_out_of_range_closes_the_connection(fake, closing):
    server = fake(lambda index, line: b"A 7 k 10000")
    c = closing(baton_locks.Client(server.addr))
    with pytest.raises(baton_locks.Unavailable):
        c.acquire("k", lease=30, limit=3)


LIMIT_RULE = "limit must be None or a whole number from 1 to 10000"
VALUE_RULE = "value must be None or str or bytes of 1 to 250 bytes without spaces or control characters"


def test_bad_limits_and_values_are_refused_before_anything_is_sent(fake, closing):
    server = fake(lambda index, line: b"E - - unknown-op")
    c = closing(baton_locks.Client(server.addr))
    for limit in (0, -1, 10001, 2**70):
        with pytest.raises(ValueError) as e:
            c.acquire("k", lease=5, limit=limit)
        assert LIMIT_RULE in str(e.value), str(e.value)
    for limit in (True, 2.0, "3", b"3"):
        with pytest.raises(TypeError) as e:
            c.acquire("k", lease=5, limit=limit)
        assert LIMIT_RULE in str(e.value), str(e.value)
    for value in ("", b"", "a b", "tab\there", b"del\x7f", "x" * 251, "é" * 126):
        with pytest.raises(ValueError) as e:
            c.acquire("k", lease=5, value=value)
        assert VALUE_RULE in str(e.value), str(e.value)
        with pytest.raises(ValueError):
            with c.lock("k", lease=5, limit=2, value=value):
                raise AssertionError("locked with value %r" % (value,))
    for value in (5, ["a"], object()):
        with pytest.raises(TypeError) as e:
            c.acquire("k", lease=5, value=value)
        assert VALUE_RULE in str(e.value), str(e.value)
    with pytest.raises(TypeError, match="value must be str or bytes"):
        c.campaign("k", None, lease=5)
    with pytest.raises(ValueError, match="value must be"):
        c.campaign("k", "a b", lease=5)
    with pytest.raises(TypeError, match="a key is str or bytes"):
        c.watch(5)
    with pytest.raises(ValueError, match="bad key"):
        c.leader("a b")

    async def main():
        a = baton_locks.AsyncClient(server.addr)
        try:
            with pytest.raises(ValueError, match=LIMIT_RULE):
                await a.acquire("k", lease=5, limit=0)
            with pytest.raises(TypeError, match="value must be"):
                await a.campaign("k", 7, lease=5)
        finally:
            await a.close()

    run(main())
    assert server.lines == [], "nothing was sent"


# --- watch ---------------------------------------------------------------


def test_a_watch_yields_the_state_now_then_each_change_and_sends_x_on_close(fake, closing):
    server = watch_server(fake)
    c = closing(baton_locks.Client(server.addr))
    with c.watch("k") as w:
        first = next(w)
        assert first == baton_locks.WatchState("k", 0, 0, 0, None)
        assert first.free
        ((index, line),) = server.sent(b"W ")
        assert line == b"W k"
        server.send(index, b"W k 5 1 0 host-a")
        server.send(index, b"W k 6 2 3 host-b")
        server.send(index, b"W k 0 0 0 -")
        assert next(w) == ("k", 5, 1, 0, "host-a")
        state = next(w)
        assert (state.token, state.holders, state.waiting, state.value) == (6, 2, 3, "host-b")
        assert next(w).value is None
        assert w.get(timeout=0.05) is None, "no change, no state"
    wait_for("X k", lambda: server.sent(b"X k"))
    assert w.closed
    assert list(w) == [], "a closed watch ends"
    assert [line for _, line in server.lines] == [b"W k", b"X k"]


def test_a_value_that_is_not_utf8_is_bytes(fake, closing):
    server = watch_server(fake, first=b"3 1 0 \xff\xfe")
    c = closing(baton_locks.Client(server.addr))
    with c.watch(b"k") as w:
        assert next(w).value == b"\xff\xfe"


def test_a_watch_is_made_again_when_the_connection_ends(fake, closing):
    answers = iter([b"W k 5 1 0 a", b"W k 9 1 0 b"])
    server = fake(lambda index, line: next(answers, b"W k 0 0 0 -") if line == b"W k" else b"X k")
    c = closing(baton_locks.Client(server.addr))
    up(c)
    with c.watch("k") as w:
        assert next(w).token == 5
        ((index, _),) = server.sent(b"W k")
        server.drop(index)
        state = w.get(DEADLINE)
        assert state is not None and (state.token, state.value) == (9, "b")
        again = server.sent(b"W k")
        assert len(again) == 2 and again[1][0] != index, "watched again on the other connection"


def test_a_watch_follows_a_redirect_to_the_active(fake, closing):
    active = watch_server(fake, first=b"12 1 0 leader")
    standby = fake(lambda index, line: b"M " + active.addr.encode() + b" " + line)
    c = closing(baton_locks.Client(standby.addr))
    with c.watch("k") as w:
        assert next(w).value == "leader"
        assert standby.sent(b"W k") and active.sent(b"W k")
        assert active.addr in c.servers


def test_a_watch_moves_when_its_node_answers_m_later(fake, closing):
    # The node that serves the watch hands over: it pushes M naming the new
    # active, which the client watches instead, yielding its state.
    new = watch_server(fake, first=b"21 1 0 b")
    old = watch_server(fake, first=b"20 1 0 a")
    c = closing(baton_locks.Client([old.addr, new.addr]))
    up(c)
    c._pool.prefer(0)
    with c.watch("k") as w:
        assert next(w).token == 20
        ((index, _),) = old.sent(b"W k")
        old.send(index, b"M " + new.addr.encode() + b" W k")
        state = w.get(DEADLINE)
        assert state is not None and (state.token, state.value) == (21, "b")
    wait_for("X k on the new active", lambda: new.sent(b"X k"))
    assert not old.sent(b"X k"), "the old node had dropped the watch itself"


def test_no_active_known_is_asked_again(fake, closing):
    calls = []

    def handle(index, line):
        calls.append(line)
        return b"M - W k" if len(calls) < 3 else b"W k 4 1 0 -"

    server = fake(handle)
    c = closing(baton_locks.Client(server.addr))
    assert c.leader("k").token == 4
    assert calls[:3] == [b"W k"] * 3


def test_two_watches_of_one_key_share_one_w(fake, closing):
    server = watch_server(fake, first=b"5 1 0 a")
    c = closing(baton_locks.Client(server.addr))
    first = c.watch("k")
    second = c.watch("k")
    assert next(first).token == 5 and next(second).token == 5
    third = c.watch("k")
    assert next(third).token == 5, "a later watch starts from the latest state"
    ((index, _),) = server.sent(b"W k")
    server.send(index, b"W k 6 1 0 b")
    assert [next(w).token for w in (first, second, third)] == [6, 6, 6]
    first.close()
    second.close()
    assert not server.sent(b"X k"), "one watch of the key is still open"
    third.close()
    wait_for("X k", lambda: server.sent(b"X k"))
    # A new watch after the X subscribes afresh.
    with c.watch("k") as again:
        assert next(again).token == 5
    assert len(server.sent(b"W k")) == 2


def test_a_watch_dropped_without_closing_is_unwatched(fake, closing):
    server = watch_server(fake)
    c = closing(baton_locks.Client(server.addr))
    w = c.watch("k")
    assert next(w).free
    del w
    wait_for("X k", lambda: server.sent(b"X k"))


def test_observe_skips_states_of_the_same_token(fake, closing):
    answers = iter([b"W k 5 1 0 a", b"W k 5 1 2 a"])
    server = fake(lambda index, line: next(answers, b"W k 0 0 0 -") if line == b"W k" else b"X k")
    c = closing(baton_locks.Client(server.addr))
    up(c)
    with c.observe("k") as leaders:
        assert next(leaders).token == 5
        ((index, _),) = server.sent(b"W k")
        server.drop(index)  # watched again: the same leader, not a change
        wait_for("the watch made again", lambda: len(server.sent(b"W k")) == 2)
        index = server.sent(b"W k")[1][0]
        server.send(index, b"W k 0 0 0 -")
        server.send(index, b"W k 8 1 0 b")
        assert [next(leaders).token, next(leaders).token] == [0, 8]


def test_leader_is_one_w_then_x(fake, closing):
    server = watch_server(fake, first=b"17 1 4 host-a")
    c = closing(baton_locks.Client(server.addr))
    state = c.leader("k")
    assert (state.token, state.holders, state.waiting, state.value) == (17, 1, 4, "host-a")
    wait_for("X k", lambda: server.sent(b"X k"))
    assert [line for _, line in server.lines] == [b"W k", b"X k"]
    assert c.leader("k").token == 17


def test_too_many_watches_is_raised_from_the_iterator(fake, closing):
    server = fake(lambda index, line: b"E W k too-many-watches")
    c = closing(baton_locks.Client(server.addr))
    w = c.watch("k")
    with pytest.raises(baton_locks.Refused) as e:
        next(w)
    assert (e.value.reason, e.value.op) == ("too-many-watches", "W")
    assert w.closed and list(w) == []
    with pytest.raises(baton_locks.Refused):
        c.leader("k")


def test_a_server_that_does_not_know_w_is_refused_not_asked_forever(fake, closing):
    server = fake(lambda index, line: b"E - - unknown-op")
    c = closing(baton_locks.Client(server.addr))
    with pytest.raises(baton_locks.Refused) as e:
        c.leader("k")
    assert e.value.reason == "unknown-op"
    assert len(server.sent(b"W k")) == 1


def test_closing_the_client_ends_its_watches(fake):
    server = watch_server(fake)
    c = baton_locks.Client(server.addr)
    w = c.watch("k")
    assert next(w).free
    ended = threading.Event()

    def drain():
        for _ in w:
            pass
        ended.set()

    threading.Thread(target=drain, daemon=True).start()
    c.close()
    assert ended.wait(DEADLINE), "the iterator ended with its client"
    with pytest.raises(baton_locks.Unavailable):
        c.watch("k")


def test_the_async_watch(fake, closing):
    server = watch_server(fake)
    c = closing(baton_locks.AsyncClient(server.addr))

    async def main():
        async with c.watch("k") as w:
            assert (await w.__anext__()).free
            ((index, _),) = server.sent(b"W k")
            server.send(index, b"W k 3 1 0 x")
            server.send(index, b"W k 0 0 0 -")
            seen = []
            async for state in w:
                seen.append(state.token)
                if len(seen) == 2:
                    break
            assert seen == [3, 0]
            assert await w.get(timeout=0.05) is None
        assert (await c.leader("k")).free
        async with c.observe("k") as leaders:
            assert (await leaders.get(DEADLINE)).token == 0

    run(main())
    wait_for("X k", lambda: server.sent(b"X k"))


# --- campaign ------------------------------------------------------------


def campaign_server(fake, lose_after=None):
    """Grants ``k`` (token 11), keeps it, and answers the ``lose_after``-th
    K with ``E K k not-held``."""
    keeps = []

    def handle(index, line):
        if line.startswith(b"A k "):
            return b"A 11 k 0"
        if line.startswith(b"K k "):
            keeps.append(line)
            if lose_after is not None and len(keeps) >= lose_after:
                return b"E K k not-held"
            return b"K k"
        if line.startswith(b"R k 11"):
            return b"R k"
        return b"E - - unknown-op"

    server = fake(handle)
    return server, keeps


def test_a_campaign_keeps_its_lease_alive_and_sees_the_loss(fake, closing):
    server, keeps = campaign_server(fake, lose_after=3)
    c = closing(baton_locks.Client(server.addr))
    leading = c.campaign("k", "host-a", lease=0.3)
    assert server.lines[0][1] == b"A k 0.300 0.000 1 host-a"
    assert (leading.token, leading.slot, leading.value) == (11, 0, "host-a")
    assert leading.is_leader()
    assert leading.lost.wait(DEADLINE), "the third K is answered not-held"
    assert not leading.is_leader()
    assert isinstance(leading.error, baton_locks.NotHeld)
    assert keeps == [b"K k 11 0.300"] * 3
    assert leading.wait_lost(0) is leading.error
    # Resigning after a loss still tells the server (which says not held).
    leading.resign()
    assert server.sent(b"R k 11")


def test_a_campaign_resigned_releases_and_stops_keeping(fake, closing):
    server, keeps = campaign_server(fake)
    c = closing(baton_locks.Client(server.addr))
    with c.campaign("k", b"host-a", lease=0.3) as leading:
        wait_for("two keeps", lambda: len(keeps) >= 2)
        assert leading.is_leader() and not leading.lost.is_set()
    assert server.sent(b"R k 11")
    assert not leading.is_leader()
    count = len(keeps)
    assert not leading.lost.wait(0.3), "a resigned campaign is not lost"
    assert len(keeps) == count, "no K after resigning"


def test_a_held_grant_dropped_without_release_is_released(fake, closing):
    server, keeps = campaign_server(fake)
    c = closing(baton_locks.Client(server.addr))
    held = c.hold("k", lease=30, limit=2, value="v")
    assert server.lines[0][1] == b"A k 30.000 0.000 2 v"
    del held
    wait_for("the dropped grant released", lambda: server.sent(b"R k 11"))


def test_the_async_campaign(fake, closing):
    server, keeps = campaign_server(fake, lose_after=2)
    c = closing(baton_locks.AsyncClient(server.addr))

    async def main():
        leading = await c.campaign("k", "host-a", lease=0.3)
        assert leading.is_leader()
        assert isinstance(await leading.wait_lost(DEADLINE), baton_locks.NotHeld)
        assert not leading.is_leader()
        async with await c.campaign("k", "host-a", lease=30) as again:
            assert again.is_leader()
            assert await again.wait_lost(0.01) is None
        assert not again.is_leader()

    run(main())
    assert server.sent(b"R k 11")
