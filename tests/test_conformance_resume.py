"""Property 6 (resume): passes on the reference targets and on seeded augmentation; resume/checkpoint,
resume/wrapper and resume/resaved fail on unseeded augmentation and on state kept in the TaskEncoder, and
each route fails on its own for a savable counter broken along that route only; resume/restore_sample is
advice (never a failure) for batches that carry no restore key or that Energon cannot rebuild. Messages
name the step, the worker count and the batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from primus_energon.conformance import check_cooker, check_task_encoder
from primus_energon.conformance.core.results import PropertyFailure, PropertyResult
from primus_energon.conformance.engine.session import make_context
from primus_energon.conformance.engine.target import resolve_target
from primus_energon.conformance.oracles.fingerprint import fingerprint
from primus_energon.conformance.properties.resume import (
    NUM_SAMPLES,
    _check_restore_sample,
    _plan,
    _reference,
    _steps_for,
)

ZOO = "tests.conformance_zoo.resume_broken"
ROUTES = ("resume/checkpoint", "resume/wrapper", "resume/resaved")


def _resume(kind: str, spec: str, workdir: Path, profile: str = "quick") -> PropertyResult:
    check = check_cooker if kind == "cooker" else check_task_encoder
    (result,) = check(spec, properties=["resume"], profile=profile, workdir=workdir)
    return result


def _assert_fails(result: PropertyResult, claim_id: str) -> str:
    """``claim_id`` failed, so the property failed naming it; returns the claim's message."""
    claim = result.claim(claim_id)
    assert claim.verdict == "fail", f"{claim_id}: {claim.verdict}: {claim.message}\n{result.verdicts()}"
    assert claim.examined > 0 and claim.fix, claim
    assert result.verdict == "fail" and f"] {claim_id}: " in result.message, result.message
    assert result.reproduce.startswith("pytest --task-encoder "), result.reproduce
    assert result.reproduce.endswith("--conformance-property resume"), result.reproduce
    return claim.message


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
    restore_sample = "skip" if kind == "cooker" else "pass"
    assert result.verdicts() == {**dict.fromkeys(ROUTES, "pass"), "resume/restore_sample": restore_sample}
    assert not result.advice and result.message == ""
    for claim_id in ROUTES:
        assert result.claim(claim_id).examined > 0, claim_id
    restores = result.details["restores"]
    assert {
        "nw=0 direct",
        "nw=0 wrapper",
        "nw=0 resaved",
        "nw=2 direct",
        "nw=2 wrapper",
        "nw=2 resaved",
    } <= set(restores)
    claim = result.claim("resume/restore_sample")
    if kind == "cooker":
        assert "a cooker target's batches are plain lists" in claim.message
        assert claim.examined == 0 and result.details["restore_sample"] == "0 batches rebuilt"
    else:
        assert claim.examined > 0
        assert result.details["restore_sample"] == f"{claim.examined} batches rebuilt"


def test_unseeded_augmentation_fails(workdir: Path) -> None:
    result = _resume("task_encoder", f"{ZOO}:UnseededNoiseTaskEncoder", workdir)
    message = _assert_fails(result, "resume/checkpoint")
    assert "after restoring at step 0 (num_workers=0), batch 0" in message.splitlines()[0], message
    assert "latents" in message and "restore_seeds=True" in message
    assert "restored with restore_state_rank() on a fresh loader" in message
    # Every route restores the same wrong noise; each is reported on its own claim.
    assert "restored with MegatronDataloaderWrapper.restore_state()" in _assert_fails(
        result, "resume/wrapper"
    )
    assert "the state saved right after a restore" in _assert_fails(result, "resume/resaved")
    rebuilt = result.claim("resume/restore_sample")
    assert rebuilt.verdict == "advice", rebuilt
    assert "did not rebuild batch 0" in rebuilt.message and "restore_sample re-runs" in rebuilt.message


def test_state_in_the_task_encoder_fails(workdir: Path) -> None:
    result = _resume("task_encoder", f"{ZOO}:StepCounterTaskEncoder", workdir)
    message = _assert_fails(result, "resume/checkpoint")
    # Step 0 restores into a fresh counter as well; the first step after it exposes the counter.
    assert "after restoring at step 0" not in message
    assert "after restoring at step 3 (num_workers=0), batch 0" in message.splitlines()[0], message
    assert ".step: expected 3, observed 0" in message
    assert "no state in self" in message
    for claim_id in ("resume/wrapper", "resume/resaved"):
        assert ".step: expected 3, observed 0" in _assert_fails(result, claim_id)


