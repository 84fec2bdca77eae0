"""Argparse argument types shared by the project's command lines (``primus-energon`` and ``primus-synth``).

Each type takes the argument's text and returns the parsed value, or raises ``argparse.ArgumentTypeError``
with the message argparse prints after ``argument --flag:``. Standard library only, so that ``--help``
imports nothing heavy.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["non_negative_int", "positive_float", "positive_int", "positive_int_or_auto"]


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _int_at_least(text, 1)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    return _int_at_least(text, 0)


def positive_int_or_auto(auto: Callable[[], int]) -> Callable[[str], int]:
    """A type taking an integer >= 1, or the word ``auto``, which becomes ``auto()`` (called only then)."""

    def parse(text: str) -> int:
        if text == "auto":
            return auto()
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be a positive integer or 'auto', got {text!r}")
        return value

    parse.__name__ = "positive_int_or_auto"
    return parse
