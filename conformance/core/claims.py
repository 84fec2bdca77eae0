"""Claims: the named, separately reported statements a property is made of.

A property (``bad_input``) is a list of claims (``bad_input/code_execution``, ``bad_input/missing_member``,
...). Each claim runs and is reported on its own, so a failing claim never hides another. A claim is
either a **defect** claim, whose failure means the target can lose, corrupt, duplicate or reorder data,
break determinism or checkpoint resume, let bad input become a training sample or run code from a shard
(the run fails), or an **advice** claim: an opinion the suite reports (terminal summary, ``report.json``'s
``advice``, ``report.md``) without changing the exit status, unless ``--conformance-strict``. A claim the
suite could not judge (it could not build data that exercises it, or the target cannot cook the data the
suite derived although it cooks the user's own) is **inconclusive**: never a defect and never a pass,
listed like advice, changing the exit status only under ``--conformance-strict``.

A check uses a :class:`ClaimRecorder`::

    with claims.claim("missing_member") as claim:
        ...
        claim.examined()                 # one more case looked at
        claim.problem("...")             # a violation; the claim goes on
        fail("...")                      # a violation that ends this claim (PropertyFailure)
        claim.inconclusive("...")        # this claim cannot be judged; it goes on (problems still win)
        raise Inconclusive("...")        # the same, ending this claim
    claims.not_applicable("images", "the format has no image members")
    claims.inconclusive("unicode", "no text member to vary")   # a claim the check does not run

A claim that examined nothing and found nothing fails: it has not passed (unless it was declared
inconclusive). :class:`~primus_energon.conformance.core.results.Inconclusive` raised outside any claim makes
every claim the check did not reach inconclusive. An exception the target raised
on clean data (:class:`~primus_energon.conformance.core.results.TargetError`) fails the claim it happened in; any other
exception is the suite's own defect and gives the verdict ``error``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sysconfig
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from . import breadcrumbs
from .rendering import describe_error
from .results import ClaimResult, ClaimVerdict, Inconclusive, PropertyFailure, PropertySkipped, TargetError

__all__ = [
    "Harm",
    "Claim",
    "ClaimResult",
    "ClaimCheck",
    "ClaimRecorder",
    "ClaimVerdict",
]


class Harm(IntEnum):
    """What a failing claim does to a training run; lower is worse (reports list the worst first)."""

    SECURITY = 0  # code from a shard runs
    DATA = 1  # samples lost, duplicated, reordered or corrupted
    BAD_INPUT = 2  # a faulty sample becomes a training sample
    CRASH = 3  # training stops or never starts (an error on clean data, a hang), loudly
    DETERMINISM = 4  # two identical runs differ
    RESUME = 5  # a resumed run continues elsewhere
    PERFORMANCE = 6  # slower than the rate the user asked for (--min-samples-per-s)
    ADVICE = 9  # an opinion: never fails unless --conformance-strict

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", " ")


@dataclass(frozen=True)
class Claim:
    """One statement about a target. ``name`` is unique within its property; ``id`` is ``property/name``."""

    property: str
    name: str
    title: str
    harm: Harm
    #: what to do when it fails (the failure message says the specific case)
    fix: str = ""
    #: runs even when the target cannot cook clean data (security claims)
    always: bool = False
    #: applies to these target kinds only
    applies_to: frozenset[str] = frozenset({"cooker", "task_encoder"})

    @property
    def id(self) -> str:
        return f"{self.property}/{self.name}"

    @property
    def advice(self) -> bool:
        return self.harm is Harm.ADVICE


def claims_of(property_id: str, *specs: tuple) -> tuple[Claim, ...]:
    """``Claim``s of one property from ``(name, title, harm[, fix[, options]])`` tuples."""
    out = []
    for spec in specs:
        name, title, harm, *rest = spec
        fix = rest[0] if rest else ""
        options = rest[1] if len(rest) > 1 else {}
        out.append(Claim(property_id, name, title, harm, fix, **options))
    return tuple(out)


@dataclass
class ClaimCheck:
    """The handle a check gets inside ``with claims.claim(name)``."""

    claim: Claim
    problems: list[str] = field(default_factory=list)
    by_sample: dict[str, list[str]] = field(default_factory=dict)
    count: int = 0
    why_nothing: str = ""
    notes: list[str] = field(default_factory=list)
    #: why this claim cannot be judged (see :meth:`inconclusive`)
    reasons: list[str] = field(default_factory=list)

    def examined(self, count: int = 1) -> None:
        """Record that ``count`` more cases were examined (a claim that examined none has not passed)."""
        self.count += count

    def problem(self, message: str, *, sample: str | None = None) -> None:
        """Record a violation and go on (the claim fails; every problem is reported). With ``sample``, the
        same message for several samples is reported once, with the samples it was seen in."""
        if sample is not None:
            keys = self.by_sample.setdefault(message, [])
            if not keys:
                self.problems.append(message)
            keys.append(sample)
        elif message not in self.problems:
            self.problems.append(message)

    def rendered(self) -> list[str]:
        """The problems, each once, with the samples it was seen in."""
        out = []
        for message in self.problems:
            keys = self.by_sample.get(message)
            if keys:
                shown = ", ".join(repr(k) for k in keys[:3]) + (", ..." if len(keys) > 3 else "")
                message += f" (sample {shown})" if len(keys) == 1 else f" ({len(keys)} samples: {shown})"
            out.append(message)
        return out

    def inconclusive(self, reason: str) -> None:
        """This claim cannot be judged, because ``reason``; the claim goes on. At its end, a problem still
        fails it (or is advice); otherwise its verdict is ``inconclusive``, with every reason given."""
        if reason not in self.reasons:
            self.reasons.append(reason)

    def nothing_because(self, reason: str) -> None:
        """Why this claim could examine nothing (said if it ends with nothing examined)."""
        self.why_nothing = reason

    def note(self, message: str) -> None:
        """Something the report says about how the claim was checked (e.g. on which data, what was left
        out and why); it is the message of a claim that passes."""
        if message and message not in self.notes:
            self.notes.append(message)


#: at most this many problems of one claim are spelled out; the rest are counted
MAX_PROBLEMS_SHOWN = 6


class ClaimRecorder:
    """Collects the claim results of one property run (see the module docstring)."""

    def __init__(
        self,
        claims: Sequence[Claim],
        *,
        kind: str,
        reproduce: Callable[[str], str],
        unreadable: Callable[[], str] = lambda: "",
    ) -> None:
        self._claims = {c.name: c for c in claims}
        self._kind = kind
        self._reproduce = reproduce
        self._unreadable = unreadable
        self._results: dict[str, ClaimResult] = {}
        self._checks: dict[str, ClaimCheck] = {}
        #: set when the property is blocked: only ``always`` claims run; entering another one stops the
        #: check (its claims were already marked blocked)
        self.only_always = False

    # -- used by checks ------------------------------------------------------------------------------------

    def declared(self, name: str) -> Claim:
        try:
            return self._claims[name]
        except KeyError:
            raise KeyError(f"claim {name!r} is not declared; declared: {sorted(self._claims)}") from None

    @contextlib.contextmanager
    def claim(self, name: str) -> Iterator[ClaimCheck]:
        """Run one claim; entering the same claim again adds to it (e.g. once per data format)."""
        claim = self.declared(name)
        if self.only_always and not claim.always:
            raise PropertySkipped("blocked")
        check = self._checks.setdefault(name, ClaimCheck(claim))
        started = time.perf_counter()
        outcome: tuple[ClaimVerdict, str] | None = None
        try:
            with breadcrumbs.mark(claim=claim.id, call=None):
                yield check
        except PropertyFailure as failure:
            check.problem(failure.message)
        except PropertySkipped as skipped:
            outcome = ("skip", str(skipped))
        except Inconclusive as inconclusive:
            check.inconclusive(inconclusive.reason)
        except Exception as error:
            origin = None if isinstance(error, TargetError) else _target_origin(error)
            died = None if isinstance(error, TargetError) else loader_worker_death(error)
            if isinstance(error, TargetError):
                check.problem(error.message)
            elif died:
                check.problem(died)
            elif origin:
                check.problem(
                    f"the target's own code raised {describe_error(error)} at {origin}, outside any call the "
                    "suite made into it (from a signal handler, a thread or a callback it left behind); in "
                    "training it would stop the run the same way"
                )
            else:
                outcome = ("error", _suite_error(error))
        seconds = time.perf_counter() - started
        previous = self._results.get(name)
        seconds += previous.seconds if previous else 0.0
        if outcome is not None and outcome[0] == "error":
            self._record(claim, "error", outcome[1], check.count, seconds)
        elif outcome is not None and not check.problems and not check.reasons:
            self._record(claim, "skip", outcome[1], check.count, seconds)
        else:
            self._record(claim, None, "", check.count, seconds)

    def failed(self, name: str) -> bool:
        """Whether the claim has run and did not pass (so the claims that depend on it can say so)."""
        result = self._results.get(name)
        return result is not None and result.verdict not in ("pass", "skip")

    def not_applicable(self, name: str, reason: str) -> None:
        """This claim does not apply to the target or its data (a skip, with the reason)."""
        claim = self.declared(name)
        if name not in self._results:
            self._results[name] = ClaimResult(claim.id, claim.title, claim.harm.label, "skip", reason)

    def inconclusive(self, name: str, reason: str) -> None:
        """This claim cannot be judged, because ``reason`` (a claim the check decides not to run); like
        :meth:`not_applicable`, it leaves a claim that has already run as it is."""
        claim = self.declared(name)
        if name not in self._results:
            self._results[name] = ClaimResult(claim.id, claim.title, claim.harm.label, "inconclusive", reason)

    def blocked(self, reason: str) -> None:
        """Every claim not yet run is skipped because ``reason`` (e.g. the target cannot cook clean data)."""
        for name in self._claims:
            self.not_applicable(name, reason)

    def aborted(self, error: BaseException) -> None:
        """The property stopped outside any claim: the claims it did not reach say why (``inconclusive`` for
        :class:`~primus_energon.conformance.core.results.Inconclusive`)."""
        for name, claim in self._claims.items():
            if name in self._results:
                continue
            if isinstance(error, TargetError):
                verdict, message = "fail", f"could not be checked: {error.message}"
            elif isinstance(error, PropertyFailure):
                verdict, message = "fail", f"could not be checked: {error.message}"
            elif loader_worker_death(error):
                verdict, message = "fail", f"could not be checked: {loader_worker_death(error)}"
            elif isinstance(error, PropertySkipped):
                verdict, message = "skip", str(error)
            elif isinstance(error, Inconclusive):
                verdict, message = "inconclusive", f"could not be checked: {error.reason}"
            else:
                verdict, message = "error", _suite_error(error)
            if verdict == "fail" and claim.advice:
                verdict = "advice"
            self._results[name] = ClaimResult(
                claim.id,
                claim.title,
                claim.harm.label,
                verdict,
                message,
                claim.fix if verdict not in ("skip", "inconclusive") else "",
            )

    # -- used by the runner --------------------------------------------------------------------------------

    def results(self) -> list[ClaimResult]:
        """Every declared claim's result, in declaration order; a claim the check never reached is the
        suite's defect (``error``)."""
        out = []
        for name, claim in self._claims.items():
            result = self._results.get(name)
            if result is None:
                if self._kind not in claim.applies_to:
                    result = ClaimResult(
                        claim.id, claim.title, claim.harm.label, "skip", f"applies to {_kinds(claim)} targets"
                    )
                else:
                    result = ClaimResult(
                        claim.id,
                        claim.title,
                        claim.harm.label,
                        "error",
                        "the suite did not run this claim (a defect of the conformance suite)",
                    )
            out.append(result)
        return out

    def _record(
        self, claim: Claim, verdict: ClaimVerdict | None, message: str, count: int, seconds: float
    ) -> None:
        check = self._checks[claim.name]
        fix = ""
        if verdict is None:
            if check.problems:
                verdict = "advice" if claim.advice else "fail"
                message = _join(check.rendered())
                fix = claim.fix
            elif check.reasons:
                verdict = "inconclusive"
                message = "; ".join(check.reasons)
            elif count == 0:
                verdict = "advice" if claim.advice else "fail"
                why = check.why_nothing or self._unreadable() or "no case reached the check"
                message = f"examined nothing, so this claim has not passed: {why}"
                fix = "make the clean data cook (see the reason), then run the suite again"
            else:
                verdict = "pass"
                message = "; ".join(check.notes)
        self._results[claim.name] = ClaimResult(
            claim.id, claim.title, claim.harm.label, verdict, message, fix, count, round(seconds, 3)
        )


