"""Property 7 (subflavor dispatch): passes on MultiFormatTaskEncoder and on overlapping cookers in the
right order; dispatch/first_match fails on last-match dispatch, dispatch/no_match on a silent fallback
and on an unclear no-match error, and dispatch/shadowed gives advice (never a failure) on a shadowed
cooker; the property is skipped for a single cooker and for cooker targets."""

from __future__ import annotations

from pathlib import Path

import pytest
from megatron.energon import Cooker

from primus_energon import MultiFormatTaskEncoder, cook_preencoded_diffusion, cook_raw_images
from primus_energon.conformance import check_cooker, check_task_encoder
from primus_energon.conformance.core.results import PropertyResult
from primus_energon.conformance.properties.dispatch import shadowed_cookers
from primus_energon.energon_compat import COOKERS_CHOSEN_PER_SAMPLE

ZOO = "tests.conformance_zoo.dispatch_broken"


def _dispatch(target: object, workdir: Path) -> PropertyResult:
    (result,) = check_task_encoder(target, properties=["dispatch"], profile="quick", workdir=workdir)
    return result


def _failed(result: PropertyResult, claim_id: str, passed: str) -> str:
    """``claim_id`` failed, ``passed`` passed, and the property failed naming only the former; returns
    the failed claim's message."""
    claim = result.claim(claim_id)
    assert claim.verdict == "fail", f"{claim_id}: {claim.verdict}: {claim.message}\n{result.verdicts()}"
    assert claim.examined > 0 and claim.fix
    other = result.claim(passed)
    assert other.verdict == "pass", f"{passed}: {other.verdict}: {other.message}"
    assert result.claim("dispatch/shadowed").verdict == "pass"
    assert result.verdict == "fail" and f"] {claim_id}: " in result.message, result.message
    assert f"] {passed}: " not in result.message
    assert result.reproduce.endswith("--conformance-property dispatch")
    return claim.message


@pytest.mark.parametrize("spec", ["primus_energon:MultiFormatTaskEncoder", f"{ZOO}:SpecificFirstTaskEncoder"])
def test_first_match_dispatch_passes(spec: str, workdir: Path) -> None:
    result = _dispatch(spec, workdir)
    assert result.verdict == "pass", result.message
    assert result.verdicts() == dict.fromkeys(
        ("dispatch/first_match", "dispatch/no_match", "dispatch/shadowed"), "pass"
    )
    assert result.details["dispatched"] > 0 and result.details["no_match_errors"] > 0
    assert result.claim("dispatch/first_match").examined == result.details["dispatched"]
    assert result.claim("dispatch/no_match").examined == result.details["no_match_errors"]
    assert result.claim("dispatch/shadowed").examined == 2


def test_an_instance_target_keeps_its_cookers(workdir: Path) -> None:
    task_encoder = MultiFormatTaskEncoder()
    task_encoder.cookers = list(task_encoder.cookers)
    before = list(task_encoder.cookers)
    result = _dispatch(task_encoder, workdir)
    assert result.verdict == "pass", result.message
    assert set(result.verdicts().values()) == {"pass"}
    assert task_encoder.cookers == before


def test_shadowed_cooker_is_advice(workdir: Path) -> None:
    result = _dispatch(f"{ZOO}:ShadowedCookerTaskEncoder", workdir)
    claim = result.claim("dispatch/shadowed")
    assert claim.verdict == "advice", f"{claim.verdict}: {claim.message}"
    assert claim.message.startswith(
        "cooker 1 (cook_preencoded_diffusion, has_subflavors={'encoding': 'preencoded'}) can never be "
        "chosen: cooker 0 (cook_preencoded_diffusion, has_subflavors=None) comes first"
    )
    assert "more specific cooker first" in claim.fix and result.advice == [claim]
    # The catch-all is what Energon runs everywhere, so dispatch itself is right; nothing is unmatched.
    assert result.claim("dispatch/first_match").verdict == "pass"
    no_match = result.claim("dispatch/no_match")
    assert no_match.verdict == "skip" and "some cooker matches every dataset" in no_match.message
    assert result.verdict == "pass" and result.message == "" and result.reproduce == ""


def test_last_match_dispatch_fails(workdir: Path) -> None:
    result = _dispatch(f"{ZOO}:LastMatchTaskEncoder", workdir)
    message = _failed(result, "dispatch/first_match", passed="dispatch/no_match")
    assert "override {'encoding': 'preencoded', 'quality': 'high'}" in message
    assert "cooker 1 (cook_preencoded_diffusion" in message
    assert "expected cooker 0 (cook_high_quality" in message


def test_silent_fallback_fails(workdir: Path) -> None:
    result = _dispatch(f"{ZOO}:FallbackTaskEncoder", workdir)
    message = _failed(result, "dispatch/no_match", passed="dispatch/first_match")
    assert "no cooker matches, yet the loader was built without an error" in message
    assert "; cooker 0 (cook_preencoded_diffusion_zero_copy, " in message  # the one that ran
    assert "'encoding': 'conformance-unseen'" in message


def test_unclear_no_match_error_fails(workdir: Path) -> None:
    result = _dispatch(f"{ZOO}:UnclearErrorTaskEncoder", workdir)
    message = _failed(result, "dispatch/no_match", passed="dispatch/first_match")
    # Energon 7.3+ chooses the cooker when the loader is built, 7.0-7.2 at the first sample.
    where = "the first sample" if COOKERS_CHOSEN_PER_SAMPLE else "building the loader"
    unclear = f"no cooker matches, and {where} raised an unclear error (RuntimeError: bad dataset)"
    assert unclear in message, message
    assert "built without an error" not in message


def test_single_cooker_and_cooker_targets_are_skipped(workdir: Path) -> None:
    single = _dispatch("primus_energon:EncodedDiffusionTaskEncoder", workdir)
    assert single.verdict == "skip", single.message
    assert set(single.verdicts().values()) == {"skip"}
    assert "has 1 cooker(s); dispatch applies to TaskEncoders with several" in single.message
    (result,) = check_cooker("primus_energon:PREENCODED_COOKER", properties=["dispatch"], workdir=workdir)
    assert result.verdict == "skip", result.message
    assert set(result.verdicts().values()) == {"skip"}
    assert "applies to task encoder targets" in result.message


def test_shadowing_rule() -> None:
    pre = Cooker(cook_preencoded_diffusion, has_subflavors={"encoding": "preencoded"})
    raw = Cooker(cook_raw_images, has_subflavors={"encoding": "raw"})
    catch_all = Cooker(cook_preencoded_diffusion)
    specific = Cooker(cook_preencoded_diffusion, has_subflavors={"encoding": "preencoded", "q": "high"})
    assert shadowed_cookers([pre, raw]) == []
    assert shadowed_cookers([specific, pre]) == []
    assert shadowed_cookers([pre, specific]) == [(0, 1)]
    assert shadowed_cookers([catch_all, pre, raw]) == [(0, 1), (0, 2)]
    assert shadowed_cookers([pre, raw, Cooker(cook_raw_images, has_subflavors={"encoding": "raw"})]) == [
        (1, 2)
    ]
