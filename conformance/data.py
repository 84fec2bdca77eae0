"""The data a target is checked on: generated shards for its encoding (or the user's own dataset, which is
never written to), crude samples read back through Energon, and the member-to-field mapping."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from megatron.energon import DefaultTaskEncoder, stateless
from megatron.energon.task_encoder.cooking import Cooker

from primus_energon.decoding import SafeSampleDecoder
from primus_energon.energon_compat import get_val_dataset, short_loader, worker_config
from primus_energon.formats import SIZES, member_kind
from primus_energon.storage import DatasetPath, dataset_dir, dataset_path
from primus_energon.synthetic import (
    ImageSpec,
    Schema,
    TensorSpec,
    TextSpec,
    builtin_schema,
    example_schemas,
    generate_dataset,
    harmonised,
    load_schema,
)
from primus_energon.synthetic.schema import (
    NPY_DTYPES,
    TENSOR_DTYPES,
    BytesSpec,
    JsonSpec,
    MemberSpec,
    NpySpec,
    PickleSpec,
)
from primus_energon.tensorfile import read_tensor

__all__ = [
    "Workspace",
    "SMALL_SHAPES",
    "KeyReader",
    "first_leaf",
    "metadataset_leaves",
    "infer_schema",
    "is_metadataset",
    "read_crude",
]

#: Tensor shapes of the built-in preencoded format used for checks: tiny, so checks are fast.
SMALL_SHAPES = SIZES["tiny"]


@stateless
def _keep_crude(sample: dict) -> dict:
    return sample


class _CrudeReader(DefaultTaskEncoder):
    """Hands back every crude sample as Energon passes it to a cooker (after ``decoder``)."""

    cookers = [Cooker(_keep_crude)]

    def __init__(self, decoder: Any) -> None:
        super().__init__()
        self.decoder = decoder

    @stateless
    def batch(self, samples: list) -> _Untouched:
        return _Untouched(samples)


class _Untouched:
    """Carries samples through torch's DataLoader unconverted: its ``default_convert`` turns numpy arrays
    into tensors and tuples into lists inside anything it recognises, which a cooker never sees."""

    __slots__ = ("samples",)

    def __init__(self, samples: list) -> None:
        self.samples = samples


@stateless
def _basic_keys(sample: dict) -> dict:
    return {k: v for k, v in sample.items() if k.startswith("__") and k != "__sources__"}


class KeyReader(DefaultTaskEncoder):
    """The suite's pass-through reference TaskEncoder: every sample is cooked to its basic keys (no member
    is decoded or read) and every batch is the list of its keys. Built by Energon's loader with a target's
    settings, it shows the order Energon itself delivers a dataset in, whatever any TaskEncoder does."""

    cookers = [Cooker(_basic_keys)]

    def __init__(self) -> None:
        super().__init__()
        self.decoder = None

    @stateless
    def batch(self, samples: list) -> list[str]:
        return [str(s.get("__key__")) for s in samples]


#: how read_crude describes a sample Energon refused while reading (at most this many are kept)
_MAX_READ_ERRORS = 8


def read_crude(
    dataset: str | os.PathLike,
    *,
    decoded: bool = False,
    decoder: Any = None,
    split_part: str = "train",
    errors: list[str] | None = None,
) -> list[dict]:
    """Every crude sample of ``dataset`` as Energon hands it to a cooker, in dataset order.

    ``decoder``: the Energon decoder to apply first (a TaskEncoder's own ``decoder``; None: raw member
    bytes); ``decoded=True`` without a decoder: :class:`~primus_energon.decoding.SafeSampleDecoder`.
    A sample Energon refuses while reading (its decoder raised) is left out; ``errors``, when given,
    receives one line per refused sample (which sample, which error), so a caller that got nothing can say
    why."""
    if decoded and decoder is None:
        decoder = SafeSampleDecoder()
    refused: list[str] = errors if errors is not None else []

    def record(error: Exception, sample: Any, sources: Any) -> None:
        if len(refused) < _MAX_READ_ERRORS:
            key = sample.get("__key__") if isinstance(sample, dict) else getattr(sample, "__key__", None)
            where = f"sample {key!r}" if key else "a sample"
            cause = error.__cause__ or error.__context__
            text = f"{type(error).__name__}: {error}"
            if cause is not None and str(cause) not in text:
                text += f" (from {type(cause).__name__}: {cause})"
            refused.append(f"{where} of {dataset_path(dataset).name}: {' '.join(text.split())[:300]}")

    config = worker_config(rank=0, world_size=1, num_workers=0, error_handler=record)
    ds = get_val_dataset(
        str(dataset),
        split_part=split_part,
        worker_config=config,
        batch_size=1,
        task_encoder=_CrudeReader(decoder),
    )
    samples: list[dict] = []
    # Energon prints every refused sample; the errors list says what a caller needs.
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            for batch in short_loader(ds):
                samples.append(batch.samples[0])
        except Exception as error:  # e.g. FatalSampleError after 100 refused samples in a row
            refused.append(
                f"reading {dataset_path(dataset).name} stopped: {type(error).__name__}: {str(error)[:300]}"
            )
    return samples


def _dataset_subflavors(path: DatasetPath) -> dict[str, Any]:
    """The subflavors Energon gives the samples of ``path``: its ``dataset.yaml``'s; for a metadataset, those
    of the first dataset its train split blends, overridden by the metadataset's (as Energon merges them)."""
    if is_metadataset(path):
        leaf = first_leaf(path)
        return {**_dataset_subflavors(leaf.path), **leaf.subflavors}
    meta = dataset_path(path) / ".nv-meta" / "dataset.yaml"
    config = yaml.safe_load(meta.read_text(encoding="utf-8")) if meta.exists() else {}
    return dict((config or {}).get("subflavors") or {})


