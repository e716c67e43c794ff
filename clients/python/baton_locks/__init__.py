"""baton_locks: the Python client of the baton lock server.

A key is granted to one holder at a time, in FIFO order, with a fencing
token that only ever grows::

    import baton_locks

    client = baton_locks.Client(["10.0.0.1:7373", "10.0.0.2:7373"])
    with client.lock("invoices", lease=30, wait=10) as grant:
        write_invoices(fence=grant.token)

Pure standard library, fully typed (``py.typed``); ``AsyncClient`` is the
same for asyncio. Installed as the distribution ``baton-locks``.
"""

from ._calls import Grant, KeyStatus
from ._client import AsyncClient, Client
from .errors import Error, Expired, NotHeld, Refused, Timeout, Unavailable

__all__ = [
    "AsyncClient",
    "Client",
    "Error",
    "Expired",
    "Grant",
    "KeyStatus",
    "NotHeld",
    "Refused",
    "Timeout",
    "Unavailable",
]
__version__ = "0.1.0"
