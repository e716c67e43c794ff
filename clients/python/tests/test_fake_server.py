"""Behaviour that needs a server misbehaving on purpose: a small fake
server (``fake_server.py``) answers (or drops) each connection as a test
says."""

import asyncio
import threading
import time

import baton_locks
from conftest import DEADLINE, wait_for
from fake_server import FakeServer


def test_not_held_after_a_retry_counts_as_released(closing):
    # The first connection that sees the release drops it unanswered (the
    # release may have got through); the retry is told N: success.
    seen = []

    def handle(index, line):
        if line.startswith(b"R "):
            seen.append(index)
            if len(seen) == 1:
                return None
            return b"N job"
        return b"E - - unknown-op"

    server = FakeServer(handle)
    try:
        c = closing(baton_locks.Client(server.addr))
        assert c.release_token("job", 42) is True
        assert len(seen) == 2 and seen[0] != seen[1], "moved to the other connection"
    finally:
        server.close()


def test_not_held_at_the_first_try_is_not_held(closing):
    server = FakeServer(lambda index, line: b"N job")
    try:
        c = closing(baton_locks.Client(server.addr))
        assert c.release_token("job", 42) is False
    finally:
        server.close()


def test_an_acquire_moves_to_the_next_connection_and_fails_after_as_many_attempts(closing):
    attempts = []

    def drop_acquires(index, line):
        attempts.append(index)
        return None

    server = FakeServer(drop_acquires)
    try:
        c = closing(baton_locks.Client(server.addr))
        try:
            c.acquire("job", lease=5)
        except baton_locks.Unavailable as e:
            assert "each of 2 attempts" in str(e)
        else:
            raise AssertionError("an acquire with every connection dropping must fail")
        assert len(attempts) == 2 and attempts[0] != attempts[1]
    finally:
        server.close()


def test_no_active_node_known_is_retried_shortly(closing):
    # A standby that knows no active node at first, then serves.
    calls = []

    def handle(index, line):
        calls.append(line)
        if len(calls) < 3:
            return b"M - A job"
        return b"A 77 job"

    server = FakeServer(handle)
    try:
        c = closing(baton_locks.Client(server.addr))
        grant = c.acquire("job", lease=5)
        assert grant.token == 77 and len(calls) == 3
    finally:
        server.close()


def test_answers_in_another_order_than_the_requests_reach_their_callers(closing):
    # Each connection holds its first query back and answers it after the
    # second: the answers come reversed.
    held = {}

    def handle(index, line):
        key = line.split(b" ")[1]
        answer = b"Q " + key + b" 0 0 " + str(len(key)).encode()
        if index not in held:
            held[index] = answer
            return b""
        return answer + b"\n" + held.pop(index)

    server = FakeServer(handle)
    try:
        c = closing(baton_locks.Client(server.addr))
        wait_for("both connections up", lambda: all(up for _, up, _ in c.connections()))
        results = {}

        def ask(key):
            results[key] = c.query(key).waiting

        keys = ["k" * n for n in range(1, 5)]
        threads = [threading.Thread(target=ask, args=(key,)) for key in keys]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE)
        assert results == {key: len(key) for key in keys}
    finally:
        server.close()


def test_a_grant_that_waited_longer_than_its_lease_is_confirmed_not_asked_again(closing):
    # The grant comes after more than its lease (it waited in line): counted
    # from the acquire it looks spent, but the server started it at the
    # hand-over. The client confirms it with K and returns it.
    def handle(index, line):
        if line.startswith(b"A slow "):
            time.sleep(0.4)  # not a synchronisation: the lease must pass
            return b"A 5 slow"
        if line.startswith(b"K slow 5 "):
            return b"K slow"
        return b"E - - unknown-op"

    server = FakeServer(handle)
    try:
        c = closing(baton_locks.Client(server.addr))
        grant = c.acquire("slow", lease=0.3)
        assert grant.token == 5
        assert [line.split(b" ")[0] for _, line in server.lines] == [b"A", b"K"]
    finally:
        server.close()


def test_hostile_answers_close_the_connection_and_fail_the_call(closing):
    hostile = [
        b"this is not an answer",
        b"Q someone-else 0 0 0",  # answers no request
        b"A 18446744073709551616 job",  # token out of range
        b"A " + b"9" * 2000 + b" job",  # longer than a line may be
        b"E - - too-many-connections",
    ]
    for answer in hostile:
        server = FakeServer(lambda index, line, answer=answer: answer)
        try:
            c = closing(baton_locks.Client(server.addr))
            try:
                c.acquire("job", lease=5)
            except baton_locks.Unavailable:
                pass
            else:
                raise AssertionError("%r was taken for an answer" % answer[:40])
            wait_for(
                "the connections to be closed",
                lambda: not any(up for _, up, _ in c.connections()),
            )
        finally:
            server.close()


def test_requests_go_round_robin_over_the_connections(closing):
    server = FakeServer(lambda index, line: b"Q " + line.split(b" ")[1] + b" 0 0 0")
    try:
        c = closing(baton_locks.Client(server.addr))
        wait_for("both connections up", lambda: all(up for _, up, _ in c.connections()))
        for i in range(6):
            assert c.query("k%d" % i).free
        used = [index for index, _ in server.lines]
        assert len(used) == 6 and sorted(set(used)) == [0, 1], used
        assert all(a != b for a, b in zip(used, used[1:])), "turn by turn: %r" % used
    finally:
        server.close()


