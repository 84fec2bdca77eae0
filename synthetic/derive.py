"""`derive_dataset`: a prepared CrudeWebdataset made from a user's own samples, not from a schema.

Where a check needs a dataset of a user's format (more shards, more samples, a fault, another dtype), it is
derived from real samples: each derived sample is a copy of one source sample, re-keyed, with every member
under its exact name and, unless said below, its exact bytes. The source samples are used in order and
repeated as often as ``num_samples`` needs; members are edited only where the derivation says so, always
in the member's own container (``torch.save`` stays ``torch.save``, ``.npy`` stays ``.npy``, a JPEG stays a
JPEG):

* **repeats**: the ``c``-th repeat (``c >= 1``) of a source sample has its tensor, array and image values
  rolled by ``c`` positions (same values, dtype and shape; a different payload), so that a check that
  follows samples by value tells the copies apart. Text, JSON and opaque members are copied as they are.
* **dtype**: every floating-point tensor (a ``.pth``, a tensor leaf of a pickled structure, a float
  ``.npy`` where numpy has the dtype) is cast to ``dtype``; cast to a wider dtype, its values are moved by a
  few parts in 2**14 (values the narrower dtype cannot hold), so that a reader narrowing them again shows.
* **faults**: the fault kinds of :data:`~primus_energon.synthetic.FAULT_KINDS`, each made from the real
  member it hits (a NaN or a wrong shape in the real tensor, the real caption in another encoding, the
  member removed), placed exactly as the generator places them, and recorded in the manifest.

What a member holds is told by its schema spec (the caller infers it from the member's name and content);
a member the derivation cannot decode is copied unchanged, and the manifest's ``options.derived`` says
which members of which samples were edited and how. The result is a pure function of the arguments.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from .damage import (
    WRONG_DTYPE,
    apply_post_prepare_faults,
    dotted_key_fault,
    garbage_bytes,
    malicious_payload,
    non_utf8_caption,
    wrong_shape,
)
from .errors import SyntheticError
from .faults import FAULT_KINDS, dotted_key, parse_faults, plan_faults
from .manifest import MANIFEST_FILENAME, FaultRecord, Manifest, MemberRecord, SampleRecord, ShardRecord
from .plan import positive_int
from .preparation import assign_splits, prepare_with_energon, write_dataset_yaml
from .schema import FLOAT_DTYPES, ImageSpec, NpySpec, PickleSpec, Schema, TensorSpec
from .tar import TarShardWriter

__all__ = ["derive_dataset"]

#: Pillow's format name and save options per image format of a derived image (lossless where the format is)
_IMAGE_SAVE = {
    "jpeg": ("JPEG", {"quality": 95}),
    "png": ("PNG", {}),
    "webp": ("WEBP", {"lossless": True}),
    "gif": ("GIF", {}),
}


def _torch() -> Any:
    import torch

    return torch


def _read_tensor(data: bytes) -> Any:
    from primus_energon.tensorfile import read_tensor

    return read_tensor(data, copy=True, fallback=True)


def _saved(tensor: Any) -> bytes:
    buffer = io.BytesIO()
    _torch().save(tensor.contiguous().clone(), buffer)
    return buffer.getvalue()


def _pickled(value: Any, original: bytes) -> bytes:
    """``value`` pickled with the protocol of the ``original`` member, byte-identical for equal values
    (``pickle.dumps`` of a tensor is not: its storage key is a memory address)."""
    from .payloads import pickle_bytes

    protocol = original[1] if len(original) > 1 and original[0] == 0x80 and 2 <= original[1] <= 5 else 4
    return pickle_bytes(value, protocol)


def _map_leaves(value: Any, tensor_fn: Any, array_fn: Any, depth: int = 0) -> Any:
    """``value`` with every torch tensor and numpy array replaced (dicts, lists and tuples walked)."""
    import numpy as np

    if depth > 16:
        return value
    if isinstance(value, _torch().Tensor):
        return tensor_fn(value)
    if isinstance(value, np.ndarray) and value.dtype != object:
        return array_fn(value)
    if isinstance(value, dict):
        return {k: _map_leaves(v, tensor_fn, array_fn, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        mapped = [_map_leaves(v, tensor_fn, array_fn, depth + 1) for v in value]
        return mapped if isinstance(value, list) else tuple(mapped)
    return value


def _rolled(data: bytes, spec: Any, shift: int) -> bytes | None:
    """The member with its values rolled by ``shift`` (same container, dtype and shape), or None when it
    holds nothing to roll or cannot be read."""
    import numpy as np

    def roll_tensor(tensor: Any) -> Any:
        return tensor.flatten().roll(shift).reshape(tensor.shape) if tensor.numel() > 1 else tensor

    def roll_array(array: Any) -> Any:
        return np.roll(array.ravel(), shift).reshape(array.shape) if array.size > 1 else array

    if isinstance(spec, TensorSpec):
        tensor = _read_tensor(data)
        return _saved(roll_tensor(tensor)) if tensor.numel() > 1 else None
    if isinstance(spec, NpySpec):
        array = np.load(io.BytesIO(data), allow_pickle=False)
        if array.size <= 1:
            return None
        buffer = io.BytesIO()
        np.save(buffer, roll_array(array), allow_pickle=False)
        return buffer.getvalue()
    if isinstance(spec, PickleSpec):
        from primus_energon.safepickle import safe_loads

        return _pickled(_map_leaves(safe_loads(data), roll_tensor, roll_array), data)
    if isinstance(spec, ImageSpec):
        from PIL import Image

        name, options = _IMAGE_SAVE.get(spec.format, ("PNG", {}))
        with Image.open(io.BytesIO(data)) as image:
            mode = image.mode
            pixels = np.asarray(image.convert("RGB") if name == "GIF" else image)
        if pixels.ndim < 2 or pixels.shape[1] < 2:
            return None
        out = Image.fromarray(np.ascontiguousarray(np.roll(pixels, shift, axis=1)))
        if name != "GIF" and out.mode != mode:
            out = out.convert(mode)
        buffer = io.BytesIO()
        out.save(buffer, format=name, **options)
        return buffer.getvalue()
    return None


def _fine_bits(tensor: Any) -> Any:
    """``tensor`` (just widened) with its values moved by a few parts in 2**14, deterministically: values a
    narrower dtype cannot hold, so that a reader casting them back (``.half()``, ``.astype(float16)``) loses
    something where a widening alone would give back the same numbers."""
    torch = _torch()
    flat = tensor.reshape(-1)
    steps = (torch.arange(flat.numel(), dtype=torch.float64) % 7 + 1) * 2.0**-14
    return (flat.double() * (1 + steps)).to(tensor.dtype).reshape(tensor.shape)


def _cast(data: bytes, spec: Any, dtype: str) -> bytes | None:
    """The member with its floating-point tensors cast to ``dtype``, or None when it holds none."""
    import numpy as np

    torch = _torch()
    target = getattr(torch, dtype)
    changed = []

    def cast_tensor(tensor: Any) -> Any:
        if tensor.is_floating_point() and tensor.dtype != target:
            changed.append(1)
            cast = tensor.to(target)
            if torch.finfo(target).eps < torch.finfo(tensor.dtype).eps:
                cast = _fine_bits(cast)
            return cast
        return tensor

    def cast_array(array: Any) -> Any:
        if array.dtype.kind == "f" and dtype != "bfloat16" and array.dtype != np.dtype(dtype):
            changed.append(1)
            cast = array.astype(dtype)
            if np.finfo(np.dtype(dtype)).eps < np.finfo(array.dtype).eps:
                cast = _fine_bits(torch.from_numpy(np.ascontiguousarray(cast))).numpy()
            return cast
        return array

    if isinstance(spec, TensorSpec):
        out = _saved(cast_tensor(_read_tensor(data)))
    elif isinstance(spec, NpySpec) and spec.view is None:
        array = cast_array(np.load(io.BytesIO(data), allow_pickle=False))
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        out = buffer.getvalue()
    elif isinstance(spec, PickleSpec):
        from primus_energon.safepickle import safe_loads

        value = _map_leaves(safe_loads(data), cast_tensor, cast_array)
        out = _pickled(value, data)
    else:
        return None
    return out if changed else None


def _edited(data: bytes, spec: Any, repeat: int, dtype: str | None, where: str, edits: list[str]) -> bytes:
    """One member of a derived sample: rolled for a repeat, cast for a dtype variant; each edit made is
    appended to ``edits`` (a member that cannot be read is copied unchanged, and that is said too)."""
    steps = []
    if repeat:
        steps.append((f"values rolled by {repeat}", lambda d: _rolled(d, spec, repeat)))
    if dtype:
        steps.append((f"floating-point values cast to {dtype}", lambda d: _cast(d, spec, dtype)))
    for label, edit in steps:
        try:
            edited = edit(data)
        except Exception as error:  # unreadable: copied as it is
            edits.append(f"{where}: copied unchanged ({label} failed: {type(error).__name__})")
            continue
        if edited is not None:
            data = edited
            edits.append(f"{where}: {label}")
    return data


def _member_fault(kind: str, spec: Any, data: bytes, rng: Any, marker_path: str) -> tuple[bytes | None, dict]:
    """The faulty form of one real member (None: removed) and the fault's manifest detail."""
    torch = _torch()
    if kind == "missing-member":
        return None, {}
    if kind == "garbage-payload":
        return garbage_bytes(rng, len(data))
    if kind == "malicious-pickle":
        return bytes(malicious_payload(marker_path)), {"marker_path": marker_path}
    if kind == "non-utf8-caption":
        return non_utf8_caption(data)
    tensor = _read_tensor(data)
    if kind == "nan-tensor":
        flat = tensor.reshape(-1).clone()
        count = min(4, flat.numel())
        where = sorted(int(i) for i in rng.choice(flat.numel(), size=count, replace=False))
        flat[torch.tensor(where, dtype=torch.long)] = float("nan")
        return _saved(flat.reshape(tensor.shape)), {"nan_indices": where}
    if kind == "wrong-dtype":
        from .payloads import DTYPE_NAMES, TORCH_DTYPES

        expected = DTYPE_NAMES[tensor.dtype]
        actual = WRONG_DTYPE.get(expected, "int64")
        return _saved(tensor.to(TORCH_DTYPES[actual])), {"expected": expected, "actual": actual}
    if kind == "wrong-shape":
        expected = list(tensor.shape)
        if tensor.dim():
            axis = next(i for i, n in enumerate(wrong_shape(tuple(expected))) if n != expected[i])
            wrong = torch.cat([tensor, tensor.narrow(axis, 0, 1)], dim=axis)
        else:
            wrong = tensor.reshape(1).repeat(2)
        return _saved(wrong), {"expected": expected, "actual": list(wrong.shape)}
    raise SyntheticError(f"fault {kind!r} is not a member fault")  # pragma: no cover


