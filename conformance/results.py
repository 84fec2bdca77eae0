"""What a property check returns: a verdict, a message a user can act on, and how to reproduce it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["Verdict", "PropertyResult", "PropertyFailure", "PropertySkipped"]

Verdict = Literal["pass", "fail", "skip", "xfail", "error"]


class PropertyFailure(AssertionError):
    """Raised by a check when the target violates the property.

    ``message`` says what was expected and what was observed; ``reproduce`` says how to see it again.
    """

    def __init__(self, message: str, *, reproduce: str = "") -> None:
        self.message = message
        self.reproduce = reproduce
        super().__init__(message + (f"\nreproduce: {reproduce}" if reproduce else ""))


class PropertySkipped(Exception):
    """Raised by a check that does not apply to the target (e.g. dispatch for a single cooker)."""


@dataclass
class PropertyResult:
    """One property's outcome for one target."""

    property: str
    target: str
    verdict: Verdict
    message: str = ""
    reproduce: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True unless the property failed or the check itself errored."""
        return self.verdict in ("pass", "skip", "xfail")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
