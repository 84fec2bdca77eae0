"""The fidelity oracle: which output field holds a member (or a leaf of a structured member), and whether
it holds it exactly.

A member's expected value is read from its bytes by the suite's own safe readers: ``read_tensor`` for
``.pth``, ``safe_loads`` for pickles, ``np.load(allow_pickle=False)`` for ``.npy``, the declared dtype and
shape for raw tensor bytes, strict UTF-8 for text, Pillow for images, ``json.loads`` for JSON. A
structured member (a pickled dict, JSON with declared fields) is checked leaf by leaf, nested ones too: a
leaf's path is dotted (``source.url``; ``captions.long`` inside a JSON string, read by parsing it;
``boxes[0].x`` in a list of objects), its name is the path's last part (``url``, ``long``; an item of a
list has none), and a list of text or numbers is one leaf (the whole list). An output field that equals
a structure the leaf sits in (the nested object, the list, the JSON string as text or parsed) holds it.

The field is found, in this order, **by ``field:``** (the schema names it), **by name** (the member's stem,
``latents.pth`` -> ``latents``, or the leaf's name), **by value** (the output field whose value equals the
expected one, or whose raw bytes equal the member's: a renamed field, ``t5.bytes`` decoded into
``prompt_embeds``, NeMo's ``png`` cooked into ``hint``), and last by the generic image names
``images``/``image`` (so a resized image is still found, and reported). Tensors compare
bitwise (a NaN equals the same NaN), a numpy array also equals the torch tensor made from it. Every match
says how it was made.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from primus_energon.safepickle import safe_loads
from primus_energon.synthetic.schema import (
    BytesSpec,
    ImageSpec,
    JsonSpec,
    JsonStringSpec,
    ListSpec,
    MemberSpec,
    NpySpec,
    ObjectSpec,
    PickleSpec,
    TensorSpec,
    TextSpec,
)
from primus_energon.tensorfile import read_tensor

from .compare import as_tensor, identical
from .fields import MISSING, fields
from .fingerprint import array_tensor, fingerprint, tensor_bytes
from .plain import type_name

__all__ = [
    "Expectation",
    "expectations",
    "claim_of",
    "decode_member",
    "locate",
    "difference",
    "raw_holder",
    "fields",
    "holds",
    "identical",
    "is_required",
    "required_values",
    "MISSING",
    "NESTED",
    "STACKED",
]


@dataclass
class Expectation:
    """One value a cooked sample must carry: a member, or one leaf of a structured member."""

    member: str
    leaf: str | None
    spec: Any  # a member or leaf spec, or "int"/"float"
    value: Any
    raw: bytes | None  # the member's bytes, for a match of raw bytes
    names: list[str]  # field names to look for, in order
    explicit: bool  # the names come from `field:`
    required: bool
    aliases: tuple[str, ...] = ()  # generic names (``images``), tried only after a match by value
    #: the structures a nested leaf sits in, outermost first (a nested object or list as stored; a JSON
    #: string as its text, and the object parsed from it): an output field equal to one holds the leaf
    within: tuple[Any, ...] = ()

    @property
    def what(self) -> str:
        return f"member {self.member!r}" + (f" leaf {self.leaf!r}" if self.leaf else "")


def claim_of(spec: Any) -> str:
    """The fidelity claim a member or leaf belongs to."""
    if isinstance(spec, (TensorSpec, NpySpec)) or (isinstance(spec, BytesSpec) and spec.dtype is not None):
        return "tensors"
    if isinstance(spec, TextSpec):
        return "text"
    if isinstance(spec, ImageSpec):
        return "images"
    if isinstance(spec, ListSpec):  # a list of text or numbers, one leaf
        return claim_of(spec.of)
    return "other"


def decode_member(spec: MemberSpec, data: bytes) -> Any:
    """The value a faithful reader gets from a member's bytes (see the module docstring)."""
    data = bytes(data)
    if isinstance(spec, TensorSpec):
        return read_tensor(data, copy=True, fallback=True)
    if isinstance(spec, NpySpec):
        array = np.load(io.BytesIO(data), allow_pickle=False)
        return _viewed(array, spec.view) if spec.view else array
    if isinstance(spec, PickleSpec):
        return safe_loads(data)
    if isinstance(spec, BytesSpec) and spec.dtype is not None:
        dtype = getattr(torch, spec.dtype)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(spec.shape or (-1,))
    if isinstance(spec, TextSpec):
        return data.decode("utf-8")
    if isinstance(spec, ImageSpec):
        with Image.open(io.BytesIO(data)) as image:
            return np.asarray(image.convert("RGB"))
    if isinstance(spec, JsonSpec):
        return json.loads(data)
    return data


