"""batch/delivered: the batches a real Energon loader hands the training loop are traced back to the samples
as the first encode stage left them. A stage only the loader runs (encode_batch, postencode_sample) that
mixes up rows or casts payloads fails, naming the stage; the same TaskEncoders done right, and a transform
of a whole field (a normalisation in batch()), pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_energon.conformance import check_task_encoder
from primus_energon.conformance.core.results import PropertyResult

ZOO = "tests.conformance_zoo.stages_broken"


def _batch(spec: str, workdir: Path, profile: str = "quick") -> PropertyResult:
    (result,) = check_task_encoder(spec, properties=["batch"], profile=profile, workdir=workdir)
    return result


def test_an_encode_batch_that_sorts_one_field_mixes_up_the_rows(workdir: Path) -> None:
    result = _batch(f"{ZOO}:SortsTextInEncodeBatchTaskEncoder", workdir, profile="ci")
    assert result.claim("batch/rows").verdict == "pass", result.verdicts()  # batch() alone is right
    claim = result.claim("batch/delivered")
    assert claim.verdict == "fail", result.verdicts()
    assert claim.message.startswith("the real loader (num_workers=0, batch size 4), batch 0 ['main_"), (
        claim.message
    )
    assert "encode_batch does it (batch() on its own keeps every sample" in claim.message
    assert "the fields of different samples are mixed up: latents, pooled_prompt_embeds, prompt_embeds" in (
        claim.message
    )
    assert "num_workers=2" not in claim.message  # one root cause once
    assert result.verdict == "fail" and "] batch/delivered: " in result.message


def test_a_postencode_sample_that_casts_to_float16_is_named(workdir: Path) -> None:
    result = _batch(f"{ZOO}:HalfPrecisionPostencodeTaskEncoder", workdir)
    claim = result.claim("batch/delivered")
    assert claim.verdict == "fail", result.verdicts()
    assert "postencode_sample changes the samples" in claim.message, claim.message
    for field in ("latents", "prompt_embeds"):
        assert f"the '{field}' of 4 sample(s) (" in claim.message, claim.message
        assert f"reached the batch cast float32 -> float16 (at {field})" in claim.message, claim.message
    assert "pooled_prompt_embeds" not in claim.message  # left as it was


@pytest.mark.parametrize(
    "spec",
    [
        f"{ZOO}:SortsWholeRowsInEncodeBatchTaskEncoder",
        f"{ZOO}:ClonesInPostencodeTaskEncoder",
        f"{ZOO}:UpcastsInPreencodeTaskEncoder",  # float32 -> float64 changes no value
        "tests.conformance_zoo.broken:InPlaceBatchTaskEncoder",  # normalises every sample in batch(): a transform
        "primus_energon:EncodedDiffusionTaskEncoder",
    ],
)
def test_whole_rows_clones_and_field_transforms_pass(spec: str, workdir: Path) -> None:
    result = _batch(spec, workdir)
    claim = result.claim("batch/delivered")
    assert claim.verdict == "pass", claim.message
    assert claim.examined >= 6, claim  # six delivered batches traced
    assert result.details["delivered"] == {"num_workers=0": "6 batches traced"}


def test_ci_traces_loaders_with_and_without_workers(workdir: Path) -> None:
    result = _batch(f"{ZOO}:ClonesInPostencodeTaskEncoder", workdir, profile="ci")
    assert result.claim("batch/delivered").verdict == "pass"
    assert result.details["delivered"] == {
        "num_workers=0": "6 batches traced",
        "num_workers=2": "6 batches traced",
    }


def test_seeded_augmentation_is_left_to_determinism_not_called_lost(workdir: Path) -> None:
    """Noise drawn from Energon's per-sample seed depends on where the loader took the sample: it cannot be
    traced by value, and is named in the details instead of failing."""
    result = _batch("tests.conformance_zoo.correct:BoundMethodTaskEncoder", workdir)
    assert result.claim("batch/delivered").verdict == "pass", result.claim("batch/delivered").message
    assert result.details["delivered"]["seeded"] == ["noise"]


def test_a_preencode_sample_that_casts_is_named_with_the_share(workdir: Path) -> None:
    """The first encode stage is fidelity's to judge (member -> what batch() receives): the cast is named
    there, with the stage, the share and the declaration; batch/delivered does not say it again."""
    results = check_task_encoder(
        f"{ZOO}:HalfPrecisionPreencodeTaskEncoder",
        properties=["fidelity", "batch"],
        profile="quick",
        workdir=workdir,
    )
    by_id = {c.id: c for r in results for c in r.claims}
    claim = by_id["fidelity/tensors"]
    assert claim.verdict == "fail"
    assert "reaches field 'latents' changed by preencode_sample" in claim.message, claim.message
    assert "cast to float16" in claim.message and "'latents: cast dtype=float16'" in claim.message
    assert "in 48 of 48 samples" in claim.message
    assert by_id["batch/delivered"].verdict == "pass"
