"""The session that runs properties on a target, in the process that runs it: the check context
(:func:`make_context`), child processes started ahead (:func:`prestart`) and one property's run, judged and
concluded (:func:`run_property`). The supervised worker and the in-process Python API both drive it."""

from __future__ import annotations

import contextlib
import copy
import gc
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.claims import ClaimRecorder, ClaimResult, Harm
from ..core.declarations import Transform, parse_transforms
from ..core.profiles import get_profile
from ..core.rendering import describe_error
from ..core.results import PropertyResult
from ..data.workspace import Workspace
from ..processes.children import HASHSEEDS
from ..properties import Property, get_property
from ..properties.conduct import OBSERVATIONS
from . import leftovers as conduct
from .context import CheckContext
from .target import Target, load_object

__all__ = ["make_context", "parse_resume_hooks", "prestart", "run_property"]


def make_context(
    target: Target,
    *,
    workdir: str | Path,
    profile: str = "ci",
    seed: int = 0,
    encoding: str | None = None,
    schema: str | list[str] | tuple[str, ...] | None = None,
    dataset: str | None = None,
    min_samples_per_s: float | None = None,
    strict: bool = False,
    timeout_s: float | None = None,
    call_timeout_s: float | None = None,
    resume_hooks: str | Sequence[str] | None = None,
    watch: str | Path | None = ".",
    watch_exclude: Sequence[str | Path] = (),
    transforms: Sequence[str | Transform] | str | None = None,
    keep_data: bool = False,
) -> CheckContext:
    # Energon runs gc.collect() before forking each loader's workers; in a process holding torch, pytest and
    # hypothesis that walks millions of objects (0.1-0.3 s a loader, dozens of loaders a target). Frozen,
    # the objects alive now (modules, the target) are left out of those walks; what the suite creates from
    # here on is collected as usual.
    _check_environment()
    missing = target.environment_problem()
    if missing is not None:
        raise RuntimeError("broken environment: " + missing)
    gc.freeze()
    workspace = Workspace(
        Path(workdir), seed=seed, schema_files=schema or (), dataset=dataset, keep=keep_data
    )
    timeouts = {}
    if timeout_s is not None:
        timeouts["timeout_s"] = float(timeout_s)
    if call_timeout_s is not None:
        timeouts["call_timeout_s"] = float(call_timeout_s)
    ctx = CheckContext(
        target=target,
        workspace=workspace,
        profile=get_profile(profile),
        seed=seed,
        encoding=encoding,
        min_samples_per_s=min_samples_per_s,
        strict=strict,
        resume_hooks=parse_resume_hooks(resume_hooks),
        watched_folder=Path(watch).resolve() if watch is not None else None,
        watch_exclude=tuple(str(Path(p).resolve()) for p in watch_exclude),
        transforms=parse_transforms(transforms),
        **timeouts,
    )
    problem = ctx.format_problem()
    if problem:
        raise ValueError(f"{target.describe()}: {problem}")
    return ctx


def parse_resume_hooks(hooks: str | Sequence[str] | None) -> tuple[str, ...]:
    """``SAVE,LOAD`` (or a pair) as two ``MODULE:FUNC`` specs, each importing to a callable; ``ValueError``
    saying what is wrong otherwise. Empty for None."""
    if not hooks:
        return ()
    specs = [part.strip() for part in hooks.split(",")] if isinstance(hooks, str) else [str(h) for h in hooks]
    if len(specs) != 2 or not all(specs):
        raise ValueError(
            f"--resume-hooks {hooks!r}: expected SAVE,LOAD, two MODULE:FUNC separated by a comma (called as "
            "save(loader, directory, rank) and load(loader, directory, rank))"
        )
    for role, spec in zip(("save", "load"), specs, strict=True):
        try:
            hook = load_object(spec)
        except ValueError as error:
            raise ValueError(f"--resume-hooks: the {role} hook: {error}") from None
        if not callable(hook):
            raise ValueError(f"--resume-hooks: the {role} hook {spec!r} is not callable")
    return tuple(specs)


_ENVIRONMENT_CHECKED: list[bool] = []


def _check_environment() -> None:
    """``RuntimeError`` (one line, with the fix) when this environment cannot run the suite; once a process."""
    if _ENVIRONMENT_CHECKED:
        return
    from primus_energon.environment import probe_local_paths, problems

    broken = problems() or [line for line in [probe_local_paths()] if line]
    if broken:
        raise RuntimeError("broken environment: " + "; ".join(broken))
    _ENVIRONMENT_CHECKED.append(True)


