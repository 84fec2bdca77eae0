"""The pytest plugin end to end: real `pytest` subprocesses, from a directory outside the project."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import run_pytest

REPO = Path(__file__).parents[1]


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run_pytest(cwd, *args)


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
    assert "property 3 (Fidelity): " in run.stdout and "reproduce: pytest --cooker" in run.stdout
    assert "[data] fidelity/text:" in run.stdout
    document = json.loads((report / "report.json").read_text())
    assert document["schema"] == "primus-energon/conformance-report/v2"
    assert document["profile"] == "quick" and document["seed"] == 0 and document["exitstatus"] == 1
    assert document["versions"]["megatron-energon"] and document["platform"]["machine"]
    verdicts = {r["property"]: r["verdict"] for r in document["results"]}
    assert verdicts == {"keys": "pass", "fidelity": "fail"}
    claims = {c["id"]: c["verdict"] for r in document["results"] for c in r["claims"]}
    assert claims["fidelity/text"] == "fail" and claims["fidelity/tensors"] == "pass"
    assert claims["keys/key"] == "pass" and claims["fidelity/images"] == "skip"
    # the stripped caption: the edge cases show it, and hypothesis-drawn texts may too
    assert {f["claim"] for f in document["failures"]} <= {"fidelity/text", "fidelity/payloads"}
    assert "fidelity/text" in {f["claim"] for f in document["failures"]}
    assert document["failures"][0]["fix"] and document["advice"] == []
    assert "fidelity/text" in (report / "report.md").read_text()
    junit = (report / "junit.xml").read_text()
    assert "test_property" in junit and "conformance_result" in junit


@pytest.mark.slow
def test_xfails_file_turns_the_failure_into_xfail_and_warns_on_unmatched_ids(tmp_path: Path) -> None:
    xfails = tmp_path / "xfails.txt"
    xfails.write_text("# known problems\nfidelity]  # strips captions on purpose\ntest_no_such_property\n")
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


@pytest.mark.slow
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


def test_the_run_leaves_nothing_in_the_users_folder_but_the_report(tmp_path: Path) -> None:
    """Hypothesis's cache and pytest-benchmark's storage go to a temporary folder of the run (removed at its
    end), not to .hypothesis/ and .benchmarks/ in the folder the user runs in; the report asked for stays."""
    folder = tmp_path / "project"
    folder.mkdir()
    run = _pytest(
        folder,
        "--cooker",
        "primus_energon:PREENCODED_COOKER",
        "--conformance-profile",
        "quick",
        "--conformance-property",
        "purity",  # draws with hypothesis
        "--conformance-report",
        "out",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert sorted(p.name for p in folder.iterdir()) == ["out"]


@pytest.mark.slow
def test_wrappers_get_the_wrapper_and_restart_properties_only(tmp_path: Path) -> None:
    """--wrapper collects three tests per wrapper (its contract, resume as training resumes, and what it
    leaves behind); the reference passes all three, a wrapper that spins on an empty loader and passes
    Energon's bare state through fails the first two, and the run ends without a child process left."""
    run = _pytest(
        tmp_path,
        "--wrapper",
        "primus_energon:MegatronDataloaderWrapper",
        "--wrapper",
        "tests.conformance_zoo.wrappers:SpinningWrapper",
        "-v",
    )
    assert run.returncode == 1, run.stdout[-3000:]
    assert "test_property[MegatronDataloaderWrapper-wrapper] PASSED" in run.stdout
    assert "test_property[MegatronDataloaderWrapper-restart] PASSED" in run.stdout
    assert "test_property[SpinningWrapper-wrapper] FAILED" in run.stdout
    assert "test_property[SpinningWrapper-restart] FAILED" in run.stdout
    assert "[crash] wrapper/empty" in run.stdout and "[resume] restart/world_size" in run.stdout
    assert "test_property[MegatronDataloaderWrapper-conduct] PASSED" in run.stdout
    assert "MegatronDataloaderWrapper-accepted" not in run.stdout and "2 failed, 4 passed" in run.stdout


