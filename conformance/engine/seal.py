"""A seal on the suite's own code in the process that runs the target.

The supervised process imports the target into the same interpreter as the claims that judge it. A target
that replaces a function of the suite there (``ClaimRecorder.problem`` made a no-op, a comparison made to
say "equal") could turn a failing claim into a pass. :func:`take` records every function and class of the
``primus_energon.conformance`` modules (module attributes, class attributes, and each function's code
object) before the target is imported; :meth:`Seal.broken` names what is no longer the same. A broken seal
fails every claim the process judged afterwards: nothing it reports can be trusted.

What this cannot guarantee: a target that deliberately defeats the seal too (patching this module, or
changing objects in place in ways that keep their identity) in its own process. The seal catches a patch,
by accident or on purpose, of the code that judges; it is no sandbox.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["PACKAGE", "Seal", "take"]

#: the package whose code is sealed
PACKAGE = "primus_energon.conformance"


class Seal:
    """The suite's functions and classes as they were when :func:`take` ran."""

    def __init__(self, entries: dict[str, tuple[Any, Any]]) -> None:
        #: dotted name -> (the object, its code object for a function, else None)
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    def broken(self) -> list[str]:
        """The dotted names whose object or code is no longer what it was (sorted; empty: intact)."""
        current = dict(_entries())
        out = []
        for name, (obj, code) in self._entries.items():
            now = current.get(name)
            if now is None or now[0] is not obj or now[1] is not code:
                out.append(name)
        return sorted(out)


def take() -> Seal:
    """Seal every module of :data:`PACKAGE` imported now (import those to be sealed first)."""
    return Seal(dict(_entries()))


def _entries() -> Iterator[tuple[str, tuple[Any, Any]]]:
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == PACKAGE or module_name.startswith(PACKAGE + ".")):
            continue
        for attribute, value in list(vars(module).items()):
            if not _sealed(value, module_name):
                continue
            name = f"{module_name}.{attribute}"
            yield name, (value, getattr(value, "__code__", None))
            if isinstance(value, type):
                for member, item in list(vars(value).items()):
                    function = item.__func__ if isinstance(item, (classmethod, staticmethod)) else item
                    if isinstance(function, types.FunctionType):
                        yield f"{name}.{member}", (item, function.__code__)


def _sealed(value: Any, module_name: str) -> bool:
    """A function or class defined in the module (not one it imported from elsewhere)."""
    return isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == module_name
