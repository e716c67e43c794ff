"""The Python quickstart runs exactly as the docs print it (issue 45): the
shell block marked ``python-quickstart`` in docs/clients.md (the same block
as in clients/python/README.md) is run line by line with ``bash -e`` at the
root of a temporary copy of the checkout's ``clients/python``, against a
real batond. The one change: the address 127.0.0.1:7373 becomes the test
node's (the test must not take a fixed port). It needs PyPI, as the
documented ``pip install build`` does."""

import os
import re
import shutil
import subprocess

import pytest

from conftest import REPO, SOURCE

MARK = "<!-- python-quickstart"


def quickstart_block(path):
    text = path.read_text()
    at = text.index(MARK)
    match = re.compile(r"```sh\n(.*?)```", re.S).search(text, at)
    assert match and text[at:match.start()].count("\n") == 1, "the block follows the mark"
    return match.group(1)


def test_the_readme_and_the_docs_print_the_same_quickstart():
    docs = quickstart_block(REPO / "docs" / "clients.md")
    readme = quickstart_block(SOURCE / "README.md")
    assert docs == readme
    assert "python examples/" not in docs and "\npython " not in "\n" + docs
    for line in docs.splitlines():
        assert line.split()[0] in ("python3", ".venv/bin/pip", ".venv/bin/python") or line.startswith(
            "BATON_SERVERS="
        ), line


def test_the_ignored_build_outputs():
    ignored = (REPO / ".gitignore").read_text().split()
    for name in (".venv/", "dist/", "build/", "*.egg-info/"):
        assert name in ignored


def test_the_quickstart_runs_as_printed(node, tmp_path):
    block = quickstart_block(REPO / "docs" / "clients.md")
    root = tmp_path / "checkout"
    shutil.copytree(
        SOURCE,
        root / "clients" / "python",
        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".venv"),
    )
    script = "set -e\n" + block.replace("127.0.0.1:7373", node.addr)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(re.findall(r"^batch \d+ written with fence", done.stdout, re.M)) == 3
    assert "5 reports written with fences" in done.stdout
    assert node.info()["held"] == "0"
    assert (root / ".venv").is_dir() and list((root / "dist").glob("*.whl"))