def _viewed(array: np.ndarray, dtype: str) -> torch.Tensor:
    """An array's bytes as a tensor of ``dtype`` (bfloat16 stored as uint16)."""
    raw = bytearray(np.ascontiguousarray(array).tobytes())
    return (
        torch.frombuffer(raw, dtype=getattr(torch, dtype)).reshape(array.shape)
        if raw
        else torch.empty(array.shape, dtype=getattr(torch, dtype))
    )


def _names(member: str, spec: Any, leaf: str | None) -> tuple[list[str], bool]:
    explicit = getattr(spec, "field", None)
    if explicit:
        return [explicit], True
    if leaf is not None:
        return [leaf], False
    # NeMo's ".pth" (a leading dot: no stem) is conventionally cooked into the field "pth"
    stem = member.split(".", 1)[0] or member.lstrip(".").split(".", 1)[0]
    return ([stem] if stem else []), False


def _aliases(spec: Any, explicit: bool) -> tuple[str, ...]:
    # An image member's field is conventionally `images`/`image` whatever the member is called; with two
    # image members (NeMo's jpg image and png control image) only one of them is that field, so the
    # generic name ranks below a match by value.
    return ("images", "image") if isinstance(spec, ImageSpec) and not explicit else ()


def expectations(member: str, spec: MemberSpec, data: bytes, *, required: bool) -> Iterator[Expectation]:
    """What a cooked sample must carry for one member: the member itself, or each leaf of a pickled dict or
    of JSON with declared fields, nested leaves included (see the module docstring); a pickle of one
    value, ``structure: value``, is one expectation unless that value is nested."""
    value = decode_member(spec, data)
    if isinstance(spec, PickleSpec) and spec.structure == "dict" and isinstance(value, Mapping):
        yield from _field_expectations(member, spec.leaves, value, "", required, ())
        return
    if isinstance(spec, JsonSpec) and spec.fields and isinstance(value, Mapping):
        yield from _field_expectations(member, spec.fields, value, "", required, ())
        return
    if isinstance(spec, PickleSpec) and spec.structure == "value":
        leaf_spec = next(iter(spec.leaves.values()))
        if _is_nested(leaf_spec):
            yield from _value_expectations(member, leaf_spec, value, "", [], False, required, ())
            return
        names, explicit = _names(member, spec, None)
        yield Expectation(member, None, leaf_spec, value, None, names, explicit, required)
        return
    names, explicit = _names(member, spec, None)
    yield Expectation(member, None, spec, value, data, names, explicit, required, _aliases(spec, explicit))


def _is_nested(spec: Any) -> bool:
    """Whether a value spec holds leaves of its own (an object, a JSON string, a list of anything but
    text and numbers) rather than being one leaf."""
    if isinstance(spec, ListSpec):
        return not (spec.of in ("int", "float") or isinstance(spec.of, TextSpec))
    return isinstance(spec, (ObjectSpec, JsonStringSpec))


def _parsed_json(value: Any) -> Any:
    """The JSON document a string holds, or MISSING."""
    if not isinstance(value, str):
        return MISSING
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return MISSING


def _field_expectations(
    member: str,
    specs: Mapping[str, Any],
    value: Any,
    prefix: str,
    required: bool,
    within: tuple[Any, ...],
) -> Iterator[Expectation]:
    """The expectations of the named values of a dict (`value`, or MISSING) at path `prefix`."""
    for name, spec in specs.items():
        path = f"{prefix}.{name}" if prefix else name
        item = value.get(name, MISSING) if isinstance(value, Mapping) else MISSING
        names, explicit = _names(member, spec, name)
        yield from _value_expectations(member, spec, item, path, names, explicit, required, within)


