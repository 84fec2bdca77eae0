"""validate reports a tensor shape that one sample of many has (a stacking batch() crashes on it), names
that sample, and keeps resolution buckets with many samples each clean."""

from __future__ import annotations

import io
from pathlib import Path

import torch

from primus_energon.datasets import validate_path
from tests.helpers import write_prepared_dataset


def _dataset(root: Path, spatial: list[tuple[int, int]]) -> Path:
    samples = []
    for index, (h, w) in enumerate(spatial):
        members = {}
        for name, tensor in (
            ("latents.pth", torch.randn(4, h, w)),
            ("prompt_embeds.pth", torch.randn(7, 16)),
            ("pooled_prompt_embeds.pth", torch.randn(16)),
        ):
            buffer = io.BytesIO()
            torch.save(tensor, buffer)
            members[name] = buffer.getvalue()
        members["caption.txt"] = f"caption {index}".encode()
        samples.append((f"s{index:03d}", members))
    return write_prepared_dataset(root, samples, {"encoding": "preencoded"})


def test_one_sample_of_thirty_with_its_own_latent_size_is_reported(tmp_path: Path) -> None:
    spatial = [(8, 8)] * 30
    spatial[17] = (8, 12)
    report = validate_path(_dataset(tmp_path / "odd", spatial))
    found = [(p.code, p.key, p.member) for p in report.problems if p.severity == "error"]
    assert found == [("wrong-shape", "s017", "latents.pth")], report.problems
    message = next(p.message for p in report.problems if p.code == "wrong-shape")
    assert "only 1 of 30 samples" in message and "[8, 8] in 29" in message


def test_resolution_buckets_with_many_samples_each_stay_clean(tmp_path: Path) -> None:
    spatial = [(8, 8)] * 12 + [(8, 12)] * 10 + [(12, 8)] * 8
    report = validate_path(_dataset(tmp_path / "buckets", spatial))
    assert [p for p in report.problems if p.severity == "error"] == []