def _describe(spec: Any, data: bytes) -> tuple[str | None, tuple[int, ...] | None]:
    """(dtype, shape) of the tensor or array a member holds, else (None, None)."""
    try:
        if isinstance(spec, TensorSpec):
            from .payloads import DTYPE_NAMES

            tensor = _read_tensor(data)
            return DTYPE_NAMES.get(tensor.dtype), tuple(tensor.shape)
        if isinstance(spec, NpySpec):
            import numpy as np

            array = np.load(io.BytesIO(data), allow_pickle=False)
            return str(array.dtype), tuple(array.shape)
    except Exception:  # a faulty member holds no readable tensor
        pass
    return None, None


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def derive_dataset(
    out_dir: str | PathLike[str],
    samples: Sequence[Mapping[str, Any]],
    *,
    schema: Schema,
    subflavors: Mapping[str, Any] | None = None,
    num_samples: int = 48,
    shard_size: int = 8,
    seed: int = 0,
    key_prefix: str = "d",
    faults: Mapping[str, int] | Iterable[str] | None = None,
    dtype: str | None = None,
    split: Sequence[float] = (1.0, 0.0, 0.0),
    marker_path: str | PathLike[str] | None = None,
    source: str = "",
) -> Manifest:
    """Derive a prepared CrudeWebdataset in ``out_dir`` (which must be empty or absent) from ``samples``
    (each a dict of member name -> the member's bytes, with its ``__key__``) and return its manifest (also
    saved as ``manifest.json``; ``options.derived`` maps every derived key to its source key and lists
    every edit). ``schema`` describes the members (in tar order; the caller infers it from the samples),
    ``subflavors`` go to ``dataset.yaml``, ``source`` names where the samples came from. Faults, splits
    and keys work as in :func:`~primus_energon.synthetic.generate_dataset`; see the module docstring for
    what is copied and what is edited. Raises `SyntheticError` when the request cannot be met."""
    import numpy as np

    out = Path(out_dir).absolute()
    num_samples = positive_int(num_samples, "num_samples")
    shard_size = positive_int(shard_size, "shard_size")
    if not samples:
        raise SyntheticError("there are no samples to derive a dataset from")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise SyntheticError(f"dtype must be one of {', '.join(FLOAT_DTYPES)}, got {dtype!r}")
    members = list(schema.members)
    for sample in samples:
        absent = [m for m in members if not isinstance(sample.get(m), (bytes, bytearray, memoryview))]
        if absent:
            raise SyntheticError(
                f"source sample {sample.get('__key__')!r} lacks member(s) {absent}: derive from samples "
                "that hold every member of the schema"
            )
    if out.exists() and any(out.iterdir()):
        raise SyntheticError(f"output directory {str(out)!r} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    requested = parse_faults(faults)
    fault_plan = plan_faults(schema, num_samples, shard_size, requested, seed)
    marker = str(marker_path) if marker_path is not None else str(out) + ".PWNED"
    num_shards = -(-num_samples // shard_size)
    shard_names = [f"shard-{s:06d}.tar" for s in range(num_shards)]
    shard_splits = assign_splits(num_shards, split)
    width = max(6, len(str(num_samples - 1)))
    rng = np.random.default_rng([seed, 7])
    sources: dict[str, str] = {}
    edits: list[str] = []
    records: list[SampleRecord] = []
    fault_records: list[FaultRecord] = []
    for s, shard in enumerate(shard_names):
        with TarShardWriter(out / shard) as writer:
            for index in range(s * shard_size, min((s + 1) * shard_size, num_samples)):
                source_sample = samples[index % len(samples)]
                repeat = index // len(samples)
                key = f"{key_prefix}_{index:0{width}d}"
                sources[key] = str(source_sample.get("__key__"))
                planned = fault_plan.samples.get(index)
                stored_key = key
                if planned is not None and planned.kind == "dotted-key":
                    stored_key = dotted_key(key)
                    fault_records.append(dotted_key_fault(shard, key, members))
                stored: dict[str, MemberRecord] = {}
                for name in members:
                    spec = schema.members[name]
                    data = bytes(source_sample[name])
                    data = _edited(data, spec, repeat, dtype, f"{key}.{name}", edits)
                    if planned is not None and planned.member == name and planned.kind != "duplicate-key":
                        damaged, detail = _member_fault(planned.kind, spec, data, rng, marker)
                        fault_records.append(FaultRecord(planned.kind, shard, key, name, detail))
                        if damaged is None:
                            continue
                        data = damaged
                    kind = getattr(spec, "kind", "bytes")
                    member_dtype, shape = _describe(spec, data)
                    stored[name] = MemberRecord(kind, member_dtype, shape, len(data), _sha256(data))
                    writer.add(f"{stored_key}.{name}", data, lambda _digest: None)
                records.append(SampleRecord(key, index, shard, shard_splits[s], stored))
    prepare_with_energon(out, shard_names, shard_splits)
    dataset_subflavors = dict(subflavors or {})
    write_dataset_yaml(out, dataset_subflavors)

    key_of = {r.index: r.key for r in records}
    shard_of = {r.index: r.shard for r in records}
    shard_keys = [[r.key for r in records if r.shard == name] for name in shard_names]
    post = apply_post_prepare_faults(out, fault_plan, shard_names, shard_keys, key_of, shard_of)
    position = {r.key: r.index for r in records}
    faults_sorted = sorted(
        fault_records + post,
        key=lambda f: (
            shard_names.index(f.shard),
            -1 if f.key is None or f.kind == "truncated-shard" else position[f.key],
            FAULT_KINDS.index(f.kind),
            f.member or "",
        ),
    )
    options = {
        "num_samples": num_samples,
        "shard_size": shard_size,
        "key_prefix": key_prefix,
        "split": list(split),
        "faults": requested,
        "dtype": dtype,
        "derived": {
            "from": source,
            "source_samples": len(samples),
            "source_keys": sources,
            "edits": edits,
        },
    }
    manifest = Manifest(
        encoding=schema.encoding,
        seed=seed,
        num_samples=num_samples,
        shard_size=shard_size,
        schema=schema,
        subflavors=dataset_subflavors,
        options=options,
        shards=[
            ShardRecord(name, split_name, len(keys), (out / name).stat().st_size)
            for name, split_name, keys in zip(shard_names, shard_splits, shard_keys, strict=True)
        ],
        samples=records,
        faults=faults_sorted,
        marker_path=marker,
    )
    manifest.save(out / MANIFEST_FILENAME)
    return manifest
