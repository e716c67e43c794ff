"""The blocking client against one real batond."""

import signal
import socket
import threading
import time

import pytest

import baton_locks
from conftest import DEADLINE, client_of, wait_for


def test_acquire_query_keep_release(node, closing):
    c = closing(client_of(node))
    before = time.monotonic()
    grant = c.acquire("job", lease=5)
    assert grant.key == "job" and grant.token > 0
    assert before + 5 <= grant.expires_at <= time.monotonic() + 5
    status = c.query("job")
    assert (status.token, status.waiting) == (grant.token, 0)
    assert 0 < status.time_left <= 5

    c.keep(grant, 60)
    assert grant.time_left() > 5
    assert c.query("job").time_left > 5

    assert c.release(grant) is True
    assert c.query("job").free
    assert c.release(grant) is False, "released already: not held"
    with pytest.raises(baton_locks.NotHeld):
        c.keep(grant, 5)


def test_a_held_key_times_out_and_wait_zero_does_not_queue(node, closing):
    c = closing(client_of(node))
    held = c.acquire("job", lease=30)
    start = time.monotonic()
    with pytest.raises(baton_locks.Timeout):
        c.acquire("job", lease=30, wait=0)
    with pytest.raises(baton_locks.Timeout):
        c.acquire("job", lease=30, wait=0.05)
    assert time.monotonic() - start < DEADLINE
    status = c.query("job")
    assert (status.token, status.waiting) == (held.token, 0), "nothing was left in line"


def test_bad_arguments_and_refusals(node, closing):
    c = closing(client_of(node))
    for bad in ["", "a b", "x" * 251, "tab\there"]:
        with pytest.raises(ValueError):
            c.acquire(bad, lease=1)
    with pytest.raises(ValueError):
        c.acquire("k", lease=0)
    with pytest.raises(baton_locks.Refused) as refused:
        c.acquire("k", lease=10**6)
    assert refused.value.reason == "lease-too-long"
    with pytest.raises(ValueError):
        baton_locks.Client([])
    with pytest.raises(ValueError):
        baton_locks.Client("host:notaport")


def test_one_address_gets_two_connections(node, closing):
    c = closing(client_of(node))
    wait_for("two connections up", lambda: sum(up for _, up, _ in c.connections()) == 2)
    assert len(c.connections()) == 2
    assert node.info()["conns"] == "3", "the client's two and this probe's"
    assert c.servers == [node.addr]


def test_waiters_are_served_in_order_across_threads(node, closing):
    c = closing(client_of(node))
    first = c.acquire("queue", lease=30)
    got = []
    lock = threading.Lock()

    def wait_in_line(i):
        grant = c.acquire("queue", lease=30)
        with lock:
            got.append((i, grant.token))
        c.release(grant)

    threads = []
    for i in range(4):
        t = threading.Thread(target=wait_in_line, args=(i,))
        t.start()
        threads.append(t)
        wait_for("waiter %d in line" % i, lambda i=i: c.query("queue").waiting == i + 1)
    assert c.release(first)
    for t in threads:
        t.join(DEADLINE)
    assert [i for i, _ in got] == [0, 1, 2, 3], "FIFO"
    tokens = [t for _, t in got]
    assert tokens == sorted(tokens) and tokens[0] > first.token


def test_many_requests_are_pipelined_on_two_connections(node, closing):
    c = closing(client_of(node))
    grants = []
    errors = []

    def worker(w):
        try:
            for i in range(50):
                g = c.acquire("k-%d-%d" % (w, i), lease=10)
                grants.append(g)
                assert c.release(g)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE * 3)
    assert not errors, errors
    assert len({g.token for g in grants}) == 400


def test_the_lock_context_manager_releases_on_an_exception(node, closing):
    c = closing(client_of(node))
    with pytest.raises(RuntimeError):
        with c.lock("ctx", lease=30) as grant:
            assert c.query("ctx").token == grant.token
            raise RuntimeError("the work failed")
    assert c.query("ctx").free


def test_a_restarted_server_is_reconnected_in_the_background(nodes, closing):
    first = nodes()
    c = closing(client_of(first))
    c.acquire("before", lease=30)
    first.kill()
    # Every connection is down: calls fail at once, they do not hang.
    wait_for("the connections to drop", lambda: not any(up for _, up, _ in c.connections()))
    with pytest.raises(baton_locks.Unavailable):
        c.query("k")
    nodes(port=first.port)

    def served():
        try:
            return c.acquire("after", lease=30, wait=1)
        except baton_locks.Unavailable:
            return None

    grant = wait_for("the client to reconnect (every 3 s)", served)
    assert grant.token > 0


def test_nothing_listening_is_unavailable_at_once(closing):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = closing(baton_locks.Client("127.0.0.1:%d" % port))
    start = time.monotonic()
    with pytest.raises(baton_locks.Unavailable) as e:
        c.acquire("k", lease=1)
    assert "refused" in str(e.value)
    assert time.monotonic() - start < DEADLINE


def test_a_silent_server_is_given_up_after_the_request_timeout(closing):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        addr = "127.0.0.1:%d" % silent.getsockname()[1]
        c = closing(baton_locks.Client(addr, request_timeout=0.3))
        with pytest.raises(baton_locks.Unavailable) as e:
            c.query("k")
        assert "no answer" in str(e.value)
    finally:
        silent.close()



def up_count(c):
    return sum(up for _, up, _ in c.connections())


