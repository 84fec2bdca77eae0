"""What a sample contains: member names mapped to member specs, plus the dataset's encoding subflavor.

A `Schema` is the single description the generator works from. The built-in encodings (`preencoded`, `raw`)
are schemas too (`builtin_schema`), and a custom format is one YAML or JSON file (`load_schema`)::

    encoding: custom_v2
    members:
      vae_output.pth: {kind: tensor, shape: [16, 8, 8], dtype: bfloat16, bucketed: true}
      text_embed.pth: {kind: tensor, shape: [77, 64]}
      clip_embed.pth: {kind: tensor, shape: [768]}
      caption.txt: {kind: text}

Member names are the tar member suffix exactly as Energon's crude sample dict keys them (``"latents.pth"``,
``"jpg"``). `kind` may be left out when the extension says it (``.pth``/``.pt`` tensor, ``.txt`` text,
``.json`` json, ``jpg``/``jpeg``/``png``/``webp`` image, anything else bytes).

A JSON member's `fields` (and a pickle's `leaves`) may nest: ``{kind: object, fields: {...}}``, ``{kind: list,
of: <spec>, length: N}`` and ``{kind: json_string, fields: {...}}`` (a string holding a JSON document, as
datasets store caption sets). `infer_json_spec` describes a JSON document a user's dataset holds.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from os import PathLike
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import yaml

from primus_energon.formats import (
    BUILTIN_ENCODINGS,
    PREENCODED_CAPTION_MEMBER,
    PREENCODED_TENSOR_MEMBERS,
    RAW_TEXT_MEMBER,
    SIZES,
    member_extension,
    member_kind,
    member_stem,
)

from .errors import SyntheticError

__all__ = [
    "BUILTIN_ENCODINGS",
    "DEFAULT_BUCKETS",
    "FLOAT_DTYPES",
    "IMAGE_FORMATS",
    "NPY_DTYPES",
    "TENSOR_DTYPES",
    "BytesSpec",
    "ImageSpec",
    "JsonSpec",
    "JsonStringSpec",
    "ListSpec",
    "MAX_JSON_DEPTH",
    "MAX_JSON_FIELDS",
    "MemberSpec",
    "ObjectSpec",
    "NpySpec",
    "PickleSpec",
    "Schema",
    "TensorSpec",
    "TextSpec",
    "EXAMPLES_DIR",
    "builtin_schema",
    "example_schemas",
    "harmonised",
    "infer_json_spec",
    "load_schema",
]

FLOAT_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16", "float64")
TENSOR_DTYPES: tuple[str, ...] = FLOAT_DTYPES + ("int64", "int32", "int16", "int8", "uint8", "bool")
#: numpy arrays: no bfloat16 (numpy has none), and uint16 (how MLPerf's FLUX data stores bfloat16)
NPY_DTYPES: tuple[str, ...] = tuple(d for d in TENSOR_DTYPES if d != "bfloat16") + ("uint16",)
#: member extension -> Pillow format name
IMAGE_FORMATS: Mapping[str, str] = MappingProxyType(
    {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}
)
#: (height scale, width scale) per resolution bucket; bucket 0 is the schema's own size
DEFAULT_BUCKETS: tuple[tuple[float, float], ...] = (
    (1.0, 1.0),
    (0.75, 1.25),
    (1.25, 0.75),
    (0.5, 1.5),
    (1.5, 0.5),
)

# A member name becomes the part after `<key>.` in the tar; Energon skips names matching `__...__`.
# A leading dot is allowed: NeMo's prepare script writes members ".pth", ".pickle", ".json" (tar names
# "<key>..pth"), which Energon's crude dict keys exactly so.
_MEMBER_NAME_RE = re.compile(r"^\.?[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENCODING_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor written with ``torch.save``. `bucketed`: its last two dims follow the sample's resolution bucket."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    bucketed: bool = False
    field: str | None = None
    kind: ClassVar[str] = "tensor"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind, "shape": list(self.shape), "dtype": self.dtype, "bucketed": self.bucketed}
        return _with_field(out, self.field)


def _with_field(out: dict[str, Any], field_name: str | None) -> dict[str, Any]:
    if field_name is not None:
        out["field"] = field_name
    return out


@dataclass(frozen=True)
class NpySpec:
    """A numpy array written with ``np.save`` (never with pickled objects). `view`: the dtype its bytes
    hold when numpy cannot (MLPerf's FLUX data: bfloat16 stored as a uint16 array, read back with
    ``torch.from_numpy(array).view(torch.bfloat16)``)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    field: str | None = None
    view: str | None = None
    kind: ClassVar[str] = "npy"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "shape": list(self.shape), "dtype": self.dtype}
        if self.view is not None:
            out["view"] = self.view
        return _with_field(out, self.field)


@dataclass(frozen=True)
class TextSpec:
    """UTF-8 caption text. Odd-indexed samples get non-ASCII words, every `long_every`-th one a long caption."""

    min_words: int = 4
    max_words: int = 24
    non_ascii: bool = True
    long_every: int = 8
    long_words: int = 300
    field: str | None = None
    kind: ClassVar[str] = "text"

    def to_dict(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "min_words": self.min_words,
            "max_words": self.max_words,
            "non_ascii": self.non_ascii,
            "long_every": self.long_every,
            "long_words": self.long_words,
        }
        return _with_field(out, self.field)