def is_metadataset(dataset: str | os.PathLike | None) -> bool:
    """Whether ``dataset`` names an Energon metadataset (a ``.yaml``/``.yml`` file), not a dataset directory."""
    return dataset is not None and str(dataset).endswith((".yaml", ".yml"))


def metadataset_leaves(dataset: str | os.PathLike, split: str = "train") -> list[Any]:
    """The datasets (:class:`~primus_energon.datasets.metadataset.Leaf`) a metadataset's ``split``
    blends, nested metadatasets resolved as ``primus-energon validate`` resolves them. A metadataset that
    does not resolve raises ``ValueError`` with the resolver's problems."""
    from primus_energon.datasets.metadataset import resolve_metadataset

    _, leaves, problems = resolve_metadataset(dataset)
    unreadable = [p for p in problems if p.code in ("bad-metadataset", "missing-path")]
    if unreadable:
        raise ValueError(
            f"metadataset {str(dataset)!r} does not resolve: "
            + "; ".join(p.message for p in unreadable[:3])
            + (f" (and {len(unreadable) - 3} more)" if len(unreadable) > 3 else "")
            + f"; `primus-energon validate {dataset}` lists every problem"
        )
    return [leaf for leaf in leaves if leaf.split == split]


def first_leaf(dataset: str | os.PathLike, split: str = "train") -> Any:
    """The first dataset a metadataset's ``split`` blends (see :func:`metadataset_leaves`); the format of
    a user's metadataset is inferred from it."""
    leaves = metadataset_leaves(dataset, split)
    if leaves:
        return leaves[0]
    raise ValueError(f"metadataset {str(dataset)!r} blends no dataset into its {split!r} split")


def infer_schema(dataset: str | os.PathLike) -> Schema:
    """A schema that describes the first sample of a user's dataset (member kinds, tensor shapes/dtypes),
    so that variants of the user's own format can be generated. For a metadataset: of the first dataset
    its train split blends (:func:`first_leaf`)."""
    from primus_energon.datasets.metadata import list_shard_files
    from primus_energon.datasets.tarscan import TarReader, open_shard

    if is_metadataset(dataset):
        dataset = first_leaf(dataset).path
    path = dataset_dir(dataset)  # local or remote; the first shard is read with the validator's tar reader
    shards, _ = list_shard_files(path)
    if not shards:
        raise ValueError(f"{str(path)!r} has no .tar shards")
    members: dict[str, MemberSpec] = {}
    first_key = None
    data = open_shard(path / shards[0])
    try:
        for member, payload in TarReader(data):
            if member.key is None or member.part is None or payload is None:
                continue
            if first_key is None:
                first_key = member.key
            if member.key != first_key:
                break
            members[member.part] = _spec_for(member.part, bytes(payload))
    finally:
        close = getattr(data, "close", None)
        if close is not None:
            with contextlib.suppress(BufferError):
                close()
    encoding = str(_dataset_subflavors(path).get("encoding", "custom"))
    return Schema(encoding=encoding, members=members)


