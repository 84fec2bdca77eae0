"""What a property check returns: a verdict per claim, a message a user can act on, and how to reproduce it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .rendering import error_text

__all__ = [
    "Verdict",
    "ClaimVerdict",
    "ClaimResult",
    "PropertyResult",
    "PropertyFailure",
    "PropertySkipped",
    "Inconclusive",
    "TargetError",
]

Verdict = Literal["pass", "fail", "skip", "xfail", "error", "inconclusive"]
ClaimVerdict = Literal["pass", "fail", "advice", "skip", "xfail", "error", "inconclusive"]


@dataclass
class ClaimResult:
    """One claim's outcome for one target."""

    id: str
    title: str
    harm: str
    verdict: ClaimVerdict
    message: str = ""
    fix: str = ""
    examined: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.verdict in ("pass", "skip", "xfail", "advice", "inconclusive")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PropertyResult:
        """The result :meth:`to_dict` described (as the supervised process sends it)."""
        data = dict(data)
        claims = [ClaimResult(**c) for c in data.pop("claims", [])]
        return cls(**data, claims=claims)


class TargetError(Exception):
    """The target raised while the suite ran it on clean, benign data: a failure of the target (a sample
    it cannot cook is a sample Energon skips), reported on the claim being checked, never as a crash."""

    def __init__(self, what: str, error: BaseException) -> None:
        self.what = what
        self.error = error
        text = error_text(error, 400)
        self.message = f"{what} raised {type(error).__name__}: {text}"
        self.message += _version_hint(text)
        super().__init__(self.message)


#: what an error text means when it comes from code written for an earlier Energon
_VERSION_HINTS = (
    (
        "__subflavor__",
        " (`Sample` has no `__subflavor__` since Energon 7.0: use `__subflavors__`, a dict, e.g. "
        "**basic_sample_keys(sample))",
    ),
    (
        "Cooker must be stateless",
        " (since Energon 7.0 a cook function must be @stateless)",
    ),
)


def _version_hint(text: str) -> str:
    return next((hint for needle, hint in _VERSION_HINTS if needle in text), "")
