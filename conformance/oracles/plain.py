"""What a target returned, as plain data the judge can compare without running anything of the target's.

A target's output may hold its own types: a caption that is a ``str`` subclass, a tensor subclass with a
``__torch_function__``, a dict subclass, an Energon ``Sample`` dataclass. Comparing those with ``==`` or
reading them with their own methods runs the target's code inside the judge: a ``__ne__`` that always says
"equal" would pass a damaged caption, a slow one would run outside any timed call. :func:`plain` turns an
output into exact built-in types, read through the base types' own methods (``str.__str__``, ``dict.items``,
``torch.Tensor.as_subclass`` with torch functions disabled), **inside the timed call** that produced it; the
claims judge only that. Tensors and arrays are copied, so a buffer the target reuses on its next call cannot
change what was seen.

Kept as they are: ``None``, ``bool``, numpy scalars, and objects the suite cannot open (returned by their
class's name, :class:`Opaque`). Bounded: :data:`MAX_NODES` values, :data:`MAX_DEPTH` levels.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["MAX_DEPTH", "MAX_NODES", "Opaque", "Record", "plain", "type_name"]

#: values converted in one output and nesting followed, at most (past them: :class:`Opaque`)
MAX_NODES = 100_000
MAX_DEPTH = 16


#: modules whose value types (dates, decimals, fractions, UUIDs, paths, enums' values aside) are kept as they
#: are: immutable, of the standard library's own classes (a subclass has the target's module)
_STDLIB_VALUES = frozenset({"datetime", "decimal", "fractions", "uuid", "pathlib", "ipaddress"})


#: packages whose own objects (not a dataclass, not a container) are kept as they are: their code is no
#: target's (a target's subclass of one has the target's module)
_LIBRARIES = frozenset(
    {"megatron", "primus_energon", "multistorageclient", "torch", "numpy", "PIL", "webdataset"}
)


class Record(dict):
    """A target's record (a dataclass such as Energon's ``Sample``, or an object's public attributes) as a
    dict of its fields, with the name of the class it was (:attr:`type_name`). The suite's own class: its
    methods are dict's."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str, fields: dict[str, Any]) -> None:
        super().__init__(fields)
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"{self.type_name}({dict.__repr__(self)})"


@dataclasses.dataclass(frozen=True)
class Opaque:
    """A value the suite does not open (a function, a file, a value past the budget): its class's name."""

    type_name: str

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


def type_name(value: Any) -> str:
    """The name of the class a value was before :func:`plain` (a :class:`Record`'s or :class:`Opaque`'s)."""
    if isinstance(value, (Record, Opaque)):
        return value.type_name
    return type(value).__name__


def plain(value: Any) -> Any:
    """``value`` as plain data (see the module docstring). Run it where the target's code may run: inside
    the timed call that returned ``value``."""
    budget = [MAX_NODES]
    return _plain(value, 0, budget)


def _plain(value: Any, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    cls = type(value)
    if value is None or cls is bool or isinstance(value, np.generic):
        return value
    if budget[0] < 0 or depth > MAX_DEPTH:
        return Opaque(cls.__name__)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, complex):
        return complex(complex.__getattribute__(value, "real"), complex.__getattribute__(value, "imag"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(memoryview(value))
    if isinstance(value, torch.Tensor):
        with torch._C.DisableTorchFunctionSubclass():
            base = torch.Tensor.as_subclass(value, torch.Tensor)
            return base.detach().clone()
    if isinstance(value, np.ndarray):
        array = np.array(value, copy=True, subok=False)
        if array.dtype == object:
            flat = [_plain(item, depth + 1, budget) for item in array.reshape(-1)]
            out = np.empty(len(flat), dtype=object)
            out[:] = flat
            return out.reshape(array.shape)
        return array
    if isinstance(value, dict):
        return {_plain(k, depth + 1, budget): _plain(v, depth + 1, budget) for k, v in dict.items(value)}
    if isinstance(value, Mapping):  # a Mapping of the target's own: read through its own items()
        return Record(cls.__name__, {str(k): _plain(v, depth + 1, budget) for k, v in value.items()})
    if isinstance(value, list):
        return [_plain(item, depth + 1, budget) for item in list.__iter__(value)]
    if isinstance(value, tuple):
        return tuple(_plain(item, depth + 1, budget) for item in tuple.__iter__(value))
    if _is_image(value):
        return sys.modules["PIL.Image"].Image.copy(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return Record(
            cls.__name__,
            {
                f.name: _plain(object.__getattribute__(value, f.name), depth + 1, budget)
                for f in dataclasses.fields(value)
                if hasattr(value, f.name)
            },
        )
    if cls.__module__ in _STDLIB_VALUES:  # an immutable value of the standard library, of its exact type
        return value
    if (cls.__module__ or "").partition(".")[0] in _LIBRARIES:
        return value  # a library's own object (Energon's EPath in __sources__): no code of the target's
    if callable(value) or isinstance(value, type) or isinstance(value, (type(sys), range, slice)):
        return Opaque(cls.__name__)
    # Any other object: its public attributes that are no methods (properties included, as the judge's
    # field accessor reads them), read here, inside the timed call.
    attributes: dict[str, Any] = {}
    for name in dir(value):
        if not isinstance(name, str) or name.startswith("_"):
            continue
        try:
            item = getattr(value, name)
        except Exception:  # a property that raises is no field
            continue
        if not callable(item):
            attributes[name] = _plain(item, depth + 1, budget)
    return Record(cls.__name__, attributes) if attributes else Opaque(cls.__name__)


def _is_image(value: Any) -> bool:
    image = sys.modules.get("PIL.Image")  # a PIL image exists only where PIL was imported
    return image is not None and isinstance(value, image.Image)
