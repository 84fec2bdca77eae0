"""Cookers for the formats real projects' prepare scripts write (synthetic/examples/*.yaml), written as
those projects would: correct ones that must pass, and broken ones that must fail the right claim."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from megatron.energon import Cooker, DefaultTaskEncoder, Sample, basic_sample_keys, stateless

from primus_energon import safe_loads

EXAMPLES = Path(__file__).parents[2] / "synthetic" / "examples"
DFM_SCHEMA = str(EXAMPLES / "dfm_flux.yaml")
NEMO_SCHEMA = str(EXAMPLES / "nemo.yaml")
MLPERF_SCHEMA = str(EXAMPLES / "mlperf_numpy.yaml")


def _tensor(data: Any) -> torch.Tensor:
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    tensor = torch.load(io.BytesIO(bytes(data)), map_location="cpu", weights_only=True)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(tensor).__name__}")
    return tensor


@stateless
def cook_dfm_flux(sample: dict) -> dict[str, Any]:
    """DFM's layout: latents in `pth`, T5 and CLIP embeddings in one pickled dict, provenance in `json`
    (the caption is taken from it; the rest of the record is dropped, which is fine)."""
    embeddings = safe_loads(sample["pickle"])
    for name in ("prompt_embeds", "pooled_prompt_embeds"):
        if not isinstance(embeddings.get(name), torch.Tensor):
            raise KeyError(f"the pickle member has no tensor {name!r}")
    record = json.loads(sample["json"])
    return {
        **basic_sample_keys(sample),
        "latents": _tensor(sample["pth"]),
        "prompt_embeds": embeddings["prompt_embeds"],
        "pooled_prompt_embeds": embeddings["pooled_prompt_embeds"],
        "caption": record["caption"],
    }


@stateless
def cook_nemo(sample: dict) -> dict[str, Any]:
    """NeMo's layout: members with a leading dot; the T5 embedding is a pickled float16 numpy array."""
    embedding = safe_loads(sample[".pickle"])
    if not isinstance(embedding, np.ndarray):
        raise TypeError(f"expected a numpy array in .pickle, got {type(embedding).__name__}")
    info = json.loads(sample[".json"])
    return {
        **basic_sample_keys(sample),
        "video": _tensor(sample[".pth"]),
        "t5_text_embeddings": torch.from_numpy(embedding),
        "image_height": info["image_height"],
        "image_width": info["image_width"],
    }


_MLPERF = {
    "t5.bytes": "prompt_embeds",
    "clip.bytes": "pooled_prompt_embeds",
    "mean.bytes": "mean",
    "logvar.bytes": "logvar",
}
_MLPERF_SHAPES = {
    "t5.bytes": (12, 32),
    "clip.bytes": (32,),
    "mean.bytes": (4, 8, 8),
    "logvar.bytes": (4, 8, 8),
}


def _bf16(data: Any, shape: tuple[int, ...], dtype: type = np.uint16) -> torch.Tensor:
    """MLPerf's bfloat16 stored as uint16: an .npy file (shape kept), or headerless bytes of ``shape``."""
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    if bytes(data[:6]) == b"\x93NUMPY":
        words = np.load(io.BytesIO(bytes(data)), allow_pickle=False)
        if words.dtype != np.uint16:
            raise TypeError(f"expected a uint16 array, got {words.dtype}")
        words = words.view(dtype)
    else:
        words = np.frombuffer(bytes(data), dtype=dtype)
        if words.size != int(np.prod(shape)):
            raise ValueError(f"expected {int(np.prod(shape))} values, got {words.size}")
        words = words.reshape(shape)
    return torch.from_numpy(words.copy()).view(torch.bfloat16 if dtype is np.uint16 else torch.float16)


@stateless
def cook_mlperf_numpy(sample: dict) -> dict[str, Any]:
    """Primus' MLPerf layout: headerless bfloat16 bytes (read as uint16, viewed as bfloat16)."""
    return {
        **basic_sample_keys(sample),
        **{field: _bf16(sample[member], _MLPERF_SHAPES[member]) for member, field in _MLPERF.items()},
    }


@stateless
def cook_mlperf_as_float16(sample: dict) -> dict[str, Any]:
    """Reads the bfloat16 bytes as float16: same bytes, different numbers."""
    return {
        **basic_sample_keys(sample),
        **{
            field: _bf16(sample[member], _MLPERF_SHAPES[member], np.float16)
            for member, field in _MLPERF.items()
        },
    }


@stateless
def cook_dfm_zero_pooled(sample: dict) -> dict[str, Any]:
    """Fills a zero CLIP embedding when the pickle lacks it (DFM's encoder does this in encode_sample)."""
    embeddings = safe_loads(sample["pickle"]) if "pickle" in sample else {}
    pooled = embeddings.get("pooled_prompt_embeds")
    if "prompt_embeds" not in embeddings:
        raise KeyError("prompt_embeds")
    return {
        **basic_sample_keys(sample),
        "latents": _tensor(sample["pth"]),
        "prompt_embeds": embeddings["prompt_embeds"],
        "pooled_prompt_embeds": pooled if pooled is not None else torch.zeros(32),
        "caption": json.loads(sample["json"])["caption"],
    }


