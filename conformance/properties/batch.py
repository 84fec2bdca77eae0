"""Property 11, batch contract (TaskEncoders): every stacked tensor has leading dimension B; row i is
sample i's field; list fields keep batch order; nothing is dropped, duplicated or reordered; samples of
mismatched shapes give an error that names them (or, if the TaskEncoder does not stack that field, keep
each sample's value intact); ``encode_sample`` and ``batch()`` write neither into the samples they are
given nor into the crude member bytes (a zero-copy cooker's tensors are views of those bytes).

A TaskEncoder that cooks several formats (cookers for several ``encoding`` subflavors) gets, from a blend
of its datasets, batches that mix them, unless its ``batch_group_criterion`` keeps the formats apart. Such
a batch, beginning with a sample of each format in turn, must keep every field that ``batch()`` makes for
either format alone, each row its sample's (the shared tensor fields of the generated formats have one
shape and dtype, so only the format differs)."""

from __future__ import annotations

import copy
import hashlib
import inspect
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from megatron.energon import TaskEncoder

from primus_energon.energon_compat import energon_key, overrides
from primus_energon.synthetic import TensorSpec
from primus_energon.synthetic.manifest import Manifest

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..core.declarations import declaration_hint, what_changed
from ..core.rendering import describe_error
from ..core.results import Inconclusive, PropertySkipped
from ..engine.calls import matching_cooker, target_call, worker_context
from ..engine.context import CheckContext
from ..engine.delivered import (
    assign,
    cast_payloads,
    declared_alternatives,
    delivered_batches,
    explained,
    first_stage_samples,
    own_alternatives,
    row_value,
    seeded_payloads,
)
from ..oracles.declared import recognise
from ..oracles.expectations import required_values
from ..oracles.fields import fields
from ..oracles.fingerprint import fingerprint, first_difference
from ..oracles.payloads import KEY, SampleTrace, Trace, padding_problems, required_by, trace
from ..oracles.tokens import batch_pad_values, mask_fields, pair_problems
from ._common import batch_keys, error_names_sample, fail, field_names, get_field
from ._mixed_formats import batch_of as _batch
from ._mixed_formats import encoded as _encode
from ._mixed_formats import keys_of as _keys
from ._mixed_formats import mixed_format_problems
from ._packing import packing_configured, packs

CLAIMS = claims_of(
    "batch",
    (
        "rows",
        "every stacked field has leading dimension B and row i is sample i's; list fields keep batch order; "
        "no sample is dropped, duplicated or reordered",
        Harm.DATA,
        "torch.stack the samples' fields in the order batch() receives them",
    ),
    (
        "delivered",
        "what the real loader hands the training loop (every stage Energon runs: the cook, encode_sample, "
        "postencode_sample, batch(), encode_batch; 0 and 2 workers) holds every sample's payloads as the first "
        "encode stage left them (fidelity judges the stages up to there), each with its own sample: none lost, "
        "cast, duplicated or mixed with another sample's",
        Harm.DATA,
        "keep every field's rows together in every stage after encode_sample (reorder whole rows, not one "
        "field) and change no payload's dtype or values there; declare a deliberate change (CFG dropout, a "
        "flip, a truncation, a cast) with --conformance-transform 'FIELD: KIND ...' so that it is checked as "
        "declared",
    ),
    (
        "masks",
        "every mask the real loader delivers beside token ids or padded embeddings marks exactly the padding "
        "of its own row: ones for its sample's tokens, zeros for padding",
        Harm.DATA,
        "build each row of the mask from the same sample, in the same order, as the row of values it "
        "describes (ones for tokens, zeros for padding)",
    ),
    (
        "mismatched_shapes",
        "samples whose shapes differ are not padded, reshaped or cast into a batch: batch() raises, or keeps "
        "each sample's value intact",
        Harm.DATA,
        "let torch.stack raise (or bucket by shape); padding silently puts values into training that the data "
        "never had",
    ),
    (
        "error_names_samples",
        "the error for mismatched shapes names the samples",
        Harm.ADVICE,
        "catch the stack error and re-raise it with the samples' keys and shapes (primus_energon.BatchShapeError)",
    ),
    (
        "mixed_formats",
        "a batch mixing the formats the TaskEncoder cooks (as a blend of its datasets delivers) keeps every "
        "field batch() makes for each format alone, each row its sample's; or batch_group_criterion keeps the "
        "formats in separate batches",
        Harm.DATA,
        "build each batch field from every sample, not from samples[0] (a field only some formats have: a list "
        "with None for the others), or group batches by format with batch_group_criterion",
    ),
    (
        "mixed_formats_batched",
        "batch() of a batch mixing the formats the TaskEncoder cooks returns a batch (a blend of its datasets "
        "does not stop training at its first mixed batch)",
        Harm.CRASH,
        "decide each field per sample, not from samples[0] (stack a field every sample has, keep a list with "
        "None otherwise), or group batches by format with batch_group_criterion",
    ),
    (
        "order",
        "batch() keeps its samples in the order it is given them",
        Harm.ADVICE,
        "keep the order batch() receives (a consistent reorder loses nothing, but the batch no longer lines "
        "up with the keys Energon logs)",
    ),
    (
        "unmatched",
        "every field of the samples reaches the batch (a field of no required data, such as a caption next to "
        "embeddings, may be left out)",
        Harm.ADVICE,
        "carry the field into the batch if the model needs it; a provenance field left out on purpose needs "
        "nothing",
    ),
    (
        "inputs_unchanged",
        "encode_sample and batch() write neither into their samples nor into the crude member bytes",
        Harm.ADVICE,
        "compute into new tensors (clone() before an in-place op): a zero-copy cooker's tensors are views of "
        "the bytes Energon read",
    ),
)


