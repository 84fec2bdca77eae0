"""The data a target is checked on: the user's own dataset (never written to) and datasets derived from
its samples, or generated shards of a known format; member kinds told by name and content; crude samples
read back through Energon."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from megatron.energon import DefaultTaskEncoder, stateless
from megatron.energon.task_encoder.cooking import Cooker

from primus_energon.decoding import SafeSampleDecoder
from primus_energon.energon_compat import get_val_dataset, short_loader, worker_config
from primus_energon.formats import SIZES, member_kind, sniff_kind
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
    infer_json_spec,
    load_schema,
)
from primus_energon.synthetic.schema import (
    NPY_DTYPES,
    TENSOR_DTYPES,
    BytesSpec,
    ListSpec,
    MemberSpec,
    NpySpec,
    ObjectSpec,
    PickleSpec,
)
from primus_energon.tensorfile import read_tensor

from ..core.rendering import describe_error

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


#: Datasets are derived from at most this many of a user's samples, holding about this many bytes of
#: members (the largest dataset a check needs has 64 samples; more are repeats).
MAX_SOURCE_SAMPLES = 64
MAX_SOURCE_BYTES = 256 << 20


def _prefix(variant: str) -> str:
    """The key prefix of a variant's samples (letters and digits of its name)."""
    return re.sub(r"[^A-Za-z0-9]", "", variant)[:12] or "s"


#: how read_crude describes a sample Energon refused while reading (at most this many are kept)
_MAX_READ_ERRORS = 8


