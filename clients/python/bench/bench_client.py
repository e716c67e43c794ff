"""Client speed: what the Python client costs, beside redis-py's Lock.

A benchmark, not a test. For each client flavour, against one local
batond (and one local redis-server for redis-py), for ``--seconds`` each:

- pairs/s: 16 concurrent holders, each on a key of its own, acquire then
  release as fast as they can (threads for the blocking clients, tasks for
  asyncio);
- handoffs/s: 16 concurrent holders on one key (acquire waiting in line,
  release hands the key to the next): grants per second.

Rows: baton_locks.Client (threads), baton_locks.AsyncClient (tasks),
redis-py ``Lock`` (threads) and ``redis.asyncio`` ``Lock`` (tasks), the
redis ones with their default polling while blocked (``sleep=0.1``) and
with ``sleep=0.001``. redis-py is a bench-only dependency, never the
package's:

    python3 -m venv target/bench-venv
    target/bench-venv/bin/pip install redis ./clients/python
    apt-get install -y redis-server     # or: any redis-server on PATH
    target/bench-venv/bin/python clients/python/bench/bench_client.py \\
        --batond target/release/batond [--seconds 5]

It starts batond and redis-server on free ports of 127.0.0.1 itself
(``--threads 1`` for batond: one core of the two each) and kills them at
the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import baton_locks

HOLDERS = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen, what: str) -> None:  # type: ignore[type-arg]
    end = time.monotonic() + 10
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit("%s exited at start" % what)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise SystemExit("%s did not listen" % what)


def threads_rate(seconds: float, make_work: Callable[[int], Callable[[], None]]) -> float:
    """Run ``HOLDERS`` threads each calling its work in a loop for
    ``seconds``; operations per second."""
    counts = [0] * HOLDERS
    stop = threading.Event()
    start = threading.Barrier(HOLDERS + 1)

    def loop(i: int) -> None:
        work = make_work(i)
        start.wait()
        n = 0
        while not stop.is_set():
            work()
            n += 1
        counts[i] = n

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(HOLDERS)]
    for t in threads:
        t.start()
    start.wait()
    began = time.monotonic()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - began)


async def tasks_rate(seconds: float, make_work: Callable[[int], Callable[[], Any]]) -> float:
    counts = [0] * HOLDERS
    stop = asyncio.Event()

    async def loop(i: int) -> None:
        work = make_work(i)
        n = 0
        while not stop.is_set():
            await work()
            n += 1
        counts[i] = n

    tasks = [asyncio.ensure_future(loop(i)) for i in range(HOLDERS)]
    began = time.monotonic()
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks)
    return sum(counts) / (time.monotonic() - began)


def bench_baton_sync(addr: str, seconds: float, prefix: str) -> Dict[str, float]:
    out = {}
    with baton_locks.Client(addr) as client:

        def distinct(i: int) -> Callable[[], None]:
            key = "%s-sync-%d" % (prefix, i)

            def work() -> None:
                client.release(client.acquire(key, lease=30))

            return work

        def one_key(i: int) -> Callable[[], None]:
            key = "%s-sync-one" % prefix

            def work() -> None:
                client.release(client.acquire(key, lease=30))

            return work

        out["pairs"] = threads_rate(seconds, distinct)
        out["handoffs"] = threads_rate(seconds, one_key)
    return out


def bench_baton_async(addr: str, seconds: float, prefix: str) -> Dict[str, float]:
    async def main() -> Dict[str, float]:
        out = {}
        async with baton_locks.AsyncClient(addr) as client:

            def distinct(i: int) -> Callable[[], Any]:
                key = "%s-async-%d" % (prefix, i)

                async def work() -> None:
                    await client.release(await client.acquire(key, lease=30))

                return work

            def one_key(i: int) -> Callable[[], Any]:
                key = "%s-async-one" % prefix

                async def work() -> None:
                    await client.release(await client.acquire(key, lease=30))

                return work

            out["pairs"] = await tasks_rate(seconds, distinct)
            out["handoffs"] = await tasks_rate(seconds, one_key)
        return out

    return asyncio.run(main())


def bench_redis_sync(port: int, seconds: float, sleep: float) -> Dict[str, float]:
    import redis

    pool = redis.ConnectionPool(host="127.0.0.1", port=port, max_connections=HOLDERS + 4)
    r = redis.Redis(connection_pool=pool)
    out = {}

    def distinct(i: int) -> Callable[[], None]:
        lock = r.lock("rs-%d" % i, timeout=30, sleep=sleep)

        def work() -> None:
            lock.acquire()
            lock.release()

        return work

    def one_key(i: int) -> Callable[[], None]:
        lock = r.lock("rs-one", timeout=30, sleep=sleep)

        def work() -> None:
            lock.acquire()
            lock.release()

        return work

    out["pairs"] = threads_rate(seconds, distinct)
    out["handoffs"] = threads_rate(seconds, one_key)
    pool.disconnect()
    return out


def bench_redis_async(port: int, seconds: float, sleep: float) -> Dict[str, float]:
    import redis.asyncio as aredis

    async def main() -> Dict[str, float]:
        r = aredis.Redis(host="127.0.0.1", port=port, max_connections=HOLDERS + 4)
        out = {}

        def distinct(i: int) -> Callable[[], Any]:
            lock = r.lock("ra-%d" % i, timeout=30, sleep=sleep)

            async def work() -> None:
                await lock.acquire()
                await lock.release()

            return work

        def one_key(i: int) -> Callable[[], Any]:
            lock = r.lock("ra-one", timeout=30, sleep=sleep)

            async def work() -> None:
                await lock.acquire()
                await lock.release()

            return work

        out["pairs"] = await tasks_rate(seconds, distinct)
        out["handoffs"] = await tasks_rate(seconds, one_key)
        await r.aclose()
        return out

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batond", default=os.environ.get("BATON_BATOND", "target/release/batond"))
    parser.add_argument("--redis-server", default=shutil.which("redis-server"))
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()

    procs: List[subprocess.Popen] = []  # type: ignore[type-arg]
    try:
        port = free_port()
        batond = subprocess.Popen(
            [args.batond, "--bind", "127.0.0.1", "--port", str(port), "--threads", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(batond)
        wait_port(port, batond, "batond")
        addr = "127.0.0.1:%d" % port
        redis_port: Optional[int] = None
        if args.redis_server:
            redis_port = free_port()
            redis = subprocess.Popen(
                [args.redis_server, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            procs.append(redis)
            wait_port(redis_port, redis, "redis-server")

        rows: Dict[str, Dict[str, float]] = {}
        prefix = "b%d" % os.getpid()
        rows["baton_locks.Client (16 threads)"] = bench_baton_sync(addr, args.seconds, prefix)
        rows["baton_locks.AsyncClient (16 tasks)"] = bench_baton_async(addr, args.seconds, prefix)
        if redis_port is not None:
            try:
                import redis as _  # noqa: F401
            except ImportError:
                print("redis-py not installed: pip install redis (bench venv only)", file=sys.stderr)
            else:
                for sleep in (0.1, 0.001):
                    rows["redis-py Lock, sleep=%g (16 threads)" % sleep] = bench_redis_sync(
                        redis_port, args.seconds, sleep
                    )
                    rows["redis.asyncio Lock, sleep=%g (16 tasks)" % sleep] = bench_redis_async(
                        redis_port, args.seconds, sleep
                    )
        print("%-44s %12s %12s" % ("client", "pairs/s", "handoffs/s"))
        for name, row in rows.items():
            print("%-44s %12.0f %12.0f" % (name, row["pairs"], row["handoffs"]))
        base = {
            "sync": rows.get("redis-py Lock, sleep=0.1 (16 threads)"),
            "async": rows.get("redis.asyncio Lock, sleep=0.1 (16 tasks)"),
        }
        fast = {
            "sync": rows.get("redis-py Lock, sleep=0.001 (16 threads)"),
            "async": rows.get("redis.asyncio Lock, sleep=0.001 (16 tasks)"),
        }
        for flavour, name in (("sync", "baton_locks.Client (16 threads)"), ("async", "baton_locks.AsyncClient (16 tasks)")):
            for label, ref in (("default", base[flavour]), ("sleep=0.001", fast[flavour])):
                if ref:
                    print(
                        "%s vs redis (%s): pairs %.2fx, handoffs %.2fx"
                        % (name, label, rows[name]["pairs"] / ref["pairs"], rows[name]["handoffs"] / ref["handoffs"])
                    )
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


if __name__ == "__main__":
    main()