def _where(sample: SampleTrace) -> str:
    """Where a sample's payloads went, for a message (only payloads found once: a value several samples
    share says nothing about this one)."""
    found = [
        f"{path} -> {places[0]}" for path, places in sample.places.items() if len(places) == 1 and path != KEY
    ]
    return (
        "; its other payloads: " + ", ".join(found[:4]) if found else "; none of its payloads is in the batch"
    )


def _check_rows(
    batch: Any, samples: list[Any], required: Any = None, note: str = "", transforms: Any = ()
) -> Trace:
    """Follow every sample's payloads into ``batch`` by value (stacked, concatenated with or without
    lengths, in lists of per-sample dicts): a payload is lost when it is nowhere while the batch carries
    that field for other samples, or when it is required data (``required(key, payload)``); a sample's
    payload may not occur more often than it was given, the fields of different samples may not be
    mixed up, and a payload inside a padded row needs a length or mask beside it. Fails with every
    problem, worst first; returns the trace (for the advice claims)."""
    keys = _keys(samples)
    result = trace(samples, batch, keys)
    if not any(places for s in result.samples for path, places in s.places.items() if path != KEY):
        fail(
            f"the batch holds none of its {len(samples)} samples' payloads (batch fields {field_names(batch)}): "
            "every tensor and text of the samples is lost or transformed beyond recognition"
        )
    by_key = {s.key: s for s in result.samples}
    declared = own_alternatives(samples, keys, transforms) if transforms else {}
    lost: dict[str, list[tuple[str, str]]] = {}
    hints: dict[str, None] = {}  # the declarations that would express the changes seen, once each
    for key, path, why in result.lost(required, keys=True):
        if not explained(result, key, path, declared):  # a declared transform batch() applies is no loss
            row = keys.index(key) if key in keys else None  # a shared key is traced as 'KEY (#i)'
            change, hint = _recognised(batch, by_key[key].payloads.get(path), path, row)
            if hint:
                hints[hint] = None
            lost.setdefault(key, []).append((path, why + change))
    problems = []
    for key, entries in lost.items():
        if len(entries) == 1:
            problems.append(f"sample {key!r}: {entries[0][1]}{_where(by_key[key])}")
        else:  # one line per sample: the fields it lost, then where its other payloads went
            fields = ", ".join(repr(path) for path, _ in entries)
            problems.append(f"sample {key!r}: its {fields} are not in the output{_where(by_key[key])}")
    duplicated: dict[str, list[tuple[str, list[Any]]]] = {}
    for key, path, places in result.duplicated():
        duplicated.setdefault(key, []).append((path, places))
    problems += [
        f"sample {key!r}: its {', '.join(repr(path) for path, _ in entries)} occur more often than given "
        f"({', '.join(map(str, entries[0][1][:4]))}): a sample is duplicated"
        for key, entries in duplicated.items()
    ]
    problems += result.mixed()
    problems += padding_problems(result)
    if problems:
        headline = _kept_subset(result)
        shown = problems[:6] + ([f"... and {len(problems) - 6} more"] if len(problems) > 6 else [])
        fail(f"batch() of {_count(len(samples))} {keys}{note}: {headline}" + "; ".join(shown + list(hints)))
    return result


