"""The wire format of baton, version 1: requests out, answers in.

Owns: checking keys and durations before anything is sent, formatting
request lines, parsing answer lines, and naming the (op, key) an answer
belongs to. Pure functions, used by whichever thread holds the data.

Never does: I/O, or trust a line from the network: a line that does not
parse raises ``WireError`` and the connection that read it is closed.
"""

import math

MAX_LINE = 1024
MAX_KEY = 250

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


class WireError(Exception):
    """A line from the server that does not parse."""


def check_key(key):
    """The key as bytes; ValueError when it is not 1 to 250 bytes without
    spaces or control bytes."""
    if isinstance(key, str):
        key = key.encode("utf-8")
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError("a key is str or bytes")
    key = bytes(key)
    if not 1 <= len(key) <= MAX_KEY or any(b <= 0x20 or b == 0x7F for b in key):
        raise ValueError(
            "bad key %r: 1 to 250 bytes, no spaces or control characters" % (key,)
        )
    return key


def millis_ceil(seconds):
    """Whole milliseconds in ``seconds``, rounded up."""
    if seconds != seconds or seconds < 0:
        raise ValueError("a duration is a number of seconds, 0 or more")
    return int(math.ceil(seconds * 1000 - 1e-9)) if seconds > 0 else 0


def check_lease(seconds):
    ms = millis_ceil(seconds)
    if ms <= 0:
        raise ValueError("the lease must be above 0")
    return ms


def wait_millis(wait):
    """``None`` waits without limit (0 on the wire); 0 (or a tiny wait)
    becomes 1 ms, the shortest the wire allows: take the key only if it is
    free now."""
    if wait is None:
        return 0
    return max(1, millis_ceil(wait))


def seconds_field(ms):
    return b"%d.%03d" % (ms // 1000, ms % 1000)


def check_token(token):
    if not isinstance(token, int) or not 0 < token < 2**64:
        raise ValueError("a token is a whole number from 1 to 2^64 - 1")
    return token


def acquire_line(key, lease_ms, wait_ms):
    return b"A %s %s %s\n" % (key, seconds_field(lease_ms), seconds_field(wait_ms))


def release_line(key, token):
    return b"R %s %d\n" % (key, token)


def keep_line(key, token, lease_ms):
    return b"K %s %d %s\n" % (key, token, seconds_field(lease_ms))


def query_line(key):
    return b"Q %s\n" % key


INFO_LINE = b"I\n"


def auth_line(secret):
    if isinstance(secret, str):
        secret = secret.encode("ascii")
    secret = bytes(secret).strip()
    if not 16 <= len(secret) <= 128 or any(b <= 0x20 or b >= 0x7F for b in secret):
        raise ValueError("an auth secret is 16 to 128 printable ASCII bytes without spaces")
    return b"U %s\n" % secret


def _u64(field):
    if not field.isdigit() or len(field) > 20:
        raise WireError("not a number: %r" % field)
    value = int(field)
    if value >= 2**64:
        raise WireError("number out of range: %r" % field)
    return value


def _key(field):
    if not 1 <= len(field) <= MAX_KEY or any(b <= 0x20 or b == 0x7F for b in field):
        raise WireError("bad key in an answer")
    return field


def _op(field):
    if field == b"-":
        return None
    if field not in (b"A", b"R", b"K", b"Q", b"I", b"U"):
        raise WireError("unknown op %r" % field)
    return field.decode()


def parse_answer(line):
    """Parse one answer line (without its line ending) into a tuple:

    ("A", token, key) ("T", key) ("R", key) ("N", key) ("K", key)
    ("Q", key, token, ms_left, waiting) ("M", active or None, op, key or None)
    ("E", op or None, key or None, reason) ("I", {name: value}) ("U", text)
    """
    if line.endswith(b"\r"):
        line = line[:-1]
    fields = line.split(b" ")
    tag, rest = fields[0], fields[1:]
    if any(not f for f in rest):
        raise WireError("empty field")
    try:
        if tag == b"A" and len(rest) == 2:
            return (GRANTED, _u64(rest[0]), _key(rest[1]))
        if tag in (b"T", b"R", b"N", b"K") and len(rest) == 1:
            return (tag.decode(), _key(rest[0]))
        if tag == b"Q" and len(rest) == 4:
            return (QUERIED, _key(rest[0]), _u64(rest[1]), _u64(rest[2]), _u64(rest[3]))
        if tag == b"M" and len(rest) == 3:
            active = None if rest[0] == b"-" else rest[0].decode("ascii")
            key = None if rest[2] == b"-" else _key(rest[2])
            return (MOVED, active, _op(rest[1]), key)
        if tag == b"E" and len(rest) == 3:
            key = None if rest[1] == b"-" else _key(rest[1])
            return (REFUSED, _op(rest[0]), key, rest[2].decode("ascii", "replace"))
        if tag == b"I":
            pairs = {}
            for field in rest:
                name, eq, value = field.partition(b"=")
                if not eq:
                    raise WireError("info field without '='")
                pairs[name.decode("ascii", "replace")] = value.decode("ascii", "replace")
            return (INFO, pairs)
        if tag == b"U" and len(rest) == 1:
            return (AUTH, rest[0].decode("ascii", "replace"))
    except UnicodeDecodeError:
        raise WireError("not ASCII where it must be") from None
    raise WireError("an answer that does not parse: %r" % line[:80])


def route(answer):
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
    if tag == INFO:
        return ("I", None)
    if tag == MOVED:
        return (answer[2], answer[3])
    if tag == REFUSED:
        if answer[1] is None:
            return None
        return (answer[1], answer[2])
    return ("U", None)