@dataclass(frozen=True)
class ImageSpec:
    """An RGB image encoded by Pillow. `size` is (height, width); `format` comes from the member extension."""

    size: tuple[int, int] = (32, 32)
    format: str = "jpeg"
    quality: int = 90
    field: str | None = None
    kind: ClassVar[str] = "image"

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", tuple(self.size))

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind, "size": list(self.size), "format": self.format, "quality": self.quality}
        return _with_field(out, self.field)


@dataclass(frozen=True)
class JsonSpec:
    """A UTF-8 JSON object. Without `fields`, metadata (key, index, size, score, tags); with them, the key
    and exactly those fields: name -> a value spec (``text``, ``int``/``float`` numbers, or `ObjectSpec`,
    `ListSpec`, `JsonStringSpec`, nested at most `MAX_JSON_DEPTH` deep)."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    field: str | None = None
    kind: ClassVar[str] = "json"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.fields:
            out["fields"] = {k: _leaf_to_dict(v) for k, v in self.fields.items()}
        return _with_field(out, self.field)


@dataclass(frozen=True)
class ObjectSpec:
    """A nested object: name -> a value spec (``text``, ``int``, ``float``, `ObjectSpec`, `ListSpec`,
    `JsonStringSpec`; inside a pickle also tensor and npy specs). Written as a JSON object, or a dict in a
    pickle. `field:` belongs on its leaves, not on the object."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    kind: ClassVar[str] = "object"
    field: ClassVar[None] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "fields": {k: _leaf_to_dict(v) for k, v in self.fields.items()}}


@dataclass(frozen=True)
class ListSpec:
    """`length` values of one value spec `of` (``int``, ``float``, ``text``, or a nested spec; each item
    drawn on its own). A list of text or numbers is one value (`field:` may name its output field); a
    list of other items is checked item by item."""

    of: Any = None
    length: int = 0
    field: str | None = None
    kind: ClassVar[str] = "list"

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind, "of": _leaf_to_dict(self.of), "length": self.length}
        return _with_field(out, self.field)


@dataclass(frozen=True)
class JsonStringSpec:
    """A string that holds a JSON document (``json.dumps``, keys sorted): an object of `fields`, as datasets
    store caption sets (``"captions": "{\\"short\\": ..., \\"long\\": ...}"``), or with `of` any other JSON
    value spec (a list, a number). Its leaves are read by parsing the string."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    of: Any = None
    kind: ClassVar[str] = "json_string"
    field: ClassVar[None] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    def to_dict(self) -> dict[str, Any]:
        if self.of is not None:
            return {"kind": self.kind, "of": _leaf_to_dict(self.of)}
        return {"kind": self.kind, "fields": {k: _leaf_to_dict(v) for k, v in self.fields.items()}}


@dataclass(frozen=True)
class PickleSpec:
    """A pickled structure, as DFM and NeMo write: a dict of `leaves` (name -> tensor, npy, text, int,
    float, or nested object/list/json_string specs; tensors are torch tensors, npy leaves numpy arrays), or
    with ``structure="value"`` the one leaf itself."""

    leaves: Mapping[str, Any] = field(default_factory=dict)
    structure: str = "dict"
    protocol: int = 4
    field: str | None = None
    kind: ClassVar[str] = "pickle"

    def __post_init__(self) -> None:
        object.__setattr__(self, "leaves", MappingProxyType(dict(self.leaves)))

    def to_dict(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "structure": self.structure,
            "protocol": self.protocol,
            "leaves": {k: _leaf_to_dict(v) for k, v in self.leaves.items()},
        }
        return _with_field(out, self.field)


@dataclass(frozen=True)
class BytesSpec:
    """`size` random bytes; or, with `dtype` and `shape`, the raw bytes of such a tensor (no header: bf16
    as uint16 pairs, as Primus' MLPerf ``*.bytes`` members)."""

    size: int = 64
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    field: str | None = None
    kind: ClassVar[str] = "bytes"

    def __post_init__(self) -> None:
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(self.shape))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "size": self.size}
        if self.dtype is not None:
            out.update(dtype=self.dtype, shape=list(self.shape or ()))
        return _with_field(out, self.field)


#: leaf kinds of a json field or a pickle leaf besides specs: plain numbers
_NUMBER_LEAVES = ("int", "float")
#: how deep json fields and pickle leaves nest (a document's own fields are at depth 1)
MAX_JSON_DEPTH = 8
#: how many fields (at every depth together) `infer_json_spec` describes at most
MAX_JSON_FIELDS = 256


def _leaf_to_dict(leaf: Any) -> Any:
    return leaf if isinstance(leaf, str) else leaf.to_dict()


MemberSpec = TensorSpec | NpySpec | TextSpec | ImageSpec | JsonSpec | PickleSpec | BytesSpec
_SPEC_TYPES: Mapping[str, type] = MappingProxyType(
    {cls.kind: cls for cls in (TensorSpec, NpySpec, TextSpec, ImageSpec, JsonSpec, PickleSpec, BytesSpec)}
)


