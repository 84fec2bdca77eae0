"""Raw cookers for the flow oracle's own tests: one member used, ignored, or replaced by a constant under its
own name; and a cooker whose output depends on the global random generator (unstable, never "lost")."""

from __future__ import annotations

import io
import random

import numpy as np
import torch
from megatron.energon import basic_sample_keys, stateless
from PIL import Image


def _image(sample: dict) -> torch.Tensor:
    with Image.open(io.BytesIO(bytes(sample["png"]))) as image:
        pixels = np.asarray(image.convert("RGB").resize((16, 12), Image.BILINEAR))
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1).float() / 127.5 - 1


@stateless
def cook_uses_both(sample: dict) -> dict:
    """Correct: a resized, normalised image and the caption's bytes as ids."""
    ids = torch.tensor(list(bytes(sample["txt"]))[:64] or [0])
    return {**basic_sample_keys(sample), "pixel_values": _image(sample), "input_ids": ids}


@stateless
def cook_ignores_caption(sample: dict) -> dict:
    """Broken: the caption is read but no output depends on it (a fixed prompt)."""
    bytes(sample["txt"]).decode("utf-8")
    return {**basic_sample_keys(sample), "pixel_values": _image(sample), "input_ids": torch.tensor([1, 2])}


@stateless
def cook_constant_image_under_its_name(sample: dict) -> dict:
    """Broken: a field named ``png`` holds a constant image (a placeholder), the caption is kept."""
    return {**basic_sample_keys(sample), "png": torch.zeros(3, 12, 16), "txt": bytes(sample["txt"]).decode()}


@stateless
def cook_noisy_image(sample: dict) -> dict:
    """Broken for determinism (noise from the unseeded global generator), but the image does reach its field:
    fidelity must not call it lost."""
    noise = random.random() * 1e-3
    return {
        **basic_sample_keys(sample),
        "pixel_values": _image(sample) + noise,
        "txt": bytes(sample["txt"]).decode(),
    }
