"""The wheel, built from this checkout: what `pip install primus-energon` puts into site-packages."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
#: source folder -> its installed import name
MAPPED = {
    "primus_energon": "primus_energon",
    "conformance": "primus_energon/conformance",
    "synthetic": "primus_energon/synthetic",
}

#: what a checkout holds that is not its source (environments, caches, reports)
NOT_SOURCE = (".git", ".venv", ".nox", "build", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    # built from a copy: setuptools writes build/ and *.egg-info into the tree it builds, so two xdist
    # workers building this checkout at once would collide
    source = tmp_path_factory.mktemp("source") / "primus-energon"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*NOT_SOURCE, "reports", "site"))
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(source),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (built,) = out.glob("primus_energon-*.whl")
    return zipfile.ZipFile(built)


@pytest.mark.slow
def test_only_the_project_namespace_is_installed(wheel: zipfile.ZipFile) -> None:
    """No generic top-level package (``conformance``, ``synthetic``) that a user's own could collide with."""
    top = {name.split("/")[0] for name in wheel.namelist()}
    assert {t for t in top if not t.endswith(".dist-info")} == {"primus_energon"}


@pytest.mark.slow
def test_every_source_module_is_installed_under_its_mapped_name(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    expected = {
        f"{installed}/{path.relative_to(REPO / folder).as_posix()}"
        for folder, installed in MAPPED.items()
        for path in (REPO / folder).rglob("*.py")
    }
    assert expected - names == set()
    schemas = {
        f"primus_energon/synthetic/examples/{p.name}"
        for p in (REPO / "synthetic" / "examples").glob("*.yaml")
    }
    assert schemas and schemas <= names


@pytest.mark.slow
def test_entry_points_name_installed_modules(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    assert "primus_energon_conformance = primus_energon.conformance.verdict.plugin" in text
    assert "primus-synth = primus_energon.synthetic.cli:main" in text
    assert "primus-energon = primus_energon.__main__:main" in text


LAZY_PACKAGES = (
    "primus_energon",
    "primus_energon.datasets",
    "primus_energon.conformance",
    "primus_energon.synthetic",
)


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_public_name_is_exported_lazily_and_resolves(package: str) -> None:
    """``__all__`` and the lazy export table name the same things, and each resolves to its module's object."""
    import importlib

    module = importlib.import_module(package)
    exported = {name: sub for sub, names in module._EXPORTS.items() for name in names}
    assert set(module.__all__) - {"__version__"} == set(exported)
    for name, sub in exported.items():
        assert getattr(module, name) is getattr(importlib.import_module(f"{package}.{sub}"), name)
        assert name in dir(module)
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018
