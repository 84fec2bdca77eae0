"""Property 9 (distributed sharding): passes on the reference targets (in-process ranks and a real
two-rank torch.distributed run), fails with the missing or repeated keys named on targets that shard on
top of Energon or make every rank read everything, and reports a hung or crashed child with its command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from megatron.energon import Cooker, stateless

from conformance import check_cooker, check_task_encoder
from conformance.results import PropertyFailure, PropertyResult
from conformance.runner import child_env, finish, start
from primus_energon import cook_preencoded_diffusion

ZOO = "tests.conformance_zoo.sharding_broken"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One workspace for the module: the generated datasets are made once."""
    return tmp_path_factory.mktemp("sharding")


def _sharding(kind: str, target: object, workdir: Path) -> PropertyResult:
    check = check_cooker if kind == "cooker" else check_task_encoder
    (result,) = check(target, properties=["sharding"], profile="quick", workdir=workdir)
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "spec"),
    [
        ("task_encoder", "primus_energon:MultiFormatTaskEncoder"),
        ("task_encoder", f"{ZOO}:KeylessBatchTaskEncoder"),
    ],
)
def test_conformant_targets_pass(kind: str, spec: str, workdir: Path) -> None:
    result = _sharding(kind, spec, workdir)
    assert result.verdict == "pass", result.message
    runs = result.details["runs"]
    assert {"ws=2 nw=0", "ws=2 nw=2", "ws=4 nw=0"} == {run.rsplit(" keys", 1)[0] for run in runs}
    source = "cooker" if "Keyless" in spec else "batch"
    assert all(run.endswith(f"keys from {source}") for run in runs)
    assert result.details["distributed_seconds"] > 0


def test_manual_sharding_on_top_reports_missing_keys(workdir: Path) -> None:
    result = _sharding("cooker", f"{ZOO}:DOUBLE_SHARDED_COOKER", workdir)
    assert result.verdict == "fail", result.message
    assert result.message.startswith("world size 2, num_workers=0, one epoch (repeat=False)")
    assert "expected each of the 46 samples exactly once across ranks" in result.message
    assert "keys on no rank [sharding_0000" in result.message and "keys from the batches" in result.message
    assert result.reproduce.endswith("-k sharding")


def test_missing_keys_found_through_the_cookers_when_batches_have_none(workdir: Path) -> None:
    result = _sharding("task_encoder", f"{ZOO}:KeylessDoubleShardedTaskEncoder", workdir)
    assert result.verdict == "fail", result.message
    assert "keys on no rank" in result.message and "keys from the cookers" in result.message


def test_every_rank_reading_everything_reports_shared_keys(workdir: Path) -> None:
    result = _sharding("task_encoder", f"{ZOO}:IgnoresRankTaskEncoder", workdir)
    assert result.verdict == "fail", result.message
    assert "46 keys went to more than one rank ('sharding_000000' on ranks [0, 1]" in result.message
    assert "samples per rank: rank 0: 46, rank 1: 46" in result.message


@pytest.mark.slow
def test_sharding_by_torch_distributed_rank_fails_in_the_real_run(workdir: Path) -> None:
    result = _sharding("cooker", f"{ZOO}:TORCH_DISTRIBUTED_SHARDED_COOKER", workdir)
    assert result.verdict == "fail", result.message
    assert result.message.startswith("torch.distributed (gloo, 2 processes started by torch.distributed.run)")
    assert "keys on no rank" in result.message


def test_target_a_fresh_process_cannot_import_is_checked_in_process_then_skipped(workdir: Path) -> None:
    cook = stateless(lambda sample: cook_preencoded_diffusion(sample))
    result = _sharding("cooker", Cooker(cook, has_subflavors={"encoding": "preencoded"}), workdir)
    assert result.verdict == "skip", result.message
    assert result.message.startswith("in-process sharding passed (ws=2 nw=0 keys from batch;")
    assert "the torch.distributed run was not: cooker" in result.message
    assert "cannot be rebuilt in a fresh process" in result.message and "not importable" in result.message


def test_child_timeout_and_crash_are_failures_naming_the_command() -> None:
    sleeper = start(
        [sys.executable, "-c", "import time; time.sleep(60)"], env=child_env(7), show_env=["PYTHONHASHSEED"]
    )
    with pytest.raises(
        PropertyFailure, match=r"did not finish within 1 s \(killed\).*PYTHONHASHSEED=7 .*sleep"
    ):
        finish(sleeper, what="the sleeper", reproduce="pytest -k x", timeout=1)
    assert sleeper.process.returncode is not None
    crasher = start([sys.executable, "-c", "raise SystemExit('boom')"], env=child_env())
    with pytest.raises(PropertyFailure, match=r"exited with status 1.*boom") as info:
        finish(crasher, what="the crasher", reproduce="pytest -k y")
    assert info.value.reproduce == "pytest -k y"
