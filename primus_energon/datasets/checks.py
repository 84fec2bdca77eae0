"""Checks of one member's bytes, chosen by its extension: tensors, captions, JSON, images, ``.npy``, pickles.

Contract: nothing here unpickles anything but plain data (pickled members are read by
:func:`primus_energon.safepickle.safe_loads`, which refuses every other global before it runs), and a tensor member passes exactly when
``torch.load(BytesIO, weights_only=True)`` (what the reference cookers' reader is equal to) returns a tensor for it. Tensor
files are read by the allow-list reader `primus_energon.tensorfile.read_tensor` (same result as torch.load,
never unpickles); whenever it refuses a payload, torch.load decides, and a refusal that names a disallowed
global is ``malicious-pickle``, any other failure ``garbage-payload``. Speed: the reader's layout cache reads
payloads of a layout it has accepted before without parsing them again (see ``tensorfile._Layout``).
Floating tensors are scanned once (``aminmax``) for NaN/Inf and their value range.

Bounded work: every size a member declares is checked against the bytes that are there before anything
is allocated (a ``.npy`` header's shape and dtype, a tensor file's storage entry, JSON nesting, at most
`MAX_JSON_DEPTH` levels, found by a linear scan before the parser recurses); pickles are read within
`primus_energon.safepickle`'s budgets. A member past a budget is ``limit-exceeded``, naming the limit.
"""

from __future__ import annotations

import io
import json
import re
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from primus_energon.boundedread import MAX_JSON_DEPTH, json_depth, read_npy
from primus_energon.formats import IMAGE_EXTENSIONS, member_kind
from primus_energon.safepickle import (
    PickleFormatError,
    PickleLimitError,
    UnsafePickleError,
    describe_structure,
    safe_loads,
)
from primus_energon.tensorfile import TensorFileError, read_tensor

__all__ = ["MAX_JSON_DEPTH", "MemberCheck", "check_member", "member_kind", "IMAGE_EXTENSIONS"]

_DISALLOWED_GLOBAL = re.compile(r"GLOBAL (\S+) was not an allowed global")
_BLOCKED_MODULE = re.compile(r"whose module (\S+) is blocked")
_OBJECT_ADDRESS = re.compile(r" ?<[^<>]* at 0x[0-9a-fA-F]+>")
_FLOAT_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})


@dataclass
class MemberCheck:
    """The outcome for one member. `code` is None when it is fine. `dtype`/`shape` describe a decoded tensor
    (an image: ``uint8`` and ``(H, W, C)``); `vmin`/`vmax` its finite value range (floating tensors)."""

    kind: str
    code: str | None = None
    message: str = ""
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    vmin: float | None = None
    vmax: float | None = None
    detail: dict[str, Any] | None = None


def _torch_verdict(data: bytes | memoryview) -> tuple[torch.Tensor | None, str | None, str]:
    """(tensor, None, "") or (None, code, why) from ``torch.load(weights_only=True)``."""
    try:
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for bad bytes
        text = str(exc)
        found = _DISALLOWED_GLOBAL.search(text) or _BLOCKED_MODULE.search(text)
        if found:
            return (
                None,
                "malicious-pickle",
                (
                    f"it pickles {found.group(1)}, which is not a tensor; torch.load(weights_only=True) refused it "
                    "(unpickling it would run code)"
                ),
            )
        why = text.split("WeightsUnpickler error:", 1)[-1]
        lines = [ln.strip() for ln in why.splitlines() if ln.strip()]
        first = lines[0] if lines else ""
        if first.startswith("Weights only load failed") and len(lines) > 1:
            first = lines[1]
        return None, "garbage-payload", f"not a readable tensor file ({type(exc).__name__}: {first[:160]})"
    if not isinstance(loaded, torch.Tensor):
        return None, "garbage-payload", f"the tensor file holds a {type(loaded).__name__}, not a tensor"
    return loaded, None, ""


def _load_tensor(data: bytes | memoryview) -> tuple[torch.Tensor | None, str | None, str]:
    """(tensor, None, "") or (None, code, why). The allow-list reader (with its layout cache, so payloads of a
    layout it has read skip the parse) decides what it accepts; anything it refuses, torch.load decides."""
    try:
        return read_tensor(data, copy=False), None, ""
    except TensorFileError:
        return _torch_verdict(data)


def _check_tensor_values(t: torch.Tensor, out: MemberCheck) -> None:
    if t.dtype not in _FLOAT_DTYPES or t.numel() == 0:
        return
    lo, hi = torch.aminmax(t)  # NaN propagates, Inf shows in the range: one pass for the clean case
    lo_f, hi_f = float(lo), float(hi)
    if lo_f == lo_f and hi_f == hi_f and abs(lo_f) != float("inf") and abs(hi_f) != float("inf"):
        out.vmin, out.vmax = lo_f, hi_f
        return
    flat = t.reshape(-1)
    nan = torch.isnan(flat)
    inf = torch.isinf(flat)
    bad = (nan | inf).nonzero().reshape(-1)
    n_nan, n_inf = int(nan.sum()), int(inf.sum())
    first = [int(i) for i in bad[:8]]
    out.code = "nan-tensor"
    out.message = f"{n_nan} NaN and {n_inf} Inf of {flat.numel()} values (first at flat index {first[0]})"
    out.detail = {"nan": n_nan, "inf": n_inf, "first_indices": first}
    finite = flat[~(nan | inf)]
    if finite.numel():
        f_lo, f_hi = torch.aminmax(finite)
        out.vmin, out.vmax = float(f_lo), float(f_hi)