def _kind_from_name(name: str) -> str:
    """The generator's member kind for a member name (the library's kind table; kinds the generator does
    not write are random bytes)."""
    kind = member_kind(name)
    return kind if kind in _SPEC_TYPES else "bytes"


@dataclass(frozen=True)
class Schema:
    """The members of every sample (in tar order) and the dataset's subflavors.

    `subflavors` are extra entries for ``dataset.yaml``; ``encoding`` is always set from `encoding`.
    """

    encoding: str
    members: Mapping[str, MemberSpec]
    subflavors: Mapping[str, Any] = field(default_factory=dict)
    buckets: tuple[tuple[float, float], ...] = DEFAULT_BUCKETS
    #: members a cooker must not drop (the conformance suite calls a dropped one lost data)
    required: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "required", tuple(self.required))
        object.__setattr__(self, "members", MappingProxyType(dict(self.members)))
        object.__setattr__(self, "subflavors", MappingProxyType(dict(self.subflavors)))
        object.__setattr__(self, "buckets", tuple((float(h), float(w)) for h, w in self.buckets))
        _validate_schema(self, "schema")

    def __reduce__(self) -> tuple[Any, ...]:
        # MappingProxyType does not pickle; worker processes and ranks get the schema through its dict form.
        return (_schema_from_dict, (self.to_dict(), "schema"))

    @property
    def dataset_subflavors(self) -> dict[str, Any]:
        """The ``subflavors`` written to ``dataset.yaml``: `subflavors` plus ``encoding``."""
        return {**self.subflavors, "encoding": self.encoding}

    def names(self, kind: str | None = None) -> list[str]:
        """Member names in tar order, optionally only those of one `kind`."""
        return [n for n, s in self.members.items() if kind is None or s.kind == kind]

    def to_dict(self) -> dict[str, Any]:
        """The schema-file form (round-trips through `Schema.from_dict`)."""
        out: dict[str, Any] = {"encoding": self.encoding}
        if self.subflavors:
            out["subflavors"] = dict(self.subflavors)
        if self.buckets != DEFAULT_BUCKETS:
            out["buckets"] = [list(b) for b in self.buckets]
        if self.required:
            out["required"] = list(self.required)
        out["members"] = {name: spec.to_dict() for name, spec in self.members.items()}
        return out

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "schema") -> Schema:
        """Build a schema from its file form; errors name `source` and the offending member."""
        return _schema_from_dict(data, source)

    def with_overrides(
        self,
        *,
        dtype: str | None = None,
        shapes: Mapping[str, Any] | None = None,
        image_size: tuple[int, int] | None = None,
    ) -> Schema:
        """A copy where every floating tensor has `dtype`, tensors named in `shapes` (by full name or stem) have
        that shape, and every image has `image_size` (height, width)."""
        members = dict(self.members)
        if dtype is not None:
            if dtype not in FLOAT_DTYPES:
                raise SyntheticError(
                    f"dtype {dtype!r} is not supported; use one of {', '.join(FLOAT_DTYPES)}"
                )
            for name, spec in members.items():
                if isinstance(spec, TensorSpec) and spec.dtype in FLOAT_DTYPES:
                    members[name] = replace(spec, dtype=dtype)
        for want, shape in (shapes or {}).items():
            hits = [n for n in members if n == want] or [n for n in members if member_stem(n) == want]
            if not hits:
                raise SyntheticError(
                    f"shapes names {want!r}, which is not a member of the {self.encoding!r} schema; "
                    f"members are {', '.join(members)}"
                )
            for name in hits:
                spec = members[name]
                if not isinstance(spec, TensorSpec):
                    raise SyntheticError(
                        f"shapes names {name!r}, which is a {spec.kind} member, not a tensor"
                    )
                members[name] = replace(spec, shape=_check_shape(shape, f"shapes[{want!r}]"))
        if image_size is not None:
            size = _check_shape(image_size, "image_size")
            if len(size) != 2:
                raise SyntheticError(f"image_size must be (height, width), got {image_size!r}")
            for name, spec in members.items():
                if isinstance(spec, ImageSpec):
                    members[name] = replace(spec, size=size)
        return replace(self, members=members)


def _check_shape(shape: Any, where: str) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise SyntheticError(f"{where} must be a list of positive integers, got {shape!r}")
    dims = list(shape)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise SyntheticError(f"{where} must be a list of positive integers, got {dims!r}")
    return tuple(dims)


