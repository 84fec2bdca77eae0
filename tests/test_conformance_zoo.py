"""The conformance suite reports every deliberately broken target on the claim meant to catch it (a
defect fails, an opinion is advice), passes every correct one (written in different styles) and every
reference cooker and TaskEncoder, and never crashes on targets that cannot cook at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_energon.conformance import check_cooker, check_task_encoder, check_wrapper
from primus_energon.conformance.properties import PROPERTIES, all_claims
from tests.conformance_zoo.broken import BROKEN_TARGETS
from tests.conformance_zoo.correct import CORRECT_TARGETS
from tests.conformance_zoo.pathological import PATHOLOGICAL_TARGETS
from tests.helpers import live_descendants, live_processes

#: Properties that run in-process in seconds; the process-level ones have their own test files.
FAST_PROPERTIES = [
    "accepted",
    "keys",
    "fidelity",
    "purity",
    "bad_input",
    "batch",
    "wrapper",
    "packing",
    "transforms",
]

REFERENCE_TARGETS = {
    "PREENCODED_COOKER": ("cooker", "primus_energon:PREENCODED_COOKER"),
    "PREENCODED_ZERO_COPY_COOKER": ("cooker", "primus_energon:PREENCODED_ZERO_COPY_COOKER"),
    "RAW_COOKER": ("cooker", "primus_energon:RAW_COOKER"),
    "EncodedDiffusionTaskEncoder": ("task_encoder", "primus_energon:EncodedDiffusionTaskEncoder"),
    "RawDiffusionTaskEncoder": ("task_encoder", "primus_energon:RawDiffusionTaskEncoder"),
    "MultiFormatTaskEncoder": ("task_encoder", "primus_energon:MultiFormatTaskEncoder"),
    "MegatronDataloaderWrapper": ("wrapper", "primus_energon:MegatronDataloaderWrapper"),
}


def _run(kind: str, spec: str, properties: list[str], **options):
    check = {"cooker": check_cooker, "task_encoder": check_task_encoder, "wrapper": check_wrapper}[kind]
    return {r.property: r for r in check(spec, properties=properties, profile="quick", **options)}


def _not_ok(results) -> dict[str, str]:
    """Every claim that failed or errored, with its message."""
    return {
        c.id: f"{c.verdict}: {c.message}"
        for r in results.values()
        for c in r.claims
        if c.verdict in ("fail", "error")
    }


#: broken targets whose check waits out a limit (a wrapper that spins is given 10 s to return): the slow tier
WAITED_OUT = {"wrapper that spins on an empty loader", "wrapper that spins on an exhausted generator"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in WAITED_OUT else n for n in sorted(BROKEN_TARGETS)],
)
def test_broken_target_is_reported_on_its_claim(name: str, workdir: Path) -> None:
    kind, attr, options, claim_id, verdict = BROKEN_TARGETS[name]
    prop = claim_id.partition("/")[0]
    spec = f"tests.conformance_zoo.{attr}" if ":" in attr else f"tests.conformance_zoo.broken:{attr}"
    result = _run(kind, spec, [prop], workdir=workdir, **options)[prop]
    claim = result.claim(claim_id)
    assert claim.verdict == verdict, (
        f"{name}: {claim_id} gave {claim.verdict}: {claim.message}\n{result.verdicts()}"
    )
    assert claim.message and claim.fix
    if verdict == "fail":
        assert result.verdict == "fail" and claim_id in result.message
        assert result.reproduce.startswith("pytest ") and f"--conformance-property {prop}" in result.reproduce
        assert f"--{kind.replace('_', '-')} " in result.reproduce
        assert kind != "wrapper" or "(note:" not in result.message  # a wrapper's data format is no guess
    else:  # advice never fails the property
        assert result.verdict in ("pass", "skip"), (
            f"{name}: advice made {prop} {result.verdict}: {result.message}"
        )


def test_every_claim_has_a_broken_example_or_its_own_test() -> None:
    """A claim no broken target proves is a claim that may never fail; the process-level and
    multi-cooker claims are proven in their own test files (named here)."""
    proven_elsewhere = {
        "accepted/cookers": "test_targets_that_cannot_cook_are_reported_never_crashed_on",
        "accepted/loads": "test_targets_that_cannot_cook_are_reported_never_crashed_on",
        "fidelity/cooks": "test_a_cooker_that_fails_on_some_clean_samples_fails_fidelity_cooks",
        "fidelity/other": "the json member of a custom schema: test_synthetic_schema / tests with --schema",
        "fidelity/payloads": "caught together with fidelity/dtypes and fidelity/text by the zoo",
        "determinism/fresh_processes": "tests/test_conformance_determinism.py",
        "determinism/seed": "tests/test_conformance_determinism.py",
        "resume/wrapper": "tests/test_conformance_resume.py",
        "resume/resaved": "tests/test_conformance_resume.py",
        "resume/restore_sample": "tests/test_conformance_resume.py",
        "dispatch/first_match": "tests/test_conformance_dispatch.py",
        "dispatch/no_match": "tests/test_conformance_dispatch.py",
        "dispatch/shadowed": "tests/test_conformance_dispatch.py",
        "blend/ratios": "tests/test_conformance_blend.py",
        "blend/subflavors": "tests/test_conformance_blend.py",
        "blend/duplicates": "tests/test_conformance_blend.py",
        "sharding/in_process": "tests/test_conformance_sharding.py",
        "sharding/distributed": "tests/test_conformance_sharding.py",
        "throughput/rate": "tests/test_conformance_throughput.py",
        # What a target leaves behind is seen in whole pytest runs, each in fresh processes.
        **{
            f"conduct/{name}": "tests/test_conformance_supervised.py"
            for name in ("threads", "processes", "files")
        },
        # Each restart claim costs four runs in fresh processes: proven on wrappers and hooks of their own.
        **{
            f"restart/{name}": "tests/test_conformance_restart.py"
            for name in (
                "fresh_processes",
                "world_size",
                "seed",
                "num_workers",
                "micro_batch_size",
                "shards",
                "says_why",
            )
        },
    }
    by_zoo = {claim_id for *_, claim_id, _ in BROKEN_TARGETS.values()}
    unproven = {c.id for c in all_claims()} - by_zoo - set(proven_elsewhere)
    assert not unproven, f"claims without a broken example: {sorted(unproven)}"


@pytest.mark.parametrize("name", sorted(CORRECT_TARGETS))
def test_correct_target_passes(name: str, workdir: Path) -> None:
    kind, spec, options = CORRECT_TARGETS[name]
    results = _run(kind, spec, FAST_PROPERTIES, workdir=workdir, **options)
    assert not _not_ok(results), f"{name}: {_not_ok(results)}"
    assert all(r.verdict in ("pass", "skip") for r in results.values())


@pytest.mark.parametrize("name", sorted(REFERENCE_TARGETS))
def test_reference_target_passes_without_advice(name: str, workdir: Path) -> None:
    kind, spec = REFERENCE_TARGETS[name]
    results = _run(kind, spec, FAST_PROPERTIES, workdir=workdir)
    assert not _not_ok(results), f"{name}: {_not_ok(results)}"
    advice = {c.id: c.message for r in results.values() for c in r.advice}
    assert not advice, f"the reference {name} draws advice: {advice}"


#: pathological targets checked in the fast tier; the others (each a whole run of every property, one of
#: them waiting out a hang) in the slow tier
FAST_PATHOLOGICAL = {"refuses every sample", "registers no cookers"}


@pytest.mark.parametrize(
    "name",
    [
        n if n in FAST_PATHOLOGICAL else pytest.param(n, marks=pytest.mark.slow)
        for n in sorted(PATHOLOGICAL_TARGETS)
    ],
)
def test_targets_that_cannot_cook_are_reported_never_crashed_on(name: str, workdir: Path) -> None:
    """Item by item: accepted fails saying why; every property that needs a loader is skipped once as
    blocked, without a traceback; the code-execution probe still runs; no claim is an `error`; no child
    process is left behind."""
    kind, attr, options = PATHOLOGICAL_TARGETS[name]
    check = check_cooker if kind == "cooker" else check_task_encoder
    results = {
        r.property: r
        for r in check(
            f"tests.conformance_zoo.pathological:{attr}",
            profile="quick",
            workdir=workdir,
            call_timeout_s=3,
            **{"timeout_s": 25, **options},
        )
    }
    errors = {c.id: c.message for r in results.values() for c in r.claims if c.verdict == "error"}
    assert not errors, f"{name}: the suite errored: {errors}"
    accepted = results["accepted"]
    assert accepted.verdict == "fail", accepted.message
    assert "Traceback" not in accepted.message
    for prop in PROPERTIES:
        if kind not in prop.applies_to:
            assert prop.id not in results  # only the properties that check this kind of target run
            continue
        result = results[prop.id]
        if prop.needs_loader and prop.id != "bad_input" and kind in prop.applies_to:
            assert result.verdict == "skip", f"{prop.id}: {result.verdict}: {result.message}"
            assert result.message.startswith("blocked by accepted/"), result.message
            assert result.message.count("blocked by") == 1 and "Traceback" not in result.message
    probe = results["bad_input"].claim("code_execution")
    assert probe.verdict in ("pass", "skip", "fail"), probe.message
    assert probe.verdict != "pass" or probe.examined > 0
    assert all(c.verdict == "skip" for c in results["bad_input"].claims if c.id != "bad_input/code_execution")
    assert not live_processes(attr) and not live_descendants()


def test_a_cooker_that_fails_on_some_clean_samples_fails_fidelity_cooks(workdir: Path) -> None:
    results = _run(
        "cooker",
        "tests.conformance_zoo.broken:cook_fails_on_bfloat16",
        ["accepted", "fidelity"],
        workdir=workdir,
        encoding="preencoded",
    )
    assert results["accepted"].verdict == "pass", results["accepted"].message
    claim = results["fidelity"].claim("cooks")
    assert claim.verdict == "fail" and "bfloat16" in claim.message, claim.message


@pytest.mark.slow
def test_a_target_that_fails_mid_run_is_reported_without_errors(workdir: Path) -> None:
    """accepted passes; resume and blend fail on their first claim and block the claims that need it."""
    spec = "tests.conformance_zoo.pathological:FailsOnFourthBatchTaskEncoder"
    results = _run("task_encoder", spec, ["accepted", "resume", "blend"], workdir=workdir)
    assert results["accepted"].verdict == "pass", results["accepted"].message
    assert results["resume"].verdicts() == {
        "resume/checkpoint": "fail",
        "resume/wrapper": "skip",
        "resume/resaved": "skip",
        "resume/restore_sample": "skip",
    }
    assert "out of memory (simulated)" in results["resume"].claim("checkpoint").message
    assert results["blend"].claim("ratios").verdict == "fail"
    assert results["blend"].claim("subflavors").verdict == "skip"


def test_filtering_non_finite_samples_is_counted_not_failed(workdir: Path) -> None:
    """SkipSample for a NaN/Inf tensor is filtering (NeMo, DFM): counted per cause in the report, never a
    failure; a TaskEncoder that lets them through is reported as batching them, also without a verdict."""
    (filtering,) = check_task_encoder(
        "tests.conformance_zoo.correct:FiltersNonFiniteTaskEncoder",
        properties=["bad_input"],
        profile="quick",
        workdir=workdir,
    )
    assert filtering.verdict == "pass", filtering.message
    assert filtering.details["filtered"] == {"NaN values": 3, "Inf values": 3}
    assert set(filtering.details["non_finite"].values()) == {"filtered (SkipSample)"}
    (plain,) = check_task_encoder(
        "primus_energon:EncodedDiffusionTaskEncoder",
        properties=["bad_input"],
        profile="quick",
        workdir=workdir,
    )
    assert plain.verdict == "pass" and plain.details["filtered"] == {}
    assert set(plain.details["non_finite"].values()) == {"batched"}


@pytest.mark.parametrize(
    ("attr", "next_blocker"),
    [
        ("cook_not_stateless_old_sample_api", "the next blocker is: "),
        ("cook_not_stateless", "@stateless is the only blocker found"),
    ],
)
def test_a_blocked_target_is_told_its_next_blocker(attr: str, next_blocker: str, workdir: Path) -> None:
    """accepted/stateless blocks the run, and its report already says what the target meets once that is
    fixed (cooking with the requirement waived), as a consequence, not as a separate failure."""
    results = _run(
        "cooker",
        f"tests.conformance_zoo.broken:{attr}",
        ["accepted"],
        workdir=workdir,
        encoding="preencoded",
    )
    claim = results["accepted"].claim("accepted/stateless")
    assert claim.verdict == "fail"
    assert "consequence, not a separate failure" in claim.message and next_blocker in claim.message
    if attr == "cook_not_stateless_old_sample_api":
        assert "__subflavor__" in claim.message
    assert [c.id for c in results["accepted"].claims if c.verdict == "fail"] == ["accepted/stateless"]
