"""What each fault does to the bytes: a damaged member while a shard is written, or damage to the prepared
dataset (``duplicate-key``, ``truncated-shard``, ``empty-shard``: faults that would stop Energon's own
preparation, so they are applied after it, the way they appear in the wild). Each function returns the
``detail`` its manifest record carries.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from .errors import SyntheticError
from .faults import DOTTED_SUFFIX, FaultPlan, PlannedFault, dotted_key
from .manifest import FaultRecord
from .payloads import DTYPE_NAMES, TORCH_DTYPES, Payload, PayloadFactory, tensor_bytes
from .rng import fault_rng
from .schema import TensorSpec
from .tar import EMPTY_TAR, tar_header

__all__ = [
    "WRONG_DTYPE",
    "apply_member_fault",
    "apply_post_prepare_faults",
    "dotted_key_fault",
    "garbage_bytes",
    "malicious_payload",
    "non_utf8_caption",
]

#: ``wrong-dtype``: the dtype a member of each dtype is stored in instead
WRONG_DTYPE = {
    "float32": "float64",
    "bfloat16": "float32",
    "float16": "float32",
    "float64": "float32",
    "int64": "int32",
    "uint8": "int64",
    "bool": "uint8",
}
_MAX_NANS = 4


class _CreatesMarkerWhenUnpickled:
    """Pickles to ``io.open(marker_path, "w")``: unpickling it (``torch.load(..., weights_only=False)``) creates
    the marker file and nothing else. ``weights_only=True`` refuses it (``io.open`` is not an allowed global)."""

    def __init__(self, marker_path: str) -> None:
        self.marker_path = marker_path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker_path, "w"))


def malicious_payload(marker_path: str) -> memoryview:
    """A ``torch.save`` file that runs code when loaded with ``weights_only=False``. Never load it yourself."""
    return tensor_bytes(_CreatesMarkerWhenUnpickled(marker_path))  # type: ignore[arg-type]


def garbage_bytes(rng: Any, size: int) -> tuple[bytes, dict[str, Any]]:
    """``garbage-payload``: random bytes of the member's size (at least 16), and the fault's detail."""
    size = max(16, size)
    junk = bytearray(rng.bytes(size))
    junk[0] = 0  # no codec accepts a leading NUL: not a zip, pickle, JPEG/PNG/RIFF or JSON document
    return bytes(junk), {"size": size}


def non_utf8_caption(clean: bytes) -> tuple[bytes, dict[str, Any]]:
    """``non-utf8-caption``: the caption (with a word that cp1252 encodes outside UTF-8 before it) in
    cp1252, and the fault's detail (where the first invalid byte is)."""
    text = clean.decode("utf-8", errors="replace")
    data = ("Café " + text).encode("cp1252", errors="replace")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return data, {"encoding": "cp1252", "invalid_byte_offset": exc.start}
    raise AssertionError("cp1252 caption unexpectedly decoded as UTF-8")  # pragma: no cover


