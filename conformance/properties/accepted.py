"""Property 1, accepted by Energon: the target registers cookers, its cook functions are ``@stateless``, a
cooker matches every dataset it is checked on, and a loader over clean data yields batches of cooked
samples. Every other property that needs a working loader is reported as blocked (once) when this fails."""

from __future__ import annotations

from collections import Counter

from megatron.energon import SkipSample
from megatron.energon.task_encoder.base import get_stateless

from primus_energon.energon_compat import (
    NO_COOKER_BEHAVIOUR,
    SKIP_SAMPLE_TYPES,
    STATELESS_COOKERS_REQUIRED,
    describe_filters,
    release_label,
)

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..core.rendering import describe_error
from ..engine.calls import (
    TargetError,
    build_loader,
    closing,
    cook,
    dataset_sample,
    encode,
    matching_cooker,
    take,
    worker_context,
)
from ..engine.context import CheckContext
from ._common import TimedOut, call_with_timeout, fail

CLAIMS = claims_of(
    "accepted",
    (
        "cookers",
        "the target registers at least one cooker",
        Harm.CRASH,
        "add `cookers = [Cooker(cook_fn, has_subflavors={...})]` to the TaskEncoder",
    ),
    (
        "stateless",
        "every cook function is @stateless (since Energon 7.0 Energon refuses every sample otherwise)",
        Harm.CRASH,
        "decorate each cook function with @megatron.energon.stateless (@cooker alone does not do it)",
    ),
    (
        "matches",
        "a cooker matches the subflavors of every dataset the target is checked on",
        Harm.CRASH,
        "give the cooker has_subflavors the data has (dataset.yaml `subflavors`), or check it with "
        "--conformance-encoding / --conformance-dataset on the data it is for",
    ),
    (
        "loads",
        "a loader over clean data yields a batch, and the cooker returns a sample for each clean input",
        Harm.DATA,
        "run the reproduce command and read the error: a target that cannot cook clean data loses every sample",
    ),
    (
        "complete_epoch",
        "every clean sample goes on through encode_sample and batch() into a batch: none is dropped with "
        "SkipSample or with an error Energon would log and skip (an epoch of clean data is complete)",
        Harm.DATA,
        "filter only samples that are bad (NaN/Inf, corrupt), and raise an error for those; a clean sample "
        "skipped is a sample the model never sees",
        # like every accepted claim, a failure blocks the properties that need a loader: they would each
        # report the same lost samples again (sharding's missing keys, batch's failed encode)
    ),
)

#: samples per batch() call when the clean epoch is run through the pipeline
_EPOCH_BATCH = 2


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    cookers = ctx.target.cookers
    with claims.claim("cookers") as claim:
        claim.examined()
        if not cookers:
            fail(
                f"{ctx.target.describe()} registers no cookers; Energon cannot load a CrudeWebdataset without "
                "one ('CrudeWebdataset found, but no cookers registered')"
            )
    if not cookers:
        claims.blocked("blocked by accepted/cookers: the target registers no cookers")
        return {}

    if STATELESS_COOKERS_REQUIRED:
        with claims.claim("stateless") as claim:
            for index, cooker in enumerate(cookers):
                claim.examined()
                if not get_stateless(cooker.cook):
                    name = getattr(cooker.cook, "__qualname__", repr(cooker.cook))
                    claim.problem(
                        f"cooker {index} ({name}) is not marked @stateless: since Energon 7.0 a cook function "
                        "must be @stateless, and Energon fails every sample with 'Cooker must be stateless', "
                        "logs it, and stops after 100 in a row"
                    )
    else:
        claims.not_applicable(
            "stateless",
            f"{release_label()} cooks with any callable (Energon 7.0 made @stateless cook functions a rule)",
        )
    stateless_ok = not STATELESS_COOKERS_REQUIRED or all(get_stateless(c.cook) for c in cookers)

    checked = {}
    loadable = []
    with claims.claim("matches") as claim:
        for encoding in ctx.encodings():
            path = ctx.main_dataset(encoding)
            subflavors = ctx.workspace.subflavors(path)
            claim.examined()
            if matching_cooker(cookers, dataset_sample(subflavors)) is None:
                claim.problem(
                    f"no cooker matches the dataset {path.name!r} (subflavors {subflavors}); the cookers ask for "
                    f"{[describe_filters(c) for c in cookers]}. {NO_COOKER_BEHAVIOUR}"
                )
            else:
                loadable.append((encoding, path, subflavors))
            checked[str(encoding)] = subflavors

    if not stateless_ok:
        next_blocker = _next_blocker(ctx, [path for _, path, _ in loadable])
        with claims.claim("stateless") as claim:
            claim.problem(
                "consequence, not a separate failure: with @stateless waived (each cook function called "
                f"directly), {next_blocker or 'clean samples cook, encode and batch: @stateless is the only blocker found'}"
            )
        claims.not_applicable(
            "loads", "blocked by accepted/stateless: Energon refuses every sample of such a cooker"
        )
        claims.not_applicable("complete_epoch", "blocked by accepted/stateless")
        return {"datasets": checked, "next_blocker": next_blocker or ""}
    if not loadable:
        claims.not_applicable("loads", "blocked by accepted/matches: no dataset has a matching cooker")
        claims.not_applicable("complete_epoch", "blocked by accepted/matches")
        return {"datasets": checked}
    cooked_by_dataset: dict[str, list[tuple[str, object]]] = {}
    with claims.claim("loads") as claim:
        for _encoding, path, subflavors in loadable:
            where = f"the clean dataset {path.name!r} (subflavors {subflavors})"
            _first_batch(ctx, path, where)
            samples = ctx.crude(path)
            if not samples:
                claim.problem(
                    f"no sample of {where} could be read: {ctx.unreadable() or 'the dataset is empty'}"
                )
                continue
            for index, sample in enumerate(samples):
                try:
                    output = cook(ctx.target, sample, sample_index=index, seed=ctx.seed)
                except TargetError as error:
                    claim.problem(f"{where}: {error.message}")
                    continue
                claim.examined()
                if output is None or isinstance(output, (str, bytes, int, float, bool)):
                    what = "None" if output is None else f"a {type(output).__name__}, not a sample"
                    claim.problem(
                        f"the cooker returned {what} for clean samples of {where}: every member is lost",
                        sample=sample["__key__"],
                    )
                else:
                    cooked_by_dataset.setdefault(path.name, []).append((sample["__key__"], output))
    details: dict = {"datasets": checked}
    if claims.failed("loads"):
        claims.not_applicable("complete_epoch", "blocked by accepted/loads: clean samples do not cook")
        return details
    with claims.claim("complete_epoch") as claim:
        details["skipped"] = _complete_epoch(ctx, claim, cooked_by_dataset)
    return details


