"""The payload oracle: where did a sample's payload go?

One answer serves every property that follows samples into an output (a batch, a pack, a batch of
packs): a sample's **payloads** are its tensors and texts, wherever they sit in it (top-level fields,
nested dicts, lists, dataclasses); an output is searched for each of them **by value**, never by layout:

- a tensor is found as a whole leaf, as one index of a stacked tensor (along any axis), as a slice of a
  tensor concatenated along any axis (packed/THD sequences, with or without ``seq_lens``/``cu_seqlens``),
  inside one row of a padded stack (then the place says so, and :meth:`Haystack.lengths_known` tells
  whether the output carries what the padding hides: a length or a mask), or as contiguous bytes of a
  flattened tensor; comparison is bitwise (a NaN equals the same NaN), dtype included;
- a text is found as an equal string (in a field, a list entry, a per-sample dict) or inside a longer one.

Every output leaf has a path (``latents``, ``metadata[2].pooled``), and every place a payload was found
says how (``row 3``, ``axis 0 [12:19]``), so a verdict can say where a payload went, or that it went
nowhere. Searches are bounded (leaves, rows and occurrences have budgets), and empty or tiny payloads,
which a coincidence could match, are only matched whole.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .fingerprint import array_tensor, tensor_bytes

__all__ = [
    "Payload",
    "Place",
    "Haystack",
    "payloads",
    "Trace",
    "trace",
    "required_by",
    "identity",
    "padding_problems",
    "KEY",
]

#: The payload path of a sample's ``__key__``: not data, but it shows whether the output keeps each key
#: beside its sample's data (see :meth:`Trace.mixed`).
KEY = "__key__"

#: Budgets: leaves walked in one structure, nesting depth, rows of a stack searched one by one, and
#: occurrences kept per payload and leaf.
MAX_LEAVES = 4096
MAX_DEPTH = 12
MAX_ROWS = 256
MAX_OCCURRENCES = 64
#: Payloads smaller than this (bytes of a tensor, characters of a text) are matched whole only: a short
#: run of bytes or characters occurs inside unrelated data by coincidence.
MIN_SEARCHED_BYTES = 16
MIN_SEARCHED_CHARS = 8


@dataclass(frozen=True)
class Payload:
    """One payload of a sample: where it sits in the sample and its value (a CPU tensor or a str)."""

    path: str
    value: torch.Tensor | str

    @property
    def size(self) -> int:
        value = self.value
        return len(value) if isinstance(value, str) else value.numel() * value.element_size()


@dataclass(frozen=True)
class Place:
    """Where a payload was found in an output: the leaf's path, how, and its position there (an offset in
    bytes along the leaf's searched axis, used to tell the order of the samples a leaf holds)."""

    path: str
    how: str
    position: tuple[int, ...]
    #: found inside a padded row: other values share its row (see Haystack.lengths_known)
    padded: bool = False
    #: the row of a stack it was found in (None for a whole leaf or a flat search)
    row: int | None = None
    length: int | None = None  # its extent along the searched axis

    def __str__(self) -> str:
        return f"{self.path} ({self.how})"


def _join(path: str, part: str) -> str:
    return f"{path}{part}" if part.startswith("[") else (f"{path}.{part}" if path else part)


def _walk(value: Any, path: str, depth: int, out: list[tuple[str, Any]], *, skip_private: bool) -> None:
    """Every tensor, array, str and bytes leaf of ``value`` with its path (bounded)."""
    if len(out) >= MAX_LEAVES or depth > MAX_DEPTH:
        return
    if isinstance(value, torch.Tensor):
        out.append((path, value.detach().cpu()))
    elif isinstance(value, np.ndarray):
        if value.dtype.kind in "biufc":
            out.append((path, array_tensor(value)))
        elif value.dtype == object:
            for index, item in enumerate(value.reshape(-1)[:MAX_LEAVES]):
                _walk(item, _join(path, f"[{index}]"), depth + 1, out, skip_private=skip_private)
    elif isinstance(value, (str, bytes, bytearray, memoryview)):
        out.append((path, value if isinstance(value, str) else bytes(value)))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if skip_private and str(key).startswith("__"):
                continue
            _walk(item, _join(path, str(key)), depth + 1, out, skip_private=skip_private)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _walk(item, _join(path, f"[{index}]"), depth + 1, out, skip_private=skip_private)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            if skip_private and f.name.startswith("__"):
                continue
            _walk(
                getattr(value, f.name, None), _join(path, f.name), depth + 1, out, skip_private=skip_private
            )
    elif hasattr(value, "__dict__") and not callable(value) and not isinstance(value, type):
        try:
            attributes = vars(value)
        except TypeError:
            return
        for name, item in attributes.items():
            if not name.startswith("_"):
                _walk(item, _join(path, name), depth + 1, out, skip_private=skip_private)


