"""Property 5 (determinism across fresh processes): passes on the reference targets, fails on cookers that
depend on hash(), the process id or an unseeded RNG and on a TaskEncoder that pins the seed, and is
skipped for a target that a fresh process cannot rebuild."""

from __future__ import annotations

from pathlib import Path

import pytest
from megatron.energon import Cooker, stateless

from conformance import check_cooker, check_task_encoder
from conformance.results import PropertyResult
from conformance.runner import batch_keys, cook_order, parse_fingerprint
from primus_energon import cook_preencoded_diffusion

ZOO = "tests.conformance_zoo.determinism_broken"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One workspace for the module: the generated datasets are made once."""
    return tmp_path_factory.mktemp("determinism")


def _determinism(kind: str, target: object, workdir: Path) -> PropertyResult:
    check = check_cooker if kind == "cooker" else check_task_encoder
    (result,) = check(target, properties=["determinism"], profile="quick", workdir=workdir)
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
    assert result.details["workers"] == [0, 1, 2]


@pytest.mark.slow
@pytest.mark.parametrize("attr", ["HASH_NOISE_COOKER", "PID_NOISE_COOKER", "UNSEEDED_JITTER_COOKER"])
def test_process_dependent_cookers_fail(attr: str, workdir: Path) -> None:
    result = _determinism("cooker", f"{ZOO}:{attr}", workdir)
    assert result.verdict == "fail", result.message
    assert "two fresh processes with seed 0 (PYTHONHASHSEED=1 and 2), num_workers=0" in result.message
    assert "expected identical batches, observed batch 0 of 6 differs" in result.message
    assert "latents: tensor bytes differ" in result.message
    assert result.reproduce.endswith("-k determinism") and attr in result.reproduce


@pytest.mark.slow
def test_pinned_seed_fails(workdir: Path) -> None:
    result = _determinism("task_encoder", f"{ZOO}:PinnedSeedTaskEncoder", workdir)
    assert result.verdict == "fail", result.message
    assert "seed has no effect on the order for num_workers=0" in result.message
    assert "seeds 0 and 1 delivered the same samples in the same order" in result.message


def test_target_a_fresh_process_cannot_import_is_skipped(workdir: Path) -> None:
    cook = stateless(lambda sample: cook_preencoded_diffusion(sample))
    result = _determinism("cooker", Cooker(cook, has_subflavors={"encoding": "preencoded"}), workdir)
    assert result.verdict == "skip", result.message
    assert "cannot be rebuilt in a fresh process" in result.message and "not importable" in result.message


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
