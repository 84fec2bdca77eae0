"""Checks of one member's bytes, chosen by its extension: tensors, captions, JSON, images, ``.npy``.

Contract: nothing here unpickles anything but tensors, and a tensor member passes exactly when
``torch.load(BytesIO, weights_only=True)`` (what the reference cookers use) returns a tensor for it. Tensor
files are read by the allow-list reader `primus_energon.tensorfile.read_tensor` (same result as torch.load,
never unpickles); whenever it refuses a payload, torch.load decides, and a refusal that names a disallowed
global is ``malicious-pickle``, any other failure ``garbage-payload``. Speed: once a payload has been read in
full, later payloads of the same length that equal it byte for byte except in the storage bytes, the
CRC-32 fields (which torch.load does not check) and the serialization id (checked to be UTF-8) are the same
archive with other values, and are read through that verified template without parsing the zip again.
Floating tensors are scanned once (``aminmax``) for NaN/Inf and their value range.
"""

from __future__ import annotations

import io
import json
import re
import struct
import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

__all__ = ["MemberCheck", "check_member", "member_kind", "IMAGE_EXTENSIONS"]

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"})
_TENSOR_EXTENSIONS = frozenset({"pth", "pt"})
_TEXT_EXTENSIONS = frozenset({"txt", "text"})
_DISALLOWED_GLOBAL = re.compile(r"GLOBAL (\S+) was not an allowed global")
_BLOCKED_MODULE = re.compile(r"whose module (\S+) is blocked")
_FLOAT_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})

try:  # the fast reader may be absent in older checkouts; torch.load is the fallback
    from primus_energon.tensorfile import read_tensor as _read_tensor
except ImportError:  # pragma: no cover
    _read_tensor = None


def member_kind(part: str) -> str:
    """``tensor``, ``text``, ``json``, ``image``, ``npy`` or ``bytes``, from the member's last extension."""
    ext = part.rsplit(".", 1)[-1].lower()
    if ext in _TENSOR_EXTENSIONS:
        return "tensor"
    if ext in _TEXT_EXTENSIONS:
        return "text"
    if ext == "json":
        return "json"
    if ext in IMAGE_EXTENSIONS or part.lower() == "images":
        return "image"
    if ext == "npy":
        return "npy"
    return "bytes"


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


class _Template(NamedTuple):
    """A torch.save archive already read in full: every byte that must match, and where the storage is."""

    head: bytes  # everything before the storage, variable ranges zeroed
    tail: bytes  # everything after it, likewise
    head_vars: tuple[tuple[int, int, bytes], ...]  # (start, end, zeros) of the variable ranges in head
    tail_vars: tuple[tuple[int, int, bytes], ...]  # ... and in tail (offsets relative to the tail)
    utf8: tuple[tuple[int, int], ...]  # ranges that vary but must stay UTF-8 (.data/serialization_id)
    data: tuple[int, int]  # the storage bytes
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


_TEMPLATES: dict[int, list[_Template]] = {}  # payload length -> templates
_MAX_TEMPLATES = 256
_n_templates = 0
_EOCD = struct.Struct("<4sHHHHIIH")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_LOCAL = struct.Struct("<4sHHHHHIIIHH")


def _address(view: memoryview) -> int:
    return torch.frombuffer(view, dtype=torch.uint8).data_ptr() if len(view) else 0


