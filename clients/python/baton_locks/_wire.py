"""The wire format of baton, version 1: requests out, answers in.

Owns: checking keys, durations, semaphore limits and holder values
before anything is sent, formatting request lines, parsing answer lines
(``W`` state lines of a watch among them), and naming the (op, key) an
answer belongs to. Pure functions, used by whichever thread holds the data.

Never does: I/O, or trust a line from the network: a line that does not
parse raises ``WireError`` and the connection that read it is closed.
"""

from __future__ import annotations

import decimal
import math
import numbers
from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

from .errors import BadArgument, BadArgumentType

MAX_LINE = 1024
MAX_KEY = 250

#: The longest lease, wait or timeout accepted, in seconds (a year): the
#: most any server's ``--max-lease`` allows, so a longer lease or wait could
#: never be granted. (A server refuses one above its own ``--max-lease``
#: with ``lease-too-long`` or ``wait-too-long``.)
MAX_SECONDS = 365 * 86400

LEASE_RULE = "a number of seconds above 0 and at most %d (a year)" % MAX_SECONDS
WAIT_RULE = "None (no limit) or a number of seconds from 0 to %d (a year)" % MAX_SECONDS
TIMEOUT_RULE = "a number of seconds above 0 and at most %d (a year)" % MAX_SECONDS

#: What a key may be given as (a key is 1 to 250 bytes on the wire).
Key = Union[str, bytes, bytearray]

#: An answer, parsed: a NamedTuple (tag, fields...), one of
#: ``TypedAnswer``; see ``parse_answer``.
Answer = Tuple[Any, ...]

#: The (op, key) an answer belongs to; the key is None for ``I`` and ``U``.
Route = Tuple[str, Optional[bytes]]

# Answers, parsed: (tag, fields...). The tags are the wire's.
GRANTED = "A"
TIMEOUT = "T"
RELEASED = "R"
NOT_HELD = "N"
KEPT = "K"
QUERIED = "Q"
MOVED = "M"
REFUSED = "E"
INFO = "I"
AUTH = "U"
WATCHED = "W"
UNWATCHED = "X"

#: The most holders a semaphore may have (``limit``), as the wire allows.
MAX_LIMIT = 10000
MAX_VALUE = 250
LIMIT_RULE = "a whole number from 1 to %d" % MAX_LIMIT
VALUE_RULE = "str or bytes of 1 to %d bytes without spaces or control characters, not \"-\" alone" % MAX_VALUE


class WireError(Exception):
    """A line from the server that does not parse."""


def check_key(key: object) -> bytes:
    """The key as bytes (a str is encoded as UTF-8); TypeError when it is
    neither str nor bytes, ValueError when it is not 1 to 250 bytes without
    spaces or control bytes."""
    if isinstance(key, str):
        key = key.encode("utf-8")
    if not isinstance(key, (bytes, bytearray)):
        raise BadArgumentType("a key is str or bytes, not %s" % type(key).__name__)
    raw = bytes(key)
    if not 1 <= len(raw) <= MAX_KEY or any(b <= 0x20 or b == 0x7F for b in raw):
        raise BadArgument(
            "bad key %r: 1 to 250 bytes, no spaces or control characters" % (raw,)
        )
    return raw