def _value_expectations(
    member: str,
    spec: Any,
    value: Any,
    path: str,
    names: list[str],
    explicit: bool,
    required: bool,
    within: tuple[Any, ...],
) -> Iterator[Expectation]:
    """The expectations of one value at `path` ("" for a pickle's one value): itself when it is one leaf,
    else each leaf in it, with the structures it sits in (`within`)."""
    inner = within if value is MISSING else (*within, value)
    if isinstance(spec, ObjectSpec):
        yield from _field_expectations(member, spec.fields, value, path, required, inner)
    elif isinstance(spec, JsonStringSpec):
        document = _parsed_json(value)
        if spec.of is not None:
            yield from _value_expectations(member, spec.of, document, path, [], False, required, inner)
        else:
            inner = inner if document is MISSING else (*inner, document)
            yield from _field_expectations(member, spec.fields, document, path, required, inner)
    elif _is_nested(spec):
        for i in range(spec.length):
            item = value[i] if isinstance(value, (list, tuple)) and i < len(value) else MISSING
            yield from _value_expectations(member, spec.of, item, f"{path}[{i}]", [], False, required, inner)
    else:
        yield Expectation(member, path or None, spec, value, None, names, explicit, required, within=within)


def is_required(schema: Any, member: str, spec: Any) -> bool:
    """Whether a member no output field holds is a defect (lost data) rather than advice: the format
    model's one definition (:func:`primus_energon.formats.is_required_member`)."""
    from primus_energon.formats import is_required_member

    kind = {"tensors": "tensor", "images": "image", "text": "text"}.get(claim_of(spec), "other")
    return is_required_member(
        member,
        encoding=schema.encoding,
        kind=kind,
        listed_required=tuple(getattr(schema, "required", ())),
        names_field=bool(getattr(spec, "field", None)),
    )


def required_values(schema: Any, raw: Mapping[str, Any]) -> list[Any]:
    """The values a sample's required members hold (tensors, texts, image pixels), read from its raw
    member bytes by the suite's safe readers: what a pack or batch must still carry for that sample."""
    out: list[Any] = []
    for member, spec in schema.members.items():
        data = raw.get(member)
        if not isinstance(data, (bytes, bytearray)) or not is_required(schema, member, spec):
            continue
        try:
            found = list(expectations(member, spec, data, required=True))
        except Exception:  # an unreadable member: fidelity reports it
            continue
        for expected in found:
            value = expected.value
            if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
                value = array_tensor(value)
            if isinstance(value, (torch.Tensor, str)):
                out.append(value)
    return out


def holds(output: Any, member: str, spec: MemberSpec, data: bytes) -> bool:
    """Whether some output field holds the member (its bytes as read, or any of its leaves)."""
    return raw_holder(output, data, spec) is not None or any(
        locate(expected, output)[0] is not None
        for expected in expectations(member, spec, data, required=False)
    )


#: the one reading of a value as a tensor (:func:`.oracles.compare.as_tensor`)
_as_tensor = as_tensor


_bits = tensor_bytes


def _image_array(value: Any) -> np.ndarray | None:
    if isinstance(value, Image.Image):
        return np.asarray(value.convert("RGB"))
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


def difference(expected: Expectation, observed: Any) -> str | None:
    """None when ``observed`` holds the expected value exactly, else what differs. A member of opaque
    bytes is held exactly by a tensor whose bytes are those bytes (headerless tensor bytes, decoded)."""
    want = expected.value
    if observed is None:
        return "it is None"
    if _same_raw_bytes(expected, observed) and (
        isinstance(want, (bytes, bytearray)) or isinstance(observed, (bytes, bytearray, memoryview))
    ):
        return None
    if isinstance(expected.spec, ImageSpec):
        array = _image_array(observed)
        if array is None:
            return f"expected an image (PIL, array or tensor), observed a {type_name(observed)}"
        if array.shape != want.shape:
            return f"image shape {list(array.shape)}, expected {list(want.shape)} (HWC RGB)"
        if not np.array_equal(array, want):
            return f"pixels differ ({int((array != want).sum())} of {array.size} values)"
        return None
    want_tensor = _as_tensor(want)
    if want_tensor is not None:
        got = _as_tensor(observed)
        if got is None:
            return f"expected a tensor, observed a {type_name(observed)}"
        if got.dtype != want_tensor.dtype and _reinterpreted(expected, want, got):
            return None
        if got.dtype != want_tensor.dtype:
            return f"dtype {str(got.dtype).removeprefix('torch.')}, expected {str(want_tensor.dtype).removeprefix('torch.')}"
        if tuple(got.shape) != tuple(want_tensor.shape):
            return f"shape {list(got.shape)}, expected {list(want_tensor.shape)}"
        if _bits(got) != _bits(want_tensor):
            diff = (got.double() - want_tensor.double()).abs().nan_to_num(nan=float("inf"))
            return f"values differ (max abs difference {diff.max().item():.3g} at {int(diff.argmax())} of {diff.numel()})"
        return None
    if isinstance(want, str):
        if not isinstance(observed, str):
            return f"expected str, observed a {type_name(observed)}"
        if observed != want:
            at = next(
                (i for i, (a, b) in enumerate(zip(observed, want, strict=False)) if a != b),
                min(len(observed), len(want)),
            )
            return (
                f"text differs at character {at}: observed {observed[max(0, at - 10) : at + 20]!r}, "
                f"expected {want[max(0, at - 10) : at + 20]!r} (lengths {len(observed)} and {len(want)})"
            )
        return None
    if type(observed) is not type(want) and not (
        isinstance(want, (int, float)) and isinstance(observed, (int, float))
    ):
        return f"observed a {type_name(observed)}, expected a {type_name(want)}"
    return None if observed == want else f"observed {observed!r:.120}, expected {want!r:.120}"


