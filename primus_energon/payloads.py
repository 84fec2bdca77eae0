"""Safe decoding of one member's payload: tensors, captions and images.

Shards are untrusted input. Tensor files are read by :func:`~primus_energon.tensorfile.read_tensor`,
which parses ``torch.save``'s format itself and accepts nothing but one plain tensor; the rare legitimate
layouts it does not parse go to ``torch.load(..., weights_only=True)``, which refuses pickled objects
other than tensors. Neither can be switched off by an environment variable (torch only lets
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` override call sites that leave ``weights_only`` unset). Everything that fails raises a :class:`~primus_energon.errors.SampleError`
subclass that names the sample, its shard and the member.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from .errors import CaptionDecodeError, PayloadDecodeError
from .tensorfile import TensorFileError, read_tensor

__all__ = ["load_tensor", "decode_text", "load_image", "TensorSource"]

#: What a tensor member may arrive as: the raw member bytes (no decoder), a tensor that a decoder
#: already produced, or the path of a file written by ``torch.save``.
TensorSource = bytes | bytearray | memoryview | torch.Tensor | str | os.PathLike

_SAVE_HINT = (
    "Write tensor members with torch.save(tensor) of one plain tensor; other pickled objects are refused "
    "because unpickling them can run arbitrary code"
)
_DISALLOWED_GLOBAL = re.compile(r"GLOBAL (\S+) was not an allowed global")
_BLOCKED_MODULE = re.compile(r"whose module (\S+) is blocked")


def _why_refused(error: BaseException) -> str:
    """One line on why a payload was refused, without torch's advice to load it unsafely."""
    text = str(error)
    if "references" in text and "not a tensor" in text:
        return f"{text.splitlines()[0]} (refused: loading it would run code)"
    found = _DISALLOWED_GLOBAL.search(text) or _BLOCKED_MODULE.search(text)
    if found:
        return f"it pickles {found.group(1)}, which is not a tensor (refused: loading it would run code)"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first.startswith("Weights only load failed"):
        return "it pickles objects other than tensors (refused: loading it could run code)"
    return f"{type(error).__name__}: {first[:200]}"


def _read_path(value: str | os.PathLike, sample: Any, member: str) -> bytes:
    path = Path(value)
    try:
        return path.read_bytes()
    except OSError as error:
        raise PayloadDecodeError(
            f"member {member!r} names the file {str(path)!r}, which cannot be read ({error.strerror or error})",
            sample,
            member=member,
        ) from error


def load_tensor(value: Any, sample: Any, member: str, *, copy: bool = True) -> torch.Tensor:
    """Return the tensor held by ``value`` (see :data:`TensorSource`), never unpickling other objects.

    ``copy=True`` returns a tensor that owns its memory. ``copy=False`` returns, for member bytes, a
    read-only view of them (no copy; see :func:`~primus_energon.tensorfile.read_tensor`): for callers
    that copy the tensor next anyway, such as a ``batch()`` that stacks it.

    Raises :class:`PayloadDecodeError` when the value is of another type, when the bytes are not a
    ``torch.save`` file, or when the file holds anything but one tensor.
    """
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (str, os.PathLike)):
        value = _read_path(value, sample, member)
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise PayloadDecodeError(
            f"member {member!r} is a {type(value).__name__}; expected tensor-file bytes, a torch.Tensor or a file path",
            sample,
            member=member,
            hint=_SAVE_HINT,
        )
    try:
        # The fast reader accepts only one plain tensor and never unpickles; the few legitimate layouts it
        # does not parse itself (legacy format, Parameter, ...) go to torch.load(weights_only=True).
        return read_tensor(value, copy=copy, fallback=True)
    except TensorFileError as error:
        raise PayloadDecodeError(
            f"member {member!r} ({len(value)} bytes) is not a readable tensor file: {_why_refused(error)}",
            sample,
            member=member,
            hint=_SAVE_HINT,
        ) from None  # torch's own messages advise turning weights_only off; the reason is summarised above


def decode_text(value: Any, sample: Any, member: str) -> str:
    """Return ``value`` as text: a ``str`` as it is, bytes decoded as strict UTF-8."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise CaptionDecodeError(
                f"member {member!r} is not valid UTF-8 (byte {error.start} of {len(data)}: "
                f"{data[error.start : error.start + 4]!r})",
                sample,
                member=member,
                hint="Re-encode the caption as UTF-8 text",
            ) from error
    raise PayloadDecodeError(
        f"member {member!r} is a {type(value).__name__}; expected text (str or UTF-8 bytes)",
        sample,
        member=member,
    )


def load_image(value: Any, sample: Any, member: str) -> Any:
    """Return the image in ``value`` as an RGB :class:`PIL.Image.Image`.

    Encoded bytes (JPEG, PNG, WebP, ...) and file paths are decoded with Pillow and converted to RGB;
    a PIL image is converted to RGB; an array or tensor that a decoder already produced is returned
    unchanged (the decoder chose that representation).
    """
    if isinstance(value, Image.Image):
        return value if value.mode == "RGB" else value.convert("RGB")
    if isinstance(value, torch.Tensor) or type(value).__module__ == "numpy":
        return value
    if isinstance(value, (str, os.PathLike)):
        value = _read_path(value, sample, member)
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise PayloadDecodeError(
            f"member {member!r} is a {type(value).__name__}; expected encoded image bytes or a PIL image",
            sample,
            member=member,
        )
    data = bytes(value)
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise PayloadDecodeError(
            f"member {member!r} ({len(data)} bytes) is not a decodable image: {type(error).__name__}: {error}",
            sample,
            member=member,
            hint="Write images as JPEG, PNG or WebP",
        ) from error
