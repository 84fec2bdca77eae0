"""The pytest plugin end to end: real `pytest` subprocesses, from a directory outside the project."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]

pytestmark = pytest.mark.slow


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_broken_cooker_exits_1_and_writes_reports(tmp_path: Path) -> None:
    report = tmp_path / "report"
    run = _pytest(
        tmp_path,
        "--cooker",
        "tests.conformance_zoo.broken:cook_strips_caption",
        "--encoding",
        "preencoded",
        "--conformance-profile",
        "quick",
        "-k",
        "fidelity or keys",
        f"--conformance-report={report}",
    )
    assert run.returncode == 1, run.stdout[-3000:]
    assert "conformance targets: cooker tests.conformance_zoo.broken:cook_strips_caption" in run.stdout
    assert "property 3 (Fidelity) failed" in run.stdout and "reproduce: pytest --cooker" in run.stdout
    document = json.loads((report / "report.json").read_text())
    assert document["schema"] == "primus-energon/conformance-report/v1"
    assert document["profile"] == "quick" and document["seed"] == 0 and document["exitstatus"] == 1
    assert document["versions"]["megatron-energon"] and document["platform"]["machine"]
    verdicts = {r["property"]: r["verdict"] for r in document["results"]}
    assert verdicts == {"keys": "pass", "fidelity": "fail"}
    assert "fidelity" in (report / "report.md").read_text()
    junit = (report / "junit.xml").read_text()
    assert "test_fidelity" in junit and "conformance_result" in junit


def test_xfails_file_turns_the_failure_into_xfail_and_warns_on_unmatched_ids(tmp_path: Path) -> None:
    xfails = tmp_path / "xfails.txt"
    xfails.write_text(
        "# known problems\ntest_fidelity  # strips captions on purpose\ntest_no_such_property\n"
    )
    run = _pytest(
        tmp_path,
        "--cooker",
        "tests.conformance_zoo.broken:cook_strips_caption",
        "--encoding",
        "preencoded",
        "--conformance-profile",
        "quick",
        "-k",
        "fidelity",
        f"--xfails-file={xfails}",
        "-rxX",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert "1 xfailed" in run.stdout
    assert "test_no_such_property" in run.stdout and "match no conformance test" in run.stdout


def test_reference_cooker_exits_0(tmp_path: Path) -> None:
    run = _pytest(
        tmp_path,
        "--cooker",
        "primus_energon:PREENCODED_COOKER",
        "--conformance-profile",
        "quick",
        "-k",
        "accepted or keys or purity",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert "3 passed" in run.stdout


def test_plugin_stays_out_of_the_way_without_its_options(tmp_path: Path) -> None:
    (tmp_path / "test_unrelated.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    run = _pytest(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "1 passed" in run.stdout and "conformance targets" not in run.stdout


def test_a_target_that_is_not_importable_is_a_clear_error(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "--cooker", "no_such_module:cook", "--conformance-profile", "quick", "-k", "keys")
    assert run.returncode != 0
    assert "cannot import module 'no_such_module'" in run.stdout + run.stderr


def test_a_project_that_uses_the_short_option_names_keeps_them(tmp_path: Path) -> None:
    """Installing this package must not break a test suite whose conftest adds --dataset or --encoding (a
    duplicate option name stops pytest): the project keeps them, the suite answers to --conformance-*."""
    (tmp_path / "conftest.py").write_text(
        "def pytest_addoption(parser):\n"
        "    parser.addoption('--dataset', default='none')\n"
        "    parser.addoption('--encoding', default='none')\n"
    )
    (tmp_path / "test_project.py").write_text(
        "def test_own_options(request):\n"
        "    assert request.config.getoption('--dataset') == '/data/imagenet'\n"
        "    assert request.config.getoption('--encoding') == 'jpeg'\n"
    )
    own = _pytest(tmp_path, "--dataset", "/data/imagenet", "--encoding", "jpeg")
    assert own.returncode == 0 and "1 passed" in own.stdout, own.stdout[-3000:] + own.stderr[-3000:]
    suite = _pytest(
        tmp_path,
        "--cooker",
        "tests.conformance_zoo.broken:cook_strips_caption",
        "--conformance-encoding",
        "preencoded",
        "--encoding",
        "jpeg",
        "--conformance-profile",
        "quick",
        "-k",
        "fidelity",
    )
    assert suite.returncode == 1, suite.stdout[-3000:] + suite.stderr[-3000:]
    assert "property 3 (Fidelity) failed" in suite.stdout
