"""Datasets in formats the suite's generator cannot write, built the way a user's prepare script builds them,
and the third-party targets that read them: correct ones, which must pass every property on these datasets,
and broken ones with one realistic defect each, which the claim meant for it must catch.

Six formats (``FORMATS``), each written member by member with :mod:`tarfile` or ``webdataset.TarWriter``
(fixed seeds, mtime 0: the same arguments give the same bytes) and prepared with Energon's own preparation:

- ``t2i_image_json``: ``image`` (a JPEG under an extension-less name) and ``json`` whose ``captions`` is a
  JSON-encoded string of ``{"short", "long", "tags"}``, beside ``width``, ``height`` and a nested ``source``;
  no subflavors in ``dataset.yaml``.
- ``nested_json``: ``latents.pth`` and ``meta.json`` with nested objects and lists; ``encoding: nested``.
- ``json_string``: ``record.json``, a JSON document that is a string holding JSON, and ``latents.pth``.
- ``npy_renamed``: ``t5.bytes``, ``clip.bytes`` and ``latents.bytes``, plain float16 ``.npy`` files under
  the ``.bytes`` extension; no caption.
- ``video_frames``: a clip as the frame members ``frame_000.png`` ... ``frame_003.png`` plus ``caption.txt``.
- ``pickled_tensors``: ``embeds.pickle`` (a pickled dict of torch tensors), ``latents.pth``, ``caption.txt``.

``CORRECT`` and ``BROKEN`` name the targets (``tests.conformance_zoo.foreign:NAME``) with their format and
kind; a broken one also with the claim id that must fail for it (``tests/test_conformance_foreign.py``).
"""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
import random
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from megatron.energon import Cooker, DefaultTaskEncoder, Sample, basic_sample_keys, stateless
from PIL import Image

from primus_energon import safe_loads
from primus_energon.datasets.preparation import prepare_shards, write_dataset_yaml

__all__ = ["FORMATS", "CORRECT", "BROKEN", "SUBFLAVORS", "NUM_FRAMES"]

#: Payload sizes: a few hundred values a tensor, 16x24 images, a 4-frame clip.
LATENT_SHAPE = (4, 8, 8)
T5_SHAPE = (7, 16)
CLIP_SHAPE = (16,)
IMAGE_HW = (16, 24)
NUM_FRAMES = 4

#: ``dataset.yaml`` subflavors of each format (t2i_image_json has none).
SUBFLAVORS: dict[str, dict[str, Any]] = {
    "t2i_image_json": {},
    "nested_json": {"encoding": "nested"},
    "json_string": {"encoding": "json_string"},
    "npy_renamed": {"encoding": "npy_renamed"},
    "video_frames": {"encoding": "video_frames"},
    "pickled_tensors": {"encoding": "pickled_tensors"},
}


# Writing: what a user's prepare script does -------------------------------------------------------------

Members = list[tuple[str, bytes]]

_SUBJECTS = ("red fox", "lighthouse", "bicycle", "teapot", "glacier", "street market", "violin", "cactus")
_PLACES = ("in the snow", "at dusk", "on a wooden table", "in Zürich", "under neon lights", "in the rain")
_STYLES = ("a photo of", "an oil painting of", "a sketch of", "a close-up of", "ein Foto von")


def _caption(rng: np.random.Generator, index: int) -> str:
    """A distinct caption (the index is in it); some non-ASCII, some with the trailing newline a script
    that writes captions with print() leaves."""
    text = (
        f"{_STYLES[rng.integers(len(_STYLES))]} a {_SUBJECTS[rng.integers(len(_SUBJECTS))]} "
        f"{_PLACES[rng.integers(len(_PLACES))]}, no. {index}"
    )
    if index % 3 == 1:
        text += " — crème brûlée 東京"
    if index % 4 == 3:
        text += "\n"
    return text


