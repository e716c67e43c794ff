"""With ``BATON_PY_INSTALLED=1`` (CI), the package under test is the one
installed in this virtual environment's site-packages from the wheel, with
its ``py.typed`` marker and metadata, and not the source directory."""

import importlib.metadata
import pathlib
import sys
import sysconfig

import pytest

import baton_locks
from conftest import INSTALLED, SOURCE

pytestmark = pytest.mark.skipif(
    not INSTALLED, reason="set BATON_PY_INSTALLED=1 to test an installed wheel"
)


def test_the_package_is_the_one_installed_in_the_venv():
    assert sys.prefix != sys.base_prefix, "not in a virtual environment"
    site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
    package = pathlib.Path(baton_locks.__file__).resolve().parent
    assert package == site / "baton_locks", (package, site)
    assert pathlib.Path(sys.prefix).resolve() in package.parents
    assert SOURCE not in package.parents, "imported from the source tree"
    for name in list(sys.modules):
        if name == "baton_locks" or name.startswith("baton_locks."):
            where = getattr(sys.modules[name], "__file__", None)
            assert where and site in pathlib.Path(where).resolve().parents, (name, where)


def test_the_wheel_ships_its_type_marker_and_metadata():
    package = pathlib.Path(baton_locks.__file__).resolve().parent
    assert (package / "py.typed").is_file()
    dist = importlib.metadata.distribution("baton-locks")
    assert dist.version == baton_locks.__version__
    assert dist.metadata["Requires-Python"] == ">=3.9"
    assert "Typing :: Typed" in dist.metadata.get_all("Classifier")
    assert not dist.requires or all("extra ==" in r for r in dist.requires), (
        "no run-time dependencies: %r" % dist.requires
    )
    shipped = {str(f) for f in dist.files or []}
    assert "baton_locks/py.typed" in shipped
    assert "baton_locks/__init__.py" in shipped


def test_the_wheel_ships_the_repository_license():
    # clients/python/LICENSE is a copy (an sdist carries only files under
    # clients/python): it must stay the repository's.
    dist = importlib.metadata.distribution("baton-locks")
    licenses = [f for f in dist.files or [] if f.name == "LICENSE"]
    assert len(licenses) == 1, dist.files
    shipped = licenses[0].locate().read_text()
    assert shipped == (SOURCE.parent.parent / "LICENSE").read_text()
    assert dist.metadata["License-Expression"] == "MIT OR Apache-2.0"
