"""Deterministic member payloads: every byte is a function of (seed, sample index, member name) only
(see `primus_energon.synthetic.rng`).

Floating-point tensors are cut from a per-seed pool of standard-normal values (one random offset per member,
plus fresh values in the first few elements so no two members collide), so a FLUX-sized sample costs a memcpy
rather than millions of normal draws.
"""

from __future__ import annotations

import collections
import io
import json
import pickle
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from PIL import Image

from .captions import make_caption
from .rng import member_rng, pool_rng, sample_rng
from .schema import (
    FLOAT_DTYPES,
    BytesSpec,
    ImageSpec,
    JsonSpec,
    JsonStringSpec,
    ListSpec,
    MemberSpec,
    NpySpec,
    ObjectSpec,
    PickleSpec,
    Schema,
    TensorSpec,
    TextSpec,
)

__all__ = [
    "TORCH_DTYPES",
    "Payload",
    "PayloadFactory",
    "tensor_bytes",
    "pickle_bytes",
]

TORCH_DTYPES: Mapping[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES: Mapping[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}

_FRESH_VALUES = 8  # leading elements drawn per member so pool slices never collide
_POOL_MIN, _POOL_MAX = 1 << 16, 1 << 22


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """``torch.save`` of `tensor` (which must own its storage) as a buffer without an extra copy."""
    buf = io.BytesIO()
    torch.save(tensor, buf)
    return buf.getbuffer()


@lru_cache(maxsize=4)
def _normal_pool(seed: int, size: int, dtype_name: str) -> torch.Tensor:
    """`2 * size` values: `size` standard normals, repeated once so any `size`-long slice needs no wrap."""
    base = pool_rng(seed, size).standard_normal(size, dtype=np.float32)
    return torch.from_numpy(np.concatenate([base, base])).to(TORCH_DTYPES[dtype_name])


@dataclass
class Payload:
    """A member's bytes plus what the manifest says about them."""

    data: bytes | memoryview
    kind: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


class _StorageBytes:
    """Pickles as ``torch.storage._load_from_bytes(<torch.save of the storage>)``, as torch's own tensor
    pickling does, but with the zip serialization (deterministic) instead of the legacy one, whose storage
    key is a memory address."""

    def __init__(self, tensor: torch.Tensor) -> None:
        buffer = io.BytesIO()
        with warnings.catch_warnings():  # TypedStorage is what _rebuild_tensor_v2 takes
            warnings.simplefilter("ignore", UserWarning)
            torch.save(tensor.storage(), buffer)
        self.data = buffer.getvalue()

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return (torch.storage._load_from_bytes, (self.data,))


class _DeterministicPickler(pickle.Pickler):
    """``pickle.dumps`` whose bytes depend on the values only: a torch tensor is reduced exactly as
    ``Tensor.__reduce_ex__`` does (``_rebuild_tensor_v2`` of its storage), with a deterministic storage."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not torch.Tensor:
            return NotImplemented
        tensor = obj.detach().contiguous()
        hooks = collections.OrderedDict()
        args = (_StorageBytes(tensor), 0, tuple(tensor.size()), tensor.stride(), False, hooks)
        return (torch._utils._rebuild_tensor_v2, args)


def pickle_bytes(value: Any, protocol: int) -> bytes:
    """``pickle.dumps(value, protocol)``, byte-identical for equal values (see `_DeterministicPickler`)."""
    buffer = io.BytesIO()
    _DeterministicPickler(buffer, protocol=protocol).dump(value)
    return buffer.getvalue()


class PayloadFactory:
    """Makes the clean payload of any member of any sample of one (schema, seed, variable_shapes)."""

    def __init__(self, schema: Schema, seed: int, *, variable_shapes: bool = False) -> None:
        self.schema = schema
        self.seed = seed
        self.variable_shapes = variable_shapes
        numels = [
            int(np.prod(spec.shape, dtype=np.int64))
            for spec in schema.members.values()
            if isinstance(spec, TensorSpec) and spec.dtype in FLOAT_DTYPES
        ]
        self.pool_size = int(
            min(_POOL_MAX, max(_POOL_MIN, 1 << max(1, max(numels, default=1) - 1).bit_length()))
        )

    # -- shapes --------------------------------------------------------------------------------------------------
    def bucket(self, index: int) -> tuple[float, float]:
        """The (height, width) scale of sample `index`: (1, 1) unless variable shapes are on."""
        if not self.variable_shapes:
            return (1.0, 1.0)
        buckets = self.schema.buckets
        return buckets[int(sample_rng(self.seed, index).integers(len(buckets)))]

    @staticmethod
    def _scale(dims: tuple[int, ...], bucket: tuple[float, float]) -> tuple[int, ...]:
        h, w = dims[-2:]
        return dims[:-2] + (max(1, int(h * bucket[0] + 0.5)), max(1, int(w * bucket[1] + 0.5)))

    def tensor_shape(self, spec: TensorSpec, index: int) -> tuple[int, ...]:
        return self._scale(spec.shape, self.bucket(index)) if spec.bucketed else spec.shape

    def image_size(self, spec: ImageSpec, index: int) -> tuple[int, int]:
        h, w = self._scale(spec.size, self.bucket(index))
        return h, w

    # -- members -------------------------------------------------------------------------------------------------
    def tensor(
        self, name: str, spec: TensorSpec, index: int, *, shape: tuple[int, ...] | None = None
    ) -> torch.Tensor:
        """The tensor of member `name` of sample `index` (a fresh contiguous tensor owning its storage)."""
        shape = self.tensor_shape(spec, index) if shape is None else shape
        rng = member_rng(self.seed, index, name)
        n = int(np.prod(shape, dtype=np.int64))
        dtype = TORCH_DTYPES[spec.dtype]
        if spec.dtype in FLOAT_DTYPES:
            pool = _normal_pool(self.seed, self.pool_size, spec.dtype)
            offset = int(rng.integers(self.pool_size))
            if n <= self.pool_size:
                flat = pool[offset : offset + n].clone()
            else:
                reps = -(-n // self.pool_size)
                flat = pool[offset : offset + self.pool_size].repeat(reps)[:n].clone()
            k = min(n, _FRESH_VALUES)
            flat[:k] = torch.from_numpy(rng.standard_normal(k, dtype=np.float32)).to(dtype)
        elif spec.dtype == "bool":
            flat = torch.from_numpy(rng.integers(0, 2, n, dtype=np.uint8).astype(np.bool_))
        else:
            lo, hi = (0, 256) if spec.dtype == "uint8" else (-100, 101)
            flat = torch.from_numpy(rng.integers(lo, hi, n, dtype=np.int64)).to(dtype)
        return flat.view(shape)

    def text(self, name: str, spec: TextSpec, index: int) -> str:
        return make_caption(spec, index, member_rng(self.seed, index, name))

    def image(self, name: str, spec: ImageSpec, index: int) -> tuple[bytes, tuple[int, int, int]]:
        """An RGB image (smooth gradient plus blocky noise, so codecs behave as on photos) and its (H, W, 3)."""
        h, w = self.image_size(spec, index)
        rng = member_rng(self.seed, index, name)
        cell = 8
        low = rng.integers(0, 256, size=(-(-h // cell), -(-w // cell), 3), dtype=np.uint8)
        blocks = np.repeat(np.repeat(low, cell, axis=0), cell, axis=1)[:h, :w].astype(np.float32)
        yy = np.linspace(0.0, 255.0, h, dtype=np.float32)[:, None, None]
        xx = np.linspace(0.0, 255.0, w, dtype=np.float32)[None, :, None]
        tint = rng.random(3).astype(np.float32)
        pixels = (0.5 * blocks + 0.25 * yy * tint + 0.25 * xx * (1.0 - tint)).clip(0, 255).astype(np.uint8)
        buf = io.BytesIO()
        img = Image.fromarray(pixels, "RGB")
        if spec.format == "jpeg":
            img.save(buf, format="JPEG", quality=spec.quality)
        elif spec.format == "png":
            img.save(buf, format="PNG", compress_level=6)
        elif spec.format == "gif":
            img.save(buf, format="GIF")
        else:
            img.save(buf, format="WEBP", quality=spec.quality, method=4)
        return buf.getvalue(), (h, w, 3)

    def json(self, name: str, spec: JsonSpec, index: int, key: str) -> bytes:
        if spec.fields:
            fields = {field: self.leaf(f"{name}/{field}", leaf, index) for field, leaf in spec.fields.items()}
            return json.dumps({"key": key, **fields}, sort_keys=True, ensure_ascii=False).encode("utf-8")
        rng = member_rng(self.seed, index, name)
        image_members = [s for s in self.schema.members.values() if isinstance(s, ImageSpec)]
        h, w = self.image_size(image_members[0], index) if image_members else (0, 0)
        obj = {
            "key": key,
            "index": index,
            "height": h,
            "width": w,
            "aesthetic_score": round(float(rng.random()) * 10.0, 4),
            "tags": sorted(
                {str(t) for t in rng.choice(["photo", "art", "outdoor", "night", "food", "portrait"], 2)}
            ),
            "source": "synthetic",
        }
        return json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")

    def raw_bytes(self, name: str, spec: BytesSpec, index: int) -> bytes:
        if spec.dtype is not None:  # a tensor's raw bytes, no header (bf16 as uint16 pairs)
            tensor = self.tensor(name, TensorSpec(spec.shape or (), spec.dtype), index)
            return tensor.view(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        return member_rng(self.seed, index, name).bytes(spec.size)

    def array(self, name: str, spec: NpySpec, index: int) -> np.ndarray:
        """The numpy array of an npy member or leaf (the tensor it would be, as numpy; with `view`, a
        tensor of that dtype whose bytes are stored as the array's dtype)."""
        if spec.view is not None:
            tensor = self.tensor(name, TensorSpec(spec.shape, spec.view), index).contiguous()
            raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
            return np.frombuffer(raw, dtype=spec.dtype).reshape(spec.shape).copy()
        return self.tensor(name, TensorSpec(spec.shape, spec.dtype), index).numpy()

    def leaf(self, name: str, leaf: Any, index: int) -> Any:
        """The value of a pickle leaf or json field ``name`` (``member/leaf``) of sample `index`. Nested
        values draw from their own streams: an object's field ``member/leaf/field``, a list's item
        ``member/leaf/<i>``; a json string is ``json.dumps`` (keys sorted) of the document it holds."""
        if isinstance(leaf, ObjectSpec):
            return {field: self.leaf(f"{name}/{field}", s, index) for field, s in leaf.fields.items()}
        if isinstance(leaf, ListSpec):
            return [self.leaf(f"{name}/{i}", leaf.of, index) for i in range(leaf.length)]
        if isinstance(leaf, JsonStringSpec):
            document = (
                self.leaf(name, ObjectSpec(leaf.fields), index)
                if leaf.of is None
                else self.leaf(name, leaf.of, index)
            )
            return json.dumps(document, sort_keys=True, ensure_ascii=False)
        if isinstance(leaf, TensorSpec):
            return self.tensor(name, leaf, index)
        if isinstance(leaf, NpySpec):
            return self.array(name, leaf, index)
        if isinstance(leaf, TextSpec):
            return self.text(name, leaf, index)
        rng = member_rng(self.seed, index, name)
        return int(rng.integers(0, 1000)) if leaf == "int" else round(float(rng.random()) * 10.0, 6)

    def structure(self, name: str, spec: PickleSpec, index: int) -> Any:
        """The object a pickle member holds (what ``pickle.loads`` of its bytes returns)."""
        values = {leaf: self.leaf(f"{name}/{leaf}", s, index) for leaf, s in spec.leaves.items()}
        return next(iter(values.values())) if spec.structure == "value" else values

    def payload(self, name: str, spec: MemberSpec, index: int, key: str) -> Payload:
        """The clean stored form of one member."""
        if isinstance(spec, TensorSpec):
            t = self.tensor(name, spec, index)
            return Payload(tensor_bytes(t), "tensor", spec.dtype, tuple(t.shape))
        if isinstance(spec, TextSpec):
            return Payload(self.text(name, spec, index).encode("utf-8"), "text")
        if isinstance(spec, ImageSpec):
            data, shape = self.image(name, spec, index)
            return Payload(data, "image", "uint8", shape)
        if isinstance(spec, JsonSpec):
            return Payload(self.json(name, spec, index, key), "json")
        if isinstance(spec, NpySpec):
            array = self.array(name, spec, index)
            buffer = io.BytesIO()
            np.save(buffer, array, allow_pickle=False)
            return Payload(buffer.getvalue(), "npy", spec.dtype, tuple(array.shape))
        if isinstance(spec, PickleSpec):
            return Payload(pickle_bytes(self.structure(name, spec, index), spec.protocol), "pickle")
        shape = spec.shape if spec.dtype is not None else None
        return Payload(self.raw_bytes(name, spec, index), "bytes", spec.dtype, shape)