def _spec_for(member: str, data: bytes) -> MemberSpec:
    """The spec of one member of a user's sample, from its kind and content (read safely)."""
    import numpy as np

    from primus_energon.safepickle import safe_loads

    kind, extension = member_kind(member), member.rsplit(".", 1)[-1].lower()
    if bytes(data[:6]) == b"\x93NUMPY":
        kind = "npy"  # an .npy file under another name (MLPerf's FLUX data: t5.bytes)
    try:
        if kind == "tensor":
            tensor = read_tensor(data, copy=True, fallback=True)
            return TensorSpec(tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
        if kind == "npy":
            array = np.load(io.BytesIO(data), allow_pickle=False)
            if str(array.dtype) in NPY_DTYPES:
                return NpySpec(tuple(array.shape) or (1,), str(array.dtype))
        if kind == "pickle":
            value = safe_loads(data)
            if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
                leaves = {k: _leaf_spec(v) for k, v in value.items()}
                if all(leaf is not None for leaf in leaves.values()):
                    return PickleSpec(leaves)
            leaf = _leaf_spec(value)
            if leaf is not None:
                return PickleSpec({"value": leaf}, structure="value")
        if kind == "json":
            document = json.loads(bytes(data))
            if isinstance(document, dict):
                fields = {k: _json_leaf(v) for k, v in document.items() if k != "key"}
                return JsonSpec({k: v for k, v in fields.items() if v is not None})
            return JsonSpec()
        if kind == "text":
            return TextSpec()
        if kind == "image" and extension in ("jpg", "jpeg", "png", "webp"):
            from PIL import Image

            with Image.open(io.BytesIO(data)) as image:
                return ImageSpec(
                    (image.height, image.width), format={"jpg": "jpeg"}.get(extension, extension)
                )
    except Exception:  # an unreadable first sample: describe the member as opaque bytes of its size
        pass
    return BytesSpec(max(1, len(data)))


def _leaf_spec(value: Any) -> Any:
    """The spec of one leaf of a pickled structure, or None when the generator cannot write it."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return TensorSpec(tuple(value.shape) or (1,), dtype) if dtype in TENSOR_DTYPES else None
    if isinstance(value, np.ndarray):
        dtype = str(value.dtype)
        return NpySpec(tuple(value.shape) or (1,), dtype) if dtype in NPY_DTYPES else None
    if isinstance(value, str):
        return TextSpec()
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return None


def _json_leaf(value: Any) -> Any:
    if isinstance(value, str):
        return TextSpec()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return "int" if isinstance(value, int) else "float"


@dataclass
class Workspace:
    """Datasets for checking targets, generated on first use under ``root`` and reused.

    ``dataset``: a user's prepared dataset; it is read, never written (variants are generated in the
    user's format, inferred from its first sample, under ``root``). ``schema_files``: the user's formats
    (``--conformance-schema``, repeatable). Otherwise an encoding is generated from the built-in
    formats or the shipped example schemas (:func:`primus_energon.synthetic.example_schemas`). ``together``: the formats
    one target cooks; their shared tensor fields get one shape and dtype (:func:`primus_energon.synthetic.harmonised`),
    so their samples can meet in a batch.
    """

    root: Path
    seed: int = 0
    schema_files: tuple[str, ...] = ()
    dataset: str | None = None
    together: tuple[str | None, ...] = ()
    _cache: dict[str, Path] = field(default_factory=dict)
    _schemas: dict[Any, Schema] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.schema_files, (str, os.PathLike)):
            self.schema_files = (str(self.schema_files),)
        self.schema_files = tuple(str(f) for f in self.schema_files or ())

    def user_schemas(self) -> list[Schema]:
        """The schemas of ``--conformance-schema``, in the order given."""
        if "user" not in self._schemas:
            self._schemas["user"] = [load_schema(f) for f in self.schema_files]
        return self._schemas["user"]

    def knows(self, encoding: str | None) -> bool:
        """Whether data of ``encoding`` can be generated (built in, a shipped example, or a user schema)."""
        return (
            encoding is None
            or encoding in ("preencoded", "raw")
            or encoding in example_schemas()
            or any(s.encoding == encoding for s in self.user_schemas())
        )

    def source(self, encoding: str | None) -> str:
        """Where the format of ``encoding`` comes from, for the report."""
        if self.dataset:
            return f"inferred from {self.dataset}"
        for path, schema in zip(self.schema_files, self.user_schemas(), strict=True):
            if schema.encoding == encoding or encoding is None:
                return f"schema {path}"
        if encoding in (None, "preencoded", "raw"):
            return "built in"
        return (
            f"example schema {example_schemas()[encoding].name}"
            if encoding in example_schemas()
            else "unknown"
        )

    def schema(self, encoding: str | None, *, dtype: str | None = None) -> Schema:
        """The schema to generate for ``encoding`` (the user dataset's, a schema file's, a built-in or an
        example one), harmonised with the other formats in ``together`` (a ``dtype`` variant is not: it is
        checked on its own)."""
        key = (encoding, dtype)
        if key not in self._schemas:
            schema = self._base(encoding, dtype)
            others = [e for e in self.together if e != encoding]
            if dtype is None and not self.dataset and encoding in self.together and others:
                group = [schema if e == encoding else self._base(e, None) for e in self.together]
                schema = harmonised(group)[self.together.index(encoding)]
            self._schemas[key] = schema
        return self._schemas[key]

    def _base(self, encoding: str | None, dtype: str | None) -> Schema:
        if self.dataset:
            return infer_schema(self.dataset)
        users = self.user_schemas()
        if users:
            return next((s for s in users if s.encoding == encoding), users[0])
        encoding = encoding or "preencoded"
        if encoding == "preencoded":
            return builtin_schema("preencoded", shapes=SMALL_SHAPES, dtype=dtype)
        if encoding == "raw":
            return builtin_schema("raw", image_format="png", image_size=(24, 32))
        examples = example_schemas()
        if encoding in examples:
            return load_schema(examples[encoding])
        raise ValueError(
            f"no data for encoding {encoding!r}: the suite knows the built-in encodings preencoded and raw and "
            f"the example formats {', '.join(sorted(examples))}; pass --conformance-schema FILE describing the "
            f"format (with `encoding: {encoding}`), or --conformance-dataset PATH with data in it"
        )

    def generated(
        self, encoding: str | None, variant: str = "main", *, schema: Schema | None = None, **options: Any
    ) -> Path:
        """A generated dataset of ``encoding`` (or of ``schema``); ``variant`` and ``options`` (num_samples,
        faults, dtype, ...) name it. Same arguments, same dataset (generated once)."""
        options = {"num_samples": 48, "shard_size": 8, **options}
        dtype = options.pop("dtype", None)
        schema = schema or self.schema(encoding, dtype=dtype)
        ident = hashlib.sha256(repr((schema.to_dict(), variant, sorted(options.items()), self.seed)).encode())
        name = f"{schema.encoding}-{variant}-{ident.hexdigest()[:10]}"
        if name not in self._cache:
            out = self.root / name
            if not (out / "manifest.json").exists():
                options.setdefault("key_prefix", re.sub(r"[^A-Za-z0-9]", "", variant)[:12] or "s")
                generate_dataset(
                    out, schema=schema, seed=self.seed, overwrite=True, distributed=False, **options
                )
            self._cache[name] = out
        return self._cache[name]

    def generated_note(self, layout: str, why: str) -> str:
        """On a user's dataset (``--conformance-dataset``), what a claim checked on generated data says: the
        data is generated in the user's format (``layout``: its samples and shards) because ``why``; else ""."""
        if not self.dataset:
            return ""
        return (
            f"checked on generated data in the format of {self.dataset} ({layout}), not on the dataset itself: "
            f"{why}"
        )

    def main(self, encoding: str | None) -> DatasetPath:
        """The clean dataset checks run on: the user's ``--dataset`` (local or remote), else a generated one."""
        return dataset_path(self.dataset) if self.dataset else self.generated(encoding)

    def subflavors(self, path: DatasetPath) -> dict[str, Any]:
        return _dataset_subflavors(path)

    def members(self, encoding: str | None) -> Mapping[str, MemberSpec]:
        return self.schema(encoding).members

    def metadataset(
        self, name: str, entries: list[tuple[Path, float, dict[str, Any]]], *, legacy: bool = False
    ) -> Path:
        from primus_energon.synthetic import write_metadataset

        return write_metadataset(self.root / f"{name}.yaml", entries, legacy=legacy)