def test_plugin_stays_out_of_the_way_without_its_options(tmp_path: Path) -> None:
    (tmp_path / "test_unrelated.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    run = _pytest(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "1 passed" in run.stdout and "conformance targets" not in run.stdout


_HEAVY = ("torch", "megatron", "hypothesis", "numpy", "webdataset", "primus_energon.conformance.api")

_IMPORT_COST_PROBE = f"""
import sys

def test_the_plugin_is_loaded_and_light(request):
    assert request.config.pluginmanager.has_plugin("primus_energon_conformance")
    assert request.config.getoption("cooker") == []
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in {_HEAVY!r} or m in {_HEAVY!r})
    assert heavy == [], heavy
"""


def test_the_plugin_imports_nothing_heavy_without_a_target(tmp_path: Path) -> None:
    """Installing the package must not slow down an unrelated pytest run: loading the plugin (through its
    ``pytest11`` entry point, in a fresh interpreter) imports neither torch, Energon, hypothesis nor the
    suite. The probe test fails if anything heavy is in ``sys.modules`` after the plugin loaded."""
    (tmp_path / "test_probe.py").write_text(_IMPORT_COST_PROBE)
    run = _pytest(tmp_path, "-p", "no:xdist", "-p", "no:benchmark", "-p", "no:hypothesispytest")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "1 passed" in run.stdout


@pytest.mark.slow
def test_the_suite_loads_only_with_a_target_and_under_its_installed_name(tmp_path: Path) -> None:
    """The same probe with a target given sees the suite load (so the probe above can fail), as
    ``primus_energon.conformance`` only: never as a top-level ``conformance``, the name of the source folder,
    which would collide with a user's own package."""
    (tmp_path / "conftest.py").write_text(
        "def pytest_sessionfinish(session):\n"
        "    import sys\n"
        "    print('LOADED:', sorted(m for m in sys.modules if m.partition('.')[0] == 'conformance'\n"
        "        or m.startswith('primus_energon.conformance.verdict.suite')))\n"
    )
    run = _pytest(tmp_path, "-s", "--cooker", "primus_energon:PREENCODED_COOKER", "--collect-only", "-q")
    assert run.returncode == 0, run.stdout[-3000:]
    assert (
        "LOADED: ['primus_energon.conformance.verdict.suite', 'primus_energon.conformance.verdict.suite.test_conformance']"
        in run.stdout
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--cooker", "no_such_module:cook"],
            "--cooker no_such_module:cook: cannot import module 'no_such_module'",
        ),
        (["--cooker", "primus_energon:no_such_cook"], "has no attribute 'no_such_cook'"),
        (
            ["--cooker", "primus_energon:EncodedDiffusionTaskEncoder"],
            "is a TaskEncoder class, not an Energon Cooker or a cook function; check it with --task-encoder "
            "primus_energon:EncodedDiffusionTaskEncoder",
        ),
        (
            ["--task-encoder", "primus_energon:PREENCODED_COOKER"],
            "is a Cooker, not a TaskEncoder class or instance; check it with --cooker primus_energon:PREENCODED_COOKER",
        ),
        (
            ["--wrapper", "primus_energon:cook_preencoded_diffusion"],
            "is a function, not a wrapper class (built as Wrapper(loader)",
        ),
        (
            ["--cooker", "primus_energon:PREENCODED_COOKER", "--conformance-schema", "/nonexistent.yaml"],
            "--conformance-schema /nonexistent.yaml",
        ),
        (
            ["--cooker", "primus_energon:PREENCODED_COOKER", "--conformance-dataset", "/nonexistent"],
            "not a prepared dataset",
        ),
        (
            [
                "--cooker",
                "primus_energon:PREENCODED_COOKER",
                "--conformance-transform",
                "caption: drop rate=0.1",
            ],
            "--conformance-transform: transform 'caption: drop rate=0.1': unknown kind 'drop'",
        ),
    ],
)
def test_usage_errors_are_one_line_and_exit_4(tmp_path: Path, args: list[str], expected: str) -> None:
    """A typo is a usage error: one line, pytest's status 4, and nothing per property."""
    run = _pytest(tmp_path, *args, "--conformance-profile", "quick")
    output = run.stdout + run.stderr
    assert run.returncode == 4, output[-3000:]
    assert expected in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1, output[-3000:]
    assert "test_property" not in output and "Traceback" not in output and len(output.splitlines()) < 6


