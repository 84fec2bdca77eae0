"""Target specs: ``MODULE:ATTR`` or ``MODULE:ATTR(NAME=VALUE, ...)``, parsed without evaluating anything.

The arguments are keyword arguments whose values are Python literals (numbers, strings, bytes, ``True``,
``False``, ``None``, and tuples, lists, sets and dicts of those): each value is read with
:func:`ast.literal_eval`, never evaluated, so a command line cannot run code. Standard library only (the
pytest plugin uses this module before torch or Energon are imported).
"""

from __future__ import annotations

import ast
import shlex
from collections.abc import Mapping
from typing import Any

__all__ = ["parse_spec", "format_spec", "check_literal_kwargs", "short_name", "shell_quote"]

_LITERALS = "numbers, strings, bytes, True/False/None, and tuples, lists, sets and dicts of those"


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"pkg.mod:Cls(a=1, b='x')"`` -> ``("pkg.mod:Cls", {"a": 1, "b": "x"})``; no parentheses: no arguments.

    Raises ``ValueError`` (one line, saying what is allowed) for anything but keyword arguments with
    literal values."""
    spec = spec.strip()
    open_at = spec.find("(")
    if open_at < 0:
        return spec, {}
    base, call = spec[:open_at].strip(), spec[open_at:]
    if ":" not in base:
        raise ValueError(
            f"{spec!r} is not MODULE:ATTR(NAME=VALUE, ...) (for example mypkg.te:MyTE(seq_length=1024))"
        )
    try:
        tree = ast.parse("_" + call, mode="eval")
    except SyntaxError as error:
        raise ValueError(
            f"the arguments {call!r} do not parse ({error.msg}); write them as in Python: "
            "ATTR(NAME=VALUE, ...)"
        ) from None
    node = tree.body
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_"):
        raise ValueError(f"expected one argument list after {base}, as in {base}(NAME=VALUE, ...)")
    source = "_" + call
    if node.args:
        first = ast.get_source_segment(source, node.args[0]) or "?"
        raise ValueError(
            f"positional argument {first} not allowed; name every argument (NAME=VALUE), so the "
            "spec means the same whatever the signature's order"
        )
    kwargs: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise ValueError("**-unpacking is not allowed; give each argument as NAME=VALUE")
        text = ast.get_source_segment(source, keyword.value) or "?"
        try:
            kwargs[keyword.arg] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(
                f"{keyword.arg}={text} is not a literal value; arguments may be {_LITERALS} (the "
                "suite never runs code from its command line; for anything else name a module-level "
                "instance or factory: MODULE:ATTR)"
            ) from None
    return base, kwargs


def check_literal_kwargs(label: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` if every key is an identifier and every value a literal that reads back equal from its
    ``repr`` (so a reproduce command and a child process rebuild the same target); else ``ValueError``."""
    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{label}: argument name {name!r} is not an identifier")
        try:
            same = ast.literal_eval(repr(value)) == value
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            same = False
        if not same:
            raise ValueError(
                f"{label}: argument {name}={value!r} is not a literal value; arguments may be {_LITERALS}, so "
                "that a fresh process and the reproduce command rebuild the same target (for other objects "
                "pass a built instance)"
            )
        out[name] = value
    return out


def format_spec(base: str, kwargs: Mapping[str, Any]) -> str:
    """The spec that :func:`parse_spec` reads back as ``(base, kwargs)``."""
    if not kwargs:
        return base
    return f"{base}({', '.join(f'{name}={value!r}' for name, value in kwargs.items())})"


def short_name(spec: str) -> str:
    """The ATTR part of a spec, arguments included (``Cls(a=1)``): test ids and report lines."""
    open_at = spec.find("(")
    base, call = (spec, "") if open_at < 0 else (spec[:open_at], spec[open_at:])
    return (base.rpartition(":")[2] or base) + call


def shell_quote(text: str) -> str:
    """``text`` as one shell word."""
    return shlex.quote(text)