def _kept_subset(result: Trace) -> str:
    """One sentence first when the output holds the data of only some of the samples (the root cause of
    the per-sample lines after it), else ""."""
    kept = [s.key for s in result.samples if any(places for path, places in s.places.items() if path != KEY)]
    gone = [s.key for s in result.samples if s.key not in kept]
    if not kept or not gone:
        return ""
    shown = ", ".join(repr(k) for k in kept[:4]) + (" ..." if len(kept) > 4 else "")
    return (
        f"it returned the data of {len(kept)} ({shown}); the payloads of the other {len(gone)} are not in the "
        "output. In detail: "
    )


def _count(n: int) -> str:
    return f"{n} sample" if n == 1 else f"{n} samples"


def _required(ctx: CheckContext, encoding: str | None, path: Any, limit: int | None = None) -> Any:
    """The required-data predicate for the samples of ``path`` (their required members' values, by key)."""
    schema = ctx.workspace.schema(encoding)
    return required_by({s["__key__"]: required_values(schema, s) for s in ctx.raw(path, limit=limit)})


def _advice(result: Trace, keys: list[str], required: Any) -> list[tuple[str, str]]:
    """``(claim, problem)`` for what a batch that kept every sample still earns as advice: samples
    reordered (consistently), fields of no required data left out for every sample."""
    out = []
    order = result.order(keys)
    if order is not None and order != keys:
        out.append(
            (
                "order",
                f"batch() holds its samples in the order {order}, not in the order it was given them ({keys}); "
                "every field agrees, so no data is mixed up",
            )
        )
    dropped = result.dropped(required)
    if dropped:
        out.append(
            (
                "unmatched",
                f"batch() leaves out the samples' {dropped} (no required data of the format): if the model "
                "needs them, carry them into the batch",
            )
        )
    return out


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    task_encoder = ctx.target.make_task_encoder()

    if packing_configured(ctx.target, task_encoder):
        # Energon hands such a TaskEncoder's batch() packs only: unpacked samples are no input it ever gets.
        buffer = getattr(ctx.target, "packing_buffer_size", None) or task_encoder.packing_buffer_size
        claims.blocked(
            f"the TaskEncoder packs (packing_buffer_size={buffer}), so Energon hands its batch() packs only; "
            "its batches are checked by the packing property (packing/batch_rows, packing/payload)"
        )
        return {}
    stats = {"batches": 0}
    for encoding in ctx.encodings():
        crude = ctx.crude(ctx.main_dataset(encoding), limit=16)
        required = _required(ctx, encoding, ctx.main_dataset(encoding))
        note = (
            " (unpacked samples, as Energon hands them to batch() when the loader has no packing_buffer_size; "
            "packing/batch_rows checks batches of packs)"
            if packs(task_encoder)
            else ""
        )
        advice: list[tuple[str, str]] = []  # (claim, problem) over every batch tried
        with claims.claim("rows") as claim:
            samples = _encode(task_encoder, crude, ctx.seed)
            if not samples:
                claim.nothing_because(ctx.unreadable() or "no sample could be read")
            else:

                @ctx.hypothesis_settings()
                @given(rows=st.lists(st.integers(0, len(samples) - 1), min_size=1, max_size=8, unique=True))
                def contract(rows: list[int]) -> None:
                    chosen = [samples[i] for i in rows]  # noqa: B023 (called right below, in this iteration)
                    claim.examined()  # noqa: B023
                    batch = _batch(task_encoder, chosen, ctx.seed)
                    checked = _check_rows(batch, chosen, required, note, ctx.transforms)  # noqa: B023
                    advice.extend(_advice(checked, _keys(chosen), required))  # noqa: B023
                    stats["batches"] += 1

                contract()
        if stats["batches"] and not claims.failed("rows"):
            for name in ("order", "unmatched"):
                with claims.claim(name) as claim:
                    claim.examined(stats["batches"])
                    for problem in [p for n, p in advice if n == name][:1]:
                        claim.problem(problem)
        else:
            claims.not_applicable("order", "blocked by batch/rows")
            claims.not_applicable("unmatched", "blocked by batch/rows")
        if stats["batches"] and not claims.failed("rows"):
            stats["delivered"] = _delivered(ctx, claims, encoding)
        else:
            claims.not_applicable("delivered", "blocked by batch/rows: batch() itself loses or mixes samples")
            claims.not_applicable("masks", "blocked by batch/rows: batch() itself loses or mixes samples")
        with claims.claim("inputs_unchanged") as claim:
            _inputs_left_alone(claim, task_encoder, crude[:4], ctx.seed)
        _mismatched_shapes(ctx, claims, task_encoder, encoding)
    if len(ctx.encodings()) < 2:
        claims.not_applicable("mixed_formats_batched", "the target is checked on one data format")
        claims.not_applicable("mixed_formats", "the target is checked on one data format")
    else:
        with claims.claim("mixed_formats_batched") as claim:
            mixed = mixed_format_problems(ctx)
            claim.examined(mixed["examined"])
            for problem in mixed["raised"]:
                claim.problem(problem)
            stats["mixed_formats"] = mixed["how"]
        if mixed["batched"] == 0:
            claims.not_applicable("mixed_formats", "blocked by batch/mixed_formats_batched")
        else:
            with claims.claim("mixed_formats") as claim:
                claim.examined(mixed["batched"])
                for problem in mixed["lost"]:
                    claim.problem(problem)
    return stats


