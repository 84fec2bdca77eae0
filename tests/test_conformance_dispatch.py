"""Property 7 (subflavor dispatch): passes on MultiFormatTaskEncoder and on overlapping cookers in the
right order; fails on a shadowed cooker, on last-match dispatch, on a silent fallback and on an unclear
no-match error; is skipped for a single cooker."""

from __future__ import annotations

from pathlib import Path

import pytest
from megatron.energon import Cooker

from conformance import check_cooker, check_task_encoder
from conformance.properties.dispatch import shadowed_cookers
from conformance.results import PropertyResult
from primus_energon import MultiFormatTaskEncoder, cook_preencoded_diffusion, cook_raw_images

ZOO = "tests.conformance_zoo.dispatch_broken"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One workspace for the module: the generated datasets are made once."""
    return tmp_path_factory.mktemp("dispatch")


def _dispatch(target: object, workdir: Path) -> PropertyResult:
    (result,) = check_task_encoder(target, properties=["dispatch"], profile="quick", workdir=workdir)
    return result


@pytest.mark.parametrize("spec", ["primus_energon:MultiFormatTaskEncoder", f"{ZOO}:SpecificFirstTaskEncoder"])
def test_first_match_dispatch_passes(spec: str, workdir: Path) -> None:
    result = _dispatch(spec, workdir)
    assert result.verdict == "pass", result.message
    assert result.details["dispatched"] > 0 and result.details["no_match_errors"] > 0


def test_an_instance_target_keeps_its_cookers(workdir: Path) -> None:
    task_encoder = MultiFormatTaskEncoder()
    task_encoder.cookers = list(task_encoder.cookers)
    before = list(task_encoder.cookers)
    assert _dispatch(task_encoder, workdir).verdict == "pass"
    assert task_encoder.cookers == before


def test_shadowed_cooker_fails(workdir: Path) -> None:
    result = _dispatch(f"{ZOO}:ShadowedCookerTaskEncoder", workdir)
    assert result.verdict == "fail"
    assert result.message.startswith(
        "cooker 1 (cook_preencoded_diffusion, has_subflavors={'encoding': 'preencoded'}) can never be "
        "chosen: cooker 0 (cook_preencoded_diffusion, has_subflavors=None) comes first"
    )
    assert result.reproduce.endswith("-k dispatch")


def test_last_match_dispatch_fails(workdir: Path) -> None:
    result = _dispatch(f"{ZOO}:LastMatchTaskEncoder", workdir)
    assert result.verdict == "fail"
    assert "override {'encoding': 'preencoded', 'quality': 'high'}" in result.message
    assert "cooker 1 (cook_preencoded_diffusion" in result.message
    assert "expected cooker 0 (cook_high_quality" in result.message


def test_silent_fallback_fails(workdir: Path) -> None:
    result = _dispatch(f"{ZOO}:FallbackTaskEncoder", workdir)
    assert result.verdict == "fail"
    assert "no cooker matches, yet the loader was built without an error" in result.message
    assert "'encoding': 'conformance-unseen'" in result.message


def test_unclear_no_match_error_fails(workdir: Path) -> None:
    result = _dispatch(f"{ZOO}:UnclearErrorTaskEncoder", workdir)
    assert result.verdict == "fail"
    assert "unclear error (RuntimeError: bad dataset)" in result.message


def test_single_cooker_and_cooker_targets_are_skipped(workdir: Path) -> None:
    assert _dispatch("primus_energon:EncodedDiffusionTaskEncoder", workdir).verdict == "skip"
    (result,) = check_cooker("primus_energon:PREENCODED_COOKER", properties=["dispatch"], workdir=workdir)
    assert result.verdict == "skip"


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