def _complete_epoch(ctx: CheckContext, claim, cooked_by_dataset: dict) -> dict[str, int]:
    """Run every cooked clean sample through encode_sample and batch(); a sample that does not reach a
    batch is a problem, counted per stage and cause. Returns ``{"stage: cause": count}``."""
    skipped: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    task_encoder = ctx.target.make_task_encoder()

    def lost(stage: str, error: BaseException, keys: list[str]) -> None:
        if isinstance(error, SKIP_SAMPLE_TYPES):
            cause = f"{stage}: SkipSample"
        else:
            cause = f"{stage}: {describe_error(error, 160)}"
        skipped[cause] += len(keys)
        examples.setdefault(cause, []).extend(keys)

    total = sum(len(cooked) for cooked in cooked_by_dataset.values())
    for cooked in cooked_by_dataset.values():
        encoded: list[tuple[str, object]] = []
        for index, (key, output) in enumerate(cooked):
            claim.examined()
            try:
                outputs = call_with_timeout(
                    lambda o=output, i=index: encode(task_encoder, o, seed=ctx.seed, sample_index=i),
                    ctx.call_timeout_s,
                )
            except TimedOut:
                lost("encode_sample", TimedOut(f"no result after {ctx.call_timeout_s:.0f} s"), [key])
                continue
            except Exception as error:
                lost("encode_sample", error, [key])
                continue
            if not outputs:
                lost("encode_sample", SkipSample(), [key])  # a generator that yields nothing drops it
            encoded.extend((key, out) for out in outputs)
        for start in range(0, len(encoded), _EPOCH_BATCH):
            group = encoded[start : start + _EPOCH_BATCH]
            keys = [key for key, _ in group]
            samples = [out for _, out in group]

            def batch(samples: list = samples, start: int = start) -> None:
                with worker_context(ctx.seed, start):
                    task_encoder.batch(samples)

            try:
                call_with_timeout(batch, ctx.call_timeout_s)
            except SKIP_SAMPLE_TYPES as error:
                lost("batch()", error, keys)
            except Exception:
                # batch() failing (or hanging) on clean samples is the batch property's finding, not
                # reported twice; its SkipSample is a silent loss only this claim sees
                continue
    for cause, count in sorted(skipped.items(), key=lambda item: -item[1]):
        keys = examples[cause]
        claim.problem(
            f"{count} of {total} clean samples never reach a batch: {cause} (e.g. {', '.join(map(repr, keys[:3]))}); "
            "an epoch that drops clean samples is incomplete, and Energon counts nothing for SkipSample",
        )
    return dict(skipped)


def _next_blocker(ctx: CheckContext, paths: list) -> str | None:
    """What would stop the target next once ``@stateless`` is fixed, found without Energon's loader (which
    refuses such a cooker): a few clean samples cooked by calling each cook function directly, encoded
    and batched as Energon would. None when they go through; the first error otherwise."""
    task_encoder = ctx.target.make_task_encoder()
    for path in paths[:1]:
        cooked = []
        for index, sample in enumerate(ctx.crude(path, limit=4)):
            key = sample.get("__key__")
            try:
                output = call_with_timeout(
                    lambda s=sample, i=index: cook(ctx.target, s, sample_index=i, seed=ctx.seed),
                    ctx.call_timeout_s,
                )
            except TimedOut:
                return f"cooking the clean sample {key!r} hangs (no result after {ctx.call_timeout_s:.0f} s)"
            except TargetError as error:
                return f"the next blocker is: {error.message.splitlines()[0][:300]}"
            if output is None or isinstance(output, (str, bytes, int, float, bool)):
                return f"the next blocker is: the cooker returns {type(output).__name__} for {key!r}"
            try:
                cooked += encode(task_encoder, output, seed=ctx.seed, sample_index=index)
            except Exception as error:
                return f"the next blocker is: encode_sample of {key!r} raises {describe_error(error, 200)}"
        if len(cooked) >= 2:
            try:
                with worker_context(ctx.seed, 0):
                    task_encoder.batch(cooked[:2])
            except Exception as error:
                return f"the next blocker is: batch() of 2 clean samples raises {describe_error(error, 200)}"
    return None


def _first_batch(ctx: CheckContext, path, where: str) -> None:
    loader = build_loader(ctx.target, path, batch_size=2, num_workers=0, mode="val")
    with closing(loader):
        try:
            call_with_timeout(lambda: take(loader, 1, what=f"loading {where}"), ctx.call_timeout_s)
        except TimedOut:
            fail(
                f"loading {where}: the first batch did not arrive within {ctx.call_timeout_s:.0f} s (the "
                "target hangs: a training run would stall)"
            )
        except StopIteration:
            fail(f"loading {where} yielded no batch at all: every sample was dropped")
