"""Arguments are checked before anything is sent, the same way by the
blocking and the asyncio client: a value of the wrong type raises
TypeError, one out of range ValueError, each with a message that says
what is allowed. A bad value that reached the server would come back as
``Refused`` (``bad-lease``), so the exception's type also proves that
nothing was sent; the node is checked to hold nothing as well."""

import asyncio
import decimal
import fractions
import math

import pytest

import baton_locks
from conftest import DEADLINE, client_of

A_YEAR = 365 * 86400
LEASE_RULE = "lease must be a number of seconds above 0 and at most %d (a year)" % A_YEAR
WAIT_RULE = "wait must be None (no limit) or a number of seconds from 0 to %d (a year)" % A_YEAR

BAD_LEASES = [
    math.inf,
    -math.inf,
    math.nan,
    -1,
    -0.5,
    0,
    0.0,
    -0.0,
    A_YEAR + 0.001,
    1e300,
    10**400,  # too large for a float
    decimal.Decimal("Infinity"),
    decimal.Decimal("NaN"),
    decimal.Decimal("sNaN"),
]
BAD_WAITS = [math.inf, -math.inf, math.nan, -1, -0.001, A_YEAR + 1, 1e300, 10**400]
WRONG_TYPES = ["30", b"30", True, False, [1], complex(1, 0), object()]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE))


def assert_nothing_held(node):
    info = node.info()
    assert (info["held"], info["waiting"]) == ("0", "0"), info


def test_bad_leases_and_waits_raise_value_error_saying_what_is_allowed(node, closing):
    c = closing(client_of(node))
    for lease in BAD_LEASES:
        with pytest.raises(ValueError) as e:
            c.acquire("k", lease=lease)
        assert LEASE_RULE in str(e.value), (lease, str(e.value))
        assert "0 or more" not in str(e.value)
        with pytest.raises(ValueError, match="lease must be"):
            with c.lock("k", lease=lease):
                raise AssertionError("locked with lease %r" % (lease,))
    for wait in BAD_WAITS:
        with pytest.raises(ValueError) as e:
            c.acquire("k", lease=5, wait=wait)
        assert WAIT_RULE in str(e.value), (wait, str(e.value))
    assert_nothing_held(node)


def test_a_lease_or_wait_of_the_wrong_type_raises_type_error(node, closing):
    c = closing(client_of(node))
    for bad in WRONG_TYPES:
        with pytest.raises(TypeError, match="lease must be a number of seconds .*not %s" % type(bad).__name__):
            c.acquire("k", lease=bad)
        with pytest.raises(TypeError, match="wait must be None .*not %s" % type(bad).__name__):
            c.acquire("k", lease=5, wait=bad)
    with pytest.raises(TypeError, match="lease must be"):
        c.acquire("k", lease=None)
    assert_nothing_held(node)


def test_keep_checks_its_lease_the_same_way(node, closing):
    c = closing(client_of(node))
    grant = c.acquire("kept", lease=5)
    for lease in BAD_LEASES:
        with pytest.raises(ValueError, match="lease must be"):
            c.keep(grant, lease)
    for bad in WRONG_TYPES:
        with pytest.raises(TypeError, match="lease must be"):
            c.keep(grant, bad)
    assert grant.lease == 5.0, "a refused keep changes nothing"
    assert c.release(grant)


def test_the_async_client_checks_the_same_way(node):
    async def main():
        async with baton_locks.AsyncClient(node.addr) as c:
            for lease in BAD_LEASES:
                with pytest.raises(ValueError, match="lease must be a number of seconds above 0"):
                    await c.acquire("k", lease=lease)
                with pytest.raises(ValueError, match="lease must be"):
                    async with c.lock("k", lease=lease):
                        raise AssertionError("locked with lease %r" % (lease,))
            for wait in BAD_WAITS:
                with pytest.raises(ValueError, match="wait must be None"):
                    await c.acquire("k", lease=5, wait=wait)
            for bad in WRONG_TYPES:
                with pytest.raises(TypeError, match="lease must be"):
                    await c.acquire("k", lease=bad)
                with pytest.raises(TypeError, match="wait must be"):
                    await c.acquire("k", lease=5, wait=bad)
            grant = await c.acquire("kept", lease=5)
            with pytest.raises(ValueError, match="lease must be"):
                await c.keep(grant, math.inf)
            with pytest.raises(TypeError, match="lease must be"):
                await c.keep(grant, "5")
            assert await c.release(grant)

    run(main())
    assert_nothing_held(node)


def test_good_leases_are_rounded_up_to_whole_milliseconds(node, closing):
    # The wire carries milliseconds: a finer lease is rounded up, after
    # rounding to whole nanoseconds so that float noise adds nothing.
    c = closing(client_of(node))
    cases = [
        (30, 30.0),
        (0.1 + 0.2, 0.3),  # 0.30000000000000004
        (2.0000001, 2.001),
        (1.0000000001, 1.0),
        (decimal.Decimal("2.5"), 2.5),
        (fractions.Fraction(7, 4), 1.75),
    ]
    for lease, sent in cases:
        grant = c.acquire("round", lease=lease)
        assert grant.lease == sent, (lease, grant.lease)
        assert c.release(grant)
    # A year is the most any server's --max-lease allows: it is sent (and
    # refused by this server, whose --max-lease is a day), a millisecond
    # more is not.
    with pytest.raises(baton_locks.Refused) as refused:
        c.acquire("round", lease=A_YEAR)
    assert refused.value.reason == "lease-too-long"
    with pytest.raises(baton_locks.Refused) as refused:
        c.acquire("round", lease=5, wait=A_YEAR)
    assert refused.value.reason == "wait-too-long"
    assert_nothing_held(node)


def test_bad_timeouts_tokens_servers_and_secrets(node, closing):
    for name in ("connect_timeout", "request_timeout"):
        for bad in (0, -1, math.inf, math.nan, A_YEAR + 1):
            with pytest.raises(ValueError, match="%s must be a number of seconds above 0" % name):
                baton_locks.Client(node.addr, **{name: bad})
        with pytest.raises(TypeError, match="%s must be" % name):
            baton_locks.Client(node.addr, **{name: "5"})
    c = closing(client_of(node))
    with pytest.raises(TypeError, match="a token is a whole number"):
        c.release_token("k", "42")
    with pytest.raises(TypeError, match="a token is a whole number"):
        c.release_token("k", True)
    for bad in (0, -1, 2**64):
        with pytest.raises(ValueError, match="a token is a whole number from 1 to 2\\*\\*64 - 1"):
            c.release_token("k", bad)
    with pytest.raises(TypeError, match="a key is str or bytes"):
        c.acquire(42, lease=5)
    with pytest.raises(TypeError, match="a server is a 'host:port' str"):
        baton_locks.Client([node.addr, 7373])
    with pytest.raises(TypeError, match="an auth secret is str or bytes"):
        baton_locks.Client(node.addr, auth=12345678901234567890)
    with pytest.raises(ValueError, match="an auth secret is 16 to 128 printable ASCII"):
        baton_locks.Client(node.addr, auth="é" * 20)
    with pytest.raises(TypeError, match="tls is an ssl.SSLContext"):
        baton_locks.Client(node.addr, tls=1)