#: batches of each delivering loader that are traced
DELIVERED_BATCHES = 6
DELIVERED_BATCH_SIZE = 4


def _delivered(ctx: CheckContext, claims: ClaimRecorder, encoding: str | None) -> dict[str, Any]:
    """The ``delivered`` claim: the real loader's batches traced to the samples as the first encode stage
    left them; for a batch that loses, casts, duplicates or mixes payloads, the stages are re-run on their
    own on the same samples to say which one does it."""
    details: dict[str, Any] = {}
    with claims.claim("delivered") as claim:
        task_encoder = ctx.target.make_task_encoder()
        path = ctx.main_dataset(encoding)
        counts = (0,) if ctx.profile.name == "quick" else (0, 2)
        loaders = [
            delivered_batches(
                ctx, path, num_workers=nw, batch_size=DELIVERED_BATCH_SIZE, max_batches=DELIVERED_BATCHES
            )
            for nw in counts
        ]
        _masks(claims, loaders)
        # The samples to trace back to: those the batches name (each cooked and encoded once), else all.
        named = [batch_keys(batch) for loader in loaders for batch in loader.batches]
        crude = ctx.crude(path)
        if all(named):
            wanted = {key for keys in named for key in keys or ()}
            crude = [sample for sample in crude if sample.get("__key__") in wanted] or crude
        given = first_stage_samples(task_encoder, crude, ctx.seed)
        if given is None:
            raise PropertySkipped("the first encode stage yields several samples (or none) per input")
        reported: set[str] = set()  # the first encode stage's changes are judged by fidelity
        # Energon seeds a sample's randomness by where the loader took it: what changes under another
        # per-sample seed cannot be found by value (determinism and resume judge it)
        again = first_stage_samples(task_encoder, crude, ctx.seed, index_offset=7919) or given
        seeded = seeded_payloads(given, again, _keys(given))
        seeded_paths = {path for _, path in seeded}
        if seeded:
            details["seeded"] = sorted(seeded_paths)
        alternatives = declared_alternatives(
            task_encoder, crude, ctx.seed, ctx.transforms, [given, again], _keys(given)
        )
        candidates = dict(zip(_keys(given), given, strict=True))
        for delivered in loaders:
            num_workers = delivered.num_workers
            details[f"num_workers={num_workers}"] = f"{len(delivered.batches)} batches traced"
            for index, batch in enumerate(delivered.batches):
                held = assign(batch, batch_keys(batch), candidates)
                claim.examined()
                if not held:
                    claim.problem(
                        f"{delivered.where}, batch {index}: holds none of the samples' payloads (batch fields "
                        f"{field_names(batch)}): every tensor and text is lost or changed beyond recognition"
                    )
                    break
                problems, drawn, hints = _delivered_problems(
                    batch, [candidates[k] for k in held], held, seeded, alternatives, seeded_paths, reported
                )
                if problems:
                    stage = (
                        "the cooker or the first encode stage changes it with Energon's per-sample seed (its "
                        "draws differ from one sample index to another)"
                        if drawn
                        else _stage_at_fault(
                            task_encoder, [candidates[k] for k in held], held, seeded, ctx.seed
                        )
                    )
                    claim.problem(
                        f"{delivered.where}, batch {index} {held}: {stage}: "
                        + "; ".join(problems[:4] + (["..."] if len(problems) > 4 else []) + hints)
                    )
                    return details  # one root cause once: the next batch, or loader, would say the same
    return details


