"""The one way the suite reads a target's output: its fields by name, a value at a dotted path, and every
leaf with its path. A dict's items, a dataclass's fields (Energon's ``Sample`` and ``Batch``), else an
object's public attributes; nothing of the target's is called but attribute access."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MISSING", "fields", "field_names", "get_field", "field_at", "leaves", "join_path", "top_field"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: what :func:`get_field` and :func:`field_at` return for a field that is not there
MISSING: Any = _Missing()

#: leaves walked in one output and nesting depth followed, at most
MAX_LEAVES = 4096
MAX_DEPTH = 12


def fields(output: Any) -> dict[str, Any]:
    """The output's fields by name (a dict's items, a dataclass's fields, else public attributes that are
    no methods)."""
    if isinstance(output, Mapping):
        return {str(k): v for k, v in output.items()}
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return {f.name: getattr(output, f.name, None) for f in dataclasses.fields(output)}
    out = {}
    for name in dir(output):
        if name.startswith("_"):
            continue
        try:
            value = getattr(output, name)
        except Exception:  # a property that raises is no field
            continue
        if not callable(value):
            out[name] = value
    return out


def field_names(output: Any) -> list[str]:
    return list(fields(output))


def get_field(output: Any, name: str) -> Any:
    """One field by name, or :data:`MISSING`."""
    if isinstance(output, Mapping):
        return output.get(name, MISSING)
    return getattr(output, name, MISSING)


def field_at(output: Any, path: str) -> Any:
    """The value at a dotted path (``caption``, ``metadata.caption``, ``frames[0]``) of a sample or batch,
    or :data:`MISSING`."""
    current = output
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("["):
            index = int(part[1:-1])
            if not isinstance(current, (list, tuple)) or index >= len(current):
                return MISSING
            current = current[index]
        else:
            current = get_field(current, part)
        if current is MISSING:
            return MISSING
    return current


def join_path(path: str, part: str) -> str:
    return f"{path}{part}" if part.startswith("[") else (f"{path}.{part}" if path else part)


def top_field(path: str) -> str:
    """The output field a leaf path sits in (``metadata`` for ``metadata.caption``, ``x`` for ``x[0]``)."""
    return re.split(r"[.\[]", path, maxsplit=1)[0]


def leaves(value: Any, *, skip_private: bool = True) -> list[tuple[str, Any]]:
    """Every leaf of an output with its path: tensors, arrays, texts, bytes, numbers, None, PIL images and
    other objects, inside dicts, lists, tuples and dataclasses (bounded: :data:`MAX_LEAVES`,
    :data:`MAX_DEPTH`); ``__``-fields (keys, restore keys) are left out unless ``skip_private`` is False."""
    out: list[tuple[str, Any]] = []
    _walk(value, "", 0, out, skip_private)
    return out


def _walk(value: Any, path: str, depth: int, out: list[tuple[str, Any]], skip_private: bool) -> None:
    if len(out) >= MAX_LEAVES:
        return
    if depth > MAX_DEPTH:
        out.append((path, value))
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if skip_private and str(key).startswith("__"):
                continue
            _walk(item, join_path(path, str(key)), depth + 1, out, skip_private)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _walk(item, join_path(path, f"[{index}]"), depth + 1, out, skip_private)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            if skip_private and f.name.startswith("__"):
                continue
            _walk(getattr(value, f.name, None), join_path(path, f.name), depth + 1, out, skip_private)
    else:
        out.append((path, value))
