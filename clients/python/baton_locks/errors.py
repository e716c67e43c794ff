"""What can go wrong with a call: typed, distinct errors.

``Timeout`` (also a ``TimeoutError``), ``Refused`` (with the server's
``reason``) and ``Lost`` (``NotHeld``, ``Expired``) are clear answers;
``Unavailable`` means no server gave one, so the outcome on the server may
be unknown (a grant made just before a connection dropped stays held until
its lease runs out); ``Closed`` (an ``Unavailable``, as a closed client
used to raise) is a call on a closed client, or on a grant already
released. Bad arguments raise ``BadArgument`` before anything is sent: a
``ValueError`` (out of range: a lease of 0, ``inf`` or ``nan``), and
``BadArgumentType``, also a ``TypeError``, for the wrong kind of value (a
lease that is a str).
"""

from __future__ import annotations

from typing import Optional


class Error(Exception):
    """Every error of this package."""


#: Another name for ``Error``.
BatonError = Error


class Timeout(Error, TimeoutError):
    """The key was not granted within the wait (``T``); nothing is held.
    Also a ``TimeoutError``."""


class Refused(Error):
    """The server refused the request (``E <op> <key> <reason>``).

    ``reason`` is the server's word for it, for example ``lease-too-long``,
    ``limit-mismatch`` or ``bad-auth``.
    """

    reason: str
    op: Optional[str]

    def __init__(self, reason: str, op: Optional[str] = None) -> None:
        super().__init__("refused by the server: %s" % reason)
        self.reason = reason
        self.op = op

    def __reduce__(self) -> "tuple[type, tuple[str, Optional[str]]]":
        return (type(self), (self.reason, self.op))


class Lost(Error):
    """The grant no longer holds its key: a keep answered ``N`` /
    ``not-held``, its lease ran out by the client's clock before a keep
    got through, or (for a held grant) every call after it was lost."""


class NotHeld(Lost):
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


class Closed(Unavailable):
    """The client was closed, or the grant was already released (a second
    release of a held grant)."""

    def __init__(self, message: str = "the client is closed") -> None:
        super().__init__(message)


class BadArgument(Error, ValueError):
    """An argument was refused before anything was sent (out of range,
    malformed); also a ``ValueError``."""


class BadArgumentType(BadArgument, TypeError):
    """An argument of the wrong type (a lease that is a str); a
    ``BadArgument`` that is also a ``TypeError``."""


class AuthRefused(Refused, Unavailable):
    """Every server reached refused this client's secret (``reason``
    ``bad-auth``), or wants one and none was set (``auth-required``): a
    ``Refused``, and an ``Unavailable`` as it used to be (no server
    serves this client)."""

    def __init__(self, reason: str, op: Optional[str] = "U") -> None:
        super().__init__(reason, op)
