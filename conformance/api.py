"""The Python API: run the properties on a target and get structured results, without pytest."""

from __future__ import annotations

import tempfile
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .context import CheckContext
from .data import Workspace
from .profiles import get_profile
from .properties import PROPERTIES, Property
from .results import PropertyFailure, PropertyResult, PropertySkipped
from .target import InputForm, Target, resolve_target

__all__ = ["check_cooker", "check_task_encoder", "run_property", "make_context"]


def make_context(
    target: Target,
    *,
    workdir: str | Path,
    profile: str = "ci",
    seed: int = 0,
    encoding: str | None = None,
    schema: str | None = None,
    dataset: str | None = None,
    min_samples_per_s: float | None = None,
) -> CheckContext:
    workspace = Workspace(Path(workdir), seed=seed, schema_file=schema, dataset=dataset)
    return CheckContext(
        target=target,
        workspace=workspace,
        profile=get_profile(profile),
        seed=seed,
        encoding=encoding,
        min_samples_per_s=min_samples_per_s,
    )


def run_property(
    prop: Property, ctx: CheckContext, *, expected_failures: dict[str, str] | None = None
) -> PropertyResult:
    """Run one property; never raises for a failing target (the verdict says so)."""
    started = time.perf_counter()
    result = PropertyResult(property=prop.id, target=ctx.target.spec, verdict="pass")
    if ctx.target.kind not in prop.applies_to:
        result.verdict, result.message = "skip", f"applies to {', '.join(sorted(prop.applies_to))} targets"
    else:
        try:
            result.details = prop.check(ctx) or {}
        except PropertyFailure as failure:
            result.verdict, result.message, result.reproduce = "fail", failure.message, failure.reproduce
        except PropertySkipped as skipped:
            result.verdict, result.message = "skip", str(skipped)
        except Exception as error:  # the check itself broke on this target: report it, with where
            result.verdict = "error"
            result.message = f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=6)}"
            result.reproduce = ctx.reproduce(prop.id)
    if result.verdict in ("fail", "error") and _guessed_encoding(ctx):
        result.message += (
            f"\n(note: {ctx.target.describe()} declares no `encoding` in has_subflavors, so the suite generated "
            f"{ctx.encodings()[0] or 'preencoded'} data; pass --encoding, --schema FILE or --dataset PATH if it "
            "expects another format)"
        )
    reason = (expected_failures or {}).get(prop.id)
    if reason is not None and result.verdict in ("fail", "error"):
        result.verdict, result.message = "xfail", f"expected failure ({reason}): {result.message}"
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def _guessed_encoding(ctx: CheckContext) -> bool:
    """True when the data format was a guess: no encoding from the cookers, the options or the data."""
    return not (ctx.encoding or ctx.workspace.dataset or ctx.workspace.schema_file) and all(
        (c.has_subflavors or {}).get("encoding") is None for c in ctx.target.cookers
    )


def _check(
    target: Target, properties: Iterable[str] | None, expected_failures: dict[str, str] | None, **options: Any
) -> list[PropertyResult]:
    wanted = set(properties) if properties is not None else None
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        ctx = make_context(target, workdir=options.pop("workdir", None) or tmp, **options)
        return [
            run_property(prop, ctx, expected_failures=expected_failures)
            for prop in PROPERTIES
            if wanted is None or prop.id in wanted
        ]


def check_cooker(
    cooker: Any,
    *,
    properties: Iterable[str] | None = None,
    input_form: InputForm = "bytes",
    expected_failures: dict[str, str] | None = None,
    **options: Any,
) -> list[PropertyResult]:
    """Check a ``Cooker``, a ``@stateless`` cook function, or ``"module:attr"`` naming one.

    Options: ``profile`` ("quick", "ci", "thorough"), ``seed``, ``encoding``, ``schema`` (file),
    ``dataset`` (a prepared dataset, read only), ``min_samples_per_s``, ``workdir``. ``expected_failures``
    maps property ids to reasons (sklearn's ``expected_failed_checks``). Returns one result per property.
    """
    target = resolve_target(cooker, kind="cooker", input_form=input_form)
    return _check(target, properties, expected_failures, **options)


def check_task_encoder(
    task_encoder: Any,
    *,
    properties: Iterable[str] | None = None,
    expected_failures: dict[str, str] | None = None,
    **options: Any,
) -> list[PropertyResult]:
    """Check a TaskEncoder class (built with no arguments), instance, or ``"module:attr"``; see
    :func:`check_cooker` for the options."""
    target = resolve_target(task_encoder, kind="task_encoder")
    return _check(target, properties, expected_failures, **options)