def _masks(claims: ClaimRecorder, loaders: list[Any]) -> None:
    """The ``masks`` claim on the delivered batches: each mask row against the padding of its own row of
    the values beside it, and, where it is wrong, the row whose padding it describes instead."""
    found = []
    for delivered in loaders:
        for index, batch in enumerate(delivered.batches):
            present = {n: v for n, v in fields(batch).items() if not n.startswith("__")}
            for pair in mask_fields(present):
                found.append((delivered, index, batch_keys(batch) or [], present, pair))
    if not found:
        claims.not_applicable(
            "masks", "no delivered batch carries a mask beside token ids or padded embeddings"
        )
        return
    pads = {}
    for *_, pair in found:
        if pair.mask not in pads:
            pads[pair.mask] = batch_pad_values([p for _, _, _, p, q in found if q.mask == pair.mask], pair)
    with claims.claim("masks") as claim:
        for delivered, index, keys, present, pair in found:
            claim.examined()
            for row, problem, source in pair_problems(present, pair, pads[pair.mask]):
                which = f" (sample {keys[row]!r})" if row < len(keys) else ""
                origin = ""
                if source is not None:
                    named = f" (sample {keys[source]!r})" if source < len(keys) else ""
                    origin = (
                        f"; it describes row {source}'s padding{named}: the mask rows are in another order"
                    )
                claim.problem(
                    f"{delivered.where}, batch {index}: row {row}{which} of {pair.mask!r} does not describe the "
                    f"padding of {pair.target!r}: {problem}{origin}"
                )


def _delivered_problems(
    output: Any,
    samples: list[Any],
    keys: list[str],
    seeded: set[tuple[str, str]] = frozenset(),
    alternatives: dict[tuple[str, str], list[Any] | None] | None = None,
    seeded_paths: set[str] = frozenset(),
    reported: set[str] = frozenset(),
) -> tuple[list[str], bool, list[str]]:
    """What ``output`` does wrong with ``samples`` (first-stage samples): payloads cast to another dtype,
    lost (a field the output carries for other samples but not for this one), duplicated, mixed up, padded
    without a length; whether a problem is a change drawn from the per-sample seed; and the declarations
    that would express the changes a declaration can (each once). A field changed for
    every sample alike (a normalisation in batch(), a scale factor in encode_batch) is a transform, not a
    loss; a payload found as its declaration allows (``alternatives``, see :func:`declared_alternatives`)
    is no loss either. A payload drawn from the per-sample seed (``seeded``; ``seeded_paths``: the fields
    where some sample's draw differs) cannot be found by value and is left out, unless the change is one a
    declaration expresses (a dropout, a flip, a truncation, a cast): undeclared, that is a defect, and the
    message names the declaration. Payload paths in ``reported`` (changed by the first encode stage, said
    already) are left out."""
    alternatives = alternatives or {}
    result = trace(samples, output, keys)
    rows = {key: index for index, key in enumerate(keys)}
    by_key = {s.key: s for s in result.samples}
    drawn = False

    hints: dict[str, None] = {}  # the declarations that would express the changes seen, once each

    def judged(key: str, path: str) -> tuple[bool, str]:
        """(whether the absence is a problem, what the sample's row holds instead where that is a change a
        declaration expresses)"""
        if path in reported or explained(result, key, path, alternatives):
            return False, ""
        if (key, path) in seeded or path in seeded_paths:
            # drawn from the per-sample seed in the first stage: fidelity judges what that stage makes of the
            # member, determinism and resume judge the draws
            return False, ""
        change, hint = _recognised(output, by_key[key].payloads.get(path), path, rows.get(key))
        if hint:
            hints[hint] = None
        return True, change

    lost = []
    for key, path, why in result.lost(None, keys=True):
        problem, change = judged(key, path)
        if problem:
            lost.append((key, path, why + change))
            drawn |= bool(change) and path in seeded_paths
    missing = []
    for s in result.samples:
        for path in s.missing():
            if path != KEY and judged(s.key, path)[0]:
                missing.append((s.key, path, ""))
    casts = cast_payloads(result, missing)
    grouped: dict[tuple[str, str], list[str]] = {}
    for (key, path), cast in casts.items():
        grouped.setdefault((path, cast), []).append(key)
    problems = [
        f"the {path!r} of {len(group)} sample(s) ({', '.join(map(repr, group[:4]))}) reached the batch cast "
        f"{cast}: every value changed, silently; "
        + declaration_hint(path, "cast dtype=" + cast.split(" -> ")[1].split(" ")[0])
        for (path, cast), group in grouped.items()
    ]
    problems += [f"sample {key!r}: {why}" for key, path, why in lost if (key, path) not in casts]
    # No duplicate check here: a training loader repeats its data, so a small dataset's sample may come twice in
    # one delivered batch by design (batch/rows checks that batch() duplicates nothing).
    problems += result.mixed()
    problems += padding_problems(result)
    return problems, drawn, list(hints)