def test_a_stale_state_saved_right_after_a_restore_fails_resaved_only(workdir: Path) -> None:
    """The counter is restored lazily (at the next pass), and a save before that pass reports the old
    counter: restoring directly or through the wrapper continues right, restoring the re-saved state not."""
    result = _resume("task_encoder", f"{ZOO}:LazyRestoreTaskEncoder", workdir)
    message = _assert_fails(result, "resume/resaved")
    assert result.claim("resume/checkpoint").verdict == "pass", result.claim("resume/checkpoint").message
    assert result.claim("resume/wrapper").verdict == "pass", result.claim("resume/wrapper").message
    assert "] resume/checkpoint: " not in result.message and "] resume/wrapper: " not in result.message
    assert "after restoring at step 3 (num_workers=0), batch 0" in message
    assert ".batch_index: expected 3, observed 0" in message
    assert "the state saved right after a restore (before any batch)" in message
    # With workers, Energon hands back the restored state itself, so only num_workers=0 goes wrong.
    assert "num_workers=2" not in message


def test_a_save_between_restore_and_first_batch_fails_the_wrapper(workdir: Path) -> None:
    """The save drops the pending restore. With 0 workers only the wrapper, which saves right after
    restoring, continues at the wrong batch; with workers Energon saves in each worker after a restore."""
    result = _resume("task_encoder", f"{ZOO}:SaveDropsRestoreTaskEncoder", workdir)
    message = _assert_fails(result, "resume/wrapper")
    assert "after restoring at step 3 (num_workers=0), batch 0" in message
    assert ".batch_index: expected 3, observed 0" in message
    assert "restored with MegatronDataloaderWrapper.restore_state() on a fresh loader" in message
    direct = result.claim("resume/checkpoint")
    assert "num_workers=0" not in direct.message, direct.message  # the direct route is right without workers
    assert direct.verdict == "fail" and "(num_workers=2)" in direct.message, direct.message


def test_batches_without_a_restore_key_are_advice(workdir: Path) -> None:
    """A list batch resumes exactly; that restore_sample cannot rebuild it is an opinion, not a failure."""
    result = _resume("task_encoder", f"{ZOO}:ListBatchTaskEncoder", workdir)
    assert result.verdict == "pass", result.message
    assert {claim_id: result.claim(claim_id).verdict for claim_id in ROUTES} == dict.fromkeys(ROUTES, "pass")
    claim = result.claim("resume/restore_sample")
    assert claim.verdict == "advice" and result.advice == [claim]
    assert "(num_workers=0) carries no __restore_key__" in claim.message
    assert "restore_sample" in claim.message and "list batch cannot carry one" in claim.message
    assert "__restore_key__" in claim.fix
    assert result.reproduce == ""  # nothing failed


def test_batches_not_marked_stateless_are_advice(workdir: Path) -> None:
    result = _resume("task_encoder", f"{ZOO}:NotStatelessBatchTaskEncoder", workdir)
    assert result.verdict == "pass", result.message
    assert {claim_id: result.claim(claim_id).verdict for claim_id in ROUTES} == dict.fromkeys(ROUTES, "pass")
    claim = result.claim("resume/restore_sample")
    assert claim.verdict == "advice", claim
    assert "loader.restore_sample(<__restore_key__ of batch 0>) (num_workers=0) raised AssertionError" in (
        claim.message
    )
    assert "@stateless" in claim.message and "@stateless" in claim.fix


def test_strict_makes_restore_sample_advice_fail(workdir: Path) -> None:
    (result,) = check_task_encoder(
        f"{ZOO}:ListBatchTaskEncoder", properties=["resume"], profile="quick", workdir=workdir, strict=True
    )
    assert result.claim("resume/restore_sample").verdict == "advice"
    assert result.verdict == "fail" and "] resume/restore_sample: " in result.message, result.message
    assert result.reproduce.endswith("--conformance-property resume")


def test_steps_with_workers_avoid_energons_startup_race() -> None:
    steps = [0, 1, 3, 6, 7]
    assert _steps_for(steps, 0, quick=True) == steps
    assert _steps_for(steps, 2, quick=False) == [0, 3, 6, 7]
    assert _steps_for(steps, 2, quick=True) == [3, 6, 7]


def test_route_plan() -> None:
    every = ("direct", "wrapper", "resaved")
    assert _plan([0, 3, 6], True, 6, thorough=False) == {0: every, 3: every, 6: every}
    assert _plan([3, 6], False, 6, thorough=True) == {3: every, 6: every}
    plan = _plan([0, 3, 6, 7], False, 6, thorough=False)
    assert plan == {0: ("direct",), 3: ("wrapper",), 7: ("direct",), 6: ("wrapper", "resaved")}


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
