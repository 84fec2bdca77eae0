"""Property 12 (throughput): throughput/rate reports cook time, loader samples/s and MB/s and a raw read
of the same shards for every encoding the target cooks; it fails only below ``min_samples_per_s``, with
both numbers. Nothing here asserts on how fast anything is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from primus_energon.conformance import check_cooker, check_task_encoder
from primus_energon.conformance.core.results import PropertyResult

NUMBERS = (
    "cook_us_per_sample",
    "loader_samples_per_s",
    "loader_mb_per_s",
    "loader_first_batch_s",
    "loader_end_to_end_samples_per_s",
    "loader_end_to_end_mb_per_s",
    "raw_read_mb_per_s",
    "raw_read_samples_per_s",
)


def _throughput(kind: str, target: str, workdir: Path, **options: object) -> PropertyResult:
    check = check_cooker if kind == "cooker" else check_task_encoder
    (result,) = check(target, properties=["throughput"], profile="quick", workdir=workdir, **options)
    return result


@pytest.mark.parametrize(
    ("kind", "spec", "encodings"),
    [
        ("cooker", "primus_energon:PREENCODED_COOKER", ["preencoded"]),
        ("task_encoder", "primus_energon:MultiFormatTaskEncoder", ["preencoded", "raw"]),
    ],
)
def test_reference_targets_report_positive_numbers(
    kind: str, spec: str, encodings: list[str], workdir: Path
) -> None:
    result = _throughput(kind, spec, workdir)
    assert result.verdict == "pass", result.message
    assert result.verdicts() == {"throughput/rate": "pass"}
    assert result.claim("throughput/rate").examined == 64 * len(encodings)
    measured = result.details["measurements"]
    assert [m["encoding"] for m in measured] == encodings
    for m in measured:
        assert all(m[name] > 0 for name in NUMBERS), m
        assert m["samples"] == 64 and m["sample_kb"] > 0
    assert all(f"{e} (" in result.details["summary"] for e in encodings)
    assert "samples/s" in result.details["summary"] and "raw read" in result.details["summary"]
    assert "min_samples_per_s" not in result.details


def test_below_min_samples_per_s_fails_naming_the_rate(workdir: Path) -> None:
    result = _throughput("cooker", "primus_energon:PREENCODED_COOKER", workdir, min_samples_per_s=1e9)
    claim = result.claim("throughput/rate")
    assert claim.verdict == "fail", f"{claim.verdict}: {claim.message}"
    assert claim.examined == 64 and "profile the cooker" in claim.fix
    match = re.search(r"loader throughput on preencoded data is ([0-9.]+) samples/s", claim.message)
    assert match and float(match.group(1)) > 0, claim.message
    assert float(match.group(1)) == result.details["loader_samples_per_s"]
    assert "(steady state, after the first batch)" in claim.message
    assert "below --min-samples-per-s 1e+09" in claim.message and "raw read" in claim.message
    assert result.verdict == "fail" and result.message.startswith("[performance] throughput/rate: ")
    assert result.details["min_samples_per_s"] == 1e9  # the numbers are reported even when it fails
    assert "--conformance-min-samples-per-s 1e+09" in result.reproduce, result.reproduce
    assert result.reproduce.endswith("--conformance-property throughput"), result.reproduce


def test_reachable_min_samples_per_s_passes(workdir: Path) -> None:
    result = _throughput("cooker", "primus_energon:PREENCODED_COOKER", workdir, min_samples_per_s=1e-3)
    assert result.verdict == "pass", result.message
    assert result.verdicts() == {"throughput/rate": "pass"}
    assert result.details["min_samples_per_s"] == 1e-3


def test_a_cooker_that_pops_its_members_is_timed_on_fresh_dicts(workdir: Path) -> None:
    """Energon hands every cook a dict of its own; the timing loop does too, so a cooker that pops the
    members it reads is measured (its only fault, input_unchanged, is advice elsewhere)."""
    result = _throughput("cooker", "tests.conformance_zoo.broken:cook_pops_its_members", workdir)
    assert result.verdicts() == {"throughput/rate": "pass"}, result.message
    assert result.details["measurements"][0]["cook_us_per_sample"] > 0