def _recognised(output: Any, payload: Any, path: str, row: int | None) -> tuple[str, str]:
    """Where a lost payload's row holds a recognisable transform of it (a dropout, a flip, a truncation, a
    cast): what it became, and the declaration that would express it; else ``("", "")``."""
    if payload is None or row is None:
        return "", ""
    observed = row_value(output, path, row)
    if observed is None:
        return "", ""
    recognised = recognise(payload.value, observed)
    if not recognised:
        return "", ""
    return f" (its row holds {what_changed(recognised)})", declaration_hint(path, recognised)


def _stage_at_fault(
    task_encoder: TaskEncoder, samples: list[Any], keys: list[str], seeded: set[tuple[str, str]], seed: int
) -> str:
    """Which stage changes the samples, found by running each stage after the first encode stage on its
    own on copies of the same samples (postencode_sample, then batch(), then encode_batch)."""
    current = copy.deepcopy(samples)
    try:
        with worker_context(seed, 0):
            if overrides(task_encoder, "postencode_sample"):
                current = [task_encoder.postencode_sample(s) for s in current]
                if any(
                    _delivered_problems(out, [given], [key], seeded)[0]
                    for out, given, key in zip(current, samples, keys, strict=True)
                ):
                    return "postencode_sample changes the samples (a stage Energon runs after encode_sample)"
            batch = task_encoder.batch(current)
            if _delivered_problems(batch, samples, keys, seeded)[0]:
                return "batch() does it (called on its own on the same samples)"
            if _own_encode_batch(task_encoder):
                return (
                    "encode_batch does it (batch() on its own keeps every sample; encode_batch runs after it)"
                )
            return (
                "no stage does it on its own: batch() keeps every sample of the same samples encoded again here, "
                "so what the loader batched differs from them (state the TaskEncoder keeps between samples, or a "
                "draw not from the per-sample seed: purity and determinism name which)"
            )
    except Exception as error:  # a stage that fails on its own where the loader ran it: name the loader's run
        return f"the delivered batch is wrong (running the stages on their own failed: {describe_error(error, 160)})"
    return "a stage after batch() in Energon's loader does it (batch() on its own keeps every sample)"


def _own_encode_batch(task_encoder: TaskEncoder) -> bool:
    """Whether the TaskEncoder's class (not Energon's DefaultTaskEncoder, whose encode_batch only converts
    to the batch type it declares) defines an encode_batch of its own."""
    from megatron.energon import DefaultTaskEncoder

    method = getattr(type(task_encoder), "encode_batch", None)
    return method is not None and method not in (TaskEncoder.encode_batch, DefaultTaskEncoder.encode_batch)