def wrong_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of a ``wrong-shape`` fault: one longer along the first axis that is not 1 (an axis of 1 is
    part of the format, a batch or frame axis a reader may check, and stays 1), or ``(2,)`` for a scalar."""
    if not shape:
        return (2,)
    axis = next((i for i, n in enumerate(shape) if n != 1), 0)
    return shape[:axis] + (shape[axis] + 1,) + shape[axis + 1 :]


def dotted_key_fault(shard: str, key: str, members: Iterable[str]) -> FaultRecord:
    """The manifest record of a ``dotted-key`` fault on sample ``key`` (stored as :func:`dotted_key`)."""
    return FaultRecord(
        "dotted-key",
        shard,
        key,
        None,
        {
            "stored_key": dotted_key(key),
            "energon_key": key,
            "energon_members": [DOTTED_SUFFIX[1:] + "." + m for m in members],
        },
    )


def apply_member_fault(
    planned: PlannedFault,
    factory: PayloadFactory,
    index: int,
    key: str,
    clean: Payload,
    *,
    marker_path: str | None,
) -> tuple[Payload | None, dict[str, Any]]:
    """The damaged form of member `planned.member` of sample `index` (None: the member is dropped) and the
    fault's detail for the manifest. `clean` is the member's clean payload."""
    name = planned.member
    assert name is not None
    spec = factory.schema.members[name]
    rng = fault_rng(factory.seed, 1, index)
    kind = planned.kind
    if kind == "missing-member":
        return None, {}
    if kind == "garbage-payload":
        junk, detail = garbage_bytes(rng, len(clean.data))
        return Payload(junk, clean.kind), detail
    if kind == "malicious-pickle":
        if marker_path is None:  # pragma: no cover - generate_dataset always sets one
            raise SyntheticError("malicious-pickle needs a marker_path")
        return Payload(malicious_payload(marker_path), "tensor"), {"marker_path": marker_path}
    if kind == "non-utf8-caption":
        data, detail = non_utf8_caption(bytes(clean.data))
        return Payload(data, "text"), detail
    assert isinstance(spec, TensorSpec)
    tensor = factory.tensor(name, spec, index)
    if kind == "nan-tensor":
        flat = tensor.view(-1)
        count = int(rng.integers(1, min(_MAX_NANS, flat.numel()) + 1))
        where = sorted(int(i) for i in rng.choice(flat.numel(), size=count, replace=False))
        flat[torch.tensor(where, dtype=torch.long)] = float("nan")
        return Payload(tensor_bytes(tensor), "tensor", spec.dtype, tuple(tensor.shape)), {
            "nan_indices": where
        }
    if kind == "wrong-dtype":
        actual = WRONG_DTYPE.get(spec.dtype, "int64")
        wrong = tensor.to(TORCH_DTYPES[actual]).clone()
        detail = {"expected": spec.dtype, "actual": DTYPE_NAMES[wrong.dtype]}
        return Payload(tensor_bytes(wrong), "tensor", detail["actual"], tuple(wrong.shape)), detail
    if kind == "wrong-shape":
        expected = tuple(tensor.shape)
        actual = wrong_shape(expected)
        wrong = factory.tensor(name, spec, index, shape=actual)
        detail = {"expected": list(expected), "actual": list(actual)}
        return Payload(tensor_bytes(wrong), "tensor", spec.dtype, actual), detail
    raise AssertionError(f"not a member fault: {kind}")  # pragma: no cover


# -- faults on the prepared dataset ------------------------------------------------------------------------------
def _layout(path: Path) -> list[tuple[str, int, int, int]]:
    """(name, header offset, data offset, size) of every member of a tar, in order."""
    with tarfile.open(path, "r:") as tar:
        return [(m.name, m.offset, m.offset_data, m.size) for m in tar]


def _split_name(name: str) -> tuple[str, str]:
    key, _, member = name.partition(".")
    return key, member


def _duplicate_key(root: Path, shard: str, key: str, stored_key: str) -> None:
    """Rewrite, in place, the headers of `key`'s members to name `stored_key` (same length: offsets hold)."""
    path = root / shard
    with open(path, "r+b") as f:
        for name, header_at, data_at, size in _layout(path):
            k, member = _split_name(name)
            if k != key:
                continue
            header = tar_header(f"{stored_key}.{member}", size)
            if len(header) != data_at - header_at:  # pragma: no cover - keys have a fixed width
                raise AssertionError(f"cannot rename {name!r} in place")
            f.seek(header_at)
            f.write(header)


def _truncate(
    root: Path, shard: str, planned: PlannedFault, keys: list[str]
) -> tuple[dict[str, Any], str, str]:
    path = root / shard
    size_before = path.stat().st_size
    key = keys[planned.position or 0]
    layout = [entry for entry in _layout(path) if _split_name(entry[0]) == (key, planned.member)]
    if not layout:  # pragma: no cover - the member is never missing in a faulted shard
        raise AssertionError(f"{key}.{planned.member} not found in {shard}")
    _, header_at, data_at, size = layout[0]
    cut = data_at + int(planned.fraction * size) if size > 0 else header_at + 256
    os.truncate(path, cut)
    damaged = keys[planned.position or 0 :]
    return {"size_before": size_before, "size_after": cut, "damaged_keys": damaged}, key, str(planned.member)


def _empty(root: Path, shard: str, keys: list[str]) -> dict[str, Any]:
    path = root / shard
    size_before = path.stat().st_size
    path.write_bytes(EMPTY_TAR)
    return {"size_before": size_before, "size_after": len(EMPTY_TAR), "damaged_keys": list(keys)}


def apply_post_prepare_faults(
    root: Path,
    plan: FaultPlan,
    shard_names: list[str],
    shard_keys: list[list[str]],
    key_of: Mapping[int, str],
    shard_of: Mapping[int, str],
) -> list[FaultRecord]:
    """Apply ``duplicate-key``, ``truncated-shard`` and ``empty-shard`` to the prepared dataset at `root`."""
    records: list[FaultRecord] = []
    for index, planned in sorted(plan.samples.items()):
        if planned.kind != "duplicate-key":
            continue
        assert planned.partner is not None
        key, stored = key_of[index], key_of[planned.partner]
        _duplicate_key(root, shard_of[index], key, stored)
        detail = {
            "stored_key": stored,
            "duplicate_of": stored,
            "duplicate_of_shard": shard_of[planned.partner],
            "damaged_keys": [key, stored],
        }
        records.append(FaultRecord("duplicate-key", shard_of[index], key, None, detail))
    for s, planned in sorted(plan.shards.items()):
        name = shard_names[s]
        if planned.kind == "truncated-shard":
            detail, key, member = _truncate(root, name, planned, shard_keys[s])
            records.append(FaultRecord("truncated-shard", name, key, member, detail))
        else:
            records.append(FaultRecord("empty-shard", name, None, None, _empty(root, name, shard_keys[s])))
    return records