def payloads(sample: Any) -> list[Payload]:
    """A sample's payloads: every non-empty tensor (numeric numpy arrays as tensors, PIL images as their
    pixels) and non-empty text in it, wherever it sits; ``__``-fields (keys, restore keys) are not
    payloads. Bytes are left out: a pack or batch decodes them, so they are not expected in it."""
    leaves: list[tuple[str, Any]] = []
    _walk(_pixels(sample), "", 0, leaves, skip_private=True)
    out = []
    for path, value in leaves:
        if isinstance(value, torch.Tensor) and value.numel():
            out.append(Payload(path, value))
        elif isinstance(value, str) and value:
            out.append(Payload(path, value))
    return out


def _pixels(value: Any) -> Any:
    """PIL images as arrays of their pixels (a sample may carry an image the batch holds as an array)."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is a dependency
        return value
    if isinstance(value, Image.Image):
        return np.asarray(value)
    if isinstance(value, Mapping):
        return {k: _pixels(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_pixels(v) for v in value]
    return value


_bits = tensor_bytes


def _aligned_finds(hay: bytes, needle: bytes, step: int) -> Iterator[int]:
    """Offsets where ``needle`` occurs in ``hay`` at a multiple of ``step``."""
    start = 0
    found = 0
    while found < MAX_OCCURRENCES:
        at = hay.find(needle, start)
        if at < 0:
            return
        if at % step == 0:
            found += 1
            yield at
            start = at + step
        else:
            start = at + 1


class Haystack:
    """An output (batch, pack) indexed once for payload searches."""

    def __init__(self, output: Any) -> None:
        leaves: list[tuple[str, Any]] = []
        _walk(_pixels(output), "", 0, leaves, skip_private=False)
        self.tensors = [(p, t) for p, t in leaves if isinstance(t, torch.Tensor)]
        self.texts = [(p, t) for p, t in leaves if isinstance(t, str)]
        self._moved: dict[tuple[int, int, int | None], bytes] = {}

    # -- tensors -------------------------------------------------------------------------------------

    def _axis_bytes(self, index: int, tensor: torch.Tensor, axis: int, row: int | None) -> bytes:
        key = (index, axis, row)
        if key not in self._moved:
            base = tensor if row is None else tensor[row]
            self._moved[key] = _bits(base.movedim(axis, 0)) if base.ndim else _bits(base)
        return self._moved[key]

    def _in(
        self, index: int, path: str, leaf: torch.Tensor, needle: torch.Tensor, row: int | None
    ) -> list[Place]:
        """Places of ``needle`` in ``leaf`` (or its row ``row``) of as many dimensions: the whole of it,
        or a block of it (a slice along one axis: concatenated samples; along several: padding)."""
        hay = leaf if row is None else leaf[row]
        if hay.ndim != needle.ndim or hay.dtype != needle.dtype or not needle.ndim:
            if hay.ndim == needle.ndim == 0 and hay.dtype == needle.dtype and _bits(hay) == _bits(needle):
                return [Place(path, "the whole tensor", (0,), row=row)]
            return []
        prefix = "" if row is None else f"row {row}, "
        if hay.shape == needle.shape:
            if _bits(hay) == _bits(needle):
                how = "the whole tensor" if row is None else f"row {row}"
                return [Place(path, how, (0,), row=row, length=needle.shape[0])]
            return []
        if any(h < n for h, n in zip(hay.shape, needle.shape, strict=True)):
            return []
        extended = [d for d in range(needle.ndim) if hay.shape[d] != needle.shape[d]]
        if len(extended) == 1 and len(_bits(needle)) < MIN_SEARCHED_BYTES:
            # a small per-sample value (a length [1]) concatenated with the others': compared chunk by
            # chunk at the sample slots, never searched inside other bytes
            axis, step = extended[0], needle.shape[extended[0]]
            if step == 0 or hay.shape[axis] % step:
                return []
            data = _bits(needle)
            chunks = [
                i
                for i in range(min(hay.shape[axis] // step, MAX_ROWS))
                if _bits(hay.narrow(axis, i * step, step)) == data
            ]
            return [
                Place(
                    path,
                    f"{prefix}axis {axis} [{i * step}:{(i + 1) * step}] of {hay.shape[axis]}",
                    (axis, i),
                    row=row,
                    length=step,
                )
                for i in chunks[:MAX_OCCURRENCES]
            ]
        # The block is searched by one innermost row of it, the anchor: the first row that is not one value
        # throughout (a padded or rolled needle may start with zero rows, which occur everywhere).
        rows = needle.reshape(-1, needle.shape[-1])
        anchor = next((i for i in range(min(rows.shape[0], MAX_ROWS)) if not _uniform(rows[i])), 0)
        offset = (*(int(i) for i in np.unravel_index(anchor, tuple(needle.shape[:-1]))), 0)
        first = _bits(rows[anchor])
        if len(first) < MIN_SEARCHED_BYTES // 2 and len(extended) > 1:
            return []  # a tiny innermost vector inside padding: too weak to search
        whole = _bits(needle)
        if len(whole) < MIN_SEARCHED_BYTES:
            return []
        key = (index, -1, row)
        if key not in self._moved:
            self._moved[key] = _bits(hay)
        haybytes = self._moved[key]
        element = needle.element_size()
        places = []
        for at in _aligned_finds(haybytes, first, element):
            found_at = np.unravel_index(at // element, tuple(hay.shape))
            corner = tuple(int(i) - o for i, o in zip(found_at, offset, strict=True))
            if any(c < 0 or c + n > h for c, n, h in zip(corner, needle.shape, hay.shape, strict=True)):
                continue
            block = hay[tuple(slice(c, c + n) for c, n in zip(corner, needle.shape, strict=True))]
            if _bits(block) != whole:
                continue
            if len(extended) == 1:
                axis = extended[0]
                how = f"{prefix}axis {axis} [{corner[axis]}:{corner[axis] + needle.shape[axis]}] of {hay.shape[axis]}"
                length = needle.shape[axis]
            else:
                how = f"{prefix}a block at {list(corner)} of {list(hay.shape)} (padded)"
                length = needle.shape[extended[0]]
            places.append(
                Place(path, how, corner, padded=row is not None or len(extended) > 1, row=row, length=length)
            )
        return places

    def _stacked(self, index: int, path: str, leaf: torch.Tensor, needle: torch.Tensor) -> list[Place]:
        """Places of ``needle`` as one index of ``leaf`` along some axis (a stack of samples)."""
        places = []
        data = _bits(needle)
        for axis in range(leaf.ndim):
            if tuple(s for d, s in enumerate(leaf.shape) if d != axis) != tuple(needle.shape):
                continue
            if len(data) >= MIN_SEARCHED_BYTES:
                rows = [
                    at // len(data)
                    for at in _aligned_finds(self._axis_bytes(index, leaf, axis, None), data, len(data))
                ]
            else:  # a small payload: compared row by row, never searched inside other bytes
                rows = [
                    i for i in range(min(leaf.shape[axis], MAX_ROWS)) if _bits(leaf.select(axis, i)) == data
                ]
            how = "row {}" if axis == 0 else f"index {{}} of axis {axis}"
            places += [Place(path, how.format(i), (axis, i), row=i) for i in rows[:MAX_OCCURRENCES]]
        return places

    def find(self, payload: Payload) -> list[Place]:
        """Every place ``payload`` occurs in the output (empty when it is nowhere)."""
        if isinstance(payload.value, str):
            return self._find_text(payload.value)
        needle = payload.value
        found: list[Place] = []
        for index, (path, leaf) in enumerate(self.tensors):
            if leaf.dtype != needle.dtype or not leaf.numel():
                continue
            found += self._placed(index, path, leaf, needle)
            if not any(place.path == path for place in found) and (1 in leaf.shape or 1 in needle.shape):
                # The same values with unit axes added or removed (an image as a one-frame video
                # [C, 1, H, W]; a packed sequence as [S, 1, D]): a layout, not a loss.
                unit_free = _without_unit_axes(leaf), _without_unit_axes(needle)
                if unit_free[0] is not leaf or unit_free[1] is not needle:
                    found += [
                        dataclasses.replace(place, how=f"{place.how} (unit axes left out)")
                        for place in self._placed(len(self.tensors) + index, path, *unit_free)
                    ]
            if not any(place.path == path for place in found) and leaf.numel() >= needle.numel():
                data = _bits(needle)
                if len(data) >= MIN_SEARCHED_BYTES and leaf.ndim < needle.ndim:
                    for at in _aligned_finds(_bits(leaf), data, needle.element_size()):
                        element = at // needle.element_size()
                        found.append(
                            Place(path, f"contiguous elements [{element}:{element + needle.numel()}]", (at,))
                        )
        return found

    def _placed(self, index: int, path: str, leaf: torch.Tensor, needle: torch.Tensor) -> list[Place]:
        """Places of ``needle`` in ``leaf`` of as many dimensions or one more (a stack, padded rows)."""
        depth = leaf.ndim - needle.ndim
        if depth == 0:
            return self._in(index, path, leaf, needle, None)
        if depth != 1:
            return []
        stacked = self._stacked(index, path, leaf, needle)
        if stacked:
            return stacked
        found: list[Place] = []
        for row in range(min(leaf.shape[0], MAX_ROWS)):  # padded rows: the needle is a slice of one row
            found += self._in(index, path, leaf, needle, row)
        return found

    def near(self, payload: Payload) -> str:
        """For a payload found nowhere: the closest thing the output holds (a cast, a reshaped copy), or ""."""
        if isinstance(payload.value, str):
            return ""
        needle = payload.value
        for path, leaf in self.tensors:
            if leaf.dtype != needle.dtype and leaf.numel() and leaf.shape[-needle.ndim :] == needle.shape:
                try:
                    cast = needle.to(leaf.dtype)
                except Exception:
                    continue
                if _bits(cast) in _bits(leaf):
                    return f"{path} holds it cast to {str(leaf.dtype).removeprefix('torch.')}"
        for path, leaf in self.tensors:
            if leaf.dtype == needle.dtype and leaf.numel() >= needle.numel():
                flat = _bits(needle)
                if len(flat) >= MIN_SEARCHED_BYTES and flat in _bits(leaf):
                    return f"{path} holds its bytes, reshaped"
        return ""

    def _find_text(self, text: str) -> list[Place]:
        places = []
        for path, leaf in self.texts:
            if leaf == text:
                places.append(Place(path, "equal text", (0,)))
            elif len(text) >= MIN_SEARCHED_CHARS and text in leaf:
                places.append(Place(path, f"inside a text at {leaf.index(text)}", (leaf.index(text),)))
        return places

    # -- what padding hides ----------------------------------------------------------------------------

    def lengths_known(self, place: Place, covered: int | None = None) -> bool:
        """Whether the output carries, beside a padded place, what tells the padding from the data: the
        payload's length (or ``covered``, what all payloads of its row take up) as an integer
        (``seq_lens``, ``cu_seqlens`` differences, a per-row length), or a mask whose row has that many
        (or a multiple as many) elements set."""
        lengths = {n for n in (place.length, covered) if n}
        if not lengths:
            return False
        for _path, leaf in self.tensors:
            if leaf.is_complex() or not leaf.numel():
                continue
            # a mask: bool, or integers or floats (NeMo's bf16 loss_mask) holding only 0 and 1
            binary = leaf.dtype == torch.bool or (
                leaf.numel() > 1 and bool(((leaf == 0) | (leaf == 1)).all())
            )
            if binary and place.row is not None and leaf.ndim >= 2 and place.row < leaf.shape[0]:
                ones = int(leaf[place.row].to(torch.int64).sum())
                if any(ones == n or (ones > 0 and ones % n == 0) for n in lengths):
                    return True
            if leaf.dtype == torch.bool or leaf.is_floating_point():
                continue
            values = leaf.reshape(-1).to(torch.int64).tolist()[:MAX_LEAVES]
            if lengths & set(values):
                return True
            if len(values) > 1 and lengths & {b - a for a, b in zip(values, values[1:], strict=False)}:
                return True
        return False


@dataclass
class SampleTrace:
    """Where one sample's payloads went."""

    key: str
    places: dict[str, list[Place]]  # payload path -> places
    payloads: dict[str, Payload]

    def missing(self) -> list[str]:
        return [path for path, places in self.places.items() if not places]