def test_a_dropped_connection_is_tried_again_three_seconds_later(node, proxy, closing):
    p = proxy(node)
    c = closing(baton_locks.Client(p.addr))
    p.wait_linked(2)
    assert p.accepted == 2
    cut = time.monotonic()
    p.cut()
    wait_for("both connections down", lambda: up_count(c) == 0)
    # All down and none connecting: a call fails at once, it does not sit
    # until the reconnect.
    start = time.monotonic()
    with pytest.raises(baton_locks.Unavailable):
        c.query("k")
    assert time.monotonic() - start < 0.5
    wait_for("both connections back", lambda: up_count(c) == 2)
    took = time.monotonic() - cut
    assert 2.9 <= took < 6, "reconnected after %.2fs" % took
    p.wait_linked(2)
    assert p.accepted == 4, "one attempt per connection"
    assert c.query("k").free


def test_a_release_is_retried_until_a_connection_is_back(node, proxy, closing):
    p = proxy(node)
    c = closing(baton_locks.Client(p.addr))
    grant = c.acquire("job", lease=30)
    p.wait_linked(2)
    p.cut()
    wait_for("both connections down", lambda: up_count(c) == 0)
    # They come back 3 s after the drop: until then the release finds no
    # connection and tries again every 200 ms (for up to 5 s).
    start = time.monotonic()
    assert c.release(grant) is True, "the server still held it"
    took = time.monotonic() - start
    assert 2.5 <= took < 5.5, "released after %.2fs" % took
    assert closing(client_of(node)).query("job").free


def test_a_release_gives_up_after_five_seconds(closing):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = closing(baton_locks.Client("127.0.0.1:%d" % port))
    start = time.monotonic()
    with pytest.raises(baton_locks.Unavailable):
        c.release_token("job", 42)
    took = time.monotonic() - start
    assert 4.7 <= took < 7, "gave up after %.2fs" % took


def test_an_interrupted_blocking_acquire_gives_up_its_request(node, closing):
    # A signal handler that raises (Ctrl+C's KeyboardInterrupt, a timeout
    # alarm) cuts a blocking acquire short; the request still waits in line
    # on the server, and the grant it gets later must be released, not
    # held until its lease runs out.
    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted()

    c = closing(client_of(node))
    watcher = closing(client_of(node))
    held = c.acquire("job", lease=30)
    main = threading.main_thread().ident

    def send_signal_once_in_line():
        wait_for("the acquire to wait in line", lambda: watcher.query("job").waiting == 1)
        signal.pthread_kill(main, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        sender = threading.Thread(target=send_signal_once_in_line, daemon=True)
        sender.start()
        # Kept until the end, as a caller may keep it (this also keeps the
        # call's frames alive, so garbage collection cannot stand in for
        # giving up the request).
        with pytest.raises(Interrupted) as interrupted:
            c.acquire("job", lease=30)
        sender.join(DEADLINE)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert c.release(held)
    wait_for("the unwanted grant to be released", lambda: watcher.query("job").free)
    assert interrupted.type is Interrupted


def _wait_in_line(c, key, name, granted, watcher, waiting):
    """``c`` asks for ``key`` without a wait limit on its own thread; the
    grant goes to ``granted`` as (name, grant) once ``waiting`` are in line."""

    def run():
        granted.put((name, c.acquire(key, lease=30)))

    threading.Thread(target=run, daemon=True).start()
    wait_for("%s waits in line" % name, lambda: watcher.query(key).waiting == waiting)


def test_a_try_acquire_behind_the_clients_own_waiter_times_out_and_the_waiter_keeps_its_place(
    node, closing
):
    import queue

    c, other = closing(client_of(node)), closing(client_of(node))
    holder = other.acquire("own", lease=30)
    granted = queue.Queue()
    _wait_in_line(c, "own", "first", granted, other, 1)
    # Two in a row: round-robin alone would put one of them behind the
    # waiter, where the server holds its T back until the waiter is
    # answered (and the connection, deemed dead, would be closed).
    for _ in range(2):
        with pytest.raises(baton_locks.Timeout):
            c.acquire("own", lease=30, wait=0)
    _wait_in_line(other, "own", "second", granted, other, 2)
    assert other.release(holder) is True
    name, first = granted.get(timeout=DEADLINE)
    assert name == "first" and first.token > holder.token
    assert c.release(first) is True
    name, second = granted.get(timeout=DEADLINE)
    assert name == "second" and second.token > first.token
    assert other.release(second) is True


def test_a_try_acquire_held_back_on_every_connection_times_out_without_closing_one(node, closing):
    import queue

    # A short request timeout: the try-acquire's answer is due within it
    # (plus its wait), by which time the server still holds it back.
    c = closing(client_of(node, request_timeout=0.3))
    other = closing(client_of(node))
    holder = other.acquire("full", lease=30)
    granted = queue.Queue()
    # One waiter of c on each of its two connections, another client's
    # behind them.
    _wait_in_line(c, "full", "first", granted, other, 1)
    _wait_in_line(c, "full", "second", granted, other, 2)
    _wait_in_line(other, "full", "third", granted, other, 3)
    with pytest.raises(baton_locks.Timeout):
        c.acquire("full", lease=30, wait=0)
    # Had a connection been closed, its waiter would have been sent again,
    # behind the third.
    assert other.release(holder) is True
    last = holder
    for want in ["first", "second", "third"]:
        name, grant = granted.get(timeout=DEADLINE)
        assert name == want and grant.token > last.token
        assert other.release(grant) is True
        last = grant
