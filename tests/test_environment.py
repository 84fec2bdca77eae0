"""Versions and environment problems: ``--version`` of both commands, the suite's header line, and a broken
environment reported as one usage-error line (exit 4) with its fix."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from primus_energon.environment import MSC_FIX, incompatibilities, probe_local_paths, problems, version_line
from tests.helpers import run_pytest


@pytest.mark.parametrize("command", ["primus-energon", "primus-synth"])
def test_version_is_one_line_of_installed_versions(command: str) -> None:
    module = "primus_energon" if command == "primus-energon" else "primus_energon.synthetic.cli"
    code = f"import sys; from {module} import main; sys.exit(main(['--version']))"
    if command == "primus-energon":
        code = "import sys; from primus_energon.__main__ import main; sys.exit(main(['--version']))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 1, run.stdout
    assert lines[0].startswith(f"{command} {metadata.version('primus-energon')} (")
    for name in ("megatron-energon", "torch", "multi-storage-client"):
        assert f"{name} {metadata.version(name)}" in lines[0]
    assert lines[0] == version_line(command)


@pytest.mark.parametrize(
    ("energon", "msc", "broken"),
    [
        ("7.0.0", "1.3.1", True),
        ("7.2.1", "1.0.0", True),
        ("6.0.1", "1.3.1", True),
        ("6.0.1", "0.34.0", False),
        ("5.2.0", "1.3.1", False),
        ("7.0.0", "0.51.0", False),
        ("7.3.2", "1.3.1", False),
        ("7.4.1", "1.3.1", False),
        ("7.0.0", None, False),
        (None, "1.3.1", False),
    ],
)
def test_the_known_broken_energon_msc_pair_is_named_with_its_fix(energon, msc, broken: bool) -> None:
    found = incompatibilities(energon, msc)
    assert bool(found) is broken
    if broken:
        assert len(found) == 1 and MSC_FIX in found[0] and "\n" not in found[0]
        assert f"megatron-energon {energon} with multi-storage-client {msc}" in found[0]


@pytest.mark.parametrize(
    ("energon", "outside"),
    [("5.1.0", True), ("5.2.0", False), ("6.0.1", False), ("7.4.1", False), ("7.5.0", True), ("8.0.0", True)],
)
def test_a_release_outside_the_range_is_one_usage_line(energon: str, outside: bool) -> None:
    found = incompatibilities(energon, "0.34.0")
    assert bool(found) is outside
    if outside:
        assert len(found) == 1 and "\n" not in found[0]
        assert (
            f"megatron-energon {energon} is outside the releases primus-energon supports (5.2 to 7.4)"
            in found[0]
        )
        assert "pip install 'megatron-energon>=5.2,<7.5'" in found[0]


def test_a_missing_dependency_is_named_with_its_install_command() -> None:
    found = problems(need=("no-such-distribution-xyz", "hypothesis", "torch"))
    assert found == [
        "no-such-distribution-xyz is not installed (no module no_such_distribution_xyz): pip install "
        "no-such-distribution-xyz"
    ]


def test_this_environment_is_sound_and_the_probe_opens_a_local_directory() -> None:
    """The checks pass where the suite works (so they do not refuse good environments)."""
    assert problems() == [] and probe_local_paths() is None


@pytest.mark.slow
def test_the_suite_header_names_the_versions_and_profile(tmp_path: Path) -> None:
    run = run_pytest(
        tmp_path, "--cooker", "primus_energon:PREENCODED_COOKER", "--conformance-profile", "quick", "--co"
    )
    assert run.returncode == 0, run.stdout[-3000:]
    header = next(line for line in run.stdout.splitlines() if line.startswith("conformance profile:"))
    assert header.startswith("conformance profile: quick, seed 0; ")
    for name in ("primus-energon", "megatron-energon", "torch", "multi-storage-client", "hypothesis"):
        assert f"{name} {metadata.version(name)}" in header


@pytest.mark.slow
def test_a_dependency_the_suite_cannot_import_is_one_usage_error_line(tmp_path: Path) -> None:
    """hypothesis made unimportable for the run (a directory on the path whose hypothesis.py raises
    ImportError): the suite says so in one line, exit 4, with the install command, before any property."""
    blocker = tmp_path / "blocked"
    blocker.mkdir()
    (blocker / "hypothesis").mkdir()
    # A namespace-less package that find_spec sees but that is no hypothesis: the real check is the import
    (blocker / "hypothesis" / "__init__.py").write_text("raise ImportError('blocked for this test')\n")
    run = run_pytest(
        tmp_path,
        "-p",
        "no:hypothesispytest",
        "--cooker",
        "primus_energon:PREENCODED_COOKER",
        "--conformance-profile",
        "quick",
        pythonpath=str(blocker),
    )
    output = run.stdout + run.stderr
    errors = [line for line in output.splitlines() if line.startswith("ERROR:")]
    assert run.returncode == 4 and len(errors) == 1, output[-3000:]
    assert "hypothesis" in errors[0] and "pip install 'primus-energon[test]'" in errors[0], errors
