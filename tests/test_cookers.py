"""The reference cook functions on real crude samples read by Energon from generated shards."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from megatron.energon.task_encoder.base import get_stateless
from PIL import Image

from primus_energon import (
    CaptionDecodeError,
    DiffusionSample,
    MissingMemberError,
    PayloadDecodeError,
    cook_preencoded_diffusion,
    cook_preencoded_diffusion_zero_copy,
    cook_raw_images,
)
from tests.helpers import assert_tensor_identical, crude_samples, read_members, tensor_from_bytes

FIELDS = {
    "latents": "latents.pth",
    "prompt_embeds": "prompt_embeds.pth",
    "pooled_prompt_embeds": "pooled_prompt_embeds.pth",
}


@pytest.fixture(scope="module")
def crude(preencoded_dataset: Path) -> list[dict]:
    return crude_samples(preencoded_dataset)


def _where(sample: dict) -> tuple[str, str]:
    return sample["__key__"], sample["__sources__"][0].shard_name


Cook = Callable[[dict], DiffusionSample]
PREENCODED_COOKERS = [cook_preencoded_diffusion, cook_preencoded_diffusion_zero_copy]


@pytest.fixture(params=PREENCODED_COOKERS, ids=["copying", "zero_copy"])
def cook_preencoded(request: pytest.FixtureRequest) -> Cook:
    """Each preencoded cooker: the two differ only in whether the tensors own their memory."""
    return request.param


def test_cookers_are_stateless() -> None:
    assert get_stateless(cook_preencoded_diffusion)
    assert get_stateless(cook_preencoded_diffusion_zero_copy)
    assert get_stateless(cook_raw_images)


def test_preencoded_matches_shard_bytes(
    cook_preencoded: Cook, crude: list[dict], preencoded_dataset: Path
) -> None:
    oracle = read_members(preencoded_dataset)
    assert sorted(s["__key__"] for s in crude) == sorted(oracle)
    for sample in crude:
        cooked = cook_preencoded(sample)
        assert isinstance(cooked, DiffusionSample)
        members = oracle[sample["__key__"]]
        for field, member in FIELDS.items():
            assert_tensor_identical(
                getattr(cooked, field), tensor_from_bytes(members[member]), f"{sample['__key__']}.{field}"
            )
        assert cooked.caption == members["caption.txt"].decode("utf-8")


def test_bytes_tensor_and_path_inputs_give_identical_samples(
    cook_preencoded: Cook, crude: list[dict], preencoded_dataset: Path, tmp_path: Path
) -> None:
    decoded = {s["__key__"]: s for s in crude_samples(preencoded_dataset, decoded=True)}
    for sample in crude[:6]:
        from_bytes = cook_preencoded(sample)
        other = decoded[sample["__key__"]]
        assert isinstance(other["latents.pth"], torch.Tensor) and isinstance(other["caption.txt"], str)
        from_tensors = cook_preencoded(other)
        as_paths = dict(sample)
        for member in FIELDS.values():
            path = tmp_path / f"{sample['__key__'].replace('/', '_')}.{member}"
            path.write_bytes(sample[member])
            as_paths[member] = str(path)
        from_paths = cook_preencoded(as_paths)
        for field in FIELDS:
            assert_tensor_identical(getattr(from_tensors, field), getattr(from_bytes, field), field)
            assert_tensor_identical(getattr(from_paths, field), getattr(from_bytes, field), field)
        assert from_tensors.caption == from_bytes.caption == from_paths.caption


def test_forwards_basic_sample_keys(cook_preencoded: Cook, crude: list[dict]) -> None:
    sample = crude[0]
    cooked = cook_preencoded(sample)
    assert cooked.__key__ == sample["__key__"]
    assert cooked.__restore_key__ == sample["__restore_key__"]
    assert cooked.__subflavors__ == sample["__subflavors__"] == {"encoding": "preencoded"}
    assert cooked.__sources__ == sample["__sources__"]


def test_input_dict_is_not_modified(cook_preencoded: Cook, crude: list[dict]) -> None:
    sample = crude[1]
    before = dict(sample)
    cook_preencoded(sample)
    assert sample.keys() == before.keys()
    assert all(sample[k] is before[k] for k in before)


def test_missing_caption_gives_empty_string(cook_preencoded: Cook, crude: list[dict]) -> None:
    sample = {k: v for k, v in crude[2].items() if k != "caption.txt"}
    assert cook_preencoded(sample).caption == ""


@pytest.mark.parametrize("member", list(FIELDS.values()))
def test_missing_required_member_names_member_key_and_shard(
    cook_preencoded: Cook, crude: list[dict], member: str
) -> None:
    sample = {k: v for k, v in crude[3].items() if k != member}
    key, shard = _where(sample)
    with pytest.raises(MissingMemberError) as caught:
        cook_preencoded(sample)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert member in message and repr(key) in message and shard in message
    assert (caught.value.key, caught.value.shard, caught.value.member) == (key, shard, member)


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"this is not a tensor file", "not a readable tensor file"),
        (b"", "not a readable tensor file"),
        ("torch.save of a dict", "holds a dict, not a tensor"),
        (12345, "is a int"),
    ],
)
def test_non_tensor_payload_is_refused_with_context(
    cook_preencoded: Cook, crude: list[dict], payload: object, reason: str
) -> None:
    if payload == "torch.save of a dict":
        buffer = io.BytesIO()
        torch.save({"latents": torch.zeros(2)}, buffer)
        payload = buffer.getvalue()
    sample = dict(crude[4], **{"prompt_embeds.pth": payload})
    key, shard = _where(sample)
    with pytest.raises(PayloadDecodeError, match=re.escape(reason)) as caught:
        cook_preencoded(sample)
    assert (
        "prompt_embeds.pth" in str(caught.value)
        and repr(key) in str(caught.value)
        and shard in str(caught.value)
    )


def test_truncated_tensor_file_is_refused(cook_preencoded: Cook, crude: list[dict]) -> None:
    sample = dict(crude[5], **{"latents.pth": crude[5]["latents.pth"][:-40]})
    with pytest.raises(PayloadDecodeError, match="latents.pth"):
        cook_preencoded(sample)


def test_unreadable_path_is_refused(cook_preencoded: Cook, crude: list[dict], tmp_path: Path) -> None:
    sample = dict(crude[5], **{"latents.pth": str(tmp_path / "nope.pth")})
    with pytest.raises(PayloadDecodeError, match="cannot be read"):
        cook_preencoded(sample)


def test_non_utf8_caption_names_member_key_and_shard(cook_preencoded: Cook, crude: list[dict]) -> None:
    sample = dict(crude[6], **{"caption.txt": "caf\u00e9".encode("latin-1")})
    key, shard = _where(sample)
    with pytest.raises(CaptionDecodeError) as caught:
        cook_preencoded(sample)
    message = str(caught.value)
    assert "caption.txt" in message and "UTF-8" in message and repr(key) in message and shard in message


@pytest.mark.parametrize("image_format", ["jpg", "jpeg", "png", "webp"])
def test_raw_images_every_format_loads(raw_datasets: dict[str, Path], image_format: str) -> None:
    oracle = read_members(raw_datasets[image_format])
    samples = crude_samples(raw_datasets[image_format])
    assert len(samples) == len(oracle) == 8
    for sample in samples:
        cooked = cook_raw_images(sample)
        members = oracle[sample["__key__"]]
        expected = Image.open(io.BytesIO(members[image_format])).convert("RGB")
        assert cooked["images"].mode == "RGB" and cooked["images"].size == (32, 24)
        assert cooked["images"].tobytes() == expected.tobytes()
        assert cooked["txt"] == members["txt"].decode("utf-8")
        assert cooked["__key__"] == sample["__key__"] and cooked["__subflavors__"] == {"encoding": "raw"}


def test_raw_image_under_images_key(raw_datasets: dict[str, Path]) -> None:
    sample = crude_samples(raw_datasets["png"])[0]
    renamed = {("images" if k == "png" else k): v for k, v in sample.items()}
    assert cook_raw_images(renamed)["images"].tobytes() == cook_raw_images(sample)["images"].tobytes()


def test_raw_without_image_or_caption_raises(raw_datasets: dict[str, Path]) -> None:
    sample = crude_samples(raw_datasets["jpg"])[0]
    with pytest.raises(MissingMemberError, match="no image member"):
        cook_raw_images({k: v for k, v in sample.items() if k != "jpg"})
    with pytest.raises(MissingMemberError, match="'txt'"):
        cook_raw_images({k: v for k, v in sample.items() if k != "txt"})


def test_raw_garbage_image_raises_with_context(raw_datasets: dict[str, Path]) -> None:
    sample = dict(crude_samples(raw_datasets["webp"])[0], webp=b"\x00not an image")
    with pytest.raises(PayloadDecodeError, match="not a decodable image") as caught:
        cook_raw_images(sample)
    assert repr(sample["__key__"]) in str(caught.value)


def test_zero_copy_tensors_view_the_member_bytes_and_copies_own_theirs(crude: list[dict]) -> None:
    sample = crude[0]
    views = cook_preencoded_diffusion_zero_copy(sample)
    owned = cook_preencoded_diffusion(sample)
    for field, member in FIELDS.items():
        data = sample[member]
        start = torch.frombuffer(data, dtype=torch.uint8).data_ptr()
        inside = start <= getattr(views, field).data_ptr() < start + len(data)
        assert inside, f"{field} of the zero-copy cooker is not a view of {member}"
        owned_ptr = getattr(owned, field).data_ptr()
        assert not start <= owned_ptr < start + len(data), f"{field} of the copying cooker aliases {member}"
        assert_tensor_identical(getattr(views, field), getattr(owned, field), field)
