"""Property 6 (resume): passes on the reference targets and on seeded augmentation; fails on unseeded
augmentation, on state kept in the TaskEncoder and on batches that carry no restore key, with a message
that names the step, the worker count and the batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conformance import check_cooker, check_task_encoder
from conformance.api import make_context
from conformance.fingerprint import fingerprint
from conformance.properties.resume import NUM_SAMPLES, _check_restore_sample, _plan, _reference, _steps_for
from conformance.results import PropertyFailure, PropertyResult
from conformance.target import resolve_target

ZOO = "tests.conformance_zoo.resume_broken"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One workspace for the module: the generated datasets are made once."""
    return tmp_path_factory.mktemp("resume")


def _resume(kind: str, spec: str, workdir: Path, profile: str = "quick") -> PropertyResult:
    check = check_cooker if kind == "cooker" else check_task_encoder
    (result,) = check(spec, properties=["resume"], profile=profile, workdir=workdir)
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "spec"),
    [
        ("cooker", "primus_energon:PREENCODED_COOKER"),
        ("cooker", "primus_energon:RAW_COOKER"),
        ("task_encoder", "primus_energon:EncodedDiffusionTaskEncoder"),
        ("task_encoder", "primus_energon:RawDiffusionTaskEncoder"),
        ("task_encoder", "primus_energon:MultiFormatTaskEncoder"),
        ("task_encoder", f"{ZOO}:SeededNoiseTaskEncoder"),
    ],
)
def test_resumable_targets_pass(kind: str, spec: str, workdir: Path) -> None:
    result = _resume(kind, spec, workdir)
    assert result.verdict == "pass", result.message
    restores = result.details["restores"]
    assert {
        "nw=0 direct",
        "nw=0 wrapper",
        "nw=0 resaved",
        "nw=2 direct",
        "nw=2 wrapper",
        "nw=2 resaved",
    } <= set(restores)
    if kind == "cooker":
        assert result.details["restore_sample"].startswith("not checked")
    else:
        assert result.details["restore_sample"].endswith("batches rebuilt")


def test_unseeded_augmentation_fails(workdir: Path) -> None:
    result = _resume("task_encoder", f"{ZOO}:UnseededNoiseTaskEncoder", workdir)
    assert result.verdict == "fail"
    assert "after restoring at step 0 (num_workers=0), batch 0" in result.message
    assert "latents" in result.message and "restore_seeds=True" in result.message
    assert result.reproduce.startswith("pytest --task-encoder ") and result.reproduce.endswith("-k resume")


def test_state_in_the_task_encoder_fails(workdir: Path) -> None:
    result = _resume("task_encoder", f"{ZOO}:StepCounterTaskEncoder", workdir)
    assert result.verdict == "fail"
    # Step 0 restores into a fresh counter as well; the first step after it exposes the counter.
    assert "after restoring at step 3 (num_workers=0), batch 0" in result.message
    assert ".step: expected 3, observed 0" in result.message
    assert "no state in self" in result.message


def test_batches_without_a_restore_key_fail(workdir: Path) -> None:
    result = _resume("task_encoder", f"{ZOO}:ListBatchTaskEncoder", workdir)
    assert result.verdict == "fail"
    assert "(num_workers=0) carries no __restore_key__" in result.message
    assert "restore_sample" in result.message and "list batch cannot carry one" in result.message


def test_steps_with_workers_avoid_energons_startup_race() -> None:
    steps = [0, 1, 3, 6, 7]
    assert _steps_for(steps, 0, quick=True) == steps
    assert _steps_for(steps, 2, quick=False) == [0, 3, 6, 7]
    assert _steps_for(steps, 2, quick=True) == [3, 6, 7]


def test_route_plan() -> None:
    every = ("direct", "wrapper", "resaved")
    assert _plan([0, 3, 6], 0, 6, thorough=False) == {0: every, 3: every, 6: every}
    assert _plan([3, 6], 2, 6, thorough=True) == {3: every, 6: every}
    plan = _plan([0, 3, 6, 7], 2, 6, thorough=False)
    assert plan == {0: ("direct",), 3: ("wrapper",), 7: ("direct",), 6: ("wrapper", "resaved")}


def test_batches_not_marked_stateless_fail(workdir: Path) -> None:
    result = _resume("task_encoder", f"{ZOO}:NotStatelessBatchTaskEncoder", workdir)
    assert result.verdict == "fail"
    assert "loader.restore_sample(<__restore_key__ of batch 0>) (num_workers=0) raised AssertionError" in (
        result.message
    )
    assert "@stateless" in result.message


def test_restore_sample_must_rebuild_the_same_batch(workdir: Path) -> None:
    """A rebuilt batch that differs from the one the loader produced is reported with where it differs."""
    target = resolve_target("primus_energon:EncodedDiffusionTaskEncoder")
    ctx = make_context(target, workdir=workdir, profile="quick")
    path = ctx.workspace.generated("preencoded", "resume", num_samples=NUM_SAMPLES, shard_size=6)
    ref = _reference(ctx, path, 0, {0}, 2)
    assert _check_restore_sample(ctx, path, ref, [0, 1], None) == 2
    ref.batches[1] = fingerprint({"latents": torch.zeros(1)})
    with pytest.raises(
        PropertyFailure, match=r"did not rebuild batch 1 \(keys .*\): .*restore_sample re-runs"
    ):
        _check_restore_sample(ctx, path, ref, [0, 1], None)
