"""Throwaway test certificates for the TLS and mTLS scenarios.

Owns: one CA, a server certificate for 127.0.0.1 and ``localhost`` (IP and
DNS names: every client checks the host part of the address it dialed), and
a client certificate, all signed by that CA, made once per run in the run's
directory with the ``openssl`` command (Debian's ``openssl`` package; no
Python package needed). Keys are P-256, written as PKCS#8 PEM, which every
client's TLS stack reads.

Never does: write a key outside the run's directory, or make anything that
outlives the run.
"""

from __future__ import annotations

import os
import subprocess


def _run(args: list[str], cwd: str) -> None:
    subprocess.run(args, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _key(cwd: str, name: str) -> None:
    _run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
          "-out", f"{name}.key"], cwd)


def make(directory: str) -> dict[str, str]:
    """Make the CA and the two certificates in ``directory``; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    _key(directory, "ca")
    _run(["openssl", "req", "-x509", "-new", "-key", "ca.key", "-days", "2", "-subj",
          "/CN=baton conformance CA", "-out", "ca.pem",
          "-addext", "basicConstraints=critical,CA:TRUE",
          "-addext", "keyUsage=critical,keyCertSign,cRLSign"], directory)
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
                   "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"),
        ("client", "subjectAltName=DNS:conformance-client\nextendedKeyUsage=clientAuth\n"
                   "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"),
    ):
        _key(directory, name)
        _run(["openssl", "req", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}",
              "-out", f"{name}.csr"], directory)
        with open(os.path.join(directory, f"{name}.ext"), "w") as f:
            f.write(ext)
        _run(["openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
              "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem"],
             directory)
    p = lambda f: os.path.join(directory, f)  # noqa: E731
    return {
        "ca": p("ca.pem"),
        "server_cert": p("server.pem"),
        "server_key": p("server.key"),
        "client_cert": p("client.pem"),
        "client_key": p("client.key"),
    }
