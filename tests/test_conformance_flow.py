"""The flow oracle through fidelity: a member is lost only when no output depends on it, a constant under the
member's name is no holder, and leaves that change on their own (unseeded noise) say nothing about flow."""

from __future__ import annotations

from pathlib import Path

from primus_energon.conformance import check_cooker

ZOO = "tests.conformance_zoo.flow_cases"


def _fidelity(attr: str, workdir: Path) -> dict:
    (result,) = check_cooker(
        f"{ZOO}:{attr}", properties=["fidelity"], profile="quick", workdir=workdir, encoding="raw"
    )
    return {c.id: c for c in result.claims}


def test_a_transformed_member_is_kept_and_ids_hold_the_caption(workdir: Path) -> None:
    claims = _fidelity("cook_uses_both", workdir)
    assert claims["fidelity/images"].verdict == "pass", claims["fidelity/images"].message
    assert claims["fidelity/text"].verdict == "pass", claims["fidelity/text"].message
    assert claims["fidelity/images"].examined > 0 and claims["fidelity/text"].examined > 0


def test_a_member_no_output_depends_on_is_lost(workdir: Path) -> None:
    claim = _fidelity("cook_ignores_caption", workdir)["fidelity/text"]
    assert claim.verdict == "fail"
    assert "no output field holds member 'txt' or depends on it (changing it changes nothing" in claim.message


def test_a_constant_under_the_member_s_name_is_no_holder(workdir: Path) -> None:
    claim = _fidelity("cook_constant_image_under_its_name", workdir)["fidelity/images"]
    assert claim.verdict == "fail"
    assert "field 'png' does not equal member 'png'" in claim.message
    assert "no output field depends on it" in claim.message


def test_noise_from_the_global_generator_is_not_called_lost(workdir: Path) -> None:
    claims = _fidelity("cook_noisy_image", workdir)
    assert claims["fidelity/images"].verdict == "pass", claims["fidelity/images"].message
