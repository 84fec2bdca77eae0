"""What became of a member in an output field: the one vocabulary every data claim speaks.

A :class:`Form` says how a field holds the value it depends on: ``kept`` (as it was, or through a
transform the suite recognises as deliberate and harmless: a normalisation, a layout, a widening cast, a
resize or crop that keeps the content, a tokenisation); ``declared`` (changed as a declaration allows);
``undeclared`` (a change a declaration would express, such as a flip, a truncation or a lossy cast: loss
unless declared); ``corrupted`` (a change shown to damage the data: values from another sample, a fill, a
wrap-around, colour lost, axes mixed up, distinct inputs collapsed); ``unrecognised`` (the field depends on
the member through a transform the suite does not know: advice, never loss).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Form", "Verdict", "DEFECTS"]

Verdict = Literal["kept", "declared", "undeclared", "corrupted", "unrecognised"]

#: the verdicts that are lost or damaged data (the rest is kept, or advice)
DEFECTS: frozenset[str] = frozenset({"undeclared", "corrupted"})


@dataclass(frozen=True)
class Form:
    """How an output field holds a member's value."""

    verdict: Verdict
    #: what was done to the value, in words ("resized to 16x16 (bicubic), centre-cropped, normalised to
    #: [-1, 1], CHW")
    how: str
    #: the declaration (``KIND NAME=VALUE ...``, no field) that expresses the change, where one does
    declaration: str | None = None
    #: a short name of the cause, for grouping one root cause once ("normalised twice", "grey")
    cause: str = ""
    #: what the form was fitted with, where samples must agree on it (a scale and shift: ``(scale, shift)``)
    params: tuple = ()

    @property
    def defect(self) -> bool:
        return self.verdict in DEFECTS

    def __str__(self) -> str:
        return self.how
