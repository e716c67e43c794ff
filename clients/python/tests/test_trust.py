"""``auth=`` and ``tls=`` against a batond that has them. Each test is
skipped while the batond under test lacks the flag it needs."""

import os
import shutil
import signal
import subprocess

import pytest

import baton_locks
from conftest import DEADLINE, client_of, has_flag, wait_for

SECRET = "correct-horse-battery-staple"

needs_auth = pytest.mark.skipif(not has_flag("--auth-file"), reason="batond has no --auth-file yet")
needs_tls = pytest.mark.skipif(
    not has_flag("--tls-cert") or shutil.which("openssl") is None,
    reason="batond has no --tls-cert yet (or no openssl to make a test certificate)",
)


@needs_auth
def test_the_right_secret_is_let_in_and_others_are_not(nodes, tmp_path, closing):
    secrets = tmp_path / "secrets"
    secrets.write_text("# clients\n%s\n" % SECRET)
    node = nodes(["--auth-file", str(secrets)])
    c = closing(client_of(node, auth=SECRET))
    grant = c.acquire("authed", lease=5)
    assert c.release(grant)

    wrong = closing(client_of(node, auth="x" * 24, connect_timeout=1))
    with pytest.raises(baton_locks.Unavailable) as e:
        wrong.query("k")
    assert "bad-auth" in str(e.value)
    none = closing(client_of(node))
    with pytest.raises(baton_locks.Unavailable):
        none.query("k")


@needs_auth
def test_the_client_authenticates_again_after_the_node_restarts(nodes, tmp_path, closing):
    secrets = tmp_path / "secrets"
    secrets.write_text(SECRET + "\n")
    node = nodes(["--auth-file", str(secrets)])
    c = closing(client_of(node, auth=SECRET))
    assert c.query("k").token is None
    node.kill()
    nodes(["--auth-file", str(secrets)], node.port)

    def served():
        try:
            return c.acquire("k", lease=5, wait=0)
        except baton_locks.Error:
            return None

    grant = wait_for("the client to authenticate with the restarted node", served)
    assert c.release(grant)


@needs_auth
def test_sighup_rotates_the_secrets(nodes, tmp_path, closing):
    new_secret = "the-next-secret-0123456789"
    secrets = tmp_path / "secrets"
    secrets.write_text(SECRET + "\n")
    node = nodes(["--auth-file", str(secrets)])
    old = closing(client_of(node, auth=SECRET))
    assert old.query("k").token is None
    tmp = tmp_path / "secrets.tmp"
    tmp.write_text("# rotated\n" + new_secret + "\n")
    tmp.replace(secrets)
    os.kill(node.proc.pid, signal.SIGHUP)

    def new_works():
        fresh = client_of(node, auth=new_secret, connect_timeout=1)
        try:
            return fresh.query("k") is not None
        except baton_locks.Error:
            return False
        finally:
            fresh._close()

    wait_for("the new secret to be accepted", new_works)
    # The old client's connections were authenticated before: still served.
    assert old.query("k").token is None
    refused = closing(client_of(node, auth=SECRET, connect_timeout=1))
    with pytest.raises(baton_locks.Unavailable) as e:
        refused.query("k")
    assert "bad-auth" in str(e.value)


@needs_auth
def test_a_secret_for_a_server_without_auth_is_harmless(node, closing):
    c = closing(client_of(node, auth=SECRET))
    grant = c.acquire("authed", lease=5)
    assert c.release(grant)


def test_a_malformed_secret_is_refused_before_connecting():
    with pytest.raises(ValueError):
        baton_locks.Client("127.0.0.1:1", auth="short")
    with pytest.raises(ValueError):
        baton_locks.Client("127.0.0.1:1", auth="has a space in it ......")


@needs_tls
def test_tls_with_a_ca_file(nodes, tmp_path, closing):
    cert, key = tmp_path / "node.pem", tmp_path / "node.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=DEADLINE,
    )
    node = nodes(["--tls-cert", str(cert), "--tls-key", str(key)])
    c = closing(client_of(node, tls=str(cert)))
    grant = c.acquire("secret-work", lease=5)
    assert c.query("secret-work").token == grant.token
    assert c.release(grant)

    plain = closing(client_of(node, request_timeout=1))
    with pytest.raises(baton_locks.Unavailable):
        plain.query("k")


@needs_auth
def test_a_wrong_secret_is_refused_bad_auth_blocking_and_async(nodes, tmp_path, closing):
    import asyncio

    secrets = tmp_path / "secrets"
    secrets.write_text(SECRET + "\n")
    node = nodes(["--auth-file", str(secrets)])
    wrong = closing(client_of(node, auth="y" * 24, connect_timeout=1))
    with pytest.raises(baton_locks.Refused) as e:
        wrong.query("k")
    assert e.value.reason == "bad-auth"

    async def main():
        async with baton_locks.AsyncClient(node.addr, auth=SECRET) as right:
            grant = await right.acquire("authed", lease=5)
            assert await right.release(grant)
        async with baton_locks.AsyncClient(node.addr, auth="y" * 24, connect_timeout=1) as bad:
            with pytest.raises(baton_locks.Refused) as e:
                await bad.query("k")
            assert e.value.reason == "bad-auth"

    asyncio.run(asyncio.wait_for(main(), DEADLINE))
