"""Lazy package exports (PEP 562): a package names what it exports and where, and a name's module is
imported on first access. ``import primus_energon`` (and so loading the pytest plugin, or ``--help`` of a
console script) then costs nothing: torch, Energon and hypothesis load only when something that needs them
is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, modules: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose submodule ``M`` (relative to the package,
    without the dot) holds the public names ``modules[M]``. A resolved name is cached in the package."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        vars(importlib.import_module(package))[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *where})

    return __getattr__, __dir__
