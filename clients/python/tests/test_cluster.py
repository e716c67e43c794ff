"""Both clients against a real 2-node cluster: redirects and failover."""

import asyncio

import baton_locks
from conftest import DEADLINE, client_of, wait_for


def test_the_client_follows_a_standby_redirect_to_the_active(pair, closing):
    active, standby = pair
    c = closing(client_of(standby))
    grant = c.acquire("redirected", lease=5, wait=5)
    assert active.addr in c.servers, "learned from the redirect"
    assert c.query("redirected").token == grant.token
    assert c.release(grant)


def test_failover_after_sigkill_of_the_active(pair, closing):
    active, standby = pair
    c = closing(client_of(active, standby))
    first = c.acquire("before", lease=30, wait=5)

    # Replication is asynchronous (a grant made just before a failover can
    # be lost): kill the active once the standby holds the grant.
    def replicated():
        info = standby.info()
        return info and int(info.get("held", "0")) >= 1

    wait_for("the grant to reach the standby", replicated)
    active.kill()

    def promoted():
        info = standby.info()
        return info and info.get("role") == "active"

    wait_for("the standby to be promoted", promoted)
    # The replicated grant is still held on the promoted node.
    assert c.query("before").token == first.token
    second = c.acquire("after", lease=30, wait=5)
    assert second.token > first.token, "tokens only grow"
    assert c.release(first)


def test_the_async_client_fails_over_too(pair):
    active, standby = pair

    async def main():
        async with baton_locks.AsyncClient([active.addr, standby.addr]) as c:
            first = await c.acquire("before", lease=30, wait=5)
            active.kill()
            second = await c.acquire("after", lease=30, wait=5)
            assert second.token > first.token

    asyncio.run(asyncio.wait_for(main(), DEADLINE))
