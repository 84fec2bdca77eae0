"""The reference TaskEncoders through Energon's full loading path, checked against the shard bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from primus_energon import (
    PREENCODED_ZERO_COPY_COOKER,
    BatchError,
    BatchShapeError,
    DiffusionSample,
    EncodedDiffusionTaskEncoder,
    MultiFormatTaskEncoder,
    RawDiffusionTaskEncoder,
    batch_preencoded,
    cook_preencoded_diffusion_zero_copy,
    get_loader,
)
from primus_energon.energon_compat import ENERGON_VERSION
from primus_energon.synthetic import generate_dataset, write_metadataset
from tests.helpers import (
    SMALL_SHAPES,
    assert_tensor_identical,
    crude_samples,
    read_members,
    tensor_from_bytes,
)


def _one_pass(path: Path | str, task_encoder, batch_size: int, **kwargs) -> list[dict]:
    loader = get_loader(
        path, task_encoder, batch_size=batch_size, num_workers=0, mode="val", split_part="train", **kwargs
    )
    return list(loader.dataloader)


def test_encoded_batches_stack_each_sample_in_order(preencoded_dataset: Path) -> None:
    oracle = read_members(preencoded_dataset)
    batches = _one_pass(preencoded_dataset, EncodedDiffusionTaskEncoder, batch_size=4)
    assert [len(b["__key__"]) for b in batches] == [4] * 6
    seen = [key for b in batches for key in b["__key__"]]
    assert sorted(seen) == sorted(oracle), "every sample exactly once"
    for batch in batches:
        assert batch["latents"].shape == (4, *SMALL_SHAPES["latents"])
        assert batch["prompt_embeds"].shape == (4, *SMALL_SHAPES["prompt_embeds"])
        assert batch["pooled_prompt_embeds"].shape == (4, *SMALL_SHAPES["pooled_prompt_embeds"])
        for row, key in enumerate(batch["__key__"]):
            for field in ("latents", "prompt_embeds", "pooled_prompt_embeds"):
                expected = tensor_from_bytes(oracle[key][f"{field}.pth"])
                assert_tensor_identical(batch[field][row], expected, f"batch row {row} ({key}).{field}")
            assert batch["caption"][row] == oracle[key]["caption.txt"].decode("utf-8")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_encoded_keeps_dtype(tmp_path: Path, dtype: str) -> None:
    dataset = tmp_path / dtype
    generate_dataset(dataset, num_samples=4, shard_size=4, seed=3, shapes=SMALL_SHAPES, dtype=dtype)
    (batch,) = _one_pass(dataset, EncodedDiffusionTaskEncoder, batch_size=4)
    for field in ("latents", "prompt_embeds", "pooled_prompt_embeds"):
        assert batch[field].dtype == getattr(torch, dtype)


def test_raw_batches_list_images_and_captions(raw_datasets: dict[str, Path]) -> None:
    oracle = read_members(raw_datasets["png"])
    batches = _one_pass(raw_datasets["png"], RawDiffusionTaskEncoder, batch_size=3)
    assert [len(b["images"]) for b in batches] == [3, 3, 2]
    for batch in batches:
        assert len(batch["images"]) == len(batch["txt"]) == len(batch["__key__"])
        for image, text, key in zip(batch["images"], batch["txt"], batch["__key__"], strict=True):
            assert image.size == (32, 24) and image.mode == "RGB"
            assert text == oracle[key]["txt"].decode("utf-8")


def _samples(shapes: list[tuple[int, ...]]) -> list[DiffusionSample]:
    return [
        DiffusionSample(
            __key__=f"s{i}",
            __restore_key__=(),
            latents=torch.zeros(shape),
            prompt_embeds=torch.zeros(3, 2),
            pooled_prompt_embeds=torch.zeros(2),
        )
        for i, shape in enumerate(shapes)
    ]


def test_batch_shape_mismatch_names_samples_and_shapes() -> None:
    with pytest.raises(BatchShapeError) as caught:
        batch_preencoded(_samples([(4, 8, 8), (4, 8, 8), (4, 8, 12)]))
    message = str(caught.value)
    assert "'latents'" in message
    assert "[4, 8, 8] float32 for 's0', 's1'" in message and "[4, 8, 12] float32 for 's2'" in message
    assert caught.value.groups == {((4, 8, 8), "float32"): ["s0", "s1"], ((4, 8, 12), "float32"): ["s2"]}


def test_batch_dtype_mismatch_is_reported() -> None:
    samples = _samples([(2,), (2,)])
    samples[1].latents = samples[1].latents.to(torch.bfloat16)
    with pytest.raises(BatchShapeError, match="bfloat16 for 's1'"):
        batch_preencoded(samples)


def test_variable_shapes_through_the_loader_name_the_samples(tmp_path: Path) -> None:
    dataset = tmp_path / "buckets"
    generate_dataset(dataset, num_samples=12, shard_size=6, seed=4, shapes=SMALL_SHAPES, variable_shapes=True)
    with pytest.raises(BatchShapeError, match="cannot stack field 'latents'"):
        _one_pass(dataset, EncodedDiffusionTaskEncoder, batch_size=12)


def test_multiformat_dispatches_per_dataset(
    preencoded_dataset: Path, raw_datasets: dict[str, Path], tmp_path: Path
) -> None:
    blend = write_metadataset(
        tmp_path / "mixed.yaml",
        [(preencoded_dataset, 0.5, {"source": "pre"}), (raw_datasets["jpg"], 0.5, {"source": "raw"})],
    )
    loader = get_loader(blend, MultiFormatTaskEncoder, batch_size=1, num_workers=0, seed=1)
    kinds = {"pre": 0, "raw": 0}
    pre_keys, raw_keys = set(read_members(preencoded_dataset)), set(read_members(raw_datasets["jpg"]))
    for _ in range(40):
        batch = next(loader)
        (key,) = batch["__key__"]
        if "latents" in batch:
            assert key in pre_keys and batch["latents"].shape == (1, *SMALL_SHAPES["latents"])
            kinds["pre"] += 1
        else:
            assert key in raw_keys and batch["images"][0].size == (32, 24)
            kinds["raw"] += 1
    assert kinds["pre"] > 5 and kinds["raw"] > 5


def test_multiformat_blend_batches_each_encoding_apart(
    preencoded_dataset: Path, raw_datasets: dict[str, Path], tmp_path: Path
) -> None:
    """batch_group_criterion keeps a blend of both encodings out of one batch, and loses no sample."""
    blend = write_metadataset(
        tmp_path / "mixed.yaml",
        [(preencoded_dataset, 0.5, {"source": "pre"}), (raw_datasets["jpg"], 0.5, {"source": "raw"})],
    )
    loader = get_loader(blend, MultiFormatTaskEncoder, batch_size=4, num_workers=0, seed=1)
    pre_keys, raw_keys = set(read_members(preencoded_dataset)), set(read_members(raw_datasets["jpg"]))
    seen = {"pre": 0, "raw": 0}
    for _ in range(30):
        batch = next(loader)
        keys = set(batch["__key__"])
        assert len(batch["__key__"]) == 4
        if "latents" in batch:
            assert keys <= pre_keys and batch["latents"].shape == (4, *SMALL_SHAPES["latents"])
            seen["pre"] += 1
        else:
            assert keys <= raw_keys and len(batch["images"]) == 4
            seen["raw"] += 1
    assert seen["pre"] > 3 and seen["raw"] > 3


def test_multiformat_mixed_batch_is_a_clear_error() -> None:
    samples = [_samples([(2,)])[0], {"__key__": "r0", "images": None, "txt": "x"}]
    with pytest.raises(BatchError, match="mixes encodings"):
        MultiFormatTaskEncoder().batch(samples)


@pytest.mark.skipif(
    ENERGON_VERSION < (7, 3),
    reason="Energon 7.0-7.2 look for a cooker per sample, not when the loader is built",
)
def test_no_matching_cooker_is_reported_when_the_loader_is_built(raw_datasets: dict[str, Path]) -> None:
    with pytest.raises(
        ValueError, match=r"No cooker found.*registers cookers for \[\{'encoding': 'preencoded'\}\]"
    ):
        get_loader(raw_datasets["jpg"], EncodedDiffusionTaskEncoder, batch_size=2, num_workers=0)


def _cooked(preencoded_dataset: Path, count: int) -> tuple[list[dict], list[DiffusionSample]]:
    crude = crude_samples(preencoded_dataset)[:count]
    return crude, [cook_preencoded_diffusion_zero_copy(sample) for sample in crude]


def test_the_reference_encoder_cooks_without_copying_and_batches_own_their_memory(
    preencoded_dataset: Path,
) -> None:
    assert EncodedDiffusionTaskEncoder.cookers == [PREENCODED_ZERO_COPY_COOKER]
    crude, samples = _cooked(preencoded_dataset, 4)
    members = [(sample, member) for sample in crude for member in sample if member.endswith(".pth")]
    starts = [torch.frombuffer(sample[member], dtype=torch.uint8).data_ptr() for sample, member in members]
    spans = [(start, start + len(s[m])) for start, (s, m) in zip(starts, members, strict=True)]
    before = [bytes(sample[member]) for sample, member in members]
    batch = EncodedDiffusionTaskEncoder().batch(samples)
    for field in ("latents", "prompt_embeds", "pooled_prompt_embeds"):
        pointer = batch[field].untyped_storage().data_ptr()
        assert not any(start <= pointer < end for start, end in spans), f"batch {field} aliases member bytes"
        batch[field].zero_()  # writing into the batch ...
    assert [bytes(sample[member]) for sample, member in members] == before  # ... leaves the shard bytes alone
    assert not batch["latents"].any()
