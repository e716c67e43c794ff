"""The examples in ``examples/`` run as a user would run them (a new
interpreter, the package as installed) against a real batond."""

import os
import subprocess
import sys

from conftest import DEADLINE, INSTALLED, SOURCE

EXAMPLES = SOURCE / "examples"


def run_example(name, node):
    env = dict(os.environ, BATON_SERVERS=node.addr)
    if not INSTALLED:  # a checkout without the package installed
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_blocking_quickstart(node):
    out = run_example("quickstart.py", node)
    assert out.count("written with fence") == 3
    assert "backup running with fence" in out
    assert "invoices free again: True" in out
    assert node.info()["held"] == "0"


def test_the_asyncio_quickstart(node):
    out = run_example("async_quickstart.py", node)
    assert "5 reports written with fences" in out
    assert "refused before sending: wait must be None (no limit)" in out
    assert node.info()["held"] == "0"