def _tensor(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def _pth(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    torch.save(torch.from_numpy(np.ascontiguousarray(array)), buffer)
    return buffer.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _pickle(tensors: dict[str, torch.Tensor]) -> bytes:
    """``pickle.dumps(tensors, protocol=4)``, reproducible: torch pickles each storage under its memory address
    (twice, as a length-prefixed string); each is replaced by a counter of the same length, so the bytes
    depend on the values only and unpickle as before."""
    raw = pickle.dumps(tensors, protocol=4)
    for number, tensor in enumerate(tensors.values()):
        address = str(tensor.untyped_storage()._cdata).encode()
        raw = raw.replace(address, str(number).rjust(len(address), "0").encode())
    return raw


def _image(rng: np.random.Generator, image_format: str) -> bytes:
    """A 16x24 RGB image: a gradient with noise (every sample's differs)."""
    height, width = IMAGE_HW
    ramp = np.linspace(0, 160, width, dtype=np.float64)[None, :, None]
    noise = rng.integers(0, 96, (height, width, 3))
    pixels = np.clip(ramp + noise + rng.integers(0, 64, (1, 1, 3)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    options = {"quality": 90} if image_format == "JPEG" else {}
    Image.fromarray(pixels, "RGB").save(buffer, format=image_format, **options)
    return buffer.getvalue()


def _write_tarfile(path: Path, samples: Sequence[tuple[str, Members]]) -> None:
    """Members in the order given, with the metadata of a reproducible build (mtime 0, root, 0644)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for key, members in samples:
            for name, data in members:
                info = tarfile.TarInfo(f"{key}.{name}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))


def _write_webdataset(path: Path, samples: Sequence[tuple[str, Members]]) -> None:
    """``webdataset.TarWriter`` (it writes each sample's members sorted by name), mtime 0."""
    from webdataset import TarWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as stream:
        writer = TarWriter(stream, encoder=False, mtime=0)
        for key, members in samples:
            writer.write({"__key__": key, **dict(members)})
        writer.close()


def _finish(
    root: Path,
    samples: list[tuple[str, Members]],
    *,
    shard_size: int,
    shard_name: Callable[[int], str],
    writer: Callable[[Path, Sequence[tuple[str, Members]]], None],
    subflavors: dict[str, Any],
) -> Path:
    """Write ``samples`` into shards of ``shard_size``, all in the train split, and prepare them."""
    if shard_size < 1 or not samples:
        raise ValueError("need at least one sample and a shard size of at least 1")
    root.mkdir(parents=True, exist_ok=True)
    names = []
    for number, start in enumerate(range(0, len(samples), shard_size)):
        names.append(shard_name(number))
        writer(root / names[-1], samples[start : start + shard_size])
    prepare_shards(root, names, shard_splits=["train"] * len(names))
    write_dataset_yaml(root, subflavors)
    return root


def build_t2i_image_json(root: Path, *, num_samples: int = 12, shard_size: int = 12, seed: int = 0) -> Path:
    """img2dataset-style shards (``00000.tar``): ``{key}.image`` (JPEG) and ``{key}.json``."""
    rng = np.random.default_rng([seed, 1])
    samples = []
    for index in range(num_samples):
        long = _caption(rng, index)
        captions = {
            "short": f"{_SUBJECTS[index % len(_SUBJECTS)]} #{index}",
            "long": long,
            "tags": [_SUBJECTS[index % len(_SUBJECTS)].split()[-1], f"batch-{seed}", f"n{index}"],
        }
        document = {
            "captions": json.dumps(captions, ensure_ascii=False),
            "width": IMAGE_HW[1],
            "height": IMAGE_HW[0],
            "source": {
                "url": f"https://images.example.org/{seed}/{index}.jpg",
                "license": "cc-by-4.0",
                "crawl": {"id": 1000 * seed + index, "sha1": f"{rng.integers(2**62):016x}"},
            },
        }
        samples.append(
            (
                f"{seed:03d}{index:05d}",
                [
                    ("image", _image(rng, "JPEG")),
                    ("json", json.dumps(document, ensure_ascii=False).encode("utf-8")),
                ],
            )
        )
    return _finish(
        root,
        samples,
        shard_size=shard_size,
        shard_name=lambda n: f"{n:05d}.tar",
        writer=_write_webdataset,
        subflavors=SUBFLAVORS["t2i_image_json"],
    )


def build_nested_json(root: Path, *, num_samples: int = 12, shard_size: int = 12, seed: int = 0) -> Path:
    """``latents.pth`` (float32) and ``meta.json`` with nested objects and lists."""
    rng = np.random.default_rng([seed, 2])
    samples = []
    for index in range(num_samples):
        meta = {
            "caption": {"en": _caption(rng, index), "de": f"Beschreibung Nr. {index}: Größe {index % 5}"},
            "tags": ["latent", _SUBJECTS[index % len(_SUBJECTS)], f"n{index}"],
            "size": {"h": LATENT_SHAPE[1], "w": LATENT_SHAPE[2]},
            "crops": [[0, 0, LATENT_SHAPE[1], LATENT_SHAPE[2]], [index % 2, 0, 4, 4]],
            "aesthetic": round(float(rng.uniform(3, 7)), 3),
        }
        samples.append(
            (
                f"sample_{seed:02d}_{index:06d}",
                [
                    ("latents.pth", _pth(_tensor(rng, LATENT_SHAPE))),
                    ("meta.json", json.dumps(meta).encode("utf-8")),
                ],
            )
        )
    return _finish(
        root,
        samples,
        shard_size=shard_size,
        shard_name=lambda n: f"shard-{n:06d}.tar",
        writer=_write_tarfile,
        subflavors=SUBFLAVORS["nested_json"],
    )


def build_json_string(root: Path, *, num_samples: int = 12, shard_size: int = 12, seed: int = 0) -> Path:
    """``record.json`` = ``json.dumps(json.dumps(record))`` (a document that is a string), ``latents.pth``."""
    rng = np.random.default_rng([seed, 3])
    samples = []
    for index in range(num_samples):
        record = {
            "caption": _caption(rng, index),
            "aesthetic": round(float(rng.uniform(3, 7)), 3),
            "resolution": [IMAGE_HW[0] * 32, IMAGE_HW[1] * 32],
            "id": 1000 * seed + index,
        }
        samples.append(
            (
                f"rec{seed:02d}x{index:06d}",
                [
                    ("latents.pth", _pth(_tensor(rng, LATENT_SHAPE))),
                    ("record.json", json.dumps(json.dumps(record)).encode("utf-8")),
                ],
            )
        )
    return _finish(
        root,
        samples,
        shard_size=shard_size,
        shard_name=lambda n: f"part-{n:05d}.tar",
        writer=_write_tarfile,
        subflavors=SUBFLAVORS["json_string"],
    )


def build_npy_renamed(root: Path, *, num_samples: int = 12, shard_size: int = 12, seed: int = 0) -> Path:
    """``t5.bytes``, ``clip.bytes``, ``latents.bytes``: float16 ``.npy`` files (np.save) under ``.bytes``."""
    rng = np.random.default_rng([seed, 4])
    samples = []
    for index in range(num_samples):
        samples.append(
            (
                f"flux_{seed:02d}_{index:06d}",
                [
                    ("t5.bytes", _npy(_tensor(rng, T5_SHAPE, np.float16))),
                    ("clip.bytes", _npy(_tensor(rng, CLIP_SHAPE, np.float16))),
                    ("latents.bytes", _npy(_tensor(rng, LATENT_SHAPE, np.float16))),
                ],
            )
        )
    return _finish(
        root,
        samples,
        shard_size=shard_size,
        shard_name=lambda n: f"train-{n:06d}.tar",
        writer=_write_tarfile,
        subflavors=SUBFLAVORS["npy_renamed"],
    )


def build_video_frames(root: Path, *, num_samples: int = 12, shard_size: int = 12, seed: int = 0) -> Path:
    """A clip as ``frame_000.png`` ... ``frame_003.png`` of one sample, plus ``caption.txt``; shards in a
    ``shards/`` folder (written with webdataset's TarWriter)."""
    rng = np.random.default_rng([seed, 5])
    samples = []
    for index in range(num_samples):
        members = [(f"frame_{frame:03d}.png", _image(rng, "PNG")) for frame in range(NUM_FRAMES)]
        members.append(("caption.txt", _caption(rng, index).encode("utf-8")))
        samples.append((f"clip{seed:02d}_{index:06d}", members))
    return _finish(
        root,
        samples,
        shard_size=shard_size,
        shard_name=lambda n: f"shards/video-{n:06d}.tar",
        writer=_write_webdataset,
        subflavors=SUBFLAVORS["video_frames"],
    )


def build_pickled_tensors(root: Path, *, num_samples: int = 12, shard_size: int = 12, seed: int = 0) -> Path:
    """``embeds.pickle`` = ``pickle.dumps({"t5": tensor, "clip": tensor}, protocol=4)``, ``latents.pth``,
    ``caption.txt``."""
    rng = np.random.default_rng([seed, 6])
    samples = []
    for index in range(num_samples):
        embeds = {
            "t5": torch.from_numpy(_tensor(rng, T5_SHAPE)),
            "clip": torch.from_numpy(_tensor(rng, CLIP_SHAPE)),
        }
        samples.append(
            (
                f"pk{seed:02d}-{index:06d}",
                [
                    ("embeds.pickle", _pickle(embeds)),
                    ("latents.pth", _pth(_tensor(rng, LATENT_SHAPE))),
                    ("caption.txt", _caption(rng, index).encode("utf-8")),
                ],
            )
        )
    return _finish(
        root,
        samples,
        shard_size=shard_size,
        shard_name=lambda n: f"data-{n:06d}.tar",
        writer=_write_tarfile,
        subflavors=SUBFLAVORS["pickled_tensors"],
    )


#: format name -> builder
FORMATS: dict[str, Callable[..., Path]] = {
    "t2i_image_json": build_t2i_image_json,
    "nested_json": build_nested_json,
    "json_string": build_json_string,
    "npy_renamed": build_npy_renamed,
    "video_frames": build_video_frames,
    "pickled_tensors": build_pickled_tensors,
}


# Reading: the safe readers a careful third party uses ----------------------------------------------------


def read_pth(raw: bytes) -> torch.Tensor:
    value = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"expected a tensor, the .pth holds a {type(value).__name__}")
    return value


def read_npy(raw: bytes) -> torch.Tensor:
    return torch.from_numpy(np.load(io.BytesIO(raw), allow_pickle=False))


def read_image(raw: bytes) -> torch.Tensor:
    """RGB, CHW uint8 (as torchvision's pil_to_tensor)."""
    with Image.open(io.BytesIO(raw)) as image:
        pixels = np.array(image.convert("RGB"))
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


def read_json(raw: bytes) -> Any:
    return json.loads(bytes(raw).decode("utf-8"))


def _tensor_leaf(value: Any, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what}: expected a tensor, got a {type(value).__name__}")
    return value


def _stack_batch(samples: Sequence[Any], tensors: Sequence[str], lists: Sequence[str]) -> dict[str, Any]:
    """The batch most third-party TaskEncoders write: tensors stacked, the rest in lists, keys kept."""
    out: dict[str, Any] = {"__key__": [s.__key__ for s in samples]}
    out.update({name: torch.stack([getattr(s, name) for s in samples]) for name in tensors})
    out.update({name: [getattr(s, name) for s in samples] for name in lists})
    return out


# t2i_image_json -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TextImageSample(Sample):
    image: torch.Tensor
    caption: str
    short_caption: str
    tags: list[str]
    width: int
    height: int


def _t2i(
    sample: dict, *, caption: Callable[[dict], str], image: Callable[[bytes, dict], torch.Tensor]
) -> Any:
    meta = read_json(sample["json"])
    captions = json.loads(meta["captions"])  # a JSON object stored as a string
    if not isinstance(captions, dict):
        raise TypeError(f"'captions' holds a {type(captions).__name__}, expected an object")
    return TextImageSample(
        **basic_sample_keys(sample),
        image=image(sample["image"], meta),
        caption=caption(captions),
        short_caption=captions["short"],
        tags=list(captions["tags"]),
        width=meta["width"],
        height=meta["height"],
    )


@stateless
def cook_t2i(sample: dict) -> TextImageSample:
    """Correct: the image decoded with PIL, the long caption from the JSON string in ``captions``."""
    return _t2i(sample, caption=lambda c: c["long"], image=lambda raw, meta: read_image(raw))


class T2ITaskEncoder(DefaultTaskEncoder):
    """Correct: decodes the members itself (``decoder = None``)."""

    decoder = None
    cookers = [Cooker(cook_t2i)]

    @stateless
    def batch(self, samples: list[TextImageSample]) -> dict[str, Any]:
        return _stack_batch(samples, ["image"], ["caption", "short_caption", "tags"])


@stateless
def cook_t2i_random_caption(sample: dict) -> TextImageSample:
    """Broken: "caption dropout" style augmentation, short or long caption drawn with the global ``random``
    in a cooker that is @stateless without restore_seeds: it advances the training loop's RNG."""
    return _t2i(
        sample,
        caption=lambda c: random.choice([c["short"], c["long"]]),
        image=lambda raw, meta: read_image(raw),
    )


class T2IRandomCaptionTaskEncoder(T2ITaskEncoder):
    cookers = [Cooker(cook_t2i_random_caption)]


def _image_or_blank(raw: bytes, meta: dict) -> torch.Tensor:
    try:
        return read_image(raw)
    except Exception:  # "a few JPEGs in a web crawl are always broken": a black image instead
        return torch.zeros(3, meta["height"], meta["width"], dtype=torch.uint8)


@stateless
def cook_t2i_blank_on_error(sample: dict) -> TextImageSample:
    """Broken: an image that does not decode becomes a black image: a corrupt sample trains."""
    return _t2i(sample, caption=lambda c: c["long"], image=_image_or_blank)


class T2IBlankImageTaskEncoder(T2ITaskEncoder):
    cookers = [Cooker(cook_t2i_blank_on_error)]


# nested_json ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class NestedSample(Sample):
    latents: torch.Tensor
    caption: str
    caption_de: str
    tags: list[str]
    crops: torch.Tensor
    aesthetic: float


def _nested(sample: dict, latents: torch.Tensor, meta: dict) -> NestedSample:
    return NestedSample(
        **basic_sample_keys(sample),
        latents=latents,
        caption=meta["caption"]["en"],
        caption_de=meta["caption"]["de"],
        tags=list(meta["tags"]),
        crops=torch.tensor(meta["crops"], dtype=torch.int64),
        aesthetic=float(meta["aesthetic"]),
    )


@stateless
def cook_nested(sample: dict) -> NestedSample:
    return _nested(sample, read_pth(sample["latents.pth"]), read_json(sample["meta.json"]))


class NestedJsonTaskEncoder(DefaultTaskEncoder):
    """Correct: latents with ``torch.load(weights_only=True)``, the nested metadata with ``json.loads``."""

    decoder = None
    cookers = [Cooker(cook_nested, has_subflavors={"encoding": "nested"})]

    @stateless
    def batch(self, samples: list[NestedSample]) -> dict[str, Any]:
        out = _stack_batch(samples, ["latents"], ["caption", "caption_de", "tags", "crops"])
        out["aesthetic"] = torch.tensor([s.aesthetic for s in samples], dtype=torch.float64)
        return out


@stateless
def cook_nested_zero_latents(sample: dict) -> NestedSample:
    """Broken: a sample whose latents were "not encoded yet" gets zero latents of the size in its meta."""
    meta = read_json(sample["meta.json"])
    if "latents.pth" in sample:
        latents = read_pth(sample["latents.pth"])
    else:
        latents = torch.zeros(LATENT_SHAPE[0], meta["size"]["h"], meta["size"]["w"])
    return _nested(sample, latents, meta)


class NestedZeroLatentsTaskEncoder(NestedJsonTaskEncoder):
    cookers = [Cooker(cook_nested_zero_latents, has_subflavors={"encoding": "nested"})]


# json_string ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RecordSample(Sample):
    latents: torch.Tensor
    caption: str
    aesthetic: float
    resolution: list[int]


def read_record(raw: bytes) -> dict:
    """The record: a JSON document that is a string, which holds the JSON object."""
    text = read_json(raw)
    if not isinstance(text, str):
        raise TypeError(f"record.json holds a {type(text).__name__}, expected a JSON string")
    record = json.loads(text)
    if not isinstance(record, dict):
        raise TypeError(f"record.json's string holds a {type(record).__name__}, expected an object")
    return record


def _record(sample: dict, latents: torch.Tensor) -> RecordSample:
    record = read_record(sample["record.json"])
    return RecordSample(
        **basic_sample_keys(sample),
        latents=latents,
        caption=record["caption"],
        aesthetic=float(record["aesthetic"]),
        resolution=list(record["resolution"]),
    )


@stateless
def cook_json_string(sample: dict) -> RecordSample:
    return _record(sample, read_pth(sample["latents.pth"]))


class JsonStringTaskEncoder(DefaultTaskEncoder):
    decoder = None
    cookers = [Cooker(cook_json_string, has_subflavors={"encoding": "json_string"})]

    @stateless
    def batch(self, samples: list[RecordSample]) -> dict[str, Any]:
        return _stack_batch(samples, ["latents"], ["caption", "aesthetic", "resolution"])


@stateless
def cook_json_string_bf16(sample: dict) -> RecordSample:
    """Broken: "the model trains in bf16", so the latents are cast on the way in."""
    return _record(sample, read_pth(sample["latents.pth"]).to(torch.bfloat16))


class JsonStringBf16TaskEncoder(JsonStringTaskEncoder):
    cookers = [Cooker(cook_json_string_bf16, has_subflavors={"encoding": "json_string"})]


# npy_renamed ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class EmbeddingSample(Sample):
    latents: torch.Tensor
    prompt_embeds: torch.Tensor
    pooled_prompt_embeds: torch.Tensor


@stateless
def cook_npy_renamed(sample: dict) -> EmbeddingSample:
    """Correct (also checked as a plain cook function): each ``.bytes`` member read with
    ``np.load(allow_pickle=False)``, renamed to the model's field names."""
    return EmbeddingSample(
        **basic_sample_keys(sample),
        latents=read_npy(sample["latents.bytes"]),
        prompt_embeds=read_npy(sample["t5.bytes"]),
        pooled_prompt_embeds=read_npy(sample["clip.bytes"]),
    )


class NpyTaskEncoder(DefaultTaskEncoder):
    decoder = None
    cookers = [Cooker(cook_npy_renamed, has_subflavors={"encoding": "npy_renamed"})]

    @stateless
    def batch(self, samples: list[EmbeddingSample]) -> dict[str, Any]:
        return _stack_batch(samples, ["latents", "prompt_embeds", "pooled_prompt_embeds"], [])


def _read_as_bfloat16(raw: bytes) -> torch.Tensor:
    # copied from an MLPerf FLUX loader, whose .npy files hold bfloat16 stored as uint16
    array = np.load(io.BytesIO(raw), allow_pickle=False)
    return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)


@stateless
def cook_npy_as_bfloat16(sample: dict) -> EmbeddingSample:
    """Broken: float16 arrays reinterpreted as bfloat16 (same bytes, other numbers)."""
    return EmbeddingSample(
        **basic_sample_keys(sample),
        latents=_read_as_bfloat16(sample["latents.bytes"]),
        prompt_embeds=_read_as_bfloat16(sample["t5.bytes"]),
        pooled_prompt_embeds=_read_as_bfloat16(sample["clip.bytes"]),
    )


class NpyAsBfloat16TaskEncoder(NpyTaskEncoder):
    cookers = [Cooker(cook_npy_as_bfloat16, has_subflavors={"encoding": "npy_renamed"})]


@stateless
def cook_npy_as_float16(sample: dict) -> EmbeddingSample:
    """Broken: every array forced to float16 (``.astype(np.float16)``: what the data happens to hold
    today), so data of another dtype is silently cast."""
    return EmbeddingSample(
        **basic_sample_keys(sample),
        **{
            field: torch.from_numpy(
                np.load(io.BytesIO(sample[member]), allow_pickle=False).astype(np.float16)
            )
            for field, member in (
                ("latents", "latents.bytes"),
                ("prompt_embeds", "t5.bytes"),
                ("pooled_prompt_embeds", "clip.bytes"),
            )
        },
    )


class NpyForcesFloat16TaskEncoder(NpyTaskEncoder):
    """Right on its own data, which is float16 throughout: data of another dtype is outside the format, so
    the suite derives none and ``fidelity/dtypes`` does not apply (tests/test_conformance_foreign.py)."""

    cookers = [Cooker(cook_npy_as_float16, has_subflavors={"encoding": "npy_renamed"})]


_NPY_SHAPES = {"latents.bytes": LATENT_SHAPE, "t5.bytes": T5_SHAPE, "clip.bytes": CLIP_SHAPE}


@stateless
def cook_npy_zeros_on_error(sample: dict) -> EmbeddingSample:
    """Broken (a plain cook function): an array that does not load becomes zeros of the usual shape."""

    def load(member: str) -> torch.Tensor:
        try:
            return read_npy(sample[member])
        except (ValueError, OSError, EOFError):
            return torch.zeros(_NPY_SHAPES[member], dtype=torch.float16)

    return EmbeddingSample(
        **basic_sample_keys(sample),
        latents=load("latents.bytes"),
        prompt_embeds=load("t5.bytes"),
        pooled_prompt_embeds=load("clip.bytes"),
    )


# video_frames ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ClipSample(Sample):
    video: torch.Tensor  # [T, C, H, W] uint8
    caption: str


def _clip(sample: dict, frames: range, caption: Callable[[str], str] = lambda text: text) -> ClipSample:
    return ClipSample(
        **basic_sample_keys(sample),
        video=torch.stack([read_image(sample[f"frame_{i:03d}.png"]) for i in frames]),
        caption=caption(sample["caption.txt"].decode("utf-8")),
    )


@stateless
def cook_video_frames(sample: dict) -> ClipSample:
    """Correct: every frame, in order, stacked into a [T, C, H, W] clip; a missing frame is a KeyError."""
    return _clip(sample, range(NUM_FRAMES))


class VideoFramesTaskEncoder(DefaultTaskEncoder):
    decoder = None
    cookers = [Cooker(cook_video_frames, has_subflavors={"encoding": "video_frames"})]

    @stateless
    def batch(self, samples: list[ClipSample]) -> dict[str, Any]:
        return _stack_batch(samples, ["video"], ["caption"])


@stateless
def cook_video_skips_first_frame(sample: dict) -> ClipSample:
    """Broken: frames counted from 1 (the author's other export numbered them so): frame_000 is lost."""
    return _clip(sample, range(1, NUM_FRAMES))


class VideoSkipsFrameTaskEncoder(VideoFramesTaskEncoder):
    cookers = [Cooker(cook_video_skips_first_frame, has_subflavors={"encoding": "video_frames"})]


def _frame_or_black(raw: bytes) -> torch.Tensor:
    try:
        return read_image(raw)
    except Exception:  # "one bad frame should not kill the clip": a black frame instead
        return torch.zeros(3, *IMAGE_HW, dtype=torch.uint8)


@stateless
def cook_video_black_frame(sample: dict) -> ClipSample:
    """Broken: a frame that does not decode becomes a black frame: a corrupt clip trains."""
    return ClipSample(
        **basic_sample_keys(sample),
        video=torch.stack([_frame_or_black(sample[f"frame_{i:03d}.png"]) for i in range(NUM_FRAMES)]),
        caption=sample["caption.txt"].decode("utf-8"),
    )


class VideoBlackFrameTaskEncoder(VideoFramesTaskEncoder):
    cookers = [Cooker(cook_video_black_frame, has_subflavors={"encoding": "video_frames"})]


@stateless
def cook_video_stripped_caption(sample: dict) -> ClipSample:
    """Broken (a plain cook function): the caption is ``.strip()``-ed "to clean it up"."""
    return _clip(sample, range(NUM_FRAMES), caption=str.strip)


# pickled_tensors ------------------------------------------------------------------------------------------


def _embeds(raw: bytes, loads: Callable[[bytes], Any]) -> dict:
    embeds = loads(raw)
    if not isinstance(embeds, dict):
        raise TypeError(f"embeds.pickle holds a {type(embeds).__name__}, expected a dict")
    return embeds


def _pickled(sample: dict, embeds: dict, clip: Any) -> Any:
    return CaptionedEmbeddingSample(
        **basic_sample_keys(sample),
        latents=read_pth(sample["latents.pth"]),
        prompt_embeds=_tensor_leaf(embeds["t5"], "embeds.pickle['t5']"),
        pooled_prompt_embeds=_tensor_leaf(clip, "embeds.pickle['clip']"),
        caption=sample["caption.txt"].decode("utf-8"),
    )


@dataclasses.dataclass
class CaptionedEmbeddingSample(Sample):
    latents: torch.Tensor
    prompt_embeds: torch.Tensor
    pooled_prompt_embeds: torch.Tensor
    caption: str


@stateless
def cook_pickled(sample: dict) -> CaptionedEmbeddingSample:
    """Correct: the pickled dict read with primus_energon.safe_loads (plain data and tensors, no code)."""
    embeds = _embeds(sample["embeds.pickle"], safe_loads)
    return _pickled(sample, embeds, embeds["clip"])


class PickledTensorsTaskEncoder(DefaultTaskEncoder):
    decoder = None
    cookers = [Cooker(cook_pickled, has_subflavors={"encoding": "pickled_tensors"})]

    @stateless
    def batch(self, samples: list[CaptionedEmbeddingSample]) -> dict[str, Any]:
        return _stack_batch(samples, ["latents", "prompt_embeds", "pooled_prompt_embeds"], ["caption"])


@stateless
def cook_pickled_zero_clip(sample: dict) -> CaptionedEmbeddingSample:
    """Broken: "older shards have no CLIP embedding": a missing ``clip`` leaf becomes zeros."""
    embeds = _embeds(sample["embeds.pickle"], safe_loads)
    return _pickled(sample, embeds, embeds.get("clip", torch.zeros(CLIP_SHAPE)))


class PickledZeroClipTaskEncoder(PickledTensorsTaskEncoder):
    cookers = [Cooker(cook_pickled_zero_clip, has_subflavors={"encoding": "pickled_tensors"})]


@stateless
def cook_pickled_unsafe(sample: dict) -> CaptionedEmbeddingSample:
    """Broken: ``pickle.loads`` on shard bytes (what the embeds were written with): a shard runs code."""
    embeds = _embeds(sample["embeds.pickle"], pickle.loads)
    return _pickled(sample, embeds, embeds["clip"])


class PickleLoadsTaskEncoder(PickledTensorsTaskEncoder):
    cookers = [Cooker(cook_pickled_unsafe, has_subflavors={"encoding": "pickled_tensors"})]


# Registries -----------------------------------------------------------------------------------------------

_HERE = "tests.conformance_zoo.foreign"

#: correct target spec -> (format, kind): must pass every property on its format's datasets
CORRECT: dict[str, tuple[str, str]] = {
    f"{_HERE}:T2ITaskEncoder": ("t2i_image_json", "task_encoder"),
    f"{_HERE}:cook_t2i": ("t2i_image_json", "cooker"),
    f"{_HERE}:NestedJsonTaskEncoder": ("nested_json", "task_encoder"),
    f"{_HERE}:JsonStringTaskEncoder": ("json_string", "task_encoder"),
    f"{_HERE}:NpyTaskEncoder": ("npy_renamed", "task_encoder"),
    f"{_HERE}:cook_npy_renamed": ("npy_renamed", "cooker"),
    f"{_HERE}:VideoFramesTaskEncoder": ("video_frames", "task_encoder"),
    f"{_HERE}:PickledTensorsTaskEncoder": ("pickled_tensors", "task_encoder"),
}

#: broken target spec -> (format, the claim id that must fail for its defect, kind)
BROKEN: dict[str, tuple[str, str, str]] = {
    f"{_HERE}:T2IRandomCaptionTaskEncoder": ("t2i_image_json", "purity/global_rng", "task_encoder"),
    f"{_HERE}:T2IBlankImageTaskEncoder": ("t2i_image_json", "bad_input/corrupt_payload", "task_encoder"),
    f"{_HERE}:NestedZeroLatentsTaskEncoder": ("nested_json", "bad_input/missing_member", "task_encoder"),
    f"{_HERE}:JsonStringBf16TaskEncoder": ("json_string", "fidelity/tensors", "task_encoder"),
    f"{_HERE}:NpyAsBfloat16TaskEncoder": ("npy_renamed", "fidelity/tensors", "task_encoder"),
    f"{_HERE}:cook_npy_zeros_on_error": ("npy_renamed", "bad_input/corrupt_payload", "cooker"),
    f"{_HERE}:VideoSkipsFrameTaskEncoder": ("video_frames", "fidelity/images", "task_encoder"),
    f"{_HERE}:VideoBlackFrameTaskEncoder": ("video_frames", "bad_input/corrupt_payload", "task_encoder"),
    f"{_HERE}:cook_video_stripped_caption": ("video_frames", "fidelity/text", "cooker"),
    f"{_HERE}:PickledZeroClipTaskEncoder": ("pickled_tensors", "bad_input/missing_member", "task_encoder"),
    f"{_HERE}:PickleLoadsTaskEncoder": ("pickled_tensors", "bad_input/code_execution", "task_encoder"),
}