@dataclass
class Trace:
    """Where every sample of an output went (see :func:`trace`)."""

    samples: list[SampleTrace]
    haystack: Haystack

    def lost(self, required: Any = None, *, keys: bool = False) -> list[tuple[str, str, str]]:
        """``(key, payload path, why)`` for each payload that is lost: found nowhere while the same payload
        path of another sample of the output was found (so the output carries that field, but not for
        this sample), or found nowhere for any sample while ``required(key, payload)`` says it is
        required data. A payload found for no sample and not required is a dropped field (see
        :meth:`dropped`), not lost data. With ``keys``, a sample whose ``__key__`` is missing from an
        output that carries the keys of the others is lost too (a batch that labels its data with another
        sample's key; a pack may carry one key for all its samples, so packs are not asked)."""
        carried = {path for s in self.samples for path, places in s.places.items() if places}
        out = []
        for sample in self.samples:
            for path in sample.missing():
                payload = sample.payloads[path]
                if keys and path == KEY and path in carried:  # the output names others but not this one
                    others = [s.key for s in self.samples if s.places.get(path)]
                    out.append(
                        (
                            sample.key,
                            path,
                            f"the output carries the keys of {_keys(others)} but not this sample's: its data is "
                            "labelled as another sample's",
                        )
                    )
                    continue
                if path == KEY:
                    continue
                if path in carried:
                    if isinstance(payload.value, torch.Tensor) and _uniform(payload.value):
                        # one value throughout (a mask of ones, a zero padding): another sample's equal
                        # payload may be this one's, so its absence cannot be told by value
                        continue
                    others = [s.key for s in self.samples if s.places.get(path)]
                    out.append(
                        (
                            sample.key,
                            path,
                            f"the output holds the {_what(path)} of {_keys(others)} but not this sample's",
                        )
                    )
                elif required is not None and required(sample.key, payload):
                    near = self.haystack.near(payload)
                    out.append(
                        (
                            sample.key,
                            path,
                            f"its {_what(path)} is required data and is found nowhere in the output"
                            + (f" ({near})" if near else ""),
                        )
                    )
        return out

    def dropped(self, required: Any = None) -> list[str]:
        """Payload paths that no sample's payload reached and that are not required data (a field the
        output leaves out for every sample)."""
        paths: dict[str, bool] = {}
        for sample in self.samples:
            for path in sample.missing():
                if path == KEY:
                    continue
                needed = required is not None and required(sample.key, sample.payloads[path])
                paths[path] = paths.get(path, False) or needed
        carried = {path for s in self.samples for path, places in s.places.items() if places}
        return [path for path, needed in paths.items() if not needed and path not in carried]

    def duplicated(self) -> list[tuple[str, str, list[Place]]]:
        """``(key, path, places)`` for a payload that occurs more often in one output leaf than samples
        carrying that value were given (a repeated sample)."""
        counts: dict[tuple[str, bytes | str], int] = {}
        for sample in self.samples:
            for path, payload in sample.payloads.items():
                counts[(path, _identity(payload))] = counts.get((path, _identity(payload)), 0) + 1
        out = []
        for sample in self.samples:
            for path, places in sample.places.items():
                payload = sample.payloads[path]
                if (
                    payload.size < MIN_SEARCHED_BYTES
                    or isinstance(payload.value, str)
                    or _uniform(payload.value)
                ):
                    continue  # a mask of ones or a zero fill occurs inside any larger one: no evidence
                per_leaf: dict[str, int] = {}
                spans: dict[str, list[tuple[Any, int, int]]] = {}
                for place in places:
                    start = place.position[-1] if place.position else 0
                    span = (place.row, start, start + max(payload.size, 1))
                    taken = spans.setdefault(place.path, [])
                    if any(r == span[0] and a < span[2] and span[1] < b for r, a, b in taken):
                        continue  # overlapping occurrences are one
                    taken.append(span)
                    per_leaf[place.path] = per_leaf.get(place.path, 0) + 1
                given = counts[(path, _identity(payload))]
                if any(n > given for n in per_leaf.values()):
                    out.append((sample.key, path, places))
        return out

    def mixed(self) -> list[str]:
        """Leaves that hold several samples' payloads in an order that contradicts another leaf's order:
        the fields of different samples mixed up (sample a's latents beside sample b's embeddings).
        Only payloads that are distinct among the samples and found exactly once count."""
        orders: dict[str, list[tuple[tuple[int, ...], str]]] = {}
        identities: dict[tuple[str, bytes | str], int] = {}
        for sample in self.samples:
            for path, payload in sample.payloads.items():
                identities[(path, _identity(payload))] = identities.get((path, _identity(payload)), 0) + 1
        for sample in self.samples:
            slots: dict[str, tuple[int, ...]] = {}
            for path, places in sample.places.items():
                payload = sample.payloads[path]
                if len(places) != 1 or identities[(path, _identity(payload))] != 1:
                    continue
                group, position = _slot(places[0])
                slots.setdefault(group, position)  # several payloads of one sample in a group: one entry
            for group, position in slots.items():
                orders.setdefault(group, []).append((position, sample.key))
        sequences = {
            leaf: [key for _, key in sorted(entries)] for leaf, entries in orders.items() if len(entries) > 1
        }
        groups: dict[tuple[str, ...], list[str]] = {}
        for leaf in sorted(sequences):
            groups.setdefault(tuple(sequences[leaf]), []).append(leaf)
        ranked = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1]))
        for i, (order_a, leaves_a) in enumerate(ranked):
            for order_b, leaves_b in ranked[i + 1 :]:
                common = [k for k in order_a if k in order_b]
                if len(common) >= 2 and common != [k for k in order_b if k in common]:
                    return [
                        f"the fields of different samples are mixed up: {', '.join(leaves_a)} hold the samples in "
                        f"the order {[k for k in order_a if k in common]}, {', '.join(leaves_b)} in the order "
                        f"{[k for k in order_b if k in common]}"
                    ]
        return []

    def order(self, keys: Sequence[str]) -> list[str] | None:
        """The order in which the output holds the samples, when its leaves agree on one, else None."""
        sequences: dict[str, list[tuple[tuple[int, ...], str]]] = {}
        for sample in self.samples:
            slots: dict[str, tuple[int, ...]] = {}
            for places in sample.places.values():
                if len(places) == 1:
                    group, position = _slot(places[0])
                    slots.setdefault(group, position)
            for group, position in slots.items():
                sequences.setdefault(group, []).append((position, sample.key))
        full = [
            [key for _, key in sorted(entries)]
            for entries in sequences.values()
            if sorted(key for _, key in entries) == sorted(keys) and len(set(keys)) == len(keys)
        ]
        return full[0] if full else None


