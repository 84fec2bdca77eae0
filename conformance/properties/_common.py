"""Helpers shared by the property checks: reading output fields, expected member values, timeouts."""

from __future__ import annotations

import dataclasses
import io
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from PIL import Image

from synthetic import ImageSpec, JsonSpec, TensorSpec, TextSpec
from synthetic.schema import MemberSpec

from ..data import field_candidates
from ..execution import target_call
from ..results import PropertyFailure

__all__ = [
    "MISSING",
    "field_names",
    "get_field",
    "find_field",
    "expected_value",
    "compare",
    "call_with_timeout",
    "TimedOut",
    "error_names_sample",
    "decode_like_target",
    "same_tensor",
]

MISSING = object()
BASIC_KEYS = ("__key__", "__restore_key__", "__subflavors__", "__sources__")


def field_names(output: Any) -> list[str]:
    if isinstance(output, Mapping):
        return [str(k) for k in output]
    if dataclasses.is_dataclass(output):
        return [f.name for f in dataclasses.fields(output)]
    return [n for n in dir(output) if not n.startswith("_")]


def get_field(output: Any, name: str) -> Any:
    if isinstance(output, Mapping):
        return output.get(name, MISSING)
    return getattr(output, name, MISSING)


def find_field(output: Any, member: str, spec: MemberSpec) -> tuple[str | None, Any]:
    """The output field that corresponds to ``member`` and its value, or ``(None, MISSING)``."""
    for name in field_candidates(member, spec):
        value = get_field(output, name)
        if value is not MISSING:
            return name, value
    return None, MISSING


def expected_value(spec: MemberSpec, value: Any) -> Any:
    """What a faithful cooker outputs for a member holding ``value`` (bytes, or a safely decoded value)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        if isinstance(spec, TensorSpec):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if isinstance(spec, TextSpec):
            return data.decode("utf-8")
        if isinstance(spec, ImageSpec):
            with Image.open(io.BytesIO(data)) as image:
                return np.asarray(image.convert("RGB"))
        if isinstance(spec, JsonSpec):
            return json.loads(data)
        return data
    if isinstance(spec, ImageSpec) and isinstance(value, Image.Image):
        return np.asarray(value.convert("RGB"))
    return value


def _image_array(value: Any) -> np.ndarray | None:
    if isinstance(value, Image.Image):
        return np.asarray(value)
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.ndim == 3 and tensor.shape[0] in (1, 3, 4) and tensor.shape[-1] not in (1, 3, 4):
            tensor = tensor.permute(1, 2, 0)
        if tensor.is_floating_point():
            tensor = (tensor * 255).round().clamp(0, 255).to(torch.uint8)
        return tensor.numpy()
    return None


def compare(spec: MemberSpec, expected: Any, observed: Any) -> str | None:
    """None when ``observed`` equals ``expected`` exactly, else what differs."""
    if isinstance(spec, TensorSpec) or isinstance(expected, torch.Tensor):
        if not isinstance(observed, torch.Tensor):
            return f"expected a tensor, observed a {type(observed).__name__}"
        if observed.dtype != expected.dtype:
            return f"dtype {str(observed.dtype).removeprefix('torch.')}, expected {str(expected.dtype).removeprefix('torch.')}"
        if tuple(observed.shape) != tuple(expected.shape):
            return f"shape {list(observed.shape)}, expected {list(expected.shape)}"
        if not same_tensor(observed, expected):
            diff = (observed.cpu().double() - expected.double()).abs()
            return f"values differ (max abs difference {diff.max().item():.3g} at {int(diff.argmax())} of {diff.numel()})"
        return None
    if isinstance(spec, ImageSpec):
        array = _image_array(observed)
        if array is None:
            return f"expected an image (PIL, array or tensor), observed a {type(observed).__name__}"
        if array.shape != expected.shape:
            return f"image shape {list(array.shape)}, expected {list(expected.shape)} (HWC RGB)"
        if not np.array_equal(array, expected):
            return f"pixels differ ({int((array != expected).sum())} of {array.size} values)"
        return None
    if isinstance(spec, TextSpec):
        if not isinstance(observed, str):
            return f"expected str, observed a {type(observed).__name__}"
        if observed != expected:
            at = next(
                (i for i, (a, b) in enumerate(zip(observed, expected, strict=False)) if a != b),
                min(len(observed), len(expected)),
            )
            return (
                f"text differs at character {at}: observed {observed[max(0, at - 10) : at + 20]!r}, "
                f"expected {expected[max(0, at - 10) : at + 20]!r} (lengths {len(observed)} and {len(expected)})"
            )
        return None
    if observed != expected:
        return f"observed {observed!r:.120}, expected {expected!r:.120}"
    return None


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of dtype, shape and every element (NaN equals the same NaN; -0.0 is not 0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.detach().cpu().contiguous().reshape(-1), b.detach().cpu().contiguous().reshape(-1)
    if a.dtype.is_complex or a.element_size() not in (1, 2, 4, 8):
        return torch.equal(a, b)
    unsigned = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(unsigned), b.view(unsigned))


def decode_like_target(ctx: Any, sample: dict) -> dict:
    """``sample`` (member bytes) as the target's cookers receive it: through the target's own decoder,
    if it has one. A decoder error on benign data is the target's (:class:`~conformance.execution.TargetError`)."""
    decoder = ctx.cached("decoder", ctx.target.decoder)
    if decoder is None:
        return dict(sample)
    with target_call(f"the target's decoder on sample {sample.get('__key__')!r}"):
        return decoder(dict(sample))


class TimedOut(Exception):
    pass


def call_with_timeout(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()`` in a daemon thread; raises :class:`TimedOut` when it has not returned after ``seconds``.

    A hung call cannot be killed from Python: the check reports it and goes on. Energon keeps the active
    worker config of a single-process loader in class attributes, which the hung call still holds; they are
    released here so that the suite's next loader can start (the hung call keeps running in its thread)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as error:  # handed back to the caller below
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        from megatron.energon import WorkerConfig

        WorkerConfig.active_worker_config = None
        WorkerConfig._sample_index_stack = None
        raise TimedOut(f"no result after {seconds:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def error_names_sample(error: BaseException, key: str) -> bool:
    """True when the error (or an error it was raised from) mentions the sample key."""
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < 8:
        if key in str(current):
            return True
        # Follow what a traceback shows: the cause, or the context unless `raise ... from None` hid it.
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
        seen += 1
    return False


def fail(message: str, reproduce: str = "") -> None:
    raise PropertyFailure(message, reproduce=reproduce)