@stateless
def cook_dfm_unpickles(sample: dict) -> dict[str, Any]:
    """DFM's layout read with pickle.loads, as its TaskEncoder's default decoder does."""
    import pickle

    embeddings = pickle.loads(sample["pickle"])  # noqa: S301 (the defect this target shows)
    return {
        **basic_sample_keys(sample),
        "latents": _tensor(sample["pth"]),
        "prompt_embeds": embeddings["prompt_embeds"],
        "pooled_prompt_embeds": embeddings["pooled_prompt_embeds"],
        "caption": json.loads(sample["json"])["caption"],
    }


NEMO_RAW_SCHEMA = str(EXAMPLES / "nemo_raw.yaml")


@stateless
def cook_nemo_raw_images(sample: dict) -> dict[str, Any]:
    """NeMo's raw images: `jpg` is the image, `png` the control image (field `hint`), `txt` the caption."""
    from PIL import Image

    def image(member: str) -> Any:
        with Image.open(io.BytesIO(sample[member])) as opened:
            return opened.convert("RGB")

    return {
        **basic_sample_keys(sample),
        "images": image("jpg"),
        "hint": image("png"),
        "txt": sample["txt"].decode("utf-8"),
    }


# --- one TaskEncoder, two formats (the common preencoded .pth layout and MLPerf's raw bf16 bytes) ---------


@dataclasses.dataclass
class TwoFormatSample(Sample):
    """What both cookers return: the preencoded format has latents, the MLPerf one mean/logvar."""

    prompt_embeds: torch.Tensor
    pooled_prompt_embeds: torch.Tensor
    latents: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    logvar: torch.Tensor | None = None


@stateless
def cook_two_format_preencoded(sample: dict) -> TwoFormatSample:
    return TwoFormatSample(
        **basic_sample_keys(sample),
        latents=_tensor(sample["latents.pth"]),
        prompt_embeds=_tensor(sample["prompt_embeds.pth"]),
        pooled_prompt_embeds=_tensor(sample["pooled_prompt_embeds.pth"]),
    )


@stateless
def cook_two_format_numpy(sample: dict) -> TwoFormatSample:
    """The MLPerf layout's headerless bf16 bytes, in the shapes that format fixes."""
    fields = {field: _bf16(sample[member], _MLPERF_SHAPES[member]) for member, field in _MLPERF.items()}
    return TwoFormatSample(**basic_sample_keys(sample), **fields)


_TWO_FORMAT_COOKERS = [
    Cooker(cook_two_format_preencoded, has_subflavors={"encoding": "preencoded"}),
    Cooker(cook_two_format_numpy, has_subflavors={"encoding": "preencoded_numpy"}),
]
_OPTIONAL = ("latents", "mean", "logvar")


def _shared_fields(samples: list[TwoFormatSample]) -> dict[str, Any]:
    """The fields both formats have, stacked."""
    return {
        "__key__": [s.__key__ for s in samples],
        "prompt_embeds": torch.stack([s.prompt_embeds for s in samples]),
        "pooled_prompt_embeds": torch.stack([s.pooled_prompt_embeds for s in samples]),
    }


class FirstSampleDecidesTaskEncoder(DefaultTaskEncoder):
    """Both formats in one TaskEncoder; batch() decides from samples[0] which optional fields to stack
    (as Primus' EncodedDiffusionTaskEncoder does): a batch mixing the formats loses fields or crashes."""

    decoder = None
    cookers = _TWO_FORMAT_COOKERS

    def batch(self, samples: list[TwoFormatSample]) -> dict[str, Any]:
        out = _shared_fields(samples)
        for name in _OPTIONAL:
            if getattr(samples[0], name) is not None:
                out[name] = torch.stack([getattr(s, name) for s in samples])
        return out


class EverySampleTaskEncoder(FirstSampleDecidesTaskEncoder):
    """Both formats in one TaskEncoder; an optional field is stacked when every sample has it, else kept
    as a list with None for the samples of the other format: mixed batches keep everything."""

    def batch(self, samples: list[TwoFormatSample]) -> dict[str, Any]:
        out = _shared_fields(samples)
        for name in _OPTIONAL:
            values = [getattr(s, name) for s in samples]
            if all(v is not None for v in values):
                out[name] = torch.stack(values)
            elif any(v is not None for v in values):
                out[name] = values
        return out


class GroupsByFormatTaskEncoder(FirstSampleDecidesTaskEncoder):
    """The first-sample batch() made safe by grouping: batch_group_criterion keeps the formats apart."""

    def batch_group_criterion(self, sample: TwoFormatSample) -> tuple[Any, int | None]:
        return ("latents" if sample.latents is not None else "mean/logvar"), None


