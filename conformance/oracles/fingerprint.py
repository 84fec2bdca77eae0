"""Canonical, comparable descriptions of cooked samples and batches, every field included.

``fingerprint(x)`` turns tensors, arrays, images, strings, numbers, containers and dataclasses (Energon
``Sample``/``Batch``) into nested tuples of plain values, with tensor and image bytes replaced by their
dtype, shape and SHA-256, so two runs compare with ``==`` and a difference can be located with
:func:`first_difference`.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..core.rendering import safe_repr

__all__ = ["array_tensor", "fingerprint", "first_difference", "digest", "tensor_bytes"]


def array_tensor(array: np.ndarray) -> torch.Tensor:
    """A numeric array as a tensor sharing its memory, for reading only: an array over read-only bytes (a
    shard member) needs no copy, so torch's warning about non-writable arrays is not shown to the user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.ascontiguousarray(array))


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """A tensor's values as bytes in row-major order (bool as one byte per value): the one way the suite
    reads a tensor's bits. Copied into a fresh dense tensor first where needed: ``contiguous()`` keeps the
    stride of a one-element view (``x[:, 0]`` of a ``[1, 2]`` tensor), which ``view(torch.uint8)`` refuses."""
    flat = tensor.detach().cpu().reshape(-1)
    if not flat.numel():
        return b""
    if flat.stride() != (1,):
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    return flat.view(torch.uint8).numpy().tobytes()


def _tensor(value: torch.Tensor) -> tuple:
    data = tensor_bytes(value)
    return ("tensor", str(value.dtype), tuple(value.shape), hashlib.sha256(data).hexdigest()[:24])


#: nesting deeper than this is described by its type alone (a target's value may nest without end)
MAX_DEPTH = 64


def fingerprint(value: Any, _active: frozenset[int] = frozenset(), _depth: int = 0) -> Any:
    """A hashable, comparable description of ``value`` (see the module docstring). A container that holds
    itself, or nesting past :data:`MAX_DEPTH`, is described by its type; no ``repr`` or ``str`` of a
    target's object can make it raise."""
    if isinstance(value, torch.Tensor):
        return _tensor(value)
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return ("ndarray", str(array.dtype), array.shape, hashlib.sha256(array.tobytes()).hexdigest()[:24])
    if type(value).__module__.startswith("PIL.") and hasattr(value, "tobytes"):
        return ("image", value.mode, value.size, hashlib.sha256(value.tobytes()).hexdigest()[:24])
    if isinstance(value, (str, int, float, bool, bytes, type(None))):
        return value
    if id(value) in _active:
        return ("cycle", type(value).__qualname__)
    if _depth >= MAX_DEPTH:
        return ("too deep", type(value).__qualname__)
    active, depth = _active | {id(value)}, _depth + 1
    if isinstance(value, Mapping):
        return (
            "dict",
            tuple(
                (k if isinstance(k, str) else safe_repr(k, 80), fingerprint(v, active, depth))
                for k, v in value.items()
            ),
        )
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            tuple(
                (f.name, fingerprint(getattr(value, f.name), active, depth))
                for f in dataclasses.fields(value)
            ),
        )
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(fingerprint(v, active, depth) for v in value))
    return ("object", type(value).__qualname__, safe_repr(value, 200))


def digest(value: Any) -> str:
    """SHA-256 of the fingerprint's repr: one string per batch, for cross-process comparison."""
    return hashlib.sha256(repr(fingerprint(value)).encode()).hexdigest()


def first_difference(expected: Any, observed: Any, path: str = "") -> str | None:
    """Where two fingerprints first differ, as ``"path: expected X, observed Y"``, or None if equal."""
    if expected == observed:
        return None
    if isinstance(expected, tuple) and isinstance(observed, tuple) and len(expected) == len(observed):
        # Named pairs (dict items, dataclass fields) read better by name than by index.
        for index, (e, o) in enumerate(zip(expected, observed, strict=True)):
            if isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], str) and isinstance(o, tuple):
                name = e[0] if len(o) == 2 and o[0] == e[0] else f"[{index}]"
                inner = first_difference(e[1], o[1], f"{path}.{name}") if len(o) == 2 else None
                if inner:
                    return inner
            else:
                inner = first_difference(e, o, f"{path}[{index}]")
                if inner:
                    return inner
    return f"{path or 'value'}: expected {_short(expected)}, observed {_short(observed)}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


def parse_fingerprint(text: str | None) -> Any:
    """A fingerprint back from its ``repr`` (as the determinism and restart children write it), or None."""
    if text is None:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
