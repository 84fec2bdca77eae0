"""The form of one member (or leaf of a structured member) in one output field, by the member's kind:
images (:mod:`.images`), tensors (:mod:`.tensors`), text (here: kept, inside a longer text, tokenised,
or changed), anything else by equality. A field's declared transform is honoured the same way for every
kind: a value it allows is ``declared``."""

from __future__ import annotations

from typing import Any

import numpy as np

from primus_energon.synthetic.schema import BytesSpec, ImageSpec, ListSpec, NpySpec, TensorSpec, TextSpec

from .compare import as_tensor, same
from .declared import outcome as declared_value
from .declared import recognise
from .forms import Form
from .images import image_form
from .tensors import tensor_form
from .tokens import is_token_ids

__all__ = ["member_form", "text_form", "declared_outcome"]


def text_form(text: str, observed: Any) -> Form | None:
    """How ``observed`` holds the caption ``text``: as it is, inside a longer text (a prompt template), as
    token ids (judged across samples by the caller), or changed (stripped, cut, replaced)."""
    if isinstance(observed, (bytes, bytearray, memoryview)):
        try:
            observed = bytes(observed).decode("utf-8")
        except UnicodeDecodeError:
            return None
    if isinstance(observed, str):
        if same(text, observed):
            return Form("kept", "as it is")
        if text and str.__contains__(observed, text):
            return Form("kept", "inside a longer text")
        recognised = recognise(text, observed)
        if recognised:
            return Form(
                "undeclared", f"changed to {observed[:40]!r}", declaration=recognised, cause="text changed"
            )
        return Form("corrupted", "text changed", cause="text changed")
    if is_token_ids(observed):
        n = as_tensor(observed).numel() if as_tensor(observed) is not None else len(observed)
        return Form("kept", f"tokenised ({n} ids)", cause="tokenised")
    return None


def declared_outcome(transform: Any, spec: Any, clean: Any, observed: Any) -> str | None:
    """What a declared transform made of one sample's value: ``"kept"`` (the value as it is, or through a
    recognised transform), ``"applied"`` (transformed as declared), or None (neither): the one reading of
    a declaration every claim shares. Exact where the transform can be computed from the value (a dropout,
    a flip of a tensor, a cut, a cast), else by the value's form (a flip after a resize, a normalisation)."""
    try:
        exact = declared_value(transform, clean, observed)
    except Exception:  # a declaration that does not apply to this kind of value
        exact = None
    if exact is not None:
        return exact
    form = member_form(spec, clean, observed, transform)
    if form is None:
        return None
    if form.verdict == "declared":
        return "applied"
    if form.verdict == "kept":
        if transform.kind in ("normalize", "resize", "crop", "tokenize"):
            return "applied" if form.how != "as it is" else "kept"
        return "kept"
    return None


def member_form(spec: Any, value: Any, observed: Any, declared: Any = None) -> Form | None:
    """How ``observed`` holds ``value`` (a member's or leaf's value as the suite reads it; ``spec`` its
    kind), or None where the suite sees no relation between them."""
    if declared is not None and declared.kind in ("dropout", "flip", "truncate", "cast"):
        try:
            outcome = declared_value(declared, value, observed)
        except Exception:  # a declaration that does not apply to this kind of value
            outcome = None
        if outcome == "applied":
            return Form("declared", f"{declared.kind} as declared")
    if isinstance(spec, ImageSpec) and isinstance(value, np.ndarray):
        return image_form(value, observed, declared=declared)
    if isinstance(spec, TextSpec) or (isinstance(spec, ListSpec) and isinstance(value, str)):
        if not isinstance(value, str):
            return None
        form = text_form(value, observed)
        if (
            form is not None
            and form.cause == "tokenised"
            and declared is not None
            and declared.kind == "tokenize"
        ):
            return Form("declared", form.how, cause="tokenised")
        return form
    if isinstance(spec, (TensorSpec, NpySpec)) or (isinstance(spec, BytesSpec) and spec.dtype is not None):
        return tensor_form(value, observed, declared=declared)
    if as_tensor(value) is not None:
        return tensor_form(value, observed, declared=declared)
    if isinstance(value, str):
        return text_form(value, observed)
    return Form("kept", "as it is") if same(value, observed) else None