def prestart(ctx: CheckContext, properties: Iterable[Property]) -> None:
    """Start the child processes of ``properties`` that have a ``prestart`` (fresh-process determinism, the
    torch.distributed run, the code-execution probe) now, so that they run while the properties before
    them are checked. Only for properties that apply to the target; ``ctx.close()`` ends whatever is left.
    A failure to start is raised again, and judged, when the property runs."""
    properties = [p for p in properties if p.prestart is not None and ctx.target.kind in p.applies_to]
    # their fresh processes fork from these: importing torch now overlaps making their data
    ctx.fork_servers.warm(HASHSEEDS[: max((p.hash_seeds for p in properties), default=0)])
    for prop in properties:
        with contextlib.suppress(Exception), ctx.workspace.owned_by(prop.id):  # kept by ctx.started
            ctx.started(prop.id, lambda start=prop.prestart: start(ctx))  # type: ignore[misc]


def run_property(
    prop: Property, ctx: CheckContext, *, expected_failures: Mapping[str, str] | None = None
) -> PropertyResult:
    """Run one property's claims; never raises for a failing or broken target (the verdicts say so).

    ``expected_failures`` maps a property id (every claim) or a claim id (``bad_input/names_sample``) to a
    reason: such a claim's failure is reported as ``xfail``."""
    watch = prop.id != "conduct" and ctx.target.kind in prop.applies_to
    before = conduct.snapshot(ctx.watched_folder, ctx.cached("conduct-known", set)) if watch else None
    try:
        with ctx.workspace.owned_by(prop.id):
            if prop.id == "accepted":
                # Every property consults the accepted verdict (see _blocker): run it once per context.
                result = copy.deepcopy(ctx.cached("accepted-result", lambda: _run(prop, ctx, None)))
            else:
                applies = ctx.target.kind in prop.applies_to
                result = _run(prop, ctx, _blocker(ctx) if prop.needs_loader and applies else None)
    finally:
        ctx.release(prop.id)  # its children, if it started any, are done with (or it was blocked)
        ctx.finished(prop.id)  # and the datasets only it (and properties done before) used
        if before is not None:
            left = conduct.observe(before, exclude=(ctx.workspace.root, *ctx.watch_exclude))
            ctx.cached(OBSERVATIONS, list).append((prop.id, left))
    _apply_expected(result, expected_failures or {})
    _conclude(result, ctx, prop)
    result.formats = copy.deepcopy(ctx.cached("formats", lambda: _formats(ctx)))
    if ctx.workspace.derivations:  # the datasets derived from the user's samples so far, and from how many
        result.formats["derived"] = {
            "from": str(ctx.workspace.dataset),
            "source_samples": len(ctx.workspace.sources()),
            "datasets": copy.deepcopy(ctx.workspace.derivations),
        }
    return result


def _formats(ctx: CheckContext) -> dict[str, Any]:
    try:
        return ctx.formats()
    except Exception as error:  # the data could not be described; the claims say why
        return {"checked": [], "not_checked": [], "error": f"{describe_error(error)}"}


def _run(prop: Property, ctx: CheckContext, blocker: str | None) -> PropertyResult:
    started = time.perf_counter()
    result = PropertyResult(property=prop.id, target=ctx.target.spec, verdict="pass")
    claims = ClaimRecorder(
        prop.claims, kind=ctx.target.kind, reproduce=ctx.reproduce, unreadable=ctx.unreadable
    )
    if ctx.target.kind not in prop.applies_to:
        claims.blocked(
            f"applies to {' and '.join(sorted(k.replace('_', ' ') for k in prop.applies_to))} targets"
        )
    elif blocker is not None:
        claims.blocked(blocker)
        if any(c.always for c in prop.claims):
            claims.only_always = True
            _call(prop, ctx, claims, result)
        result.details["blocked"] = blocker
    else:
        _call(prop, ctx, claims, result)
    result.claims = claims.results()
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def _call(prop: Property, ctx: CheckContext, claims: ClaimRecorder, result: PropertyResult) -> None:
    try:
        result.details = prop.check(ctx, claims) or {}
    except Exception as error:  # outside any claim: the claims it did not reach say why
        claims.aborted(error)


