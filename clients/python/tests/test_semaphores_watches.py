"""Semaphores, watches and elections against real batond processes: a
single node, and a 2-node cluster for a watch that survives a failover."""

import asyncio
import threading

import baton_locks
from conftest import DEADLINE, client_of, wait_for


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE))


def in_thread(call):
    """Run ``call`` on a thread; ``result()`` joins it (bounded) and
    returns what it returned or raises what it raised."""
    out = {}

    def body():
        try:
            out["value"] = call()
        except BaseException as e:  # handed to the test
            out["error"] = e

    thread = threading.Thread(target=body, daemon=True)
    thread.start()

    def result():
        thread.join(DEADLINE)
        assert not thread.is_alive(), "the call did not return"
        if "error" in out:
            raise out["error"]
        return out["value"]

    result.done = lambda: not thread.is_alive()
    return result


def next_state(watch):
    state = watch.get(DEADLINE)
    assert state is not None, "no state within %ss" % DEADLINE
    return state


def test_a_semaphore_of_two_grants_two_and_queues_the_third(node, closing):
    c = closing(client_of(node))
    first = c.acquire("sem", lease=30, limit=2, value="a")
    second = c.acquire("sem", lease=30, limit=2, value="b")
    assert (first.slot, second.slot) == (0, 1)
    assert second.token > first.token
    third = in_thread(lambda: c.acquire("sem", lease=30, wait=DEADLINE, limit=2))
    wait_for("the third in line", lambda: c.query("sem").waiting == 1)
    assert not third.done()
    # Another client: on the third's connection, an answer for the same
    # (op, key) would come after the third's.
    other = closing(client_of(node))
    try:
        other.acquire("sem", lease=30, wait=0, limit=3)
    except baton_locks.Refused as e:
        assert e.reason == "limit-mismatch"
    else:
        raise AssertionError("another limit while the key is held must be refused")
    assert c.release(first)
    got = third()
    assert got.slot == 0, "the slot just freed"
    assert got.token > second.token
    assert c.release(second) and c.release(got)
    # Free again: any limit registers it afresh; a plain acquire is slot 0.
    with c.lock("sem", lease=5, limit=5) as grant:
        assert grant.slot == 0
    assert c.acquire("sem", lease=5).slot == 0


def test_a_watch_sees_a_grant_a_release_and_nobody(node, closing):
    c = closing(client_of(node))
    with c.watch("job") as w:
        assert next_state(w) == ("job", 0, 0, 0, None)
        grant = c.acquire("job", lease=30, limit=1, value="worker-1")
        state = next_state(w)
        assert (state.token, state.holders, state.value) == (grant.token, 1, "worker-1")
        assert c.release(grant)
        state = next_state(w)
        assert (state.token, state.holders, state.value) == (0, 0, None)
        assert w.get(0.2) is None, "no change, no line"
    assert c.leader("job").free


def test_an_election_hands_over_when_the_leader_resigns(node, closing):
    a = closing(client_of(node))
    b = closing(client_of(node))
    follower = closing(client_of(node))
    assert follower.leader("election").token == 0, "nobody leads yet"
    with follower.observe("election") as leaders:
        assert next_state(leaders).token == 0
        first = a.campaign("election", "host-a", lease=3)
        assert first.is_leader()
        state = next_state(leaders)
        assert (state.token, state.value) == (first.token, "host-a")
        second = in_thread(lambda: b.campaign("election", "host-b", lease=3))
        wait_for("b in line", lambda: a.query("election").waiting == 1)
        assert follower.leader("election").value == "host-a"
        assert first.resign()
        assert not first.is_leader()
        won = second()
        try:
            assert won.is_leader() and won.token > first.token
            # The follower sees b leading next (a hand-over written as a
            # release and then a grant may show nobody leading in between).
            state = next_state(leaders)
            if state.token == 0:
                state = next_state(leaders)
            assert (state.token, state.value) == (won.token, "host-b")
            assert follower.leader("election").value == "host-b"
            # b keeps its 3 s lease alive past it.
            assert not won.lost.wait(4)
            assert a.query("election").token == won.token
        finally:
            won.resign()
        assert next_state(leaders).token == 0


def test_an_async_election(node):
    async def main():
        async with baton_locks.AsyncClient(node.addr) as a, baton_locks.AsyncClient(node.addr) as b:
            async with b.observe("async-election") as leaders:
                assert (await leaders.get(DEADLINE)).free
                async with await a.campaign("async-election", "a", lease=5) as leading:
                    state = await leaders.get(DEADLINE)
                    assert (state.token, state.value) == (leading.token, "a")
                    assert (await b.leader("async-election")).value == "a"
                assert (await leaders.get(DEADLINE)).free

    run(main())


def test_a_watch_survives_a_failover(pair, closing):
    active, standby = pair
    c = closing(client_of(active, standby))
    with c.watch("leader") as w:
        assert next_state(w).free
        grant = c.acquire("leader", lease=30, limit=1, value="host-a")
        state = next_state(w)
        assert (state.token, state.value) == (grant.token, "host-a")

        def replicated():
            info = standby.info()
            return info and int(info.get("held", "0")) >= 1

        wait_for("the grant to reach the standby", replicated)
        active.kill()
        # Watched again on the promoted node: its first line is its state,
        # the replicated grant with its value.
        state = next_state(w)
        assert (state.token, state.holders, state.value) == (grant.token, 1, "host-a")
        assert standby.info().get("role") == "active"
        assert c.release(grant)
        state = next_state(w)
        assert (state.token, state.holders, state.value) == (0, 0, None)