def _validate_schema(schema: Schema, source: str) -> None:
    if not isinstance(schema.encoding, str) or not _ENCODING_RE.match(schema.encoding):
        raise SyntheticError(
            f"{source}: encoding must be a non-empty name of letters, digits, '_', '-', '.', got {schema.encoding!r}"
        )
    if not schema.members:
        raise SyntheticError(f"{source}: a schema needs at least one member")
    for name, spec in schema.members.items():
        where = f"{source}: member {name!r}"
        if not isinstance(name, str) or not _MEMBER_NAME_RE.match(name) or name.endswith("__"):
            raise SyntheticError(
                f"{where}: a member name is the tar suffix after '<key>.' exactly as Energon's crude dict has "
                "it (e.g. 'latents.pth', 'jpg', '.pth'): letters, digits, '_', '-', '.', starting with a letter "
                "or digit or one leading '.'"
            )
        if not isinstance(spec, tuple(_SPEC_TYPES.values())):
            raise SyntheticError(
                f"{where}: spec must be one of {', '.join(t.__name__ for t in _SPEC_TYPES.values())}"
            )
        _validate_spec(spec, where)
    if "encoding" in schema.subflavors:
        raise SyntheticError(f"{source}: put the encoding in 'encoding', not in 'subflavors'")
    unknown = [name for name in schema.required if name not in schema.members]
    if unknown:
        raise SyntheticError(f"{source}: required names {unknown}, which are not members")
    if not schema.buckets or not all(h > 0 and w > 0 for h, w in schema.buckets):
        raise SyntheticError(
            f"{source}: buckets must be a non-empty list of positive [height_scale, width_scale]"
        )


_ITEMSIZES = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "bfloat16": 2, "float16": 2, "int16": 2}
_ITEMSIZES.update({"uint16": 2, "int8": 1, "uint8": 1, "bool": 1})


def _itemsize(dtype: str) -> int:
    return _ITEMSIZES[dtype]


def _validate_spec(spec: Any, where: str) -> None:
    """Check one member or leaf spec; errors name `where`."""
    if spec.field is not None and (not isinstance(spec.field, str) or not spec.field):
        raise SyntheticError(f"{where}: field must be the name of the output field, got {spec.field!r}")
    if isinstance(spec, NpySpec):
        _check_shape(spec.shape, f"{where}: shape")
        if spec.dtype == "bfloat16":
            raise SyntheticError(
                f"{where}: numpy has no bfloat16; store it as uint16 with view: bfloat16 (or as raw bytes: "
                "kind: bytes, dtype: bfloat16)"
            )
        if spec.dtype not in NPY_DTYPES:
            raise SyntheticError(f"{where}: dtype {spec.dtype!r} is not one of {', '.join(NPY_DTYPES)}")
        if spec.view is not None and (
            spec.view not in TENSOR_DTYPES or _itemsize(spec.view) != _itemsize(spec.dtype)
        ):
            raise SyntheticError(
                f"{where}: view must be a dtype of the same size as {spec.dtype} ({', '.join(TENSOR_DTYPES)}), "
                f"got {spec.view!r}"
            )
    elif isinstance(spec, TensorSpec):
        _check_shape(spec.shape, f"{where}: shape")
        if spec.dtype not in TENSOR_DTYPES:
            raise SyntheticError(f"{where}: dtype {spec.dtype!r} is not one of {', '.join(TENSOR_DTYPES)}")
        if isinstance(spec, TensorSpec) and spec.bucketed and len(spec.shape) < 2:
            raise SyntheticError(f"{where}: a bucketed tensor needs at least 2 dims, got {list(spec.shape)}")
    elif isinstance(spec, TextSpec):
        if not (1 <= spec.min_words <= spec.max_words):
            raise SyntheticError(f"{where}: need 1 <= min_words <= max_words")
        if spec.long_every < 0 or spec.long_words < 1:
            raise SyntheticError(f"{where}: long_every must be >= 0 (0 disables) and long_words >= 1")
    elif isinstance(spec, ImageSpec):
        size = _check_shape(spec.size, f"{where}: size")
        if len(size) != 2:
            raise SyntheticError(f"{where}: size must be [height, width], got {list(size)}")
        if spec.format not in ("jpeg", "png", "webp", "gif"):
            raise SyntheticError(f"{where}: image format must be jpeg, png, webp or gif, got {spec.format!r}")
        if not (1 <= spec.quality <= 100):
            raise SyntheticError(f"{where}: quality must be in 1..100")
    elif isinstance(spec, BytesSpec):
        if spec.dtype is not None:
            if spec.dtype not in TENSOR_DTYPES or spec.shape is None:
                raise SyntheticError(
                    f"{where}: raw tensor bytes need a dtype of {', '.join(TENSOR_DTYPES)} and a shape"
                )
            _check_shape(spec.shape, f"{where}: shape")
        elif not isinstance(spec.size, int) or spec.size < 1:
            raise SyntheticError(f"{where}: size must be a positive integer")
    elif isinstance(spec, JsonSpec):
        _validate_fields(spec.fields, where, "field", "", arrays=False, depth=1)
    elif isinstance(spec, PickleSpec):
        if spec.structure not in ("dict", "value"):
            raise SyntheticError(f"{where}: structure must be dict or value, got {spec.structure!r}")
        if not spec.leaves or (spec.structure == "value" and len(spec.leaves) != 1):
            raise SyntheticError(f"{where}: a pickle needs leaves (exactly one with structure: value)")
        if not (2 <= spec.protocol <= 5):
            raise SyntheticError(f"{where}: protocol must be 2..5")
        _validate_fields(spec.leaves, where, "leaf", "", arrays=True, depth=1)


def _value_kinds(arrays: bool) -> str:
    """The value kinds a json field (`arrays` False) or a pickle leaf may have, for error messages."""
    nested = "object, list or json_string spec"
    return (
        f"int, float, text or a tensor, npy, text, {nested}" if arrays else f"int, float, text or an {nested}"
    )


