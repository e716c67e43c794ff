"""The asyncio client: the same calls as coroutines; many tasks share the
client's connections.

    BATON_SERVERS=127.0.0.1:7373 python async_quickstart.py

The tests run it against a real batond, and CI type-checks it with
``mypy --strict`` against the installed wheel.
"""

import asyncio
import os
from typing import List

import baton_locks


async def one_job(client: baton_locks.AsyncClient, n: int) -> int:
    async with client.lock("report-%d" % n, lease=30, wait=10) as grant:
        await asyncio.sleep(0)  # the work, fenced by grant.token
        return grant.token


async def main() -> None:
    servers = os.environ.get("BATON_SERVERS", "127.0.0.1:7373")
    async with baton_locks.AsyncClient(servers) as client:
        tokens: List[int] = await asyncio.gather(*(one_job(client, n) for n in range(5)))
        print("5 reports written with fences %s" % ", ".join(map(str, tokens)))
        try:
            await client.acquire("report-0", lease=5, wait=-1)
        except ValueError as e:
            print("refused before sending: %s" % e)


if __name__ == "__main__":
    asyncio.run(main())