def read_crude(
    dataset: str | os.PathLike,
    *,
    decoded: bool = False,
    decoder: Any = None,
    split_part: str = "train",
    errors: list[str] | None = None,
    limit: int | None = None,
    max_bytes: int | None = None,
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
            text = f"{describe_error(error)}"
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
            held = 0
            for batch in short_loader(ds):
                samples.append(batch.samples[0])
                if max_bytes is not None:
                    held += sum(
                        len(v) for v in batch.samples[0].values() if isinstance(v, (bytes, bytearray))
                    )
                if (limit is not None and len(samples) >= limit) or (
                    max_bytes is not None and held >= max_bytes
                ):
                    break
        except Exception as error:  # e.g. FatalSampleError after 100 refused samples in a row
            refused.append(f"reading {dataset_path(dataset).name} stopped: {describe_error(error, 300)}")
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
    """A schema that describes the first sample of a user's dataset (member kinds by name and content,
    tensor shapes/dtypes), so that checks know what each member holds. For a metadataset: of the first
    dataset its train split blends (:func:`first_leaf`)."""
    if is_metadataset(dataset):
        dataset = first_leaf(dataset).path
    members = {part: _spec_for(part, payload) for part, payload in _first_sample_members(dataset).items()}
    encoding = str(_dataset_subflavors(dataset_dir(dataset)).get("encoding", "custom"))
    return Schema(encoding=encoding, members=members)


def _first_sample_members(dataset: str | os.PathLike) -> dict[str, bytes]:
    """The members of the first sample of a dataset's first shard (of a metadataset's first dataset), as
    bytes, read with the validator's bounded tar reader (local or remote)."""
    from primus_energon.datasets.metadata import list_shard_files
    from primus_energon.datasets.tarscan import TarReader, open_shard

    if is_metadataset(dataset):
        dataset = first_leaf(dataset).path
    path = dataset_dir(dataset)
    shards, _ = list_shard_files(path)
    if not shards:
        raise ValueError(f"{str(path)!r} has no .tar shards")
    members: dict[str, bytes] = {}
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
            members[member.part] = bytes(payload)
    finally:
        close = getattr(data, "close", None)
        if close is not None:
            with contextlib.suppress(BufferError):
                close()
    return members


def _spec_for(member: str, data: bytes) -> MemberSpec:
    """The spec of one member of a user's sample, from its name and its content (read safely).

    A binary signature in the bytes (:func:`primus_energon.formats.sniff_kind`: ``.npy``, ``torch.save``,
    a pickle, an image) is tried first, then the kind the member's extension says, then a textual
    signature (JSON, UTF-8): so an ``.npy`` file named ``t5.bytes`` is an array and a JPEG named ``image``
    an image, while a caption ``.txt`` that happens to parse as JSON stays text. Each guess is confirmed
    by decoding the member; a member nothing decodes is opaque bytes of its size."""
    by_name = member_kind(member)
    sniffed = sniff_kind(data)
    content, detail = sniffed if sniffed is not None else (None, None)
    candidates: list[str] = []
    if content in ("npy", "tensor", "pickle", "image"):
        candidates.append(content)
    if by_name != "bytes":
        candidates.append(by_name)
    if content in ("json", "text"):
        candidates.append(content)
    for kind in dict.fromkeys(candidates):
        try:
            spec = _spec_of_kind(kind, member, bytes(data), detail if kind == content else None)
        except Exception:  # the guess does not decode: try the next one
            continue
        if spec is not None:
            return spec
    return BytesSpec(max(1, len(data)))


def _spec_of_kind(kind: str, member: str, data: bytes, image_format: str | None) -> MemberSpec | None:
    """The spec of a member read as ``kind``; raises (or returns None) when it does not read so."""
    import numpy as np

    from primus_energon.safepickle import safe_loads

    if kind == "tensor":
        tensor = read_tensor(data, copy=True, fallback=True)
        return TensorSpec(tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
    if kind == "npy":
        array = np.load(io.BytesIO(data), allow_pickle=False)
        return (
            NpySpec(tuple(array.shape) or (1,), str(array.dtype)) if str(array.dtype) in NPY_DTYPES else None
        )
    if kind == "pickle":
        value = safe_loads(data)
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            leaves = {k: _leaf_spec(v) for k, v in value.items()}
            if all(leaf is not None for leaf in leaves.values()):
                return PickleSpec(leaves)
        leaf = _leaf_spec(value)
        return PickleSpec({"value": leaf}, structure="value") if leaf is not None else None
    if kind == "json":
        return infer_json_spec(json.loads(data))
    if kind == "text":
        data.decode("utf-8")
        return TextSpec()
    if kind == "image":
        from PIL import Image

        extension = member.rsplit(".", 1)[-1].lower()
        # Pillow parses the header here, and decodes no pixel: a huge image costs nothing to describe.
        with Image.open(io.BytesIO(data)) as image:
            found = (image.format or "").lower()
            size = (image.height, image.width)
        image_format = image_format or {"jpg": "jpeg"}.get(extension, extension)
        image_format = found if found in ("jpeg", "png", "webp", "gif") else image_format
        if image_format not in ("jpeg", "png", "webp", "gif"):
            return None
        return ImageSpec(size, format=image_format)
    return None


def refined(inferred: Schema, schema: Schema, schema_file: str, dataset: str | os.PathLike) -> Schema:
    """The format of a user's dataset as inferred from its first sample, refined by the user's schema
    file: each member the schema describes takes the schema's spec (its kind, output ``field:``, leaves,
    views), its ``required:`` list applies, every other member keeps what was inferred. Raises
    ``ValueError`` (one line: what and where) when the two disagree: a member the dataset's samples do not
    have, an encoding other than the dataset's, or a member whose bytes do not read as the schema says."""
    from ..oracles.expectations import decode_member

    where = f"--conformance-schema {schema_file} with --conformance-dataset {dataset}"
    unknown = [m for m in schema.members if m not in inferred.members]
    if unknown:
        raise ValueError(
            f"{where}: the schema describes member(s) {unknown} that the dataset's samples do not have (they "
            f"have {list(inferred.members)}); describe only members of the dataset, by their exact names"
        )
    if inferred.encoding != "custom" and schema.encoding != inferred.encoding:
        raise ValueError(
            f"{where}: the schema's encoding {schema.encoding!r} is not the dataset's ({inferred.encoding!r}, "
            "from its dataset.yaml subflavors); use the dataset's encoding in the schema"
        )
    first = _first_sample_members(dataset)
    for member, spec in schema.members.items():
        try:
            decode_member(spec, first[member])
        except Exception as error:
            raise ValueError(
                f"{where}: member {member!r} of the dataset's first sample does not read as the schema's "
                f"{spec.kind} ({describe_error(error, 200)}); describe what the "
                "member holds"
            ) from None
    missing_required = [m for m in schema.required if m not in inferred.members]
    if missing_required:
        raise ValueError(f"{where}: required member(s) {missing_required} are not in the dataset's samples")
    members = {m: schema.members.get(m, spec) for m, spec in inferred.members.items()}
    return Schema(
        encoding=inferred.encoding,
        members=members,
        subflavors=dict(inferred.subflavors),
        required=tuple(schema.required),
    )


#: nesting of a pickled structure followed when its spec is inferred
MAX_LEAF_DEPTH = 8


def _leaf_spec(value: Any, depth: int = 0) -> Any:
    """The spec of one value of a pickled structure, or None when the generator cannot write it: a tensor,
    an array, text or a number; a dict of such values (nested); a list whose items share one spec (a list of
    tensors of one shape, of dicts alike). A list of items of different specs is not described (the member
    stays opaque bytes)."""
    import numpy as np
    import torch

    if depth > MAX_LEAF_DEPTH:
        return None
    if isinstance(value, dict):
        if not value or not all(isinstance(k, str) for k in value):
            return None
        fields = {k: _leaf_spec(v, depth + 1) for k, v in value.items()}
        return ObjectSpec(fields) if all(f is not None for f in fields.values()) else None
    if isinstance(value, (list, tuple)):
        items = [_leaf_spec(v, depth + 1) for v in value]
        if not items or any(i is None for i in items) or any(i != items[0] for i in items[1:]):
            return None
        return ListSpec(items[0], len(items))

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


@dataclass
class Workspace:
    """Datasets for checking targets, made on first use under ``root`` and reused.

    ``dataset``: a user's prepared dataset; it is read, never written: every other dataset a check needs
    is derived from its samples under ``root`` (:meth:`derived`), its format inferred from its first
    sample by name and content and refined by a ``schema_files`` entry where one is given.
    ``schema_files``: without a dataset, the user's formats (``--conformance-schema``, repeatable). Otherwise an encoding is generated from the built-in
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
    #: the datasets derived from the user's samples so far (variant, path, samples, from_samples, ...)
    derivations: list[dict[str, Any]] = field(default_factory=list)
    _derived: dict[str, Any] = field(default_factory=dict, repr=False)
    #: keep every dataset to the end (``--conformance-keep-data``), else :meth:`finished` removes them
    keep: bool = False
    #: the property asking for datasets now (:meth:`owned_by`); a dataset asked for by none is kept all run
    owner: str | None = None
    #: dataset name -> the properties that asked for it ("" for none: kept)
    _users: dict[str, set[str]] = field(default_factory=dict, repr=False)
    _done: set[str] = field(default_factory=set, repr=False)

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
            if self.schema_files:
                return f"inferred from {self.dataset}, refined by schema {self.schema_files[0]}"
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
            inferred = infer_schema(self.dataset)
            users = self.user_schemas()
            if len(users) > 1:
                raise ValueError(
                    f"--conformance-dataset {self.dataset} has one format; give at most one --conformance-schema "
                    f"FILE to refine it (got {len(users)})"
                )
            return refined(inferred, users[0], self.schema_files[0], self.dataset) if users else inferred
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

    @contextlib.contextmanager
    def owned_by(self, property_id: str) -> Any:
        """Datasets asked for inside the block are property ``property_id``'s (see :meth:`finished`)."""
        previous, self.owner = self.owner, property_id
        try:
            yield
        finally:
            self.owner = previous

    def _use(self, name: str) -> None:
        self._users.setdefault(name, set()).add(self.owner or "")

    def finished(self, property_id: str) -> list[Path]:
        """Property ``property_id`` is done: remove every dataset that only finished properties asked for
        (written when a check needs it, removed when the checks that need it end; asked for again, it is
        made again, byte for byte). Returns the folders removed."""
        self._done.add(property_id)
        removed: list[Path] = []
        if self.keep:
            return removed
        for name, users in list(self._users.items()):
            if "" in users or not users <= self._done:
                continue
            del self._users[name]
            path = self._cache.pop(name, None)
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        return removed

    def generated(
        self,
        encoding: str | None,
        variant: str = "main",
        *,
        schema: Schema | None = None,
        derive: bool = True,
        **options: Any,
    ) -> Path:
        """A dataset of ``encoding`` for one check; ``variant`` and ``options`` (num_samples, shard_size,
        faults, dtype, split, key_prefix) name it. Same arguments, same dataset (made once).

        With a user's dataset (``dataset``), the dataset is **derived** from the user's own samples
        (:meth:`derived`), never generated, unless ``derive=False`` (a check that needs the suite's own
        format whatever the user's is, e.g. the wrapper's keys); otherwise it is generated from ``schema``
        or the format's schema."""
        if self.dataset and derive:
            return self.derived(variant, **options)
        options = {"num_samples": 48, "shard_size": 8, **options}
        dtype = options.pop("dtype", None)
        schema = schema or self.schema(encoding, dtype=dtype)
        ident = hashlib.sha256(repr((schema.to_dict(), variant, sorted(options.items()), self.seed)).encode())
        name = f"{schema.encoding}-{variant}-{ident.hexdigest()[:10]}"
        self._use(name)
        if name not in self._cache:
            out = self.root / name
            if not (out / "manifest.json").exists():
                options.setdefault("key_prefix", _prefix(variant))
                generate_dataset(
                    out, schema=schema, seed=self.seed, overwrite=True, distributed=False, **options
                )
            self._cache[name] = out
        return self._cache[name]

    def sources(self) -> list[dict]:
        """The user's samples datasets are derived from: the first samples of the train split of the
        user's dataset (of the first dataset a metadataset's train split blends) that hold every member
        of its format, as raw member bytes, at most :data:`MAX_SOURCE_SAMPLES` of them and about
        :data:`MAX_SOURCE_BYTES` of members. Raises ``ValueError`` (saying why) when there is none."""
        if "sources" not in self._derived:
            if not self.dataset:
                raise ValueError("there is no user dataset to derive from")
            path = first_leaf(self.dataset).path if is_metadataset(self.dataset) else self.dataset
            errors: list[str] = []
            samples = read_crude(path, errors=errors, limit=MAX_SOURCE_SAMPLES, max_bytes=MAX_SOURCE_BYTES)
            members = list(self.schema(None).members)
            usable = [s for s in samples if all(isinstance(s.get(m), (bytes, bytearray)) for m in members)]
            if not usable:
                why = "; ".join(errors[:3]) or (
                    f"none of its first {len(samples)} sample(s) holds every member {members}"
                    if samples
                    else "its train split yielded no sample"
                )
                raise ValueError(f"no sample of {self.dataset} could be read to derive datasets from: {why}")
            self._derived["sources"] = [
                {k: v for k, v in s.items() if k == "__key__" or not k.startswith("__")} for s in usable
            ]
        return self._derived["sources"]

    def derived(self, variant: str, **options: Any) -> Path:
        """A dataset derived from the user's own samples (:meth:`sources`) by
        :func:`~primus_energon.synthetic.derive_dataset`: copied, re-keyed ``<variant>_<index>``,
        resharded and repeated to ``num_samples``, in the user's exact format and subflavors; faults and
        dtype variants are edits of real members. Same arguments, same dataset (made once)."""
        from primus_energon.synthetic import derive_dataset

        options = {"num_samples": 48, "shard_size": 8, **options}
        options.setdefault("key_prefix", _prefix(variant))
        sources = self.sources()
        schema = self.schema(None)
        leaf = first_leaf(self.dataset).path if is_metadataset(self.dataset) else self.dataset
        identity = (
            str(self.dataset),
            [s["__key__"] for s in sources],
            variant,
            sorted(options.items()),
            self.seed,
        )
        name = (
            f"{schema.encoding}-{variant}-derived-{hashlib.sha256(repr(identity).encode()).hexdigest()[:10]}"
        )
        self._use(name)
        if name not in self._cache:
            out = self.root / name
            if not (out / "manifest.json").exists():
                if out.exists():
                    shutil.rmtree(out)
                derive_dataset(
                    out,
                    sources,
                    schema=schema,
                    subflavors=_dataset_subflavors(dataset_path(leaf)),
                    seed=self.seed,
                    source=str(self.dataset),
                    **options,
                )
            self._cache[name] = out
            if not self.is_derived(out):
                self.derivations.append(
                    {
                        "variant": variant,
                        "path": str(out),
                        "samples": options["num_samples"],
                        "from_samples": min(len(sources), options["num_samples"]),
                        "faults": dict(options.get("faults") or {}),
                        "dtype": options.get("dtype"),
                    }
                )
        return self._cache[name]

    def is_derived(self, path: str | os.PathLike) -> bool:
        """Whether ``path`` is a dataset this workspace derived from the user's samples."""
        return any(d["path"] == str(path) for d in self.derivations)

    def generated_note(self, layout: str, why: str) -> str:
        """On a user's dataset (``--conformance-dataset``), what a claim checked on a derived dataset says:
        the dataset is the user's own samples re-keyed and resharded (``layout``: its samples and shards)
        because ``why``; else ""."""
        if not self.dataset:
            return ""
        count = len(self.sources())
        return (
            f"checked on a dataset derived from {count} of your samples of {self.dataset} ({layout}; your "
            f"samples copied, re-keyed and resharded), not on the dataset itself: {why}"
        )

    def main(self, encoding: str | None) -> DatasetPath:
        """The clean dataset checks run on: the user's ``--dataset`` (local or remote), else a generated one."""
        if self.dataset:
            return dataset_path(self.dataset)
        with self.owned_by(""):  # every check reads it: kept all run
            return self.generated(encoding)

    def subflavors(self, path: DatasetPath) -> dict[str, Any]:
        return _dataset_subflavors(path)

    def members(self, encoding: str | None) -> Mapping[str, MemberSpec]:
        return self.schema(encoding).members

    def metadataset(
        self, name: str, entries: list[tuple[Path, float, dict[str, Any]]], *, legacy: bool = False
    ) -> Path:
        from primus_energon.synthetic import write_metadataset

        return write_metadataset(self.root / f"{name}.yaml", entries, legacy=legacy)