def _snapshot(crude: dict) -> dict[str, Any]:
    """What each member of a crude sample holds now (bytes by digest: a fingerprint would share the object)."""
    return {
        key: hashlib.sha256(value).hexdigest()
        if isinstance(value, (bytes, bytearray))
        else fingerprint(value)
        for key, value in crude.items()
    }


def _inputs_left_alone(claim: Any, task_encoder: TaskEncoder, crude: list[dict], seed: int) -> None:
    """Cook, encode and batch fresh copies of ``crude`` (member bytes copied too: in-place writes must not
    reach the suite's own data); neither the crude members nor the encoded samples may change."""
    sources = [
        {k: bytes(v) if isinstance(v, bytes) else copy.deepcopy(v) for k, v in s.items()} for s in crude
    ]
    crude_before = [_snapshot(source) for source in sources]
    samples = []
    cookers = task_encoder.cookers
    for index, source in enumerate(sources):
        cooker = cookers[matching_cooker(cookers, source) or 0]
        with (
            target_call(f"cooking and encoding the clean sample {source.get('__key__')!r}"),
            worker_context(seed, index),
        ):
            encoded = task_encoder.encode_sample(cooker.cook(source))
        if inspect.isgenerator(encoded):
            raise PropertySkipped("encode_sample yields several samples per input; rows cannot be matched")
        samples.append(encoded)
    samples_before = [fingerprint(sample) for sample in samples]
    _batch(task_encoder, samples, seed)
    for source, before in zip(sources, crude_before, strict=True):
        claim.examined()
        changed = sorted(k for k, digest in _snapshot(source).items() if before.get(k) != digest)
        if changed:
            claim.problem(
                f"cooking and encoding sample {source.get('__key__')!r} wrote into its crude member(s) {changed} "
                "(with a zero-copy cooker the tensors are views of the bytes Energon read)"
            )
    for sample, before in zip(samples, samples_before, strict=True):
        if fingerprint(sample) != before:
            claim.problem(
                f"batch() modified sample {get_field(sample, '__key__')!r} in place "
                f"({first_difference(before, fingerprint(sample))})"
            )


def _mismatched_shapes(
    ctx: CheckContext, claims: ClaimRecorder, task_encoder: TaskEncoder, encoding: str | None
) -> None:
    schema = ctx.workspace.schema(encoding)
    if not any(isinstance(spec, TensorSpec) for spec in schema.members.values()):
        for name in ("mismatched_shapes", "error_names_samples"):
            claims.not_applicable(name, "the data format has no tensor members")
        return
    try:
        path = ctx.generated(encoding, "wrong-shape", num_samples=8, shard_size=8, faults={"wrong-shape": 1})
    except Inconclusive as error:  # the other batch claims go on, on the user's own data
        for name in ("mismatched_shapes", "error_names_samples"):
            claims.inconclusive(name, error.reason)
        return
    (fault,) = [f for f in Manifest.load(path).faults if f.kind == "wrong-shape"]
    odd_key = energon_key(fault.shard, fault.key)
    error_raised: BaseException | None = None
    reached = False
    with claims.claim("mismatched_shapes") as claim:
        crude = ctx.crude(path)
        odd = [s for s in crude if s["__key__"] == odd_key]
        normal = [s for s in crude if s["__key__"] != odd_key][:3]
        if not odd or not normal:
            claim.nothing_because(ctx.unreadable() or "the samples of mismatched shapes could not be read")
            return
        samples = _encode(task_encoder, normal + odd, ctx.seed)
        claim.examined()
        reached = True
        try:
            batch = _batch(task_encoder, samples, ctx.seed, clean=False)
        except Exception as error:
            error_raised = error
        else:
            # The TaskEncoder does not stack that field: every sample's value must still be intact.
            _check_rows(batch, samples, _required(ctx, encoding, path))
    if error_raised is None:
        why = (
            "batch() raised no error for mismatched shapes"
            if reached
            else "blocked by batch/mismatched_shapes"
        )
        claims.not_applicable("error_names_samples", why)
        return
    with claims.claim("error_names_samples") as claim:
        claim.examined()
        if not error_names_sample(error_raised, odd_key):
            claim.problem(
                f"batching samples of mismatched shapes (member {fault.member!r} of {fault.key!r} differs) raised "
                f"{type(error_raised).__name__} without naming the samples: {' '.join(str(error_raised).split())[:300]}"
            )
