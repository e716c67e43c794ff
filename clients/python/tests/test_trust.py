"""``auth=`` and ``tls=`` against a batond that has them. Each test is
skipped while the batond under test lacks the flag it needs."""

import shutil
import subprocess

import pytest

import baton
from conftest import DEADLINE, client_of, has_flag

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
    with pytest.raises(baton.Unavailable) as e:
        wrong.query("k")
    assert "bad-auth" in str(e.value)
    none = closing(client_of(node))
    with pytest.raises(baton.Unavailable):
        none.query("k")


@needs_auth
def test_a_secret_for_a_server_without_auth_is_harmless(node, closing):
    c = closing(client_of(node, auth=SECRET))
    grant = c.acquire("authed", lease=5)
    assert c.release(grant)


def test_a_malformed_secret_is_refused_before_connecting():
    with pytest.raises(ValueError):
        baton.Client("127.0.0.1:1", auth="short")
    with pytest.raises(ValueError):
        baton.Client("127.0.0.1:1", auth="has a space in it ......")


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
    with pytest.raises(baton.Unavailable):
        plain.query("k")
