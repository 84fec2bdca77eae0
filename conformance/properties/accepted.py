"""Property 1, accepted by Energon: the target registers cookers, its cook functions are ``@stateless``, a
cooker matches every dataset it is checked on, and a loader over clean data yields batches of cooked
samples. Every other property that needs a working loader is reported as blocked (once) when this fails."""

from __future__ import annotations

from megatron.energon.task_encoder.base import get_stateless

from ..claims import ClaimRecorder, Harm, claims_of
from ..context import CheckContext
from ..execution import TargetError, build_loader, closing, cook, matching_cooker, take
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
)


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

    with claims.claim("stateless") as claim:
        for index, cooker in enumerate(cookers):
            claim.examined()
            if not get_stateless(cooker.cook):
                name = getattr(cooker.cook, "__qualname__", repr(cooker.cook))
                claim.problem(
                    f"cooker {index} ({name}) is not marked @stateless: since Energon 7.0 a cook function must be "
                    "@stateless, and Energon fails every sample with 'Cooker must be stateless', logs it, and "
                    "stops after 100 in a row"
                )
    stateless_ok = all(get_stateless(c.cook) for c in cookers)

    checked = {}
    loadable = []
    with claims.claim("matches") as claim:
        for encoding in ctx.encodings():
            path = ctx.main_dataset(encoding)
            subflavors = ctx.workspace.subflavors(path)
            claim.examined()
            if matching_cooker(cookers, subflavors) is None:
                claim.problem(
                    f"no cooker matches the dataset {path.name!r} (subflavors {subflavors}); the cookers ask for "
                    f"{[c.has_subflavors for c in cookers]}. Energon raises 'No cooker found for subflavors' "
                    "when the loader is built"
                )
            else:
                loadable.append((encoding, path, subflavors))
            checked[str(encoding)] = subflavors

    if not stateless_ok:
        claims.not_applicable(
            "loads", "blocked by accepted/stateless: Energon refuses every sample of such a cooker"
        )
        return {"datasets": checked}
    if not loadable:
        claims.not_applicable("loads", "blocked by accepted/matches: no dataset has a matching cooker")
        return {"datasets": checked}
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
    return {"datasets": checked}


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