def _validate_fields(fields: Any, where: str, noun: str, prefix: str, *, arrays: bool, depth: int) -> None:
    """Check the named values of a json document, a pickled dict or a nested object; errors name each
    value by its dotted path (``captions.long``) under `where`."""
    if not isinstance(fields, Mapping):
        raise SyntheticError(f"{where}: {noun}s must map names to value specs, got {type(fields).__name__}")
    for name, value in fields.items():
        if not isinstance(name, str) or not name:
            raise SyntheticError(f"{where}: {noun} names must be non-empty strings, got {name!r}")
        path = f"{prefix}.{name}" if prefix else name
        _validate_value(value, f"{where}: {noun} {path!r}", where, noun, path, arrays=arrays, depth=depth)


def _validate_value(
    value: Any, at: str, where: str, noun: str, path: str, *, arrays: bool, depth: int
) -> None:
    """Check one value spec at nesting `depth` (a document's own fields are at depth 1); `at` names it."""
    allowed: tuple[type, ...] = (TextSpec, ObjectSpec, ListSpec, JsonStringSpec)
    if arrays:
        allowed += (TensorSpec, NpySpec)
    if not (isinstance(value, allowed) or (isinstance(value, str) and value in _NUMBER_LEAVES)):
        hint = " (in Python, text is TextSpec())" if value == "text" else ""
        raise SyntheticError(f"{at} must be {_value_kinds(arrays)}, got {value!r:.80}{hint}")
    if depth > MAX_JSON_DEPTH:
        raise SyntheticError(
            f"{at} nests {depth} levels deep; at most {MAX_JSON_DEPTH} are supported (flatten the structure)"
        )
    if isinstance(value, str):
        return
    _validate_spec(value, at)
    if isinstance(value, ObjectSpec):
        if not value.fields:
            raise SyntheticError(
                f"{at}: an object needs fields, e.g. {{kind: object, fields: {{url: {{kind: text}}, width: int}}}}"
            )
        _validate_fields(value.fields, where, noun, path, arrays=arrays, depth=depth + 1)
    elif isinstance(value, JsonStringSpec):
        if (value.of is None) == (not value.fields):
            raise SyntheticError(
                f"{at}: a json_string needs either fields (the object it holds, e.g. {{kind: json_string, "
                "fields: {short: {kind: text}}}) or of (any other JSON value, e.g. {kind: json_string, of: "
                "{kind: list, of: int, length: 3}}), not both"
            )
        if value.of is None:  # a JSON document: no tensors in it, even inside a pickle
            _validate_fields(value.fields, where, noun, path, arrays=False, depth=depth + 1)
        elif isinstance(value.of, ObjectSpec):
            raise SyntheticError(
                f"{at}: for a json_string holding an object write fields: {{...}}, not of: {{kind: object}}"
            )
        else:
            _validate_value(value.of, f"{at}: of", where, noun, f"{path}[]", arrays=False, depth=depth + 1)
    elif isinstance(value, ListSpec):
        if not isinstance(value.length, int) or isinstance(value.length, bool) or value.length < 1:
            raise SyntheticError(
                f"{at}: a list needs length, the number of items (a positive integer), e.g. "
                f"{{kind: list, of: {{kind: text}}, length: 2}}, got {value.length!r}"
            )
        if value.of is None:
            raise SyntheticError(
                f"{at}: a list needs of, the spec of its items, e.g. of: int or of: {{kind: text}}"
            )
        if getattr(value.of, "field", None) is not None:
            raise SyntheticError(
                f"{at}: of: a list item has no output field of its own (a list of text or numbers may name "
                "one: put field: on the list)"
            )
        if value.field is not None and not _scalar_value(value.of):
            raise SyntheticError(
                f"{at}: field: names the output field of one value; a list of {getattr(value.of, 'kind', value.of)} "
                "items is checked item by item, so put field: on the items' leaves"
            )
        _validate_value(value.of, f"{at}: of", where, noun, f"{path}[]", arrays=arrays, depth=depth + 1)


def _scalar_value(spec: Any) -> bool:
    """Text or a number: a list of them is one value (compared as a whole)."""
    return spec in _NUMBER_LEAVES or isinstance(spec, TextSpec)


_SPEC_FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "tensor": ("shape", "dtype", "bucketed", "field"),
        "npy": ("shape", "dtype", "view", "field"),
        "text": ("min_words", "max_words", "non_ascii", "long_every", "long_words", "field"),
        "image": ("size", "format", "quality", "field"),
        "json": ("fields", "field"),
        "pickle": ("leaves", "structure", "protocol", "field"),
        "bytes": ("size", "dtype", "shape", "field"),
    }
)


