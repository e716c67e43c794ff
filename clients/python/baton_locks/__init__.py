"""baton_locks: the Python client of the baton lock server.

A key is granted to one holder at a time (or, as a semaphore, to up to
``limit`` holders), in FIFO order, with a fencing token that only ever
grows; a key can be watched, and elections are built on both::

    import baton_locks

    client = baton_locks.Client(["10.0.0.1:7373", "10.0.0.2:7373"])
    with client.lock("invoices", lease=30, wait=10) as grant:
        write_invoices(fence=grant.token)

Pure standard library, fully typed (``py.typed``); ``AsyncClient`` is the
same for asyncio, native (the loop's own sockets and tasks, no
thread). Installed as the distribution ``baton-locks``.
"""

from ._calls import Grant, KeyStatus
from ._client import AsyncClient, Client
from ._hold import AsyncCampaign, AsyncHeld, Campaign, Held
from ._watch import AsyncWatch, Watch, WatchState
from .errors import (
    AuthRefused,
    BadArgument,
    BadArgumentType,
    BatonError,
    Closed,
    Error,
    Expired,
    Lost,
    NotHeld,
    Refused,
    Timeout,
    Unavailable,
)

__all__ = [
    "AuthRefused",
    "BadArgument",
    "BadArgumentType",
    "BatonError",
    "Closed",
    "Lost",
    "AsyncCampaign",
    "AsyncClient",
    "AsyncHeld",
    "AsyncWatch",
    "Campaign",
    "Client",
    "Error",
    "Expired",
    "Grant",
    "Held",
    "KeyStatus",
    "NotHeld",
    "Refused",
    "Timeout",
    "Unavailable",
    "Watch",
    "WatchState",
]
__version__ = "0.1.0"