def _seconds(what: str, value: object, rule: str) -> float:
    """``value`` as finite float seconds: TypeError when it is not a number
    (an int, a float, any other real number or a Decimal; a bool is not a
    number here), ValueError when it is infinite or not a number (NaN).
    Both messages say what ``what`` must be (``rule``)."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, decimal.Decimal)):
        raise BadArgumentType("%s must be %s, not %s" % (what, rule, type(value).__name__))
    try:
        seconds = float(value)
    except (OverflowError, ValueError):  # a huge int, a signalling NaN
        seconds = math.nan
    if not math.isfinite(seconds):
        raise BadArgument("%s must be %s, not %r" % (what, rule, value))
    return seconds


def millis_ceil(seconds: float) -> int:
    """Whole milliseconds in ``seconds`` (finite, 0 or more), rounded up:
    first to whole nanoseconds (as a Rust ``Duration`` is), so that float
    noise (``0.1 + 0.2``) adds no millisecond, then up to whole
    milliseconds, the wire's resolution. Above 0 is at least 1 ms."""
    nanos = round(seconds * 1e9)
    ms = -(-nanos // 1_000_000)
    return 1 if ms <= 0 and seconds > 0 else max(0, ms)


def check_lease(lease: object) -> int:
    """A lease in whole milliseconds (rounded up); TypeError when it is not
    a number, ValueError when it is not above 0 and at most a year."""
    seconds = _seconds("lease", lease, LEASE_RULE)
    if not 0 < seconds <= MAX_SECONDS:
        raise BadArgument("lease must be %s, not %r" % (LEASE_RULE, lease))
    return millis_ceil(seconds)


def wait_millis(wait: object) -> int:
    """The wire's wait in milliseconds. ``None`` waits without limit (0 on
    the wire); 0 (or a wait under 1 ms) becomes 1 ms, the shortest the wire
    allows: take the key only if it is free now. TypeError when it is not
    None or a number, ValueError when it is below 0 or above a year."""
    if wait is None:
        return 0
    seconds = _seconds("wait", wait, WAIT_RULE)
    if not 0 <= seconds <= MAX_SECONDS:
        raise BadArgument("wait must be %s, not %r" % (WAIT_RULE, wait))
    return max(1, millis_ceil(seconds))


def check_timeout(what: str, timeout: object) -> float:
    """A connect or request timeout in seconds; TypeError when it is not a
    number, ValueError when it is not above 0 and at most a year."""
    seconds = _seconds(what, timeout, TIMEOUT_RULE)
    if not 0 < seconds <= MAX_SECONDS:
        raise BadArgument("%s must be %s, not %r" % (what, TIMEOUT_RULE, timeout))
    return seconds


def seconds_field(ms: int) -> bytes:
    return b"%d.%03d" % (ms // 1000, ms % 1000)


TOKEN_RULE = "a whole number from 1 to 2**64 - 1"


def check_token(token: object) -> int:
    """TypeError when ``token`` is not an int (a bool is not), ValueError
    when it is out of the fencing tokens' range."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise BadArgumentType("a token is %s, not %s" % (TOKEN_RULE, type(token).__name__))
    if not 0 < token < 2**64:
        raise BadArgument("a token is %s, not %d" % (TOKEN_RULE, token))
    return token


def check_limit(limit: object) -> Optional[int]:
    """A semaphore's limit: None (a plain lock, nothing sent) or an int
    from 1 to 10000; TypeError when it is another type (a bool is not an
    int here), ValueError when it is out of range."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise BadArgumentType("limit must be None or %s, not %s" % (LIMIT_RULE, type(limit).__name__))
    if not 1 <= limit <= MAX_LIMIT:
        raise BadArgument("limit must be None or %s, not %d" % (LIMIT_RULE, limit))
    return limit


def check_value(value: object) -> Optional[bytes]:
    """A holder's value as bytes (a str is encoded as UTF-8), or None;
    TypeError when it is neither str nor bytes, ValueError when it is not
    1 to 250 bytes without spaces or control bytes (the bytes a key may
    have)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, (bytes, bytearray)):
        raise BadArgumentType("value must be None or %s, not %s" % (VALUE_RULE, type(value).__name__))
    raw = bytes(value)
    if (
        not 1 <= len(raw) <= MAX_VALUE
        or any(b <= 0x20 or b == 0x7F for b in raw)
        or raw == b"-"
    ):
        raise BadArgument("value must be None or %s, not %r" % (VALUE_RULE, raw))
    return raw


def acquire_line(
    key: bytes,
    lease_ms: int,
    wait_ms: int,
    limit: Optional[int] = None,
    value: Optional[bytes] = None,
) -> bytes:
    """``A <key> <lease> <wait> [<limit> [<value>]]``: a value needs the
    limit before it, so a value without a limit names limit 1."""
    line = b"A %s %s %s" % (key, seconds_field(lease_ms), seconds_field(wait_ms))
    if limit is not None or value is not None:
        line += b" %d" % (1 if limit is None else limit)
    if value is not None:
        line += b" " + value
    return line + b"\n"


def watch_line(key: bytes) -> bytes:
    return b"W %s\n" % key


def unwatch_line(key: bytes) -> bytes:
    return b"X %s\n" % key


def release_line(key: bytes, token: int) -> bytes:
    return b"R %s %d\n" % (key, token)


def keep_line(key: bytes, token: int, lease_ms: int) -> bytes:
    return b"K %s %d %s\n" % (key, token, seconds_field(lease_ms))


def query_line(key: bytes) -> bytes:
    return b"Q %s\n" % key


INFO_LINE = b"I\n"

AUTH_RULE = "16 to 128 printable ASCII bytes without spaces"


def auth_line(secret: object) -> bytes:
    """The ``U <secret>`` line; TypeError when ``secret`` is not str or
    bytes, ValueError when it is not 16 to 128 printable ASCII bytes."""
    if isinstance(secret, str):
        try:
            secret = secret.encode("ascii")
        except UnicodeEncodeError:
            raise BadArgument("an auth secret is %s" % AUTH_RULE) from None
    if not isinstance(secret, (bytes, bytearray)):
        raise BadArgumentType("an auth secret is str or bytes, not %s" % type(secret).__name__)
    raw = bytes(secret).strip()
    if not 16 <= len(raw) <= 128 or any(b <= 0x20 or b >= 0x7F for b in raw):
        raise BadArgument("an auth secret is %s" % AUTH_RULE)
    return b"U %s\n" % raw


def _u64(field: bytes) -> int:
    if not field.isdigit() or len(field) > 20:
        raise WireError("not a number: %r" % field)
    value = int(field)
    if value >= 2**64:
        raise WireError("number out of range: %r" % field)
    return value


def _key(field: bytes) -> bytes:
    if not 1 <= len(field) <= MAX_KEY or any(b <= 0x20 or b == 0x7F for b in field):
        raise WireError("bad key in an answer")
    return field


def _op(field: bytes) -> Optional[str]:
    if field == b"-":
        return None
    if field not in (b"A", b"R", b"K", b"Q", b"I", b"U", b"W", b"X"):
        raise WireError("unknown op %r" % field)
    return field.decode()


class Granted(NamedTuple):
    """``A <token> <key> [<slot>]``."""

    tag: str
    token: int
    key: bytes
    slot: Optional[int]


class KeyOnly(NamedTuple):
    """``T``, ``R``, ``N``, ``K`` or ``X`` with its key."""

    tag: str
    key: bytes


class Queried(NamedTuple):
    """``Q <key> <token> <ms_left> <waiting>``."""

    tag: str
    key: bytes
    token: int
    ms_left: int
    waiting: int


class Watched(NamedTuple):
    """``W <key> <token> <holders> <waiting> <value>``."""

    tag: str
    key: bytes
    token: int
    holders: int
    waiting: int
    value: Optional[bytes]


class Moved(NamedTuple):
    """``M <host:port or -> <op> <key>``."""

    tag: str
    active: Optional[str]
    op: Optional[str]
    key: Optional[bytes]


class RefusedAnswer(NamedTuple):
    """``E <op> <key> <reason>``."""

    tag: str
    op: Optional[str]
    key: Optional[bytes]
    reason: str


class Info(NamedTuple):
    """``I <name>=<value> ...``."""

    tag: str
    fields: Dict[str, str]


class AuthAnswer(NamedTuple):
    """``U <text>``."""

    tag: str
    text: str


#: Every parsed answer (each a NamedTuple whose first field is the tag).
TypedAnswer = Union[Granted, KeyOnly, Queried, Watched, Moved, RefusedAnswer, Info, AuthAnswer]


def parse_answer(line: bytes) -> Answer:
    """Parse one answer line (without its line ending) into a NamedTuple
    whose first field is the tag (see ``TypedAnswer``):

    Granted("A", token, key, slot or None) KeyOnly("T"|"R"|"N"|"K"|"X", key)
    Queried("Q", key, token, ms_left, waiting)
    Watched("W", key, token, holders, waiting, value or None)
    Moved("M", active or None, op, key or None)
    RefusedAnswer("E", op or None, key or None, reason)
    Info("I", {name: value}) AuthAnswer("U", text)
    """
    if line.endswith(b"\r"):
        line = line[:-1]
    fields = line.split(b" ")
    tag, rest = fields[0], fields[1:]
    if any(not f for f in rest):
        raise WireError("empty field")
    try:
        if tag == b"A" and len(rest) in (2, 3):
            slot = None
            if len(rest) == 3:
                slot = _u64(rest[2])
                if slot >= MAX_LIMIT:
                    raise WireError("slot out of range: %r" % rest[2])
            return Granted(GRANTED, _u64(rest[0]), _key(rest[1]), slot)
        if tag == b"W" and len(rest) == 5:
            value = None if rest[4] == b"-" else _key(rest[4])
            return Watched(
                WATCHED,
                _key(rest[0]),
                _u64(rest[1]),
                _u64(rest[2]),
                _u64(rest[3]),
                value,
            )
        if tag in (b"T", b"R", b"N", b"K", b"X") and len(rest) == 1:
            return KeyOnly(tag.decode(), _key(rest[0]))
        if tag == b"Q" and len(rest) == 4:
            return Queried(QUERIED, _key(rest[0]), _u64(rest[1]), _u64(rest[2]), _u64(rest[3]))
        if tag == b"M" and len(rest) == 3:
            active = None if rest[0] == b"-" else rest[0].decode("ascii")
            key = None if rest[2] == b"-" else _key(rest[2])
            return Moved(MOVED, active, _op(rest[1]), key)
        if tag == b"E" and len(rest) == 3:
            key = None if rest[1] == b"-" else _key(rest[1])
            return RefusedAnswer(REFUSED, _op(rest[0]), key, rest[2].decode("ascii", "replace"))
        if tag == b"I":
            pairs: Dict[str, str] = {}
            for field in rest:
                name, eq, value = field.partition(b"=")
                if not eq:
                    raise WireError("info field without '='")
                pairs[name.decode("ascii", "replace")] = value.decode("ascii", "replace")
            return Info(INFO, pairs)
        if tag == b"U" and len(rest) == 1:
            return AuthAnswer(AUTH, rest[0].decode("ascii", "replace"))
    except UnicodeDecodeError:
        raise WireError("not ASCII where it must be") from None
    raise WireError("an answer that does not parse: %r" % line[:80])


def route(answer: Answer) -> Optional[Route]:
    """The (op, key) of the request an answer belongs to; None for
    ``E - - reason`` (the server closes the connection after it)."""
    tag = answer[0]
    if tag in (GRANTED,):
        return ("A", answer[2])
    if tag == TIMEOUT:
        return ("A", answer[1])
    if tag in (RELEASED, NOT_HELD):
        return ("R", answer[1])
    if tag == KEPT:
        return ("K", answer[1])
    if tag == QUERIED:
        return ("Q", answer[1])
    if tag in (WATCHED, UNWATCHED):
        return (tag, answer[1])
    if tag == INFO:
        return ("I", None)
    if tag == MOVED:
        return (answer[2], answer[3])
    if tag == REFUSED:
        if answer[1] is None:
            return None
        return (answer[1], answer[2])
    return ("U", None)