_INDEX = re.compile(r"\[(\d+)\]")


def _without_unit_axes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with its size-1 axes left out (itself when it has none; one axis is kept)."""
    if 1 not in tensor.shape:
        return tensor
    return tensor.reshape([d for d in tensor.shape if d != 1] or [1])


def _slot(place: Place) -> tuple[str, tuple[int, ...]]:
    """The group a place belongs to and its position there: list entries of one list are one group
    (``meta[2].pooled`` is entry 2 of ``meta[].pooled``), rows of a stack are positions in it."""
    indices = tuple(int(i) for i in _INDEX.findall(place.path))
    group = _INDEX.sub("[]", place.path)
    return group, (*indices, place.row if place.row is not None else -1, *place.position)


def _uniform(value: Any) -> bool:
    """A tensor whose every element is the same (a mask of ones, a zero fill)."""
    if not isinstance(value, torch.Tensor) or value.numel() < 2:
        return False
    flat = value.reshape(-1)
    return bool((flat == flat[0]).all())


def identity(payload: Payload) -> bytes | str:
    """A payload's value as one comparable object (dtype, shape and bits of a tensor; a text itself)."""
    return _identity(payload)


def _identity(payload: Payload) -> bytes | str:
    value = payload.value
    return (
        value
        if isinstance(value, str)
        else str(value.dtype).encode() + bytes(str(list(value.shape)), "ascii") + _bits(value)
    )


