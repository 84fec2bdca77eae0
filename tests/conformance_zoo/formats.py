"""Cookers for the formats real projects' prepare scripts write (synthetic/examples/*.yaml), written as
those projects would: correct ones that must pass, and broken ones that must fail the right claim."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from megatron.energon import basic_sample_keys, stateless

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
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    words = np.frombuffer(bytes(data), dtype=dtype)
    if words.size != int(np.prod(shape)):
        raise ValueError(f"expected {int(np.prod(shape))} values, got {words.size}")
    return (
        torch.from_numpy(words.copy())
        .view(torch.bfloat16 if dtype is np.uint16 else torch.float16)
        .reshape(shape)
    )


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
