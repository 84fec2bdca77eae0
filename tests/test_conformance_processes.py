"""No process outlives its check: a target that hangs inside a torch.distributed rank is reported, and the
torchrun agent and both rank processes (which torchrun starts in sessions of their own) are ended; no thread
outlives an in-process check either."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from primus_energon.conformance import check_task_encoder
from primus_energon.conformance.processes.children import (
    CHILD_TAG_VARIABLE,
    child_env,
    runner_command,
    start,
    stop,
    tagged_processes,
)
from tests.helpers import live_descendants, live_processes


@pytest.mark.slow
def test_a_rank_that_hangs_is_reported_and_every_rank_process_ended(tmp_path: Path) -> None:
    spec = "tests.conformance_zoo.pathological:HangsInARankTaskEncoder"
    # the ranks hang whatever the limit: a short one only makes the test wait less
    (result,) = check_task_encoder(
        spec, properties=["sharding"], profile="quick", workdir=tmp_path, timeout_s=20
    )
    assert result.claim("sharding/in_process").verdict == "pass", result.claim("sharding/in_process").message
    distributed = result.claim("sharding/distributed")
    assert distributed.verdict == "fail", distributed.message
    assert "did not finish within 20 s" in distributed.message
    deadline = time.monotonic() + 5
    while (live_processes("HangsInARankTaskEncoder") or live_descendants()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not live_processes("HangsInARankTaskEncoder") and not live_descendants()


def test_stop_ends_processes_that_left_the_session(tmp_path: Path) -> None:
    """A grandchild in a session of its own (as torchrun starts its ranks) is found by the inherited tag."""
    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
        "time.sleep(600)\n"
    )
    child = start([sys.executable, "-c", script], env=child_env())
    deadline = time.monotonic() + 20
    while len(tagged_processes(child.tag)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(tagged_processes(child.tag)) == 2  # the child and its grandchild in another session
    stop(child)
    assert tagged_processes(child.tag) == []
    assert CHILD_TAG_VARIABLE == "PRIMUS_CONFORMANCE_CHILD" and runner_command("probe", [])[-1] == "probe"


def test_children_started_ahead_end_with_the_check_even_when_their_property_is_blocked(
    tmp_path: Path,
) -> None:
    """determinism, sharding and bad_input start their children when the context is made (prestart). A
    target that fails accepted blocks determinism and sharding: their children, started for nothing, must
    still end, and bad_input's probe (which always runs) still reports."""
    spec = "tests.conformance_zoo.pathological:cook_raises_always"
    from primus_energon.conformance.engine.session import make_context, prestart, run_property
    from primus_energon.conformance.engine.target import resolve_target
    from primus_energon.conformance.properties import get_property

    ctx = make_context(
        resolve_target(spec, kind="cooker"), workdir=tmp_path, profile="quick", encoding="preencoded"
    )
    props = [get_property(p) for p in ("accepted", "determinism", "sharding", "bad_input")]
    try:
        prestart(ctx, props)
        started = dict(ctx._started)
        assert set(started) == {"determinism", "sharding", "bad_input"}
        assert all(error is None for _, error in started.values())
        assert live_descendants(), "prestart started no child process"
        results = {p.id: run_property(p, ctx) for p in props}
    finally:
        ctx.close()
    assert ctx._started == {}
    assert results["accepted"].verdict == "fail"
    assert results["determinism"].verdict == results["sharding"].verdict == "skip"
    assert "blocked by accepted/" in results["determinism"].message
    assert results["bad_input"].claim("bad_input/code_execution").verdict == "pass"
    deadline = time.monotonic() + 5
    while (live_processes("cook_raises_always") or live_descendants()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not live_processes("cook_raises_always") and not live_descendants()


def test_children_run_under_an_address_space_cap_and_a_failure_names_it(monkeypatch) -> None:
    """Every child the suite starts has its address space capped (physical memory by default); a child
    that allocates past the cap fails with a MemoryError, and the failure says which limit it hit."""
    from primus_energon.conformance.core.results import PropertyFailure
    from primus_energon.conformance.processes.children import CHILD_MEMORY_VARIABLE, child_memory_cap, finish

    show = "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0])"
    child = start([sys.executable, "-c", show], env=child_env())
    finish(child, what="the limit probe", reproduce="")
    child.stdout.seek(0)
    assert int(child.stdout.read()) == child_memory_cap() > 0

    monkeypatch.setenv(CHILD_MEMORY_VARIABLE, "1")
    assert child_memory_cap() == 1 << 30
    child = start([sys.executable, "-c", "block = bytearray(2 << 30)"], env=child_env())
    with pytest.raises(PropertyFailure) as failure:
        finish(child, what="the allocating child", reproduce="")
    assert "MemoryError" in str(failure.value)
    assert "caps each child process at 1.0 GiB of address space" in str(failure.value)
    monkeypatch.setenv(CHILD_MEMORY_VARIABLE, "0")
    assert child_memory_cap() is None


def test_the_suites_loaders_leave_no_thread_behind(workdir: Path) -> None:
    """An in-process check builds dozens of loaders; none leaves a thread running after the check (Energon's
    watchdog thread, started at each iteration and never finished, piled up by the hundred in one process)."""
    import threading

    check_task_encoder(
        "primus_energon:EncodedDiffusionTaskEncoder",
        properties=["accepted"],
        profile="quick",
        workdir=workdir,
    )  # the dataset and the process's one-off threads (tqdm's monitor) exist before the count
    before = set(threading.enumerate())
    results = check_task_encoder(
        "primus_energon:EncodedDiffusionTaskEncoder",
        properties=["fidelity", "resume", "purity"],
        profile="quick",
        workdir=workdir,
    )
    assert all(r.verdict == "pass" for r in results), [(r.property, r.message) for r in results]
    deadline = time.monotonic() + 10  # threads a closed loader is ending may take a moment
    while (left := [t for t in threading.enumerate() if t not in before]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"{len(left)} thread(s) left running: {sorted({t.name for t in left})[:5]}"
