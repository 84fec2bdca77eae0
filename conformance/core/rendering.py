"""Describing what a target raised or returned, safely: the suite reports on objects it does not control.

A target's exception whose ``__str__`` raises or recurses, or a value whose ``__repr__`` does, is a fact about
the target, never a reason for the suite to fail. Every message that quotes a target's exception or value
goes through here: one line, bounded in length, and never raising (what could not be rendered is named by
its type and what went wrong).
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["describe_error", "error_text", "safe_repr"]


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


def error_text(error: BaseException, limit: int = 400) -> str:
    """``str(error)`` on one line and at most ``limit`` characters; when ``str()`` itself raises (or
    recurses), says so instead of raising."""
    try:
        text = str(error)
    except BaseException as failure:  # noqa: BLE001 - a target's __str__ may raise anything, even SystemExit
        if isinstance(failure, KeyboardInterrupt):
            raise
        return f"<its str() raised {type(failure).__name__}>"
    if not isinstance(text, str):  # a __str__ returning another type is refused by str() already
        return "<its str() returned no text>"
    return _one_line(text, limit)


def describe_error(error: BaseException, limit: int = 400) -> str:
    """``"TypeName: message"`` of a target's exception, one line, bounded, never raising."""
    name = type(error).__name__
    text = error_text(error, limit)
    return f"{name}: {text}" if text else name


class _Repr(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 4
        self.maxstring = 120
        self.maxother = 120

    def repr_instance(self, obj: Any, level: int) -> str:
        try:
            return _one_line(repr(obj), self.maxother)
        except BaseException as failure:  # noqa: BLE001 - see error_text
            if isinstance(failure, KeyboardInterrupt):
                raise
            return f"<{type(obj).__qualname__} whose repr() raised {type(failure).__name__}>"


_REPR = _Repr()


def safe_repr(value: Any, limit: int = 200) -> str:
    """A bounded ``repr`` of a target's value (containers to depth 4); a ``__repr__`` that raises or
    recurses gives ``<Type whose repr() raised ...>``, never an exception."""
    try:
        text = _REPR.repr(value)
    except BaseException as failure:  # noqa: BLE001 - see error_text
        if isinstance(failure, KeyboardInterrupt):
            raise
        text = f"<{type(value).__qualname__} whose repr() raised {type(failure).__name__}>"
    return _one_line(text, limit)