def test_redirects_stop_after_eight(closing):
    # Two nodes that each name the other as the active one.
    servers = []
    servers.append(FakeServer(lambda index, line: b"M " + servers[1].addr.encode() + b" A job"))
    servers.append(FakeServer(lambda index, line: b"M " + servers[0].addr.encode() + b" A job"))
    try:
        c = closing(baton_locks.Client(servers[0].addr))
        try:
            c.acquire("job", lease=5, wait=1)
        except baton_locks.Unavailable as e:
            assert "redirected 8 times" in str(e), e
        else:
            raise AssertionError("an endless redirect must fail")
        sent = len(servers[0].lines) + len(servers[1].lines)
        assert sent == 9, "the first request and eight redirected ones, not %d" % sent
        assert servers[1].addr in c.servers, "learned from the redirect"
    finally:
        for server in servers:
            server.close()


def test_an_acquire_cancelled_while_its_grant_is_confirmed_releases_it(closing):
    # The grant comes late (it waited in line), so the client confirms it
    # with K, which this server never answers; the task is cancelled
    # meanwhile. The grant had arrived, so nothing else would release it.
    def handle(index, line):
        if line.startswith(b"A job "):
            time.sleep(0.2)  # not a synchronisation: the grant must come late
            return b"A 5 job"
        if line.startswith(b"R job 5"):
            return b"R job"
        return b""

    server = FakeServer(handle)
    try:
        c = closing(baton_locks.AsyncClient(server.addr))

        def sent(prefix):
            return any(line.startswith(prefix) for _, line in server.lines)

        async def main():
            task = asyncio.ensure_future(c.acquire("job", lease=0.3))
            end = time.monotonic() + DEADLINE
            while not sent(b"K job 5 "):
                assert time.monotonic() < end, "no confirming K"
                await asyncio.sleep(0.01)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            else:
                raise AssertionError("the acquire was cancelled")

        asyncio.run(asyncio.wait_for(main(), DEADLINE))
        wait_for("the grant to be released", lambda: sent(b"R job 5"))
    finally:
        server.close()


def confirm_gated_server(gate):
    """Grants ``job`` (token 5) 200 ms after the acquire, more than a third
    of a 300 ms lease, so that the client confirms it with K; the K's
    answer waits until ``gate`` is set. Answers R and I (a closing
    client's settle) too."""

    def handle(index, line):
        if line.startswith(b"A job "):
            time.sleep(0.2)  # not a synchronisation: the grant must come late
            return b"A 5 job"
        if line.startswith(b"K job 5 "):
            gate.wait(DEADLINE)
            return b"K job"
        if line == b"R job 5":
            return b"R job"
        if line == b"I":
            return b"I role=active"
        return b"E - - unknown-op"

    return FakeServer(handle)


def test_close_while_a_grant_is_confirmed_releases_it_and_fails_the_acquire(closing):
    # A close that begins while the acquire's confirming K is out ends the
    # call: it releases the grant itself, on a connection close keeps open
    # for it, and raises Closed, rather than return a grant on a closed
    # client that can no longer release it (held for its whole lease).
    gate = threading.Event()
    server = confirm_gated_server(gate)
    try:
        c = closing(baton_locks.Client(server.addr))
        outcome = []

        def acquire():
            try:
                outcome.append(c.acquire("job", lease=0.3))
            except baton_locks.Error as e:
                outcome.append(e)

        acquirer = threading.Thread(target=acquire, daemon=True)
        acquirer.start()
        wait_for("the confirming K", lambda: server.sent(b"K job 5 "))
        closer = threading.Thread(target=c.close, daemon=True)
        closer.start()
        wait_for("close to begin", lambda: c.closed)
        gate.set()
        closer.join(DEADLINE)
        assert not closer.is_alive(), "close returned"
        acquirer.join(DEADLINE)
        assert len(outcome) == 1 and isinstance(outcome[0], baton_locks.Closed), outcome
        # Received before close returned, so before the sockets closed.
        assert server.sent(b"R job 5"), server.lines
    finally:
        gate.set()
        server.close()


def test_an_async_close_while_a_grant_is_confirmed_releases_it_and_fails_the_acquire(closing):
    gate = threading.Event()
    server = confirm_gated_server(gate)
    try:
        c = closing(baton_locks.AsyncClient(server.addr))

        async def main():
            task = asyncio.ensure_future(c.acquire("job", lease=0.3))
            while not server.sent(b"K job 5 "):
                await asyncio.sleep(0.01)
            closer = asyncio.ensure_future(c.close())
            while not c.closed:
                await asyncio.sleep(0)
            gate.set()
            await closer
            try:
                await task
            except baton_locks.Closed:
                pass
            else:
                raise AssertionError("the acquire returned its grant on a closed client")
            # Received before close returned, so before the sockets closed.
            assert server.sent(b"R job 5"), server.lines

        asyncio.run(asyncio.wait_for(main(), DEADLINE))
    finally:
        gate.set()
        server.close()
