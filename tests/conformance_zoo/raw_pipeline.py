"""A correct raw-image pipeline, small and plain, that the mutation analysis puts defects into
(``benchmarks/mutation/operators.py``: normalisation, layout, resize, colour, tokenisation, masks, state).

The cooker decodes the image and the caption; ``encode_sample`` resizes the image (shorter side to 16,
bicubic), centre-crops it to 16x16, scales it to [-1, 1] in CHW, and tokenises the caption with a byte-level
tokeniser (BOS, bytes, EOS, cut to 32 ids, padded with 0) and its attention mask; ``batch()`` stacks.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from megatron.energon import Cooker, DefaultTaskEncoder, basic_sample_keys, stateless
from PIL import Image

__all__ = ["RawPipelineTaskEncoder", "SIZE", "MAX_TOKENS"]

SIZE = 16
MAX_TOKENS = 32
PAD, BOS, EOS = 0, 1, 2


@stateless
def cook_raw_pipeline(sample: dict) -> dict:
    with Image.open(io.BytesIO(bytes(sample["png"]))) as image:
        image = image.convert("RGB")
    return {**basic_sample_keys(sample), "image": image, "caption": bytes(sample["txt"]).decode("utf-8")}


def resize_and_crop(image: Image.Image) -> np.ndarray:
    """Shorter side to SIZE (bicubic), then the centre SIZE x SIZE: HWC uint8."""
    w, h = image.size
    scale = SIZE / min(w, h)
    image = image.resize((max(SIZE, round(w * scale)), max(SIZE, round(h * scale))), Image.BICUBIC)
    w, h = image.size
    left, top = (w - SIZE) // 2, (h - SIZE) // 2
    return np.asarray(image.crop((left, top, left + SIZE, top + SIZE)))


def to_pixels(array: np.ndarray) -> torch.Tensor:
    """HWC uint8 -> CHW float in [-1, 1]."""
    pixels = torch.from_numpy(array.copy()).permute(2, 0, 1)
    pixels = pixels.float() / 255.0
    return pixels * 2.0 - 1.0


def tokenize(text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """BOS, the caption's UTF-8 bytes (+3), EOS; cut to MAX_TOKENS and padded with PAD; the mask marks tokens."""
    ids = [BOS] + [b + 3 for b in text.encode("utf-8")][: MAX_TOKENS - 2] + [EOS]
    length = len(ids)
    ids = ids + [PAD] * (MAX_TOKENS - length)
    mask = [1] * length + [0] * (MAX_TOKENS - length)
    return torch.tensor(ids), torch.tensor(mask)


class RawPipelineTaskEncoder(DefaultTaskEncoder):
    """Decode in the cooker; resize, crop, normalise and tokenise in encode_sample; stack in batch()."""

    decoder = None
    cookers = [Cooker(cook_raw_pipeline, has_subflavors={"encoding": "raw"})]

    @stateless
    def encode_sample(self, sample: dict) -> dict:
        pixels = to_pixels(resize_and_crop(sample["image"]))
        input_ids, attention_mask = tokenize(sample["caption"])
        return {
            **basic_sample_keys(sample),
            "pixel_values": pixels,
            "input_ids": input_ids,
            "attention_mask": attention_mask,
        }

    def batch(self, samples: list[dict]) -> dict:
        return {
            "__key__": [s["__key__"] for s in samples],
            "__restore_key__": (),
            "pixel_values": torch.stack([s["pixel_values"] for s in samples]),
            "input_ids": torch.stack([s["input_ids"] for s in samples]),
            "attention_mask": torch.stack([s["attention_mask"] for s in samples]),
        }
