"""Variants of one member of a user's sample, each inside the member's own format, for the flow oracle.

A variant replaces one member's bytes and keeps everything else: **swap** takes the same member of another
sample (real data of the user's format); **edit** changes the member's own values a little, in its own
container (an image's colours inverted and saved in its format again; a caption's first letter changed; a
tensor's values shifted by one in its dtype; every leaf of a pickled or JSON structure changed alike);
**tail** appends words to a caption (a tokeniser that cuts captions at its maximum length does not see
them). An output field that changes under a variant depends on that member.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from primus_energon.synthetic.schema import (
    BytesSpec,
    ImageSpec,
    JsonSpec,
    NpySpec,
    PickleSpec,
    TensorSpec,
    TextSpec,
)

__all__ = ["member_variants", "TAIL_WORDS"]

#: appended to a caption by the ``tail`` variant
TAIL_WORDS = " and, far behind it, a zebra reading a newspaper"

#: Pillow's format name and save options per image format of an edited image (lossless where it can be)
_IMAGE_SAVE = {"JPEG": {"quality": 95}, "PNG": {}, "WEBP": {"lossless": True}, "GIF": {}}


def member_variants(
    member: str, spec: Any, data: bytes, others: Sequence[bytes]
) -> Iterator[tuple[str, bytes]]:
    """``(label, bytes)`` for each variant of ``member`` (``data``): a swap with the first of ``others``
    (the same member of other samples) whose bytes differ, the member's own edit, and for a caption the
    tail; a variant the suite cannot make (an unreadable member) is left out."""
    for other in others:
        if isinstance(other, (bytes, bytearray)) and bytes(other) != bytes(data):
            yield "swap", bytes(other)
            break
    try:
        edited = _edited(spec, bytes(data))
    except Exception:  # a member the suite cannot read: no edit of it
        edited = None
    if edited is not None and edited != bytes(data):
        yield "edit", edited
    if isinstance(spec, TextSpec):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            return
        yield "tail", (text + TAIL_WORDS).encode("utf-8")


def _edited(spec: Any, data: bytes) -> bytes | None:
    if isinstance(spec, ImageSpec):
        return _edited_image(data)
    if isinstance(spec, TextSpec):
        return _edited_text(data.decode("utf-8")).encode("utf-8")
    if isinstance(spec, TensorSpec):
        from primus_energon.tensorfile import read_tensor

        return _saved(_shifted(read_tensor(data, copy=True, fallback=True)))
    if isinstance(spec, NpySpec):
        array = np.load(io.BytesIO(data), allow_pickle=False)
        buffer = io.BytesIO()
        np.save(buffer, _shifted_array(array), allow_pickle=False)
        return buffer.getvalue()
    if isinstance(spec, PickleSpec):
        from primus_energon.safepickle import safe_loads
        from primus_energon.synthetic.payloads import pickle_bytes

        protocol = data[1] if len(data) > 1 and data[0] == 0x80 and 2 <= data[1] <= 5 else 4
        return pickle_bytes(_edited_structure(safe_loads(data)), protocol)
    if isinstance(spec, JsonSpec):
        return json.dumps(_edited_structure(json.loads(data)), ensure_ascii=False).encode("utf-8")
    if isinstance(spec, BytesSpec):
        return bytes(b ^ 0x01 for b in data) if data else None
    return None


def _edited_image(data: bytes) -> bytes:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        fmt = image.format or "PNG"
        mode = image.mode
        pixels = np.asarray(image.convert("RGB"))
    inverted = Image.fromarray(255 - pixels, "RGB")
    if mode in ("L", "LA"):
        inverted = inverted.convert("L")
    buffer = io.BytesIO()
    inverted.save(buffer, format=fmt, **_IMAGE_SAVE.get(fmt, {}))
    return buffer.getvalue()


def _edited_text(text: str) -> str:
    """The caption with its first letter or digit changed (a tokeniser that cuts long captions still sees
    it), or ``"x"`` for an empty caption."""
    for index, char in enumerate(text):
        if char.isalnum():
            swapped = "b" if char.lower() == "a" else "a"
            if char.isupper():
                swapped = swapped.upper()
            return text[:index] + swapped + text[index + 1 :]
    return text + "x" if text else "x"


def _shifted(tensor: Any) -> Any:
    import torch

    if tensor.dtype == torch.bool:
        return ~tensor
    if tensor.is_floating_point() or tensor.is_complex():
        return (tensor.double() + 1).to(tensor.dtype) if tensor.dtype != torch.float64 else tensor + 1
    return tensor + 1


def _shifted_array(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.bool_:
        return ~array
    if array.dtype.kind in "iufc":
        return (array + 1).astype(array.dtype)
    return array


def _saved(tensor: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(tensor.contiguous().clone(), buffer)
    return buffer.getvalue()


def _edited_structure(value: Any, depth: int = 0) -> Any:
    """``value`` with every tensor, array, number and text leaf changed (dicts, lists and tuples walked)."""
    import torch

    if depth > 16:
        return value
    if isinstance(value, torch.Tensor):
        return _shifted(value)
    if isinstance(value, np.ndarray):
        return _shifted_array(value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return _edited_text(value)
    if isinstance(value, Mapping):
        return {k: _edited_structure(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_edited_structure(v, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value
