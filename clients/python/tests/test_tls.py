"""``tls=`` with client certificates against ``batond --tls-client-ca``.
Certificates are made at test time with the ``openssl`` command (a CA, a
node certificate for 127.0.0.1, a client certificate); skipped without
openssl or while the batond under test lacks the flag."""

import shutil
import ssl
import subprocess

import pytest

import baton_locks
from conftest import DEADLINE, client_of, has_flag

needs_mtls = pytest.mark.skipif(
    not has_flag("--tls-client-ca") or shutil.which("openssl") is None,
    reason="batond has no --tls-client-ca yet (or no openssl to make test certificates)",
)


def openssl(*args):
    subprocess.run(["openssl"] + list(args), check=True, capture_output=True, timeout=DEADLINE)


def make_pki(d):
    """A CA, and a node and a client certificate it signed; their paths."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req", "-x509", *ec, "-days", "1", "-subj", "/CN=baton test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,digitalSignature",
        "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
    )
    paths = {"ca": d / "ca.pem"}
    for name, san in [("node", "IP:127.0.0.1"), ("client", "DNS:client.example")]:
        ext = d / (name + ".ext")
        ext.write_text("subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n" % san)
        csr, keyfile = d / (name + ".csr"), d / (name + ".key")
        openssl("req", *ec, "-subj", "/CN=" + name, "-keyout", str(keyfile), "-out", str(csr))
        openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(d / "ca.pem"),
            "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
            "-extfile", str(ext), "-out", str(d / (name + ".pem")),
        )
        paths[name] = (d / (name + ".pem"), d / (name + ".key"))
    return paths


@needs_mtls
def test_a_client_certificate_is_required_and_accepted(nodes, tmp_path, closing):
    pki = make_pki(tmp_path)
    cert, key = pki["node"]
    node = nodes(["--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(pki["ca"])])

    context = ssl.create_default_context(cafile=str(pki["ca"]))
    context.load_cert_chain(*[str(p) for p in pki["client"]])
    c = closing(client_of(node, tls=context))
    grant = c.acquire("mtls-work", lease=5)
    assert c.query("mtls-work").token == grant.token
    assert c.release(grant)

    without = closing(client_of(node, tls=str(pki["ca"]), connect_timeout=1, request_timeout=1))
    with pytest.raises(baton_locks.Unavailable):
        without.query("k")


@needs_mtls
def test_the_async_client_speaks_tls_and_mtls_on_the_loop(nodes, tmp_path):
    import asyncio

    pki = make_pki(tmp_path)
    cert, key = pki["node"]
    node = nodes(["--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(pki["ca"])])
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    context.load_cert_chain(*[str(p) for p in pki["client"]])

    async def main():
        async with baton_locks.AsyncClient(node.addr, tls=context) as c:
            grant = await c.acquire("mtls-async", lease=5)
            assert (await c.query("mtls-async")).token == grant.token
            assert await c.release(grant)
        async with baton_locks.AsyncClient(
            node.addr, tls=str(pki["ca"]), connect_timeout=1, request_timeout=1
        ) as without:
            with pytest.raises(baton_locks.Unavailable):
                await without.query("k")

    asyncio.run(asyncio.wait_for(main(), DEADLINE))