def test_declared_transforms_come_from_pyproject_and_the_command_line(tmp_path: Path) -> None:
    """conformance_transforms under [tool.pytest.ini_options] is read as pytest reads any ini option; a field
    given on the command line replaces the ini's declaration of it, and the reproduce line carries it."""
    (tmp_path / "pyproject.toml").write_text(
        "[tool.pytest.ini_options]\n"
        "conformance_transforms = [\n"
        "    'caption: dropout rate=0.5 to=\"\"',  # not the target's rate\n"
        "]\n"
    )
    args = [
        "--task-encoder",
        "tests.conformance_zoo.transforms:CfgDropoutTaskEncoder",
        "--conformance-profile",
    ]
    args += ["quick", "--conformance-property", "transforms"]
    from_ini = _pytest(tmp_path, *args)
    assert from_ini.returncode == 1, from_ini.stdout[-3000:] + from_ini.stderr[-3000:]
    assert "[data] transforms/rate: declared 'caption: dropout rate=0.5 to=\"\"'" in from_ini.stdout
    assert "--conformance-transform 'caption: dropout rate=0.5 to=\"\"'" in from_ini.stdout  # reproduce
    report = tmp_path / "report"
    replaced = _pytest(
        tmp_path,
        *args,
        "--conformance-transform",
        'caption: dropout rate=0.1 to=""',
        f"--conformance-report={report}",
    )
    assert replaced.returncode == 0, replaced.stdout[-3000:] + replaced.stderr[-3000:]
    assert "5 pass" in replaced.stdout, replaced.stdout[-2000:]
    assert 'declared transforms: caption: dropout rate=0.1 to=""' in replaced.stdout  # the header
    document = json.loads((report / "report.json").read_text())
    assert document["transforms"] == ['caption: dropout rate=0.1 to=""']


@pytest.mark.slow
def test_advice_is_reported_not_failed_unless_strict(tmp_path: Path) -> None:
    """A correct cooker whose errors do not name the sample passes with advice in the summary and the
    report; --conformance-strict turns the advice into a failure."""
    report = tmp_path / "report"
    args = [
        "--cooker",
        "tests.conformance_zoo.broken:cook_error_without_key",
        "--conformance-encoding",
        "preencoded",
    ]
    args += ["--conformance-profile", "quick", "--conformance-property", "bad_input"]
    run = _pytest(tmp_path, *args, f"--conformance-report={report}")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "advice (reported, not failures)" in run.stdout
    assert "bad_input/names_sample" in run.stdout and "fix: put the sample's __key__" in run.stdout
    document = json.loads((report / "report.json").read_text())
    assert [a["claim"] for a in document["advice"]] == ["bad_input/names_sample"]
    assert document["advice"][0]["fix"] and document["failures"] == [] and document["strict"] is False
    assert "Advice (reported, not failures)" in (report / "report.md").read_text()
    strict = _pytest(tmp_path, *args, "--conformance-strict")
    assert strict.returncode == 1, strict.stdout[-3000:]
    assert "[advice] bad_input/names_sample" in strict.stdout


@pytest.mark.slow
def test_an_xfails_file_can_name_one_claim(tmp_path: Path) -> None:
    """Listing one claim turns only that claim's failure into xfail: another failing claim of the same
    property still fails the run."""
    xfails = tmp_path / "xfails.txt"
    xfails.write_text("bad_input/missing_member  # zeros on purpose, tracked in our tracker\n")
    args = ["--cooker", "tests.conformance_zoo.broken:cook_zeros_on_bad_input", "--conformance-encoding"]
    args += ["preencoded", "--conformance-profile", "quick", "--conformance-property", "bad_input"]
    args += [f"--xfails-file={xfails}"]
    run = _pytest(tmp_path, *args)
    assert run.returncode == 1, run.stdout[-3000:]
    assert (
        "bad_input/corrupt_payload" in run.stdout and "[bad input] bad_input/missing_member" not in run.stdout
    )
    xfails.write_text(
        "bad_input/missing_member\nbad_input/corrupt_payload\nbad_input/wrong_type\nbad_input/not_utf8\n"
    )
    run = _pytest(tmp_path, *args, "-rxX")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "1 xfailed" in run.stdout


@pytest.mark.slow
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
    assert "property 3 (Fidelity): " in suite.stdout and "[data] fidelity/text:" in suite.stdout