def _reinterpreted(expected: Expectation, want: Any, got: torch.Tensor) -> bool:
    """A numpy uint16 array whose dtype the format did not declare (``view``), read as a float tensor of
    the same shape and bytes: how bfloat16 is stored in numpy (MLPerf's FLUX data), not a cast."""
    declared = getattr(expected.spec, "view", None)
    return (
        declared is None
        and isinstance(want, np.ndarray)
        and want.dtype == np.uint16
        and got.is_floating_point()
        and got.element_size() == 2
        and tuple(got.shape) == tuple(want.shape)
        and _bits(got) == np.ascontiguousarray(want).tobytes()
    )


def _same_raw_bytes(expected: Expectation, observed: Any) -> bool:
    """The observed value is the member's bytes: passed on undecoded (NeMo's and DFM's cookers leave
    decoding to ``encode_sample``), or decoded into a tensor whose bytes they are (headerless bytes)."""
    if expected.raw is None:
        return False
    if isinstance(observed, (bytes, bytearray, memoryview)):
        return bytes(observed) == expected.raw
    tensor = _as_tensor(observed)
    return tensor is not None and _bits(tensor) == expected.raw


def raw_holder(output: Any, data: bytes, spec: MemberSpec | None = None) -> str | None:
    """The output field that passes a whole member on, every leaf intact, or None: its bytes exactly as
    read, or (a pickle or JSON member) the whole decoded structure (NeMo's and DFM's cookers hand their
    decoder's dicts to ``encode_sample`` as they are)."""
    data = bytes(data)
    present = {n: v for n, v in fields(output).items() if not n.startswith("__")}
    for name, value in present.items():
        if isinstance(value, (bytes, bytearray, memoryview)):
            if len(value) == len(data) and bytes(value) == data:
                return name
    if isinstance(spec, (PickleSpec, JsonSpec)):
        try:
            want = _canonical(fingerprint(decode_member(spec, data)))
        except Exception:  # an unreadable member: no field can hold it whole
            return None
        for name, value in present.items():
            if isinstance(value, (Mapping, list, tuple, np.ndarray, torch.Tensor)):
                if _canonical(fingerprint(value)) == want:
                    return name
    return None


def _canonical(value: Any) -> Any:
    """A fingerprint with dict items in key order (a decoder may not keep the file's order)."""
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "dict":
        return ("dict", tuple(sorted((k, _canonical(v)) for k, v in value[1])))
    if isinstance(value, tuple):
        return tuple(_canonical(v) for v in value)
    return value


def locate(expected: Expectation, output: Any) -> tuple[str | None, str]:
    """The output field that holds the expectation and how it was found (``by field:``, ``by name``,
    ``by value``, ``by raw bytes``, then ``by name`` for a generic image field), or ``(None, "")``."""
    present = fields(output)
    for name in expected.names:
        if name in present:
            return name, "by field:" if expected.explicit else "by name"
    if expected.explicit or expected.value is MISSING:
        return None, ""
    for name, value in present.items():
        if name.startswith("__") or value is None:
            continue
        if difference(expected, value) is None:
            return name, "by value"
    for name, value in present.items():
        if not name.startswith("__") and _same_raw_bytes(expected, value):
            return name, "by raw bytes"
    nested = _holder_of_structure(expected, present) or _nested_place(expected, present)
    if nested is not None:
        return nested, NESTED
    stacked = _stacked_place(expected, present)
    if stacked is not None:
        return stacked, STACKED
    for name in expected.aliases:
        if name in present:
            return name, "by name"
    return None, ""


