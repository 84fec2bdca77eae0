"""Property 9 (distributed sharding): passes on the reference targets (in-process ranks and a real
two-rank torch.distributed run); sharding/in_process and sharding/distributed fail with the missing or
repeated keys named on targets that shard on top of Energon or make every rank read everything, and
sharding/distributed alone on a target that shards by the torch.distributed rank; a hung or crashed child
is a failure naming its command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from megatron.energon import Cooker, stateless

from primus_energon import cook_preencoded_diffusion
from primus_energon.conformance import check_cooker, check_task_encoder
from primus_energon.conformance.core.results import PropertyFailure, PropertyResult
from primus_energon.conformance.engine.session import make_context
from primus_energon.conformance.engine.target import resolve_target
from primus_energon.conformance.processes.children import child_env, finish, start
from primus_energon.conformance.properties.sharding import _verify
from primus_energon.energon_compat import energon_key

ZOO = "tests.conformance_zoo.sharding_broken"


def _sharding(kind: str, target: object, workdir: Path, **options: object) -> PropertyResult:
    # ci: world sizes 2 and 4 (quick checks 2 only)
    check = check_cooker if kind == "cooker" else check_task_encoder
    (result,) = check(target, properties=["sharding"], profile="ci", workdir=workdir, **options)
    return result


def _failed(result: PropertyResult, claim_id: str) -> str:
    """``claim_id`` failed and the property with it, naming it; returns the claim's message."""
    claim = result.claim(claim_id)
    assert claim.verdict == "fail", f"{claim_id}: {claim.verdict}: {claim.message}\n{result.verdicts()}"
    assert claim.examined > 0 and claim.fix
    assert result.verdict == "fail" and f"] {claim_id}: " in result.message, result.message
    assert result.reproduce.endswith("--conformance-property sharding")
    return claim.message


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
    assert result.verdicts() == {"sharding/in_process": "pass", "sharding/distributed": "pass"}
    # Every sample of each in-process run (2 of world size 2, 1 of 4) of each format, and of the real run.
    formats = 2 if "MultiFormat" in spec else 1
    assert result.claim("sharding/in_process").examined == 3 * 46 * formats
    assert result.claim("sharding/distributed").examined == 46 * formats
    runs = result.details["runs"]
    assert {"ws=2 nw=0", "ws=2 nw=2", "ws=4 nw=0"} == {run.rsplit(" keys", 1)[0] for run in runs}
    source = "cooker" if "Keyless" in spec else "batch"
    assert all(run.endswith(f"keys from {source}") for run in runs)
    assert result.details["distributed_seconds"] > 0


def test_manual_sharding_on_top_reports_missing_keys(workdir: Path) -> None:
    result = _sharding("cooker", f"{ZOO}:DOUBLE_SHARDED_COOKER", workdir)
    message = _failed(result, "sharding/in_process")
    lines = message.splitlines()
    assert lines[0].startswith("- world size 2, num_workers=0, one epoch (repeat=False)"), message
    assert lines[1].startswith("- world size 2, num_workers=2, ") and lines[2].startswith("- world size 4, ")
    assert "expected each of the 46 samples exactly once across ranks" in message
    assert (
        f"keys on no rank [{energon_key('shard-000000.tar', 'sharding_0000')}" in message
        and "keys from the batches" in message
    )
    # Under torch.distributed the cooker shards on top of Energon just the same.
    assert "keys on no rank" in _failed(result, "sharding/distributed")


def test_missing_keys_found_through_the_cookers_when_batches_have_none(workdir: Path) -> None:
    result = _sharding("task_encoder", f"{ZOO}:KeylessDoubleShardedTaskEncoder", workdir)
    message = _failed(result, "sharding/in_process")
    assert "keys on no rank" in message and "keys from the cookers" in message
    assert "keys from the batches" not in message
    assert "keys from the cookers" in _failed(result, "sharding/distributed")


def test_every_rank_reading_everything_reports_shared_keys(workdir: Path) -> None:
    result = _sharding("task_encoder", f"{ZOO}:IgnoresRankTaskEncoder", workdir)
    message = _failed(result, "sharding/in_process")
    first = energon_key("shard-000000.tar", "sharding_000000")
    assert f"46 keys went to more than one rank ('{first}' on ranks [0, 1]" in message
    assert "samples per rank: rank 0: 46, rank 1: 46" in message
    assert "samples per rank: rank 0: 46, rank 1: 46, rank 2: 46, rank 3: 46" in message
    assert "46 keys went to more than one rank" in _failed(result, "sharding/distributed")


@pytest.mark.slow
def test_sharding_by_torch_distributed_rank_fails_in_the_real_run(workdir: Path) -> None:
    result = _sharding("cooker", f"{ZOO}:TORCH_DISTRIBUTED_SHARDED_COOKER", workdir)
    message = _failed(result, "sharding/distributed")
    assert message.startswith("torch.distributed (gloo, 2 rank processes on this node)")
    assert "keys on no rank" in message and "(samples per rank: rank 0: " in message
    # In one process there is no torch.distributed rank to shard by: in-process sharding is right.
    in_process = result.claim("sharding/in_process")
    assert in_process.verdict == "pass" and in_process.examined == 3 * 46, in_process.message
    assert "] sharding/in_process: " not in result.message


def test_target_a_fresh_process_cannot_import_is_checked_in_process_only(workdir: Path) -> None:
    cook = stateless(lambda sample: cook_preencoded_diffusion(sample))
    result = _sharding("cooker", Cooker(cook, has_subflavors={"encoding": "preencoded"}), workdir)
    assert result.verdict == "pass", result.message
    in_process = result.claim("sharding/in_process")
    assert in_process.verdict == "pass" and in_process.examined == 3 * 46, in_process.message
    assert result.details["runs"][0] == "ws=2 nw=0 keys from batch"
    distributed = result.claim("sharding/distributed")
    assert distributed.verdict == "skip", distributed
    assert distributed.message.startswith("cooker ")
    assert "cannot be rebuilt in a fresh process" in distributed.message
    assert "not importable" in distributed.message
    assert "distributed_seconds" not in result.details


def test_verify_names_missing_repeated_shared_and_unknown_keys(workdir: Path) -> None:
    ctx = make_context(resolve_target("primus_energon:PREENCODED_COOKER"), workdir=workdir)
    expected = ["k0", "k1", "k2", "k3"]
    assert _verify(ctx, "here", {0: ["k0", "k2"], 1: ["k1", "k3"]}, expected, "batch") is None
    message = _verify(ctx, "here", {0: ["k0", "k0", "k1"], 1: ["k1", "x9"]}, expected, "cooker")
    assert message is not None and message.startswith(
        "here: expected each of the 4 samples exactly once across ranks, observed "
    )
    assert "rank 0 got 1 keys more than once ('k0' x2)" in message
    assert "1 keys went to more than one rank ('k1' on ranks [0, 1])" in message
    assert "2 keys on no rank [k2, k3]" in message and "1 keys not in the dataset [x9]" in message
    assert "(samples per rank: rank 0: 3, rank 1: 2; keys from the cookers)" in message


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
