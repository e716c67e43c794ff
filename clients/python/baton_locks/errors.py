"""What can go wrong with a call.

``Timeout``, ``Refused`` and ``NotHeld`` are clear answers from a server;
``Unavailable`` means no server gave one, so the outcome on the server may
be unknown (a grant made just before a connection dropped stays held until
its lease runs out). Bad arguments raise ``TypeError`` (not the right
kind of value: a lease that is a str) or ``ValueError`` (the right kind,
out of range: a lease of 0, ``inf`` or ``nan``) before anything is sent;
neither is an ``Error``.
"""

from __future__ import annotations

from typing import Optional


class Error(Exception):
    """Every error of this package."""


class Timeout(Error):
    """The key was not granted within the wait; nothing is held."""


class Refused(Error):
    """The server refused the request (``E <op> <key> <reason>``).

    ``reason`` is the server's word for it, for example ``lease-too-long``
    or ``too-many-waiting``.
    """

    reason: str
    op: Optional[str]

    def __init__(self, reason: str, op: Optional[str] = None) -> None:
        super().__init__("refused by the server: %s" % reason)
        self.reason = reason
        self.op = op


class NotHeld(Error):
    """``keep``: the token no longer holds the key (released, or its lease
    ran out and the key may have gone to someone else)."""


class Expired(NotHeld):
    """``keep``: the grant's lease ran out by the client's clock before a
    server answered."""


class Unavailable(Error):
    """No server gave an answer: every connection is down, a server did not
    answer in time, or no active node is known."""

    #: True when the request may have reached a server anyway.
    maybe_delivered: bool

    def __init__(self, message: str, maybe_delivered: bool = False) -> None:
        super().__init__(message)
        self.maybe_delivered = maybe_delivered