def _what(path: str) -> str:
    return f"{path!r}"


def _keys(keys: list[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:4])
    return f"sample(s) {shown}" + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


def trace(samples: Sequence[Any], output: Any, keys: Sequence[str] | None = None) -> Trace:
    """Search ``output`` for every payload of every sample (``keys``: the samples' keys, else their
    ``__key__`` or their index). A sample's ``__key__`` is searched too, under :data:`KEY`: never lost
    data, but an order to compare the data's with."""
    haystack = Haystack(output)
    traced = []
    seen: dict[str, int] = {}
    for index, sample in enumerate(samples):
        key = keys[index] if keys is not None else _key_of(sample, index)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:  # two samples sharing a key (two datasets of a blend) stay two samples
            key = f"{key} (#{index})"
        found = {p.path or "(the sample itself)": p for p in payloads(sample)}
        own_key = _key_of(sample, -1)
        if own_key != "#-1":
            found[KEY] = Payload(KEY, own_key)
        traced.append(SampleTrace(key, {path: haystack.find(p) for path, p in found.items()}, found))
    return Trace(traced, haystack)


def required_by(values_by_key: Mapping[str, Sequence[Any]]) -> Any:
    """A ``required(key, payload)`` predicate for :meth:`Trace.lost`: a payload is required data when it
    is (bitwise) one of the values its sample's required members hold (see
    ``oracle.required_values``), so a field traced to a latent or an embedding is required wherever it
    travels, and a caption next to them is not."""
    identities = {
        key: {_identity(Payload("", value)) for value in values} for key, values in values_by_key.items()
    }

    def required(key: str, payload: Payload) -> bool:
        return payload.path != KEY and _identity(payload) in identities.get(key, ())

    return required


def _key_of(sample: Any, index: int) -> str:
    if isinstance(sample, Mapping):
        key = sample.get("__key__")
    else:
        key = getattr(sample, "__key__", None)
    return str(key) if key is not None else f"#{index}"


def padding_problems(result: Trace) -> list[str]:
    """Payloads that sit in padded rows with no length or mask beside them in the output."""
    covered: dict[tuple[str, int | None], int] = {}
    for sample in result.samples:
        for path, places in sample.places.items():
            if path != KEY and len(places) == 1 and places[0].length:
                slot = (places[0].path, places[0].row)
                covered[slot] = covered.get(slot, 0) + places[0].length
    problems = []
    for sample in result.samples:
        for path, places in sample.places.items():
            if (
                places
                and all(p.padded for p in places)
                and not any(result.haystack.lengths_known(p, covered.get((p.path, p.row))) for p in places)
            ):
                problems.append(
                    f"sample {sample.key!r}'s {path!r} sits in a padded row ({places[0]}) and the batch carries "
                    "no length or mask for it: the padding becomes training data the sample never had"
                )
    return problems