def _schema_from_dict(data: Any, source: str) -> Schema:
    if not isinstance(data, Mapping):
        raise SyntheticError(
            f"{source}: a schema is a mapping with 'encoding' and 'members', got {type(data).__name__}"
        )
    unknown = set(data) - {"encoding", "members", "subflavors", "buckets", "required"}
    if unknown:
        raise SyntheticError(
            f"{source}: unknown top-level field(s) {sorted(unknown)}; allowed: encoding, members, subflavors, "
            "buckets, required"
        )
    if "encoding" not in data or "members" not in data:
        raise SyntheticError(f"{source}: a schema needs 'encoding' (the subflavor) and 'members'")
    raw_members = data["members"]
    if not isinstance(raw_members, Mapping):
        raise SyntheticError(f"{source}: 'members' must map member names to specs")
    members: dict[str, MemberSpec] = {}
    for name, raw in raw_members.items():
        where = f"{source}: member {name!r}"
        raw = {} if raw is None else raw
        if not isinstance(raw, Mapping):
            raise SyntheticError(f"{where}: spec must be a mapping like {{kind: tensor, shape: [4, 8]}}")
        kind = raw.get("kind") or _kind_from_name(str(name))
        if kind not in _SPEC_FIELDS:
            raise SyntheticError(f"{where}: kind {kind!r} is not one of {', '.join(_SPEC_FIELDS)}")
        extra = set(raw) - {"kind", *_SPEC_FIELDS[kind]}
        if extra:
            raise SyntheticError(
                f"{where}: unknown field(s) {sorted(extra)} for kind {kind}; allowed: {', '.join(_SPEC_FIELDS[kind])}"
            )
        kwargs = {k: v for k, v in raw.items() if k != "kind"}
        if kind in ("tensor", "npy"):
            if "shape" not in kwargs:
                raise SyntheticError(f"{where}: a {kind} member needs 'shape', e.g. shape: [16, 8, 8]")
            kwargs["shape"] = _check_shape(kwargs["shape"], f"{where}: shape")
        if kind == "bytes" and "shape" in kwargs:
            kwargs["shape"] = _check_shape(kwargs["shape"], f"{where}: shape")
        if kind == "json":
            kwargs["fields"] = _leaves_from_dict(kwargs.get("fields") or {}, where, "field", arrays=False)
        if kind == "pickle":
            kwargs["leaves"] = _leaves_from_dict(kwargs.get("leaves") or {}, where, "leaf", arrays=True)
        if kind == "image":
            ext = member_extension(str(name))
            fmt = kwargs.get("format") or (IMAGE_FORMATS.get(ext, "JPEG").lower())
            kwargs["format"] = {"jpg": "jpeg"}.get(str(fmt).lower(), str(fmt).lower())
            if "size" in kwargs:
                kwargs["size"] = _check_shape(kwargs["size"], f"{where}: size")
        try:
            members[str(name)] = _SPEC_TYPES[kind](**kwargs)
        except TypeError as exc:  # pragma: no cover - fields are checked above
            raise SyntheticError(f"{where}: {exc}") from None
    subflavors = data.get("subflavors") or {}
    if not isinstance(subflavors, Mapping):
        raise SyntheticError(f"{source}: 'subflavors' must be a mapping")
    buckets = data.get("buckets", DEFAULT_BUCKETS)
    try:
        buckets = tuple((float(h), float(w)) for h, w in buckets)
    except (TypeError, ValueError):
        raise SyntheticError(
            f"{source}: buckets must be a list of [height_scale, width_scale] pairs"
        ) from None
    required = data.get("required", ())
    if isinstance(required, str) or not all(isinstance(name, str) for name in required):
        raise SyntheticError(f"{source}: required must be a list of member names")
    try:
        return Schema(
            encoding=data["encoding"],
            members=members,
            subflavors=subflavors,
            buckets=buckets,
            required=tuple(required),
        )
    except SyntheticError as exc:
        raise SyntheticError(str(exc).replace("schema:", f"{source}:", 1)) from None


#: the nested value kinds of json fields and pickle leaves, and their fields
_VALUE_FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"object": ("fields",), "list": ("of", "length", "field"), "json_string": ("fields", "of")}
)
_VALUE_TYPES: Mapping[str, type] = MappingProxyType(
    {"object": ObjectSpec, "list": ListSpec, "json_string": JsonStringSpec}
)


def _leaves_from_dict(raw: Any, where: str, noun: str, *, arrays: bool, prefix: str = "") -> dict[str, Any]:
    """Value specs of a pickle's leaves (`noun` ``leaf``, `arrays`: tensor and npy allowed) or a json
    member's fields (``field``): ``int``/``float``/``text``, or a spec mapping (``{kind: tensor, ...}``,
    ``{kind: object, fields: ...}``). `where` names the member; errors name a value by its dotted path
    (``field 'captions.long'``; `prefix`: the path of the object they belong to)."""
    if not isinstance(raw, Mapping):
        at = f"{where}: {noun} {prefix!r}: fields" if prefix else f"{where}: {noun}s"
        raise SyntheticError(f"{at} must map names to value specs, e.g. {{caption: text, width: int}}")
    out: dict[str, Any] = {}
    for name, leaf in raw.items():
        path = f"{prefix}.{name}" if prefix else str(name)
        out[str(name)] = _value_from_dict(leaf, f"{where}: {noun} {path!r}", where, noun, path, arrays=arrays)
    return out


