"""Property 5 (determinism across fresh processes): passes on the reference targets; determinism/
fresh_processes fails on cookers that depend on hash(), the process id or an unseeded RNG,
determinism/seed on a TaskEncoder that pins the seed, each without the other; the property is skipped for
a target that a fresh process cannot rebuild, and a child that does not finish fails with its command."""

from __future__ import annotations

from pathlib import Path

import pytest
from megatron.energon import Cooker, stateless

from primus_energon import cook_preencoded_diffusion
from primus_energon.conformance import check_cooker, check_task_encoder
from primus_energon.conformance.core.results import PropertyResult
from primus_energon.conformance.engine.recording import cook_order
from primus_energon.conformance.oracles.fingerprint import parse_fingerprint
from primus_energon.conformance.properties._common import batch_keys

ZOO = "tests.conformance_zoo.determinism_broken"


def _determinism(kind: str, target: object, workdir: Path, **options: object) -> PropertyResult:
    check = check_cooker if kind == "cooker" else check_task_encoder
    (result,) = check(target, properties=["determinism"], profile="quick", workdir=workdir, **options)
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "spec"),
    [
        ("cooker", "primus_energon:PREENCODED_COOKER"),
        ("task_encoder", "primus_energon:MultiFormatTaskEncoder"),
    ],
)
def test_reference_targets_pass(kind: str, spec: str, workdir: Path) -> None:
    result = _determinism(kind, spec, workdir)
    assert result.verdict == "pass", result.message
    assert result.verdicts() == {"determinism/fresh_processes": "pass", "determinism/seed": "pass"}
    datasets = result.details["datasets"]
    assert datasets == (2 if "MultiFormat" in spec else 1)
    # Every batch of every worker count of every dataset was compared, for each claim (quick: 0 and 2
    # workers; ci and thorough also 1).
    assert result.details["workers"] == [0, 2]
    for claim_id in ("determinism/fresh_processes", "determinism/seed"):
        assert result.claim(claim_id).examined == datasets * 2 * 6, claim_id
    assert set(result.details["child_seconds"]) == {"a", "b"}


@pytest.mark.parametrize(
    "attr",
    [
        pytest.param("HASH_NOISE_COOKER", marks=pytest.mark.slow),
        "PID_NOISE_COOKER",
        pytest.param("UNSEEDED_JITTER_COOKER", marks=pytest.mark.slow),
    ],
)
def test_process_dependent_cookers_fail(attr: str, workdir: Path) -> None:
    result = _determinism("cooker", f"{ZOO}:{attr}", workdir)
    claim = result.claim("determinism/fresh_processes")
    assert claim.verdict == "fail", f"{claim.verdict}: {claim.message}"
    assert "two fresh processes with seed 0 (PYTHONHASHSEED=1 and 2), num_workers=0" in claim.message
    assert "expected identical batches, observed batch 0 of 6 differs" in claim.message
    assert "latents: tensor bytes differ" in claim.message
    assert "hash()" in claim.fix and "restore_seeds=True" in claim.fix
    # The values differ, the order still follows the seed.
    assert result.claim("determinism/seed").verdict == "pass", result.claim("determinism/seed").message
    assert result.verdict == "fail" and "] determinism/fresh_processes: " in result.message
    assert "] determinism/seed: " not in result.message
    assert result.reproduce.endswith("--conformance-property determinism") and attr in result.reproduce


@pytest.mark.slow
def test_pinned_seed_fails(workdir: Path) -> None:
    result = _determinism("task_encoder", f"{ZOO}:PinnedSeedTaskEncoder", workdir)
    claim = result.claim("determinism/seed")
    assert claim.verdict == "fail", f"{claim.verdict}: {claim.message}"
    assert "seed has no effect on the order for num_workers=0" in claim.message
    assert "seeds 0 and 1 delivered the same samples in the same order" in claim.message
    assert "num_workers=2" in claim.message  # every worker count is reported, not only the first
    # Pinned, it is still the same in two fresh processes.
    fresh = result.claim("determinism/fresh_processes")
    assert fresh.verdict == "pass", fresh.message
    assert result.verdict == "fail" and "] determinism/seed: " in result.message
    assert "] determinism/fresh_processes: " not in result.message


