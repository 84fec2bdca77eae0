"""Property 7, subflavor dispatch (TaskEncoders with several cookers): the cooker that runs for a dataset
is the first one whose ``has_subflavors`` the dataset's subflavors contain (:func:`matching_cooker`), with
the metadataset's per-entry ``subflavors`` merged over ``dataset.yaml``'s (the metadataset wins); a
dataset that no cooker matches makes building the loader fail with an error that says so; and no cooker
is shadowed (never chosen, because an earlier cooker matches every dataset it would).

The static check compares ``has_subflavors`` pairwise. The dynamic check draws subflavor overrides (over
the cookers' keys plus an unknown one, with the cookers' values plus an unseen one), writes a one-entry
metadataset per draw, builds a validation loader with an instrumented TaskEncoder and reads which cooker
ran on the first sample. The record is written before the cooker runs, so a cooker that cannot cook the
data it was routed to (a raw cooker on preencoded data) still tells which one was chosen.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st
from megatron.energon import Cooker, TaskEncoder

from primus_energon.energon_compat import COOKERS_CHOSEN_PER_SAMPLE, NO_COOKER_BEHAVIOUR, is_no_cooker_error

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..core.rendering import describe_error, error_text
from ..core.results import PropertySkipped
from ..engine.calls import build_loader, closing, dataset_sample, matching_cooker
from ..engine.context import CheckContext
from ..engine.recording import instrument, read_records

__all__ = ["check", "shadowed_cookers", "describe_cooker"]

CLAIMS = claims_of(
    "dispatch",
    (
        "first_match",
        "the cooker that runs for a dataset is the first whose has_subflavors the dataset's (merged) "
        "subflavors contain",
        Harm.DATA,
        "order the cookers from the most specific has_subflavors to the least",
    ),
    (
        "no_match",
        "a dataset no cooker matches makes building the loader fail with an error that says so",
        Harm.DATA,
        "let Energon raise its own error for data no cooker matches (do not route unmatched data to a fallback "
        "cooker), and keep that error's wording if you raise your own",
    ),
    (
        "shadowed",
        "no cooker is shadowed (never chosen, because an earlier one matches everything it would)",
        Harm.ADVICE,
        "put the more specific cooker first, or remove one",
    ),
)

_EXTRA_KEY = "conformance_extra"
_UNSEEN = "conformance-unseen"
_MAX_EXAMPLES = 12


def describe_cooker(cookers: list[Cooker], index: int) -> str:
    """``cooker 1 (cook_raw, has_subflavors={'encoding': 'raw'})``."""
    cooker = cookers[index]
    name = getattr(cooker.cook, "__qualname__", None) or type(cooker.cook).__name__
    return f"cooker {index} ({name}, has_subflavors={cooker.has_subflavors!r})"


def shadowed_cookers(cookers: list[Cooker]) -> list[tuple[int, int]]:
    """``(earlier, later)`` pairs where ``later`` can never be chosen: ``earlier``'s ``has_subflavors``
    (None counts as {}) is contained in ``later``'s, so every dataset ``later`` matches, ``earlier``
    matches first. Only the first shadowing cooker is given for each shadowed one."""
    pairs = []
    for later, cooker in enumerate(cookers):
        wanted = cooker.has_subflavors or {}
        for earlier in range(later):
            condition = cookers[earlier].has_subflavors or {}
            if all(key in wanted and wanted[key] == value for key, value in condition.items()):
                pairs.append((earlier, later))
                break
    return pairs


def _fresh_task_encoder(ctx: CheckContext) -> TaskEncoder:
    """A TaskEncoder to instrument; an instance target is copied so that its cookers stay untouched."""
    task_encoder = ctx.target.make_task_encoder()
    try:
        return copy.copy(task_encoder)
    except Exception:  # an uncopyable instance: instrument it in place
        return task_encoder


def _vocabulary(cookers: list[Cooker]) -> tuple[list[str], list[Any]]:
    keys: list[str] = []
    values: list[Any] = []
    for cooker in cookers:
        for key, value in (cooker.has_subflavors or {}).items():
            if key not in keys:
                keys.append(key)
            if value not in values:
                values.append(value)
    return keys + [_EXTRA_KEY], values + [_UNSEEN]


def _error_text(error: BaseException) -> str:
    return f"{describe_error(error, 300)}"


def _run(
    ctx: CheckContext, cookers: list[Cooker], encoding: str | None, overrides: dict[str, Any]
) -> tuple[str, str | None]:
    """Build a loader over a one-entry metadataset with ``overrides`` and compare the chosen cooker with
    the first-match oracle: ``(claim, problem or None)``."""
    dataset = ctx.generated(encoding, "dispatch", num_samples=4, shard_size=4)
    base = ctx.workspace.subflavors(dataset)
    merged = {**base, **overrides}
    expected = matching_cooker(cookers, dataset_sample(merged))
    claim = "first_match" if expected is not None else "no_match"
    ident = hashlib.sha256(json.dumps([str(dataset), overrides], sort_keys=True, default=str).encode())
    name = f"dispatch-{ident.hexdigest()[:12]}"
    metadataset = ctx.workspace.metadataset(name, [(dataset, 1.0, overrides)])
    sink = Path(ctx.workspace.root) / f"{name}.records.jsonl"
    sink.unlink(missing_ok=True)
    task_encoder = instrument(_fresh_task_encoder(ctx), sink)
    case = (
        f"dataset subflavors {base!r} with metadataset override {overrides!r} (merged: {merged!r})"
        if overrides
        else f"dataset subflavors {base!r} (no metadataset override)"
    )
    try:
        loader = build_loader(
            ctx.target,
            metadataset,
            batch_size=1,
            num_workers=0,
            seed=ctx.seed,
            mode="val",
            split_part="train",
            task_encoder=task_encoder,
        )
    except Exception as error:
        error = getattr(error, "error", error)  # a TargetError: the exception the target raised
        if expected is not None:
            return claim, (
                f"{case}: building the loader raised {_error_text(error)}, but "
                f"{describe_cooker(cookers, expected)} matches (first match in cooker order)"
            )
        if not any(word in error_text(error).lower() for word in ("cooker", "subflavor")):
            return claim, (
                f"{case}: no cooker matches, and building the loader raised an unclear error "
                f"({_error_text(error)}); expected one that says no cooker matches these subflavors"
            )
        return claim, None

    failure: BaseException | None = None
    with closing(loader):
        try:
            # Energon prints every failing sample; the record below says all this check needs.
            with contextlib.redirect_stdout(io.StringIO()):
                next(iter(loader))
        except Exception as error:  # the chosen cooker may not cook this data; the record says who ran
            failure = error
    records = read_records(sink)
    if expected is None and COOKERS_CHOSEN_PER_SAMPLE and not records and failure is not None:
        # Energon 7.0-7.2 look the cooker up per sample: the loader builds, the first sample raises.
        if is_no_cooker_error(failure) or any(
            word in str(failure).lower() for word in ("cooker", "subflavor")
        ):
            return claim, None
        return claim, (
            f"{case}: no cooker matches, and the first sample raised an unclear error ({_error_text(failure)}); "
            "expected one that says no cooker matches these subflavors"
        )
    if expected is None:
        ran = f"; {describe_cooker(cookers, records[0]['cooker'])} ran" if records else ""
        return claim, (
            f"{case}: no cooker matches, yet the loader was built without an error{ran}. Expected "
            f"it to fail ({NO_COOKER_BEHAVIOUR})"
        )
    if not records:
        why = f" (iterating raised {_error_text(failure)})" if failure is not None else ""
        return (
            claim,
            f"{case}: no cooker ran on the first sample{why}; expected {describe_cooker(cookers, expected)}",
        )
    chosen = records[0]["cooker"]
    if chosen != expected:
        return claim, (
            f"{case}: {describe_cooker(cookers, chosen)} ran on sample {records[0]['key']!r}, expected "
            f"{describe_cooker(cookers, expected)}, the first cooker in order whose has_subflavors the "
            "merged subflavors contain (Energon's rule: first match wins)"
        )
    return claim, None


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    cookers = ctx.target.cookers
    if len(cookers) < 2:
        raise PropertySkipped(
            f"{ctx.target.describe()} has {len(cookers)} cooker(s); dispatch applies to TaskEncoders "
            "with several"
        )
    with claims.claim("shadowed") as claim:
        claim.examined(len(cookers))
        for earlier, later in shadowed_cookers(cookers):
            claim.problem(
                f"{describe_cooker(cookers, later)} can never be chosen: {describe_cooker(cookers, earlier)} "
                f"comes first and matches every dataset that cooker {later} matches (its has_subflavors is "
                f"contained in cooker {later}'s), and the first match wins"
            )

    keys, values = _vocabulary(cookers)
    encodings = ctx.encodings()
    outcomes: dict[str, list[str | None]] = {"first_match": [], "no_match": []}
    overrides = st.dictionaries(st.sampled_from(keys), st.sampled_from(values), max_size=len(keys))

    @ctx.hypothesis_settings(max_examples=min(ctx.profile.max_examples, _MAX_EXAMPLES))
    @given(encoding=st.sampled_from(encodings), overrides=overrides)
    def dispatch(encoding: str | None, overrides: dict[str, Any]) -> None:
        claim, problem = _run(ctx, cookers, encoding, overrides)
        outcomes[claim].append(problem)

    # Explicit cases first: the data as it is, each cooker's own subflavors, an unknown encoding.
    explicit: list[dict[str, Any]] = [{}]
    explicit += [dict(c.has_subflavors) for c in cookers if c.has_subflavors]
    explicit += [{"encoding": _UNSEEN}, {_EXTRA_KEY: _UNSEEN}]
    for case in reversed(explicit):
        dispatch = example(encoding=encodings[0], overrides=case)(dispatch)
    dispatch()
    if not outcomes["no_match"]:
        claims.not_applicable("no_match", "some cooker matches every dataset (its has_subflavors is empty)")
    for name, problems in outcomes.items():
        if not problems and name == "no_match":
            continue
        with claims.claim(name) as claim:
            claim.examined(len(problems))
            for problem in problems:
                if problem:
                    claim.problem(problem)
    return {
        "cookers": len(cookers),
        "dispatched": len(outcomes["first_match"]),
        "no_match_errors": len(outcomes["no_match"]),
    }
