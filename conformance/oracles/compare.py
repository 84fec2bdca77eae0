"""The one comparison of values the suite judges by: plain CPU tensors compared dtype, shape and bits."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .fingerprint import array_tensor, tensor_bytes

__all__ = ["as_tensor", "same", "identical"]


def as_tensor(value: Any) -> torch.Tensor | None:
    """A plain CPU tensor for a tensor (a subclass is read as its base class) or a numeric numpy array
    (complex included), else None."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        return tensor.as_subclass(torch.Tensor) if type(tensor) is not torch.Tensor else tensor
    if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
        return array_tensor(value)
    return None


def identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bits (a NaN equals the same NaN; ``torch.equal`` says it does not)."""
    return a.dtype == b.dtype and a.shape == b.shape and tensor_bytes(a) == tensor_bytes(b)


def same(a: Any, b: Any) -> bool:
    """The same value: tensors (and numeric arrays) of the same dtype, shape and bits (NaN-safe), else the
    same plain value (exact types for text; numbers by value)."""
    ta, tb = as_tensor(a), as_tensor(b)
    if ta is not None or tb is not None:
        return ta is not None and tb is not None and identical(ta, tb)
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and str.__eq__(a, b)
    try:
        return bool(a == b)
    except Exception:  # an object whose comparison raises or is ambiguous
        return False
