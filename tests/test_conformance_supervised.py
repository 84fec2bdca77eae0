"""The judge outlives the code it judges: real ``pytest --cooker/--task-encoder/--wrapper`` runs (fresh
interpreters, from an empty folder) on targets that end, crash or hang the process running them, or leave
threads, processes and files behind (tests/conformance_zoo/unruly.py). Each must end in bounded time with
the verdict named here, nothing still running afterwards, nothing unnamed in the folder it ran in, and
never a "defect of the suite"."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[1]
ZOO = "tests.conformance_zoo.unruly"


def _run(
    cwd: Path, *args: str, timeout: float = 420, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, float, list[str]]:
    """The run (``env`` added to this process's environment), its seconds, and the processes it left
    running (found by a variable only its processes carry, whatever session or parent they moved to)."""
    marker = uuid.uuid4().hex
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(REPO), "UNRULY_RUN": marker}
    env.pop("PYTEST_XDIST_WORKER", None)
    started = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-rs",
            "--conformance-profile",
            "quick",
            *args,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    seconds = time.monotonic() - started
    time.sleep(0.5)
    return run, seconds, _carrying(f"UNRULY_RUN={marker}".encode())


def _run_target(
    cwd: Path, option: str, name: str, properties: list[str], *extra: str
) -> tuple[subprocess.CompletedProcess, float, list[str]]:
    """:func:`_run` on the zoo target ``name`` (``--cooker``/``--task-encoder``/``--wrapper``), for these
    properties only."""
    selected = [arg for prop in properties for arg in ("--conformance-property", prop)]
    return _run(cwd, option, f"{ZOO}:{name}", *selected, *extra)


def _carrying(needle: bytes) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")[:200]
        except (OSError, IndexError):
            continue
        if needle in environ.split(b"\0") and state != "Z":
            found.append(f"{entry.name}: {command.decode('utf-8', 'replace')}")
    return found


def _no_suite_defect(run: subprocess.CompletedProcess) -> None:
    assert "defect of the suite" not in run.stdout and "defect of the conformance suite" not in run.stdout, (
        run.stdout[-4000:]
    )
    assert "INTERNALERROR" not in run.stdout + run.stderr, (run.stdout + run.stderr)[-4000:]


def test_os_exit_in_batch_fails_naming_the_call_and_leaves_no_rank_running(tmp_path: Path) -> None:
    run, _, left = _run_target(tmp_path, "--task-encoder", "ExitsInBatch", ["accepted", "batch", "sharding"])
    assert run.returncode == 1, run.stdout[-4000:]
    assert "[crash]" in run.stdout and "exited with status 0 during" in run.stdout, run.stdout[-4000:]
    _no_suite_defect(run)
    assert not left, left
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_segfault_is_named_with_its_signal_and_stack_and_writes_no_core_file(tmp_path: Path) -> None:
    run, _, left = _run_target(tmp_path, "--cooker", "SEGFAULTS", ["accepted", "keys"])
    assert run.returncode == 1, run.stdout[-4000:]
    assert "killed by signal SIGSEGV during cooking the clean sample" in run.stdout, run.stdout[-4000:]
    assert "_cook_segfaults" in run.stdout  # the stack names the target's frame
    # one root cause once: keys, in a fresh process, crashes the same way and points to accepted
    assert "as it did in property accepted" in run.stdout or "blocked by accepted/" in run.stdout, run.stdout[
        -4000:
    ]
    _no_suite_defect(run)
    assert not left, left
    assert list(tmp_path.iterdir()) == []  # no core file


def test_a_deadlocked_wrapper_next_is_named_within_its_budget_with_the_stuck_stack(tmp_path: Path) -> None:
    run, seconds, left = _run_target(
        tmp_path, "--wrapper", "DeadlocksOnFifthNext", ["wrapper"], "--conformance-call-timeout", "10"
    )
    assert run.returncode == 1, run.stdout[-4000:]
    assert "next() of the wrapper" in run.stdout and "did not return within 10 s" in run.stdout, run.stdout[
        -4000:
    ]
    assert "in __next__" in run.stdout  # the stuck thread's stack
    assert seconds < 240, seconds
    _no_suite_defect(run)
    assert not left, left


def test_a_non_daemon_thread_left_running_fails_conduct_threads(tmp_path: Path) -> None:
    # determinism too: its fresh processes must end although the thread runs in them as well
    run, seconds, left = _run_target(
        tmp_path, "--cooker", "STARTS_THREAD", ["accepted", "determinism", "conduct"]
    )
    assert run.returncode == 1, run.stdout[-4000:]
    assert (
        "[crash] conduct/threads: after property accepted: thread 'prefetch' (not a daemon) is still running"
        in run.stdout
    ), run.stdout[-4000:]
    assert "unruly.py" in run.stdout and "in _prefetch_forever" in run.stdout  # where it is
    assert seconds < 120, seconds
    _no_suite_defect(run)
    assert not left, left


def test_helper_processes_never_waited_for_fail_conduct_processes_and_are_ended(tmp_path: Path) -> None:
    run, _, left = _run_target(tmp_path, "--cooker", "STARTS_HELPERS", ["accepted", "conduct"])
    assert run.returncode == 1, run.stdout[-4000:]
    assert run.stdout.count("time.sleep(3600)) is still running; the suite ended it") == 3, run.stdout[-4000:]
    _no_suite_defect(run)
    assert not left, left


def test_debug_files_written_into_the_users_folder_are_advice_naming_them(tmp_path: Path) -> None:
    run, _, left = _run_target(tmp_path, "--cooker", "WRITES_DEBUG_FILES", ["accepted", "conduct"])
    assert run.returncode == 0, run.stdout[-4000:]
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written and all(n.startswith("debug_") for n in written), written  # each cooking process's first
    for name in written:
        assert f"{tmp_path / name} (written)" in run.stdout, run.stdout[-4000:]
    assert "conduct/files" in run.stdout
    _no_suite_defect(run)
    assert not left, left


def test_a_target_that_closes_stdout_is_judged_as_usual(tmp_path: Path) -> None:
    run, _, left = _run_target(tmp_path, "--cooker", "CLOSES_STDOUT", ["accepted", "keys", "conduct"])
    assert run.returncode == 0, run.stdout[-4000:]
    assert "3 passed" in run.stdout, run.stdout[-4000:]
    _no_suite_defect(run)
    assert not left, left


def test_a_correct_target_leaves_nothing_in_the_folder_or_the_temporary_directory(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # a temporary directory of its own, with a short path as /tmp has (multiprocessing's sockets live there)
    temp = Path(tempfile.mkdtemp(prefix="cft"))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    cwd = tmp_path / "work"
    cwd.mkdir()
    run, _, left = _run(
        cwd,
        "--cooker",
        "primus_energon:PREENCODED_COOKER",
        *("--conformance-property", "accepted", "--conformance-property", "sharding"),
        *("--conformance-property", "conduct"),
        env={"TMPDIR": str(temp)},
    )
    assert run.returncode == 0, run.stdout[-4000:]
    assert list(cwd.iterdir()) == []
    assert list(temp.iterdir()) == []  # no pytest-of-*, torchelastic_*, conformance-* folders
    assert not left, left


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_leaves_no_process_running(tmp_path: Path, signum: int) -> None:
    """Ctrl-C (or a CI runner's SIGTERM) while the torch.distributed ranks and the fresh-process checks run:
    pytest ends, and with it every process it started, whatever session those moved to."""
    marker = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(REPO), "UNRULY_RUN": marker}
    env.pop("PYTEST_XDIST_WORKER", None)
    args = ["--conformance-profile", "quick", "--task-encoder", "primus_energon:EncodedDiffusionTaskEncoder"]
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    needle = f"UNRULY_RUN={marker}".encode()
    deadline = time.monotonic() + 120
    # wait until the run has started processes of its own beyond the supervised one (ranks, children)
    while len(_carrying(needle)) < 4 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.5)
    assert process.poll() is None, "the run ended before it could be interrupted"
    started = len(_carrying(needle))
    process.send_signal(signum)
    output, _ = process.communicate(timeout=120)
    time.sleep(1.0)
    left = _carrying(needle)
    assert not left, (started, left, output[-3000:])
    assert list(tmp_path.iterdir()) == []


def test_the_python_api_supervised_reports_a_crash_and_the_caller_lives_on(tmp_path: Path) -> None:
    """check_cooker(..., supervised=True) runs the target as the plugin does: the segfault is a verdict of
    the property it happened in, not the end of the calling process; a correct target passes the same way."""
    from primus_energon.conformance import check_cooker

    (accepted, keys) = check_cooker(
        f"{ZOO}:SEGFAULTS",
        properties=["accepted", "keys"],
        profile="quick",
        supervised=True,
        workdir=tmp_path,
    )
    assert accepted.verdict == "fail", accepted.message
    loads = accepted.claim("accepted/loads")
    assert loads.verdict == "fail" and loads.harm == "crash", loads.message
    assert "killed by signal SIGSEGV during cooking the clean sample" in loads.message
    assert keys.verdict == "skip", keys.message  # blocked by accepted, once
    correct = check_cooker(
        "primus_energon:PREENCODED_COOKER",
        properties=["accepted", "keys", "conduct"],
        profile="quick",
        supervised=True,
    )
    assert [r.verdict for r in correct] == ["pass", "pass", "pass"], [r.message for r in correct]


def test_the_python_api_supervised_imports_nothing_of_the_target_in_the_caller(tmp_path: Path) -> None:
    """With supervised=True the caller neither imports the target's module nor builds the target, for a
    spec string with arguments, a cooker and a wrapper; the verdicts come from the supervised process."""
    script = f"""
import sys
from primus_energon.conformance import check_cooker, check_task_encoder, check_wrapper
te = check_task_encoder("{ZOO}:ExitsInBatch", properties=["keys"], profile="quick", supervised=True)
co = check_cooker("{ZOO}:SLOW_BUT_STEADY", properties=["keys"], profile="quick", supervised=True)
wr = check_wrapper("{ZOO}:DeadlocksOnFifthNext", properties=["keys"], profile="quick", supervised=True)
print("VERDICTS", [r.verdict for r in te + co + wr])
print("IMPORTED", sorted(m for m in sys.modules if m.startswith("tests")))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO), "UNRULY_RUN": uuid.uuid4().hex}
    env.pop("PYTEST_XDIST_WORKER", None)
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "IMPORTED []" in run.stdout, run.stdout
    # ExitsInBatch ends its process in its 4th batch (a crash verdict); keys does not apply to a wrapper
    assert "VERDICTS ['fail', 'pass', 'skip']" in run.stdout, run.stdout