def _make_template(data: bytes | memoryview, t: torch.Tensor) -> _Template | None:
    """The template of `data`, a torch.save zip that read_tensor has just read into `t` (a view of `data`).

    Variable ranges: the storage bytes, every CRC-32 (local header, data descriptor, central directory;
    torch.load does not check them) and the serialization id's bytes (checked to be UTF-8, as torch needs).
    None when the layout is not the plain one torch.save writes (comments, no storage, a record overlapping
    the storage, ...): then every payload of this shape goes through the full reader."""
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    size = len(view)
    storage = t.untyped_storage()
    nbytes = storage.nbytes()
    if nbytes == 0 or size < _EOCD.size or size >= 1 << 32:
        return None
    start = storage.data_ptr() - _address(view)
    if not 0 <= start <= size - nbytes:
        return None
    sig, disk, cd_disk, _, count, cd_size, cd_offset, comment = _EOCD.unpack_from(view, size - _EOCD.size)
    if sig != b"PK\x05\x06" or disk or cd_disk or comment or cd_offset + cd_size > size - _EOCD.size:
        return None
    variable = [(start, start + nbytes)]
    utf8 = []
    storage_entries = 0
    pos = cd_offset
    for _ in range(count):
        if pos + _CENTRAL.size > size:
            return None
        entry = _CENTRAL.unpack_from(view, pos)
        if entry[0] != b"PK\x01\x02":
            return None
        flags, comp_size, name_len, extra_len, comment_len, local = (
            entry[3],
            entry[8],
            entry[10],
            entry[11],
            entry[12],
            entry[16],
        )
        name = bytes(view[pos + _CENTRAL.size : pos + _CENTRAL.size + name_len])
        variable.append((pos + 16, pos + 20))  # central CRC
        if local + _LOCAL.size > size:
            return None
        lh = _LOCAL.unpack_from(view, local)
        if lh[0] != b"PK\x03\x04":
            return None
        variable.append((local + 14, local + 18))  # local CRC
        data_at = local + _LOCAL.size + lh[9] + lh[10]
        data_end = data_at + comp_size
        if flags & 0x08:  # data descriptor: [signature] CRC, sizes
            crc_at = data_end + 4 if bytes(view[data_end : data_end + 4]) == b"PK\x07\x08" else data_end
            variable.append((crc_at, crc_at + 4))
        if name.endswith(b".data/serialization_id"):
            variable.append((data_at, data_end))
            utf8.append((data_at, data_end))
        if (data_at, data_end) == (start, start + nbytes):
            storage_entries += 1
        elif local < start + nbytes and start < data_end:
            return None  # another record overlaps the storage bytes: not torch.save's layout
        pos += _CENTRAL.size + name_len + extra_len + comment_len
    if storage_entries != 1 or cd_offset < start + nbytes:
        return None
    s0, s1 = start, start + nbytes
    head, tail = bytearray(view[:s0]), bytearray(view[s1:])
    head_vars, tail_vars = [], []
    for a, b in variable[1:]:
        if b <= s0:
            head[a:b] = bytes(b - a)
            head_vars.append((a, b, bytes(b - a)))
        elif a >= s1:
            tail[a - s1 : b - s1] = bytes(b - a)
            tail_vars.append((a - s1, b - s1, bytes(b - a)))
        else:
            return None  # a variable range overlapping the storage: not torch.save's layout
    return _Template(
        bytes(head),
        bytes(tail),
        tuple(head_vars),
        tuple(tail_vars),
        tuple(utf8),
        (s0, s1),
        t.dtype,
        tuple(t.shape),
        tuple(t.stride()),
        t.storage_offset(),
    )


def _from_template(data: bytes | memoryview) -> torch.Tensor | None:
    """The tensor of `data` if it matches a template byte for byte outside the variable ranges (then it is
    the same archive with other storage bytes, so read_tensor/torch.load would return exactly this)."""
    templates = _TEMPLATES.get(len(data))
    if not templates:
        return None
    view = memoryview(data)
    for tpl in templates:
        s0, s1 = tpl.data
        head = bytearray(view[:s0])
        for a, b, zeros in tpl.head_vars:
            head[a:b] = zeros
        if head != tpl.head:
            continue
        tail = bytearray(view[s1:])
        for a, b, zeros in tpl.tail_vars:
            tail[a:b] = zeros
        if tail != tpl.tail:
            continue
        try:
            for a, b in tpl.utf8:
                bytes(view[a:b]).decode("utf-8")
        except UnicodeDecodeError:
            continue
        raw = torch.frombuffer(view[tpl.data[0] : tpl.data[1]], dtype=torch.uint8)
        return torch.empty(0, dtype=tpl.dtype).set_(raw.untyped_storage(), tpl.offset, tpl.shape, tpl.stride)
    return None


def _load_tensor(data: bytes | memoryview) -> tuple[torch.Tensor | None, str | None, str]:
    global _n_templates
    if _read_tensor is not None:
        t = _from_template(data)
        if t is not None:
            return t, None, ""
        try:
            t = _read_tensor(data, copy=False)
        except Exception:  # noqa: BLE001 - any refusal: let torch decide what the cookers would see
            return _torch_verdict(data)
        if _n_templates < _MAX_TEMPLATES:
            tpl = _make_template(data, t)
            if tpl is not None:
                _TEMPLATES.setdefault(len(data), []).append(tpl)
                _n_templates += 1
        return t, None, ""
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
    try:
        json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
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
        out.message = f"not a decodable image ({type(exc).__name__}: {str(exc)[:120]})"
        return out
    out.dtype = "uint8"
    out.shape = (h, w, channels)
    return out


def check_npy(data: bytes | memoryview) -> MemberCheck:
    import numpy as np

    out = MemberCheck("npy")
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
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
        t = torch.from_numpy(np.ascontiguousarray(arr))
        _check_tensor_values(t, out)
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
    return MemberCheck(kind)