def check_tensor(data: bytes | memoryview) -> MemberCheck:
    out = MemberCheck("tensor")
    t, code, why = _load_tensor(data)
    if t is None:
        out.code, out.message = code, why
        return out
    out.dtype = str(t.dtype).removeprefix("torch.")
    out.shape = tuple(t.shape)
    _check_tensor_values(t, out)
    return out


def check_text(data: bytes | memoryview) -> MemberCheck:
    out = MemberCheck("text")
    data = bytes(data)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        out.code = "non-utf8-caption"
        out.message = (
            f"not valid UTF-8: byte {exc.start} of {len(data)} is {data[exc.start : exc.start + 1]!r} "
            f"(near {data[max(0, exc.start - 12) : exc.start + 4]!r})"
        )
        out.detail = {"invalid_byte_offset": exc.start}
    return out


def check_json(data: bytes | memoryview) -> MemberCheck:
    out = MemberCheck("json")
    raw = bytes(data)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        out.code = "garbage-payload"
        out.message = f"not a UTF-8 JSON document ({type(exc).__name__}: {str(exc)[:120]})"
        return out
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        out.code = "limit-exceeded"
        out.message = (
            f"the JSON document nests {depth} levels deep, more than the {MAX_JSON_DEPTH}-level budget"
        )
        out.detail = {"limit": "depth", "budget": MAX_JSON_DEPTH, "found": depth}
        return out
    try:
        json.loads(text)
    except (ValueError, RecursionError) as exc:
        out.code = "garbage-payload"
        out.message = f"not a UTF-8 JSON document ({type(exc).__name__}: {str(exc)[:120]})"
    return out


def check_image(data: bytes | memoryview) -> MemberCheck:
    from PIL import Image

    out = MemberCheck("image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as img:
                img.load()
                w, h = img.size
                channels = len(img.getbands())
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        out.code = "garbage-payload"
        why = _OBJECT_ADDRESS.sub("", str(exc))  # PIL names the BytesIO by address: not a fact of the data
        out.message = f"not a decodable image ({type(exc).__name__}: {why[:120]})"
        return out
    out.dtype = "uint8"
    out.shape = (h, w, channels)
    return out


def check_npy(data: bytes | memoryview) -> MemberCheck:
    import numpy as np

    out = MemberCheck("npy")
    try:
        arr = read_npy(data)
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            out.code = "malicious-pickle"
            out.message = "the .npy holds pickled objects (refused: unpickling could run code)"
        else:
            out.code = "garbage-payload"
            out.message = f"not a readable .npy file ({str(exc)[:120]})"
        return out
    except (OSError, EOFError) as exc:
        out.code = "garbage-payload"
        out.message = f"not a readable .npy file ({type(exc).__name__}: {str(exc)[:120]})"
        return out
    out.dtype = str(arr.dtype)
    out.shape = tuple(arr.shape)
    if arr.dtype.kind == "f" and arr.size:
        if not arr.dtype.isnative:  # torch reads native byte order only
            arr = arr.astype(arr.dtype.newbyteorder("="))
        with warnings.catch_warnings():  # read-only: the array is a view of the shard's bytes
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(np.ascontiguousarray(arr))
        _check_tensor_values(t, out)
    return out


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The floating tensors and arrays in a safely loaded structure, each distinct object once (a shared
    reference is not walked again), in depth-first order."""
    import numpy as np

    out: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, np.ndarray) and item.dtype.kind == "f":
            out.append(torch.from_numpy(np.ascontiguousarray(item)))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
    return out


def check_pickle(data: bytes | memoryview) -> MemberCheck:
    """A pickled member: plain data loads (its floating tensors are checked for NaN/Inf), a pickle that
    references anything else is ``malicious-pickle`` (nothing ran), malformed bytes ``garbage-payload``.
    ``detail["structure"]`` describes what it holds."""
    out = MemberCheck("pickle")
    try:
        value = safe_loads(data)
    except PickleLimitError as exc:
        out.code = "limit-exceeded"
        out.message = f"{exc} (nothing was run)"
        out.detail = {"limit": exc.limit, "budget": exc.budget}
        return out
    except UnsafePickleError as exc:
        out.code = "malicious-pickle"
        out.message = f"{exc} (nothing was run; Energon's default decoder would have run it)"
        return out
    except PickleFormatError as exc:
        out.code = "garbage-payload"
        out.message = str(exc)[:200]
        return out
    out.detail = {"structure": describe_structure(value)}
    for tensor in _tensor_leaves(value):
        _check_tensor_values(tensor, out)
        if out.code:
            break
    return out


def check_member(part: str, data: bytes | memoryview, *, decode: bool = True) -> MemberCheck:
    """Check one member's bytes by its kind (see `member_kind`); with ``decode=False`` only classify it.
    Keeps no reference to `data` (it may be a view of a reused buffer)."""
    kind = member_kind(part)
    if not decode:
        return MemberCheck(kind)
    if kind == "tensor":
        return check_tensor(data)
    if kind == "text":
        return check_text(data)
    if kind == "json":
        return check_json(data)
    if kind == "image":
        return check_image(data)
    if kind == "npy":
        return check_npy(data)
    if kind == "pickle":
        return check_pickle(data)
    return MemberCheck(kind)