def _value_from_dict(raw: Any, at: str, where: str, noun: str, path: str, *, arrays: bool) -> Any:
    """One value spec read from its file form; `at` names it in errors."""
    if isinstance(raw, str) and raw in _NUMBER_LEAVES:
        return raw
    if raw == "text":
        raw = {"kind": "text"}
    kinds = ("tensor", "npy", "text") if arrays else ("text",)
    if not isinstance(raw, Mapping) or raw.get("kind") not in (*kinds, *_VALUE_FIELDS):
        raise SyntheticError(f"{at} must be {_value_kinds(arrays)}, got {raw!r:.80}")
    kind = raw["kind"]
    args = {k: v for k, v in raw.items() if k != "kind"}
    allowed = _VALUE_FIELDS.get(kind) or _SPEC_FIELDS[kind]
    extra = set(args) - set(allowed)
    if extra:
        hint = (
            "; field: names the output field of one value, so put it on the leaves"
            if "field" in extra and kind in ("object", "json_string")
            else ""
        )
        raise SyntheticError(
            f"{at}: unknown field(s) {sorted(extra)} for kind {kind}; allowed: {', '.join(allowed)}{hint}"
        )
    if kind in ("tensor", "npy"):
        args["shape"] = _check_shape(args.get("shape"), f"{at}: shape")
    if "fields" in args:  # an object, or the object a json_string holds (JSON: no tensors in it)
        inner = arrays and kind == "object"
        args["fields"] = _leaves_from_dict(args["fields"], where, noun, arrays=inner, prefix=path)
    if "of" in args:
        inner = arrays and kind == "list"
        args["of"] = _value_from_dict(args["of"], f"{at}: of", where, noun, f"{path}[]", arrays=inner)
    return (_VALUE_TYPES.get(kind) or _SPEC_TYPES[kind])(**args)