#: How :func:`locate` names a match found inside a field (a nested dict, a list of per-sample dicts): the
#: value there is the expected one bit for bit, so there is nothing left to compare.
NESTED = "by value, nested"
#: How :func:`locate` names a match that is one slice of a stacked field (a frame member of a video stacked
#: into ``[T, C, H, W]``, one of several tensor members stacked together): exact too.
STACKED = "by value, one slice of a stacked field"
#: slices of one axis of one field compared at most (a video of more frames is not searched frame by frame)
MAX_STACKED_SLICES = 256


def _stacked_place(expected: Expectation, present: Mapping[str, Any]) -> str | None:
    """The name of an output field with one dimension more than the expectation whose slice along some
    axis equals it exactly: a tensor bit for bit; an image's pixels as an image array
    (HWC or CHW, uint8 or floats in [0, 1], as :func:`difference` compares images); else None."""
    image = isinstance(expected.spec, ImageSpec)
    if image:
        if not isinstance(expected.value, np.ndarray):
            return None
        want_ndim = 3
    else:
        want = _as_tensor(expected.value)
        if want is None or not want.numel():
            return None
        want_ndim = want.ndim
    for name, value in present.items():
        tensor = None if name.startswith("__") else _as_tensor(value)
        if tensor is None or tensor.ndim != want_ndim + 1:
            continue
        for axis in range(tensor.ndim):
            if tensor.shape[axis] > MAX_STACKED_SLICES:
                continue
            for index in range(tensor.shape[axis]):
                piece = tensor.select(axis, index)
                if image:
                    pixels = _image_array(piece)
                    same = pixels is not None and np.array_equal(pixels, expected.value)
                else:
                    same = identical(piece.contiguous(), want)
                if same:
                    return name
    return None


def _holder_of_structure(expected: Expectation, present: Mapping[str, Any]) -> str | None:
    """The output field equal to a structure a nested leaf sits in (innermost first: the parsed nested
    object passed on whole, a JSON string kept as text), or None: that field holds the leaf exactly."""
    for structure in reversed(expected.within):
        for name, value in present.items():
            if not name.startswith("__") and value is not None and _same_structure(value, structure):
                return name
    return None


def _same_structure(observed: Any, want: Any) -> bool:
    """Whether ``observed`` equals ``want`` exactly: dicts by keys and values, lists and tuples item by
    item, tensors and arrays bitwise (:func:`identical`), text and numbers of the same type."""
    if isinstance(want, Mapping):
        return (
            isinstance(observed, Mapping)
            and len(observed) == len(want)
            and all(key in observed and _same_structure(observed[key], item) for key, item in want.items())
        )
    if isinstance(want, (list, tuple)):
        return (
            isinstance(observed, (list, tuple))
            and len(observed) == len(want)
            and all(_same_structure(a, b) for a, b in zip(observed, want, strict=True))
        )
    want_tensor = _as_tensor(want)
    if want_tensor is not None:
        got = _as_tensor(observed)
        return got is not None and identical(got, want_tensor)
    if type(observed) is not type(want):
        return False
    try:
        return bool(observed == want)
    except Exception:  # an object whose == is not a truth value
        return False


def _nested_place(expected: Expectation, present: Mapping[str, Any]) -> str | None:
    """The path of a value inside the output's fields that equals the expectation exactly (the payload
    oracle's search, whole values only), or None."""
    from .payloads import Haystack, Payload

    want = _as_tensor(expected.value)
    if want is None and not isinstance(expected.value, str):
        return None
    if want is not None and not want.numel():
        return None
    payload = Payload("", want if want is not None else expected.value)
    inner = {
        n: v for n, v in present.items() if not n.startswith("__") and isinstance(v, (Mapping, list, tuple))
    }
    if not inner:
        return None
    for place in Haystack(inner).find(payload):
        if place.how in ("the whole tensor", "equal text"):
            return place.path
    return None