ADVERSARIAL = "tests.conformance_zoo.adversarial"


@pytest.mark.parametrize("cook", ["cook_lying_caption", "cook_slow_comparison"])
def test_a_caption_that_lies_or_stalls_in_its_comparison_fails_fidelity_in_bounded_time(
    tmp_path: Path, cook: str
) -> None:
    """The judge compares plain data read inside the timed call: a ``str`` subclass whose ``==`` always
    says "equal" cannot pass its damaged caption, one whose ``==`` sleeps a minute is never called."""
    run, seconds, left = _run(
        tmp_path,
        "--cooker",
        f"{ADVERSARIAL}:{cook}",
        "--conformance-property",
        "accepted",
        "--conformance-property",
        "fidelity",
        "--conformance-call-timeout",
        "2",
    )
    assert run.returncode == 1, run.stdout[-4000:]
    assert "[data] fidelity/text:" in run.stdout and "text differs at character" in run.stdout, run.stdout[
        -4000:
    ]
    assert seconds < 120, seconds
    _no_suite_defect(run)
    assert not left, left


@pytest.mark.parametrize(
    "spec", [f"{ADVERSARIAL}:cook_forges_in_a_call", "tests.conformance_zoo.forging:cook_forged"]
)
def test_a_target_that_patches_the_suite_fails_every_claim_judged_after(tmp_path: Path, spec: str) -> None:
    """A target that makes ``ClaimCheck.problem`` a no-op (when imported, or in its first call) would pass
    its damaged captions: the seal finds the patch and every claim of that process fails, saying why."""
    run, _, left = _run(
        tmp_path, "--cooker", spec, "--conformance-property", "accepted", "--conformance-property", "fidelity"
    )
    assert run.returncode == 1, run.stdout[-4000:]
    said = "changed the conformance suite's own code in the process that runs it"
    assert run.stdout.count(said) >= 2, run.stdout[-4000:]
    assert "primus_energon.conformance.core.claims.ClaimCheck.problem" in run.stdout
    assert " passed" not in run.stdout.splitlines()[-1], run.stdout[-400:]
    _no_suite_defect(run)
    assert not left, left


def test_a_slow_target_whose_every_call_returns_is_no_hang(tmp_path: Path) -> None:
    """The budget is per call (each batch of a loader), not per stretch of calls: a target at 0.4 s a sample
    passes under a 3 s budget although the checks' loops over many batches take longer than that."""
    run, _, left = _run_target(
        tmp_path, "--cooker", "SLOW_BUT_STEADY", ["accepted", "resume"], "--conformance-call-timeout", "3"
    )
    assert run.returncode == 0, run.stdout[-4000:]
    assert "did not return within" not in run.stdout
    _no_suite_defect(run)
    assert not left, left
