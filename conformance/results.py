"""What a property check returns: a verdict per claim, a message a user can act on, and how to reproduce it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .claims import ClaimResult

__all__ = ["Verdict", "PropertyResult", "PropertyFailure", "PropertySkipped", "Inconclusive"]

Verdict = Literal["pass", "fail", "skip", "xfail", "error", "inconclusive"]


class PropertyFailure(AssertionError):
    """Raised by a check when the target violates the claim being checked.

    ``message`` says what was expected and what was observed; ``reproduce`` says how to see it again.
    """

    def __init__(self, message: str, *, reproduce: str = "") -> None:
        self.message = message
        self.reproduce = reproduce
        super().__init__(message + (f"\nreproduce: {reproduce}" if reproduce else ""))


class PropertySkipped(Exception):
    """Raised by a check that does not apply to the target (e.g. dispatch for a single cooker)."""


class Inconclusive(Exception):
    """Raised by a check that cannot judge a claim: the suite could not build data that exercises it, or the
    target cannot cook the data the suite derived although it cooks the user's own samples.

    Inside ``with claims.claim(name)`` that claim is ``inconclusive`` (unless it already recorded problems);
    outside any claim, every claim the check did not reach is. Never a defect and never a pass; it changes
    the exit status only under ``--conformance-strict``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass
class PropertyResult:
    """One property's outcome for one target: its claims' verdicts and the property's, derived from them.

    ``verdict`` is ``fail`` when a defect claim failed (or, with ``strict``, an advice claim reported
    something or a claim was inconclusive), ``error`` when the suite itself broke, ``skip`` when nothing
    applied or the property was blocked, ``inconclusive`` when no claim was judged but some were
    inconclusive; ``message`` lists the failed claims, worst first.
    """

    property: str
    target: str
    verdict: Verdict
    message: str = ""
    reproduce: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    claims: list[ClaimResult] = field(default_factory=list)
    #: the data formats the target was checked on, and those it declares but was not (see
    #: ``CheckContext.formats``)
    formats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True unless the property failed or the check itself errored."""
        return self.verdict in ("pass", "skip", "xfail", "inconclusive")

    @property
    def advice(self) -> list[ClaimResult]:
        """The advice claims that reported something (never failures unless strict)."""
        return [c for c in self.claims if c.verdict == "advice"]

    @property
    def inconclusive(self) -> list[ClaimResult]:
        """The claims the suite could not judge (never failures unless strict)."""
        return [c for c in self.claims if c.verdict == "inconclusive"]

    def claim(self, claim_id: str) -> ClaimResult:
        """The result of one claim, by id (``bad_input/missing_member``) or by name (``missing_member``)."""
        for result in self.claims:
            if result.id == claim_id or result.id.partition("/")[2] == claim_id:
                return result
        raise KeyError(f"{self.property} has no claim {claim_id!r}: {[c.id for c in self.claims]}")

    def verdicts(self) -> dict[str, str]:
        """``{claim id: verdict}``."""
        return {c.id: c.verdict for c in self.claims}

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["claims"] = [c.to_dict() for c in self.claims]
        return out