class FirstSampleListsTaskEncoder(FirstSampleDecidesTaskEncoder):
    """Keeps optional fields as lists, but only those samples[0] has: no crash, and a mixed batch that
    begins with the other format silently loses them."""

    def batch(self, samples: list[TwoFormatSample]) -> dict[str, Any]:
        out = _shared_fields(samples)
        for name in _OPTIONAL:
            if getattr(samples[0], name) is not None:
                out[name] = [getattr(s, name) for s in samples]
        return out


@stateless
def cook_dfm_passthrough(sample: dict) -> dict[str, Any]:
    """DFM's cooker: the members as they are; encode_sample reads them."""
    return {
        **basic_sample_keys(sample),
        "pth": sample["pth"],
        "pickle": sample["pickle"],
        "json": sample["json"],
    }


class ZeroPooledInEncodeTaskEncoder(DefaultTaskEncoder):
    """As DFM's FLUX encoder: encode_sample fills a zero CLIP embedding of the real size ([768]) when the
    pickle lacks one, so a faulty sample trains on zeros (and, on the suite's small data, cannot stack)."""

    decoder = None
    cookers = [Cooker(cook_dfm_passthrough)]

    @stateless
    def encode_sample(self, sample: dict) -> dict[str, Any]:
        embeddings = safe_loads(sample["pickle"])
        pooled = embeddings.get("pooled_prompt_embeds")
        return {
            **basic_sample_keys(sample),
            "latents": _tensor(sample["pth"]),
            "prompt_embeds": embeddings["prompt_embeds"],
            "pooled_prompt_embeds": pooled if pooled is not None else torch.zeros(768),
        }

    def batch(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "__key__": [s["__key__"] for s in samples],
            **{
                f: torch.stack([s[f] for s in samples])
                for f in ("latents", "prompt_embeds", "pooled_prompt_embeds")
            },
        }


class DfmStyleTaskEncoder(ZeroPooledInEncodeTaskEncoder):
    """DFM's structure done right: the cooker passes members on, encode_sample decodes them and refuses a
    sample without its CLIP embedding."""

    @stateless
    def encode_sample(self, sample: dict) -> dict[str, Any]:
        embeddings = safe_loads(sample["pickle"])
        for name in ("prompt_embeds", "pooled_prompt_embeds"):
            if not isinstance(embeddings.get(name), torch.Tensor):
                raise KeyError(f"sample {sample['__key__']!r}: the pickle member has no tensor {name!r}")
        return {
            **basic_sample_keys(sample),
            "latents": _tensor(sample["pth"]),
            "prompt_embeds": embeddings["prompt_embeds"],
            "pooled_prompt_embeds": embeddings["pooled_prompt_embeds"],
        }


@stateless
def cook_nemo_as_float32(sample: dict) -> dict[str, Any]:
    """NeMo's layout with the float16 T5 embedding widened to float32 (a silent cast)."""
    cooked = cook_nemo(sample)
    return {**cooked, "t5_text_embeddings": cooked["t5_text_embeddings"].float()}


@stateless
def cook_nemo_raw_hint_from_image(sample: dict) -> dict[str, Any]:
    """NeMo's raw layout, but the control image is taken from the image member: the png is lost."""
    cooked = cook_nemo_raw_images(sample)
    return {**cooked, "hint": cooked["images"]}


# -- from the field: a context cut by a negative pad, a pickled tensor zero-filled ------------------------------

#: the text context length of the targets below (DFM's FLUX format stores 16 rows of T5 embeddings)
CONTEXT_ROWS = 12


class DfmContextPaddedTaskEncoder(DefaultTaskEncoder):
    """Correct: DFM's layout, the T5 context padded to a fixed length with ``F.pad`` as Megatron-Bridge's WAN
    TaskEncoder pads it, with a mask of the rows that hold the text."""

    decoder = None
    cookers = [Cooker(cook_dfm_flux, has_subflavors={"encoding": "flux"})]
    context_rows = 20

    @stateless
    def encode_sample(self, sample: dict) -> dict:
        import torch.nn.functional as F

        context = sample["prompt_embeds"]
        rows = context.shape[0]
        padded = F.pad(context, (0, 0, 0, self.context_rows - rows))
        mask = torch.zeros(self.context_rows, dtype=torch.bool)
        mask[: min(rows, self.context_rows)] = True
        return {**sample, "prompt_embeds": padded, "prompt_embeds_mask": mask}


class DfmContextCutTaskEncoder(DfmContextPaddedTaskEncoder):
    """Broken: the same ``F.pad`` to a context length shorter than the stored embeddings: the negative amount
    cuts every sample's T5 rows past CONTEXT_ROWS (Megatron-Bridge's WAN with its text length set below the
    226 rows UMT5 writes)."""

    context_rows = CONTEXT_ROWS


@stateless
def cook_dfm_zero_pooled_always(sample: dict) -> dict[str, Any]:
    """Broken: DFM's layout, the pooled CLIP embedding read from the pickle and replaced by zeros of its shape
    (a placeholder left in after debugging): the embedding is lost for every sample."""
    cooked = cook_dfm_flux(sample)
    return {**cooked, "pooled_prompt_embeds": torch.zeros_like(cooked["pooled_prompt_embeds"])}
