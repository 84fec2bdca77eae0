"""What a declaration (:mod:`~primus_energon.conformance.core.declarations`) means for values: whether an
observed value is the clean one kept or transformed as declared, the values a declaration may turn a clean
one into, whether it applies to every sample, and the declaration that would explain an observed change."""

from __future__ import annotations

from typing import Any

import torch

from ..core.declarations import DROPOUT_WORDS, FLOAT_DTYPES, FORM_KINDS, Transform
from .compare import as_tensor, same

__all__ = ["always", "is_applied_value", "outcome", "recognise", "variants"]


def outcome(transform: Transform, clean: Any, observed: Any) -> str | None:
    """``"kept"`` when ``observed`` is ``clean``, ``"applied"`` when it is ``clean`` transformed as
    declared, else None (a change the declaration does not explain)."""
    if same(clean, observed):
        return "kept"
    return "applied" if _applied(transform, clean, observed) else None


def _applied(transform: Transform, clean: Any, observed: Any) -> bool:
    if transform.kind in FORM_KINDS:
        return False  # judged by its form (the data judge), not computed here
    if transform.kind == "dropout":
        return _dropped(transform.to, clean, observed)
    if transform.kind == "cast":
        tensor = as_tensor(clean)
        return (
            tensor is not None
            and tensor.is_floating_point()
            and same(tensor.to(_dtype(transform.dtype)), observed)
        )
    if transform.kind == "flip":
        tensor = as_tensor(clean)
        return (
            tensor is not None
            and tensor.dim() > 0
            and -tensor.dim() <= transform.axis < tensor.dim()
            and same(tensor.flip(transform.axis), observed)
        )
    if transform.kind == "truncate":
        if isinstance(clean, str):
            return len(clean) > transform.length and observed == clean[: transform.length]
        tensor = as_tensor(clean)
        return (
            tensor is not None
            and -tensor.dim() <= transform.axis < tensor.dim()
            and tensor.shape[transform.axis] > transform.length
            and same(tensor.narrow(transform.axis, 0, transform.length), observed)
        )
    return False


def variants(transform: Transform, clean: Any) -> list[Any]:
    """The values the declared transform may turn ``clean`` into (empty where it cannot apply)."""
    tensor = as_tensor(clean)
    if transform.kind == "dropout":
        if isinstance(transform.to, str) and transform.to not in DROPOUT_WORDS:
            return [transform.to] if isinstance(clean, str) else []
        if tensor is None:
            return []
        if transform.to == "zeros":
            return [tensor.new_zeros(tensor.shape)]
        if isinstance(transform.to, (int, float)):
            return [tensor.new_full(tensor.shape, transform.to)]
        return []
    if transform.kind == "truncate" and isinstance(clean, str):
        return [clean[: transform.length]] if len(clean) > transform.length else []
    if tensor is None or not _fits(transform, tensor):
        return []
    if transform.kind == "flip":
        return [tensor.flip(transform.axis)]
    if transform.kind == "truncate":
        return (
            [tensor.narrow(transform.axis, 0, transform.length)]
            if tensor.shape[transform.axis] > transform.length
            else []
        )
    if transform.kind == "cast":
        return [tensor.to(_dtype(transform.dtype))] if tensor.is_floating_point() else []
    return []


def _fits(transform: Transform, tensor: torch.Tensor) -> bool:
    return transform.kind == "cast" or (tensor.dim() > 0 and -tensor.dim() <= transform.axis < tensor.dim())


def is_applied_value(transform: Transform, value: Any) -> bool:
    """Whether ``value`` can only be a dropped one (the dropout's ``to`` value): not a clean value."""
    return transform.kind == "dropout" and _dropped(transform.to, value, value) and transform.to != "constant"


def always(transform: Transform, clean: Any) -> bool:
    """Whether the declaration applies to every sample whose value is ``clean`` (truncate: one longer
    than the length; cast: a floating-point tensor of another dtype; a normalisation, resize, crop or
    tokenisation: every sample)."""
    if transform.kind in FORM_KINDS:
        return True
    if transform.kind == "truncate":
        size = len(clean) if isinstance(clean, str) else _size(as_tensor(clean), transform.axis)
        return size is not None and size > transform.length
    if transform.kind == "cast":
        tensor = as_tensor(clean)
        return tensor is not None and tensor.is_floating_point() and tensor.dtype != _dtype(transform.dtype)
    return False


def _size(tensor: torch.Tensor | None, axis: int) -> int | None:
    if tensor is None or not -tensor.dim() <= axis < max(tensor.dim(), 1) or tensor.dim() == 0:
        return None
    return int(tensor.shape[axis])


def _dropped(to: Any, clean: Any, observed: Any) -> bool:
    if to == "constant":  # any one value (the same for every dropped sample: the transforms property checks)
        return observed is not None or clean is not None
    if to == "zeros":
        tensor, want = as_tensor(observed), as_tensor(clean)
        return (
            tensor is not None and want is not None and tensor.shape == want.shape and not bool(tensor.any())
        )
    if to is None:
        return observed is None or (isinstance(observed, (list, tuple)) and not observed)
    if isinstance(to, str):
        return isinstance(observed, str) and observed == to
    if isinstance(to, (int, float)):
        tensor = as_tensor(observed)
        if tensor is None:
            return isinstance(observed, (int, float)) and observed == to
        return tensor.numel() > 0 and bool((tensor == to).all())
    return False


def _dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, name)


def recognise(clean: Any, observed: Any) -> str | None:
    """The declaration (``KIND NAME=VALUE ...``, without the field) that would explain ``observed`` as a
    deliberate transform of ``clean``, or None: a cast, a flip, a truncation, a dropout to "" or zeros."""
    if same(clean, observed):
        return None
    tensor, seen = as_tensor(clean), as_tensor(observed)
    if isinstance(clean, str) and isinstance(observed, str):
        if observed == "":
            return 'dropout rate=RATE to=""'
        if (
            clean.startswith(observed) and clean[len(observed) :].strip()
        ):  # white space stripped is no truncation
            return f"truncate length={len(observed)}"
        return None
    if tensor is None or seen is None:
        return "dropout rate=RATE to=None" if observed is None and clean is not None else None
    seen_name = str(seen.dtype).removeprefix("torch.")
    if tensor.is_floating_point() and seen.dtype != tensor.dtype and seen_name in FLOAT_DTYPES:
        if same(tensor.to(seen.dtype), seen):
            # a lossless cast (bfloat16 -> float32) changes no value: no transform to declare
            lossy = not same(seen.to(tensor.dtype), tensor)
            return f"cast dtype={seen_name}" if lossy else None
    if seen.shape == tensor.shape and seen.dtype == tensor.dtype:
        for axis in range(-1, -tensor.dim() - 1, -1):
            if tensor.shape[axis] > 1 and same(tensor.flip(axis), seen):
                return f"flip axis={axis} rate=RATE"
        if tensor.numel() and bool(tensor.any()) and not bool(seen.any()):
            return "dropout rate=RATE to=zeros"
    if seen.dim() == tensor.dim() and seen.dtype == tensor.dtype:
        shorter = [a for a in range(tensor.dim()) if seen.shape[a] < tensor.shape[a]]
        others = all(seen.shape[a] == tensor.shape[a] for a in range(tensor.dim()) if a not in shorter)
        if len(shorter) == 1 and others and same(tensor.narrow(shorter[0], 0, seen.shape[shorter[0]]), seen):
            return f"truncate axis={shorter[0]} length={seen.shape[shorter[0]]}"
    return None