def load_schema(path: str | PathLike[str]) -> Schema:
    """Read a schema from a YAML (``.yaml``/``.yml``) or JSON (``.json``) file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SyntheticError(f"schema file {str(p)!r} does not exist") from None
    except OSError as exc:
        raise SyntheticError(f"cannot read schema file {str(p)!r}: {exc.strerror}") from None
    try:
        data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SyntheticError(
            f"schema file {str(p)!r} is not valid {p.suffix.lstrip('.') or 'YAML'}: {first}"
        ) from None
    return _schema_from_dict(data, f"schema file {str(p)!r}")


def infer_json_spec(document: Any) -> JsonSpec:
    """The spec of a JSON document a user's dataset holds (what ``json.loads`` of a member returned), for
    generating data like it. A pure function: it reads `document` only.

    An object's fields are described recursively: a nested object as `ObjectSpec`; a list as `ListSpec`
    of its first item's spec and its length (an empty list, or one whose items are of different JSON kinds,
    is left out; ints mixed with floats are floats); a string that parses as a JSON object or list
    (stripped, starting with ``{`` or ``[``) as `JsonStringSpec`; any other string as text; an int or
    float as ``"int"``/``"float"``; a bool or null is left out, and so is an object, list or JSON string
    nothing in which can be described. The top-level ``key`` field is left out (the generator writes the
    sample key there). At most `MAX_JSON_DEPTH` levels (a document's own fields are level 1) and
    `MAX_JSON_FIELDS` fields in all are described; deeper or further fields are left out. A document
    that is not an object (a list, a number, a string) is opaque JSON: ``JsonSpec()``."""
    if not isinstance(document, Mapping):
        return JsonSpec()
    own = {name: value for name, value in document.items() if name != "key"}
    return JsonSpec(_infer_fields(own, 1, [MAX_JSON_FIELDS]))


def _infer_fields(obj: Mapping[Any, Any], depth: int, budget: list[int]) -> dict[str, Any]:
    """The described fields of one object whose fields sit at `depth`; `budget` counts fields left."""
    out: dict[str, Any] = {}
    for name, value in obj.items():
        if budget[0] <= 0:
            break
        if not isinstance(name, str) or not name:
            continue
        before = budget[0]
        budget[0] -= 1
        spec = _infer_value(value, depth, budget)
        if spec is None:
            budget[0] = before  # nothing described: its fields do not count
        else:
            out[name] = spec
    return out


def _json_kind(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "none"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "list"}.get(type(value), "object" if isinstance(value, Mapping) else "none")


def _infer_value(value: Any, depth: int, budget: list[int]) -> Any:
    """The spec of one value at `depth`, or None when it is left out."""
    if depth > MAX_JSON_DEPTH or isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        parsed = _json_in_string(value)
        if parsed is None:
            return TextSpec()
        if isinstance(parsed, Mapping):
            inner = _infer_fields(parsed, depth + 1, budget)
            return JsonStringSpec(inner) if inner else None
        of = _infer_value(parsed, depth + 1, budget)
        return JsonStringSpec(of=of) if of is not None else None
    if isinstance(value, Mapping):
        inner = _infer_fields(value, depth + 1, budget)
        return ObjectSpec(inner) if inner else None
    if isinstance(value, list) and value:
        kinds = {_json_kind(item) for item in value}
        if len(kinds) != 1 or "none" in kinds:
            return None
        first = value[0]
        if kinds == {"number"} and any(isinstance(item, float) for item in value):
            first = 0.0  # ints mixed with floats: floats
        of = _infer_value(first, depth + 1, budget)
        return ListSpec(of, len(value)) if of is not None else None
    return None


def _json_in_string(text: str) -> Any:
    """The JSON object or list a string holds (stripped, starting with ``{`` or ``[``), else None."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return None
    try:
        parsed = json.loads(stripped)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, (Mapping, list)) else None


def builtin_schema(
    encoding: str,
    *,
    dtype: str | None = None,
    shapes: Mapping[str, Any] | None = None,
    image_format: str = "jpg",
    image_size: tuple[int, int] | None = None,
) -> Schema:
    """The schema of a built-in encoding.

    ``preencoded`` (the common preencoded layout, for a 256x256 image): ``latents.pth`` float32 ``[64, 32, 32]``
    (``[64, H/8, W/8]``, bucketed), ``prompt_embeds.pth`` ``[77, 4096]``, ``pooled_prompt_embeds.pth`` ``[768]``,
    ``caption.txt``. ``raw``: one image member named `image_format` (``jpg``, ``jpeg``, ``png``, ``webp``;
    default 32x32) and ``txt``.
    """
    if encoding == "preencoded":
        schema = Schema(
            encoding="preencoded",
            members={
                **{
                    member: TensorSpec(SIZES["guide"][field], "float32", bucketed=field == "latents")
                    for field, member in PREENCODED_TENSOR_MEMBERS.items()
                },
                PREENCODED_CAPTION_MEMBER: TextSpec(),
            },
        )
    elif encoding == "raw":
        if image_format not in IMAGE_FORMATS:
            raise SyntheticError(
                f"image_format {image_format!r} is not supported; use one of {', '.join(IMAGE_FORMATS)}"
            )
        fmt = IMAGE_FORMATS[image_format].lower()
        schema = Schema(
            encoding="raw",
            members={image_format: ImageSpec((32, 32), fmt), RAW_TEXT_MEMBER: TextSpec()},
        )
    else:
        raise SyntheticError(
            f"encoding {encoding!r} is not built in; use one of {', '.join(BUILTIN_ENCODINGS)} "
            "or describe your format in a schema file (--schema FILE)"
        )
    return schema.with_overrides(dtype=dtype, shapes=shapes, image_size=image_size)


#: The example schemas shipped with the package: the layouts real projects' prepare scripts write.
EXAMPLES_DIR = Path(__file__).parent / "examples"


def example_schemas() -> dict[str, Path]:
    """The shipped example schemas by their encoding (``flux``, ``nemo``, ``preencoded_numpy``, ...): the
    formats known besides the built-in ones, so a cooker declaring one of them is checked on its data."""
    return dict(_example_schemas())


@functools.lru_cache(maxsize=1)
def _example_schemas() -> tuple[tuple[str, Path], ...]:
    # read once: the conformance suite asks on every lookup of a target's formats
    return tuple((load_schema(path).encoding, path) for path in sorted(EXAMPLES_DIR.glob("*.yaml")))


def _tensor_field(name: str, spec: MemberSpec) -> str | None:
    """The output field a tensor-valued member names (``field:``, else the member's stem), else None."""
    if isinstance(spec, (TensorSpec, NpySpec)) or (isinstance(spec, BytesSpec) and spec.dtype is not None):
        return spec.field or member_stem(name)
    return None


def harmonised(schemas: list[Schema]) -> list[Schema]:
    """The schemas with every tensor field that several of them carry given one shape and dtype, so
    samples of different formats that one TaskEncoder cooks can meet in a batch and differ only in their
    format (not in data a stacking ``batch()`` could never join). Shape and dtype come from a format that
    fixes them (headerless tensor bytes and numpy arrays: their readers know the shape and dtype), else
    from the first schema that has the field (``torch.save`` files carry their own)."""
    chosen: dict[str, tuple[tuple[int, ...], str]] = {}
    fixed: set[str] = set()
    counts: dict[str, int] = {}
    for schema in schemas:
        for name, spec in schema.members.items():
            field_name = _tensor_field(name, spec)
            if field_name is None:
                continue
            counts[field_name] = counts.get(field_name, 0) + 1
            if field_name not in fixed and (field_name not in chosen or not isinstance(spec, TensorSpec)):
                dtype = spec.view if isinstance(spec, NpySpec) and spec.view else spec.dtype
                chosen[field_name] = (tuple(spec.shape or ()), str(dtype))
                if not isinstance(spec, TensorSpec):
                    fixed.add(field_name)
    out = []
    for schema in schemas:
        members = dict(schema.members)
        for name, spec in members.items():
            field_name = _tensor_field(name, spec)
            if field_name is None or counts[field_name] < 2:
                continue
            shape, dtype = chosen[field_name]
            if isinstance(spec, NpySpec) and spec.view:
                members[name] = replace(spec, shape=shape)  # its view is what the format fixes
                continue
            if isinstance(spec, NpySpec) and dtype not in NPY_DTYPES:
                dtype = spec.dtype  # numpy has no bfloat16
            members[name] = replace(spec, shape=shape, dtype=dtype)
        out.append(replace(schema, members=members))
    return out