def _blocker(ctx: CheckContext) -> str | None:
    """Why properties that need a working loader cannot run, when ``accepted`` failed; else None."""
    accepted = ctx.cached("accepted-result", lambda: _run(get_property("accepted"), ctx, None))
    failed = sorted((c for c in accepted.claims if c.verdict == "fail"), key=_severity)
    if not failed:
        return None
    first = failed[0]
    return f"blocked by {first.id}: {first.message.splitlines()[0].removeprefix('- ')[:300]}"


def _severity(claim: ClaimResult) -> tuple[int, str]:
    return (Harm[claim.harm.upper().replace(" ", "_")].value, claim.id)


def _apply_expected(result: PropertyResult, expected: Mapping[str, str]) -> None:
    for claim in result.claims:
        reason = expected.get(claim.id, expected.get(result.property))
        if reason is not None and claim.verdict in ("fail", "error", "advice"):
            claim.message = f"expected failure ({reason}): {claim.message}"
            claim.verdict = "xfail"


def _conclude(result: PropertyResult, ctx: CheckContext, prop: Property) -> None:
    """The property's verdict and message from its claims' (worst first; inconclusive claims, which fail
    only under strict, last)."""
    claims = result.claims
    counted = ("fail", "advice", "inconclusive") if ctx.strict else ("fail",)
    failed = sorted(
        (c for c in claims if c.verdict in counted),
        key=lambda c: (c.verdict == "inconclusive", *_severity(c)),
    )
    errors = [c for c in claims if c.verdict == "error"]
    blocked = result.details.get("blocked")
    if errors:
        result.verdict = "error"
    elif failed:
        result.verdict = "fail"
    elif any(c.verdict == "xfail" for c in claims):
        result.verdict = "xfail"
    elif blocked or all(c.verdict == "skip" for c in claims):
        result.verdict = "skip"
    elif all(c.verdict in ("skip", "inconclusive") for c in claims):
        result.verdict = "inconclusive"  # nothing judged; some claims could not be
    else:
        result.verdict = "pass"
    lines = []
    for claim in failed + errors:
        tag = "inconclusive" if claim.verdict == "inconclusive" else claim.harm
        lines.append(f"[{tag}] {claim.id}: {_indent(claim.message)}")
        if claim.fix:
            lines.append(f"    fix: {claim.fix}")
    if result.verdict == "skip":
        reasons = dict.fromkeys(c.message for c in claims if c.verdict == "skip" and c.message)
        ran = [f"{c.id} {c.verdict}" for c in claims if c.verdict not in ("skip",)]
        lines.append(
            (blocked or "; ".join(reasons) or "nothing applies") + (f" ({', '.join(ran)})" if ran else "")
        )
    elif result.verdict == "xfail":
        lines += [f"{c.id}: {c.message}" for c in claims if c.verdict == "xfail"]
    elif result.verdict == "inconclusive":
        lines += [f"{c.id}: {_indent(c.message)}" for c in claims if c.verdict == "inconclusive"]
    result.message = "\n".join(lines)
    if result.verdict in ("fail", "error"):
        result.reproduce = ctx.reproduce(prop.id)
        if _guessed_encoding(ctx) and any(c.id not in _FORMAT_INDEPENDENT for c in failed + errors):
            result.message += (
                f"\n(note: {ctx.target.describe()} declares no `encoding` in has_subflavors, so the suite generated "
                f"{ctx.encodings()[0] or 'preencoded'} data; pass --encoding, --schema FILE or --dataset PATH if it "
                "expects another format)"
            )


#: claims whose verdict does not depend on the data format the suite guessed
_FORMAT_INDEPENDENT = {"accepted/cookers", "accepted/stateless", "bad_input/code_execution"}


def _indent(text: str) -> str:
    return text.replace("\n", "\n    ")


def _guessed_encoding(ctx: CheckContext) -> bool:
    """True when the data format was a guess: no encoding from the cookers, the options or the data."""
    if ctx.target.kind == "wrapper":
        return False  # its data is the reference TaskEncoder's; the format is no guess
    return not (ctx.encoding or ctx.workspace.dataset or ctx.workspace.schema_files) and all(
        (c.has_subflavors or {}).get("encoding") is None for c in ctx.target.cookers
    )