def _kinds(claim: Claim) -> str:
    return " and ".join(sorted(k.replace("_", " ") for k in claim.applies_to))


def _join(problems: list[str]) -> str:
    shown = problems[:MAX_PROBLEMS_SHOWN]
    text = "\n".join(f"- {p}" if len(problems) > 1 else p for p in shown)
    if len(problems) > len(shown):
        text += f"\n- ... and {len(problems) - len(shown)} more"
    return text


#: Where the suite's own code lives (this package and the reference library): a frame elsewhere, and not in
#: the standard library or an installed package, is the target's.
_SUITE_ROOTS = tuple(
    os.path.dirname(os.path.realpath(path)) + os.sep
    for path in (__file__, importlib.util.find_spec("primus_energon").origin or "")
    if path
)
_LIBRARY_ROOTS = tuple(
    os.path.realpath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]}
)


def _target_origin(error: BaseException) -> str | None:
    """``file:line (function)`` when the innermost frame of ``error`` is in the target's code (neither the
    suite's, the standard library's nor an installed package's), else None."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return None
    last = frames[-1]
    path = os.path.realpath(last.filename)
    if (
        path.startswith(_SUITE_ROOTS + _LIBRARY_ROOTS)
        or "-packages" + os.sep in path
        or last.filename.startswith("<")
    ):
        return None
    return f"{last.filename}:{last.lineno} ({last.name})"


#: what torch says in the main process when a loader worker dies (raised from its SIGCHLD handler wherever
#: the main process happens to be, or when a queue read finds the worker gone)
_WORKER_DEATH = re.compile(
    r"DataLoader worker \(pids?\(?s?\)? [^)]*\)+ (is killed by signal: [^.\n]*|exited unexpectedly)"
)


def loader_worker_death(error: BaseException) -> str | None:
    """What to say when ``error`` (or an error it was raised from) is torch's report of a loader worker that
    died (a signal: a segfault in a decoder, the kernel's OOM killer; or an exit), else None. A worker runs
    the target's data path, so its death is the target's crash, whichever line of the main process torch's
    handler interrupted to report it: always the same verdict."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        match = _WORKER_DEATH.search(str(current))
        if match:
            return (
                f"a loader worker process {match.group(1).replace('is killed', 'was killed')}: a worker runs the target's decoder, "
                "cooker and encode stages, and in training the same crash stops the run"
            )
        current = current.__cause__ or current.__context__
    return None


def _suite_error(error: BaseException) -> str:
    return (
        f"the conformance suite itself failed ({describe_error(error)}); this is a defect of the "
        f"suite, not of the target. Please report it with this traceback:\n{traceback.format_exc(limit=8)}"
    )
