"""baton_locks.AsyncClient against one real batond."""

import asyncio

import pytest

import baton_locks
from conftest import DEADLINE


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE))


def test_the_async_calls_work_end_to_end(node):
    async def main():
        async with baton_locks.AsyncClient(node.addr) as c:
            grant = await c.acquire("job", lease=2)
            assert (await c.query("job")).token == grant.token
            await c.keep(grant, 30)
            assert (await c.query("job")).time_left > 2
            with pytest.raises(baton_locks.Timeout):
                await c.acquire("job", lease=5, wait=0)
            assert await c.release(grant) is True
            assert await c.release(grant) is False
            async with c.lock("ctx", lease=5) as g:
                assert (await c.query("ctx")).token == g.token
            assert (await c.query("ctx")).free

    run(main())


def test_a_waiting_acquire_is_woken_by_the_hand_over(node):
    async def main():
        async with baton_locks.AsyncClient(node.addr) as c:
            held = await c.acquire("job", lease=30)
            waiter = asyncio.ensure_future(c.acquire("job", lease=30))
            while (await c.query("job")).waiting != 1:
                await asyncio.sleep(0.01)
            # Other calls go on meanwhile: the loop is not blocked.
            assert (await c.query("other")).free
            assert await c.release(held)
            grant = await waiter
            assert grant.token > held.token

    run(main())


def test_a_cancelled_acquire_leaves_nothing_held(node):
    async def main():
        async with baton_locks.AsyncClient(node.addr) as c:
            held = await c.acquire("job", lease=30)
            waiter = asyncio.ensure_future(c.acquire("job", lease=30))
            while (await c.query("job")).waiting != 1:
                await asyncio.sleep(0.01)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            # The request is still in line on the server; when the key
            # reaches it, the client releases the grant nobody awaits.
            assert await c.release(held)
            while not (await c.query("job")).free:
                await asyncio.sleep(0.01)

    run(main())


def test_many_tasks_share_the_connections(node):
    async def main():
        async with baton_locks.AsyncClient(node.addr) as c:
            async def one(i):
                g = await c.acquire("k%d" % i, lease=10)
                assert await c.release(g)
                return g.token

            tokens = await asyncio.gather(*(one(i) for i in range(200)))
            assert len(set(tokens)) == 200

    run(main())


def test_a_try_acquire_behind_the_clients_own_waiter_times_out_and_the_waiter_keeps_its_place(node):
    async def main():
        async with baton_locks.AsyncClient(node.addr) as c, baton_locks.AsyncClient(node.addr) as other:
            holder = await other.acquire("own", lease=30)
            first = asyncio.ensure_future(c.acquire("own", lease=30))
            while (await other.query("own")).waiting != 1:
                await asyncio.sleep(0.01)
            # Two in a row: round-robin alone would put one of them behind
            # the waiter, where the server holds its T back until the waiter
            # is answered (and the connection, deemed dead, would be closed).
            for _ in range(2):
                with pytest.raises(baton_locks.Timeout):
                    await c.acquire("own", lease=30, wait=0)
            second = asyncio.ensure_future(other.acquire("own", lease=30))
            while (await other.query("own")).waiting != 2:
                await asyncio.sleep(0.01)
            assert await other.release(holder)
            grant = await first
            assert grant.token > holder.token and not second.done()
            assert await c.release(grant)
            assert (await second).token > grant.token

    run(main())
