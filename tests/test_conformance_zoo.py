"""The conformance suite fails every deliberately broken target on the property meant to catch it, and
passes every correct one (written in different styles) and every reference cooker and TaskEncoder."""

from __future__ import annotations

import pytest

from conformance import check_cooker, check_task_encoder
from tests.conformance_zoo.broken import BROKEN_TARGETS
from tests.conformance_zoo.correct import CORRECT_TARGETS

#: Properties that run in-process in seconds; the process-level ones have their own test files.
FAST_PROPERTIES = ["accepted", "keys", "fidelity", "purity", "bad_input", "batch"]

REFERENCE_TARGETS = {
    "PREENCODED_COOKER": ("cooker", "primus_energon:PREENCODED_COOKER"),
    "PREENCODED_ZERO_COPY_COOKER": ("cooker", "primus_energon:PREENCODED_ZERO_COPY_COOKER"),
    "RAW_COOKER": ("cooker", "primus_energon:RAW_COOKER"),
    "EncodedDiffusionTaskEncoder": ("task_encoder", "primus_energon:EncodedDiffusionTaskEncoder"),
    "RawDiffusionTaskEncoder": ("task_encoder", "primus_energon:RawDiffusionTaskEncoder"),
    "MultiFormatTaskEncoder": ("task_encoder", "primus_energon:MultiFormatTaskEncoder"),
}


def _run(kind: str, spec: str, properties: list[str], **options):
    check = check_cooker if kind == "cooker" else check_task_encoder
    return {r.property: r for r in check(spec, properties=properties, profile="quick", **options)}


@pytest.mark.parametrize("name", sorted(BROKEN_TARGETS))
def test_broken_target_fails_its_property(name: str, tmp_path) -> None:
    kind, attr, options, prop = BROKEN_TARGETS[name]
    result = _run(kind, f"tests.conformance_zoo.broken:{attr}", [prop], workdir=tmp_path, **options)[prop]
    assert result.verdict == "fail", f"{name}: property {prop} gave {result.verdict}: {result.message}"
    assert result.message and "reproduce" not in result.message
    assert result.reproduce.startswith("pytest ") and f"-k {prop}" in result.reproduce


def test_there_are_enough_broken_targets() -> None:
    assert len(BROKEN_TARGETS) >= 20
    assert {prop for *_, prop in BROKEN_TARGETS.values()} >= set(FAST_PROPERTIES)


@pytest.mark.parametrize("name", sorted(CORRECT_TARGETS))
def test_correct_target_passes(name: str, tmp_path) -> None:
    kind, spec, options = CORRECT_TARGETS[name]
    results = _run(kind, spec, FAST_PROPERTIES, workdir=tmp_path, **options)
    bad = {p: f"{r.verdict}: {r.message}" for p, r in results.items() if r.verdict not in ("pass", "skip")}
    assert not bad, f"{name}: {bad}"


@pytest.mark.parametrize("name", sorted(REFERENCE_TARGETS))
def test_reference_target_passes(name: str, tmp_path) -> None:
    kind, spec = REFERENCE_TARGETS[name]
    results = _run(kind, spec, FAST_PROPERTIES, workdir=tmp_path)
    bad = {p: f"{r.verdict}: {r.message}" for p, r in results.items() if r.verdict not in ("pass", "skip")}
    assert not bad, f"{name}: {bad}"