def test_target_a_fresh_process_cannot_import_is_skipped(workdir: Path) -> None:
    cook = stateless(lambda sample: cook_preencoded_diffusion(sample))
    result = _determinism("cooker", Cooker(cook, has_subflavors={"encoding": "preencoded"}), workdir)
    assert result.verdict == "skip", result.message
    assert "cannot be rebuilt in a fresh process" in result.message and "not importable" in result.message
    for claim in result.claims:
        assert claim.verdict == "skip" and "not importable" in claim.message, claim


def test_a_child_that_does_not_finish_fails_naming_its_command(workdir: Path) -> None:
    """Children that hang (the cooker does, in them only): fresh_processes fails with the command, and seed,
    which needs their output, is skipped saying why."""
    spec = "tests.conformance_zoo.pathological:cook_hangs_in_the_determinism_runs"
    result = _determinism("cooker", spec, workdir, timeout_s=3)
    claim = result.claim("determinism/fresh_processes")
    assert claim.verdict == "fail", f"{claim.verdict}: {claim.message}"
    assert "the determinism child process (a) did not finish within 3 s (killed)" in claim.message
    assert (
        "PYTHONHASHSEED=1 " in claim.message
        and "primus_energon.conformance.processes.runner determinism" in claim.message
    )
    seed = result.claim("determinism/seed")
    assert seed.verdict == "skip" and "child processes did not finish" in seed.message, seed
    assert result.verdict == "fail"


def test_runner_helpers() -> None:
    assert batch_keys({"__key__": ["a", "b"], "x": 1}) == ["a", "b"]
    assert batch_keys([{"__key__": "a"}, {"__key__": "b"}]) == ["a", "b"]
    assert batch_keys({"latents": 1}) is None and batch_keys([1, 2]) is None
    records = [{"pid": 7, "key": "b"}, {"pid": 5, "key": "x"}, {"pid": 7, "key": "c"}, {"pid": 5, "key": "y"}]
    assert cook_order(records, per_process=1) == [["b"], ["x"]]
    assert cook_order(records) == [["b", "c"], ["x", "y"]]
    assert parse_fingerprint(repr(("tensor", "torch.float32", (2, 3), "ab", b"\x00"))) == (
        "tensor",
        "torch.float32",
        (2, 3),
        "ab",
        b"\x00",
    )
    assert parse_fingerprint("not a literal(") is None


def test_packs_built_over_a_set_differ_between_hash_seeds(workdir: Path) -> None:
    """A packer that takes its samples from a set of keys builds other packs under another PYTHONHASHSEED:
    the fresh processes read a loader that packs too, and the message says what differs between them."""
    result = _determinism(
        "task_encoder", "tests.conformance_zoo.packing_hashseed:SetOrderPackingTaskEncoder", workdir
    )
    claim = result.claim("determinism/fresh_processes")
    assert claim.verdict == "fail", result.verdicts()
    assert "num_workers=0, packing" in claim.message, claim.message
    assert "num_workers=2," not in claim.message  # unpacked loaders do not run the packer: identical
    assert "their PYTHONHASHSEED (so iteration over a set, or hash() of a str or bytes)" in claim.message
    assert result.details["packing_buffer_size"] == 8


@pytest.mark.slow
def test_a_correct_packer_is_deterministic_across_hash_seeds(workdir: Path) -> None:
    result = _determinism("task_encoder", "tests.conformance_zoo.packing:FirstFitPackingTaskEncoder", workdir)
    assert result.claim("determinism/fresh_processes").verdict == "pass", result.message
    assert result.details["packing_buffer_size"] == 8
    # every batch of 0 and 2 workers, and of the packed loader
    assert result.claim("determinism/fresh_processes").examined > 2 * 6
