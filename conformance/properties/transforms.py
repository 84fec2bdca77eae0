"""Property 16, declared transforms: a deliberate change of a field (``--conformance-transform``, or
``conformance_transforms`` in pyproject's ``[tool.pytest.ini_options]``) is checked as declared instead of
being forgiven.

The main dataset's samples are cooked (and, for a TaskEncoder, encoded by the stages Energon runs per sample)
many times over, each time under a per-sample seed of its own, as Energon's sample index gives it
(``transform_draws`` of the profile: 128, 192, 768). In each sample the declared field must hold its member's
value or that value transformed as declared; the share of samples the transform applies to must be within a
two-sided binomial bound (p >= 1e-4) of the declared rate; the same sample at the same seed must get the same
draw, whatever ran before it and whatever the global generators hold; a sample met again under another seed
(the next epoch) must get a new draw; and when the transform applies, no other field may change with it.
Resume and determinism across fresh processes compare every field, the declared ones included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..core.declarations import Transform, declaration_hint
from ..engine import rngs
from ..engine.calls import TargetError, cook, encode, target_call
from ..engine.context import CheckContext
from ..engine.delivered import delivered_batches, row_value
from ..oracles.compare import same
from ..oracles.declared import always, recognise
from ..oracles.expectations import MISSING, Expectation, expectations, is_required
from ..oracles.fields import field_at
from ..oracles.fingerprint import fingerprint
from ..oracles.members import declared_outcome, member_form
from ..oracles.payloads import KEY, identity, payloads
from ..oracles.plain import plain
from ..oracles.stats import binomial_p_value, binomial_range
from ._common import batch_keys

__all__ = ["check", "CLAIMS", "ALPHA"]

CLAIMS = claims_of(
    "transforms",
    (
        "observed",
        "in every sample a declared field holds its member's value or that value transformed as declared",
        Harm.DATA,
        "make the target do what the declaration says, or declare what it does (the message names a declaration "
        "where the change is one the suite knows)",
    ),
    (
        "rate",
        "a transform declared at a rate applies to a share of the samples within a two-sided binomial bound of "
        "it (p >= 1e-4); truncate and cast apply to every sample they can",
        Harm.DATA,
        "draw the decision once per sample from Energon's per-sample seed (random.random() < rate under "
        "@stateless(restore_seeds=True)); declare the rate the training configuration uses",
    ),
    (
        "deterministic",
        "the same sample at the same per-sample seed gets the same draw, whatever was cooked before it and "
        "whatever state the global random generators are in",
        Harm.DETERMINISM,
        "draw from Energon's per-sample seed: @stateless(restore_seeds=True) on encode_sample (or a generator "
        "seeded from WorkerConfig's worker seed and sample index), not from an unseeded global generator",
    ),
    (
        "redrawn",
        "a sample met again under another per-sample seed (the next epoch) gets a draw of its own: the draw "
        "is not fixed per sample key or per run",
        Harm.DATA,
        "seed from Energon's per-sample seed (@stateless(restore_seeds=True)), not from the sample's key or a "
        "constant: a draw fixed per key drops the same captions every epoch, so the model never sees them",
    ),
    (
        "only_declared",
        "when a declared transform applies to a sample, no other field of that sample changes",
        Harm.DATA,
        "change only the declared field (declare the other change too if it is deliberate, e.g. the "
        "embeddings dropped with the caption)",
    ),
)

#: the significance of the rate test (two-sided exact binomial). The per-sample seeds are fixed, so the draw
#: and the verdict are the same in every run: about one correct target and dataset in 10,000 fails it, every
#: time (another ``--conformance-seed`` draws anew)
ALPHA = 1e-4
#: samples cooked a second time, in another order and under other global RNG states (the deterministic claim)
RECOOKED = 48
_NONE = "no transform is declared (--conformance-transform, or conformance_transforms in pyproject.toml)"


@dataclass
class _Draw:
    """One sample cooked under one per-sample seed (sample index)."""

    key: str
    index: int
    output: Any
    values: dict[str, Any] = field(default_factory=dict)  # declared field -> its value
    outcomes: dict[str, str | None] = field(default_factory=dict)  # declared field -> kept/applied/None


def _first_stage(ctx: CheckContext, sample: dict, index: int) -> Any:
    """A sample as the stages Energon runs per sample leave it: the cook, then (for a TaskEncoder) its
    ``preencode_sample``/``encode_sample`` and ``postencode_sample``, at sample index ``index``."""
    what = f"cooking and encoding the clean sample {sample.get('__key__')!r}"
    cooked = cook(ctx.target, dict(sample), sample_index=index, seed=ctx.seed)
    if ctx.target.kind != "task_encoder":
        with target_call(what):  # plain data, read in a timed call: the judge runs nothing of the target's
            return plain(cooked)
    task_encoder = ctx.cached("transforms-task-encoder", ctx.target.make_task_encoder)
    try:
        produced = encode(task_encoder, cooked, seed=ctx.seed, sample_index=index)
    except Exception as error:
        raise TargetError(f"encoding the clean sample {sample.get('__key__')!r}", error) from error
    with target_call(what):
        return plain(produced[0]) if len(produced) == 1 else MISSING


def _clean_values(
    ctx: CheckContext, encoding: str | None, transform: Transform, draws: list[_Draw]
) -> tuple[dict[str, Any], str | None]:
    """Per sample key, the member (its expectation: value and kind) the declared field holds before the
    transform, and which member:
    the member that explains most draws as kept or transformed as declared (one named like the field first)."""
    schema = ctx.workspace.schema(encoding)
    raw = {s["__key__"]: s for s in ctx.raw(ctx.main_dataset(encoding))}
    by_key: dict[str, dict[str, Expectation]] = {}
    for key in {d.key for d in draws}:
        sample = raw.get(key, {})
        found: dict[str, Expectation] = {}
        for member, spec in schema.members.items():
            if member not in sample:
                continue
            required = is_required(schema, member, spec)
            for expected in expectations(member, spec, sample[member], required=required):
                if expected.value is not MISSING:
                    found[expected.what] = expected
        by_key[key] = found
    scores: dict[str, list[int]] = {}
    for draw in draws:
        for what, expected in by_key.get(draw.key, {}).items():
            observed = draw.values.get(transform.field)
            explained = declared_outcome(transform, expected.spec, expected.value, observed) is not None
            named = transform.field.split(".")[-1] in expected.names
            scores.setdefault(what, [0, 0])
            scores[what][0] += explained
            scores[what][1] = int(named)
    ranked = sorted(scores.items(), key=lambda item: (-item[1][0], -item[1][1]))
    if ranked and ranked[0][1][0] == 0:  # nothing explains a draw: the member named like the field, if any
        ranked = [item for item in ranked if item[1][1]]
    if not ranked:
        return {}, None
    what = ranked[0][0]
    return {key: found[what] for key, found in by_key.items() if what in found}, what


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    transforms = ctx.transforms
    if not transforms:
        for claim in CLAIMS:
            claims.not_applicable(claim.name, _NONE)
        return {}
    details: dict[str, Any] = {}
    for encoding in ctx.encodings():
        crude = ctx.crude(ctx.main_dataset(encoding))
        if not crude:
            for claim in CLAIMS:
                claims.inconclusive(claim.name, ctx.unreadable() or "no sample could be read")
            continue
        draws: list[_Draw] = []
        with claims.claim("observed") as claim:
            for index in range(ctx.profile.transform_draws):
                sample = crude[index % len(crude)]
                output = _first_stage(ctx, sample, index)
                if output is MISSING:
                    claim.inconclusive("encode_sample yields several samples (or none) per input")
                    break
                draw = _Draw(str(sample["__key__"]), index, output)
                draw.values = {t.field: field_at(output, t.field) for t in transforms}
                draws.append(draw)
        if not draws:
            continue
        for transform in transforms:
            details[transform.field] = _judge(ctx, claims, encoding, transform, transforms, draws)
        _deterministic(ctx, claims, draws, crude)
    return details


def _judge(
    ctx: CheckContext,
    claims: ClaimRecorder,
    encoding: str | None,
    transform: Transform,
    transforms: Sequence[Transform],
    draws: list[_Draw],
) -> dict[str, Any]:
    name = f"'{transform}'"
    present = [d for d in draws if d.values.get(transform.field) is not MISSING]
    if not present:
        with claims.claim("observed") as claim:
            claim.examined()
            fields = sorted(
                str(k) for k in (getattr(draws[0].output, "__dict__", None) or draws[0].output or {})
            )
            claim.problem(
                f"declared {name}: no sample has a field {transform.field!r} (fields: {fields[:12]})"
            )
        return {"field": "missing"}
    clean, member = _clean_values(ctx, encoding, transform, present)
    if member is None:
        for claim_name in ("observed", "rate", "redrawn", "only_declared"):
            with claims.claim(claim_name) as claim:
                claim.inconclusive(
                    f"declared {name}: no member of the format reaches field {transform.field!r} as it is or "
                    "transformed as declared, so the suite cannot tell the declared transform from another change"
                )
        return {"member": None}
    specs = {key: expected.spec for key, expected in clean.items()}
    clean = {key: expected.value for key, expected in clean.items()}
    for draw in present:
        if draw.key in clean:
            draw.outcomes[transform.field] = declared_outcome(
                transform, specs[draw.key], clean[draw.key], draw.values[transform.field]
            )
    judged = [d for d in present if d.key in clean]
    with claims.claim("observed") as claim:
        claim.examined(len(judged))
        odd = [d for d in judged if d.outcomes[transform.field] is None]
        if odd:
            first = odd[0]
            hint = recognise(clean[first.key], first.values[transform.field])
            form = member_form(specs[first.key], clean[first.key], first.values[transform.field])
            if not hint and form is not None and form.declaration:
                hint = form.declaration
            also = f"; {declaration_hint(transform.field, hint)}" if hint else ""
            seen = f" (what the suite sees: {form.how})" if form is not None else ""
            claim.problem(
                f"declared {name}: in {len(odd)} of {len(judged)} samples (e.g. {first.key!r} at sample index "
                f"{first.index}) field {transform.field!r} is neither {member}'s value nor that value transformed as "
                f"declared{seen}: {_show(first.values[transform.field])} for {_show(clean[first.key])}{also}"
            )
        if transform.kind == "dropout" and transform.to == "constant":
            distinct = {
                fingerprint(d.values[transform.field])
                for d in judged
                if d.outcomes[transform.field] == "applied"
            }
            if len(distinct) > 1:
                claim.problem(
                    f"declared {name}: the dropped samples hold {len(distinct)} different values, not one constant"
                )
    applied = [d for d in judged if d.outcomes[transform.field] == "applied"]
    kept = [d for d in judged if d.outcomes[transform.field] == "kept"]
    summary = {"member": member, "samples": len(judged), "applied": len(applied)}
    if not applied and transform.rate is not None and ctx.target.kind == "task_encoder":
        rows = _delivered_rows(ctx, encoding, transform, clean, specs)
        if any(outcome == "applied" for _, outcome in rows):
            _judged_in_batches(claims, transform, name, rows, summary)
            return summary
    if not applied and not kept:
        for claim_name in ("rate", "redrawn", "only_declared"):
            claims.not_applicable(
                claim_name,
                "blocked by transforms/observed: no sample holds the value or its declared transform",
            )
        return summary
    # Draws fixed per key are not independent, so a share of them says nothing about the rate: redrawn is
    # judged first, unless every sample got one decision (a constant seed), which the rate names.
    one_decision = not (applied and kept)
    if transform.rate is None or transform.rate >= 1:
        claims.not_applicable("redrawn", f"declared {name} applies to every sample alike")
    elif one_decision:
        claims.not_applicable("redrawn", "blocked by transforms/rate (every sample got the same decision)")
    else:
        _redrawn(claims, transform, name, judged)
    if claims.failed("redrawn"):
        claims.not_applicable(
            "rate",
            "blocked by transforms/redrawn: a sample's draws are not independent, so their share is no rate",
        )
    else:
        with claims.claim("rate") as claim:
            _rate(claim, transform, name, member, clean, judged, applied, kept, summary)
    if transform.rate is None:
        claims.not_applicable(
            "only_declared",
            f"declared {name} applies to every sample alike (no sample to compare without it); the other fields "
            "are judged as before by fidelity and batch/delivered",
        )
    else:
        _only_declared(claims, transform, transforms, name, judged)
    return summary


#: delivered batches read when a declared transform is not seen in the per-sample stages (batch size 4)
BATCH_ROWS_BATCHES = 32


def _delivered_rows(
    ctx: CheckContext,
    encoding: str | None,
    transform: Transform,
    clean: dict[str, Any],
    specs: dict[str, Any],
) -> list[tuple[str, str | None]]:
    """``(key, outcome)`` for each row of the real loader's batches whose key is known: a transform applied
    after the per-sample stages (in ``batch()`` or ``encode_batch``) is seen only there."""
    delivered = delivered_batches(
        ctx, ctx.main_dataset(encoding), num_workers=0, batch_size=4, max_batches=BATCH_ROWS_BATCHES
    )
    rows = []
    for batch in delivered.batches:
        for row, key in enumerate(batch_keys(batch) or ()):
            if key in clean:
                observed = row_value(batch, transform.field, row)
                outcome = (
                    declared_outcome(transform, specs[key], clean[key], observed)
                    if observed is not None
                    else None
                )
                rows.append((key, outcome))
    return rows


def _judged_in_batches(
    claims: ClaimRecorder,
    transform: Transform,
    name: str,
    rows: list[tuple[str, str | None]],
    summary: dict[str, Any],
) -> None:
    """A declared transform applied after the per-sample stages: its rate is judged on the delivered rows;
    the other claims cannot be judged sample by sample (determinism and resume compare those batches)."""
    judged = [(key, outcome) for key, outcome in rows if outcome is not None]
    applied = sum(outcome == "applied" for _, outcome in judged)
    summary.update({"where": "after the per-sample stages", "rows": len(judged), "applied": applied})
    with claims.claim("observed") as claim:
        claim.examined(len(rows))
        odd = [key for key, outcome in rows if outcome is None]
        if odd:
            claim.problem(
                f"declared {name}: in {len(odd)} of {len(rows)} delivered rows (e.g. {odd[0]!r}) field "
                f"{transform.field!r} is neither the member's value nor that value transformed as declared"
            )
    with claims.claim("rate") as claim:
        claim.examined(len(judged))
        p_value = binomial_p_value(applied, len(judged), transform.rate)
        summary["p_value"] = p_value
        if p_value < ALPHA:
            low, high = binomial_range(len(judged), transform.rate, ALPHA)
            claim.problem(
                f"declared {name}: applied after the per-sample stages, to {applied} of {len(judged)} delivered "
                f"rows; at the declared rate {transform.rate:g} between {low} and {high} are expected (two-sided "
                f"binomial test, p = {p_value:.2g} < {ALPHA:g})"
            )
    why = (
        f"declared {name} is applied after the per-sample stages (in batch() or encode_batch), so it cannot be "
        "judged sample by sample; determinism and resume compare those batches whole"
    )
    for claim_name in ("redrawn", "only_declared"):
        claims.not_applicable(claim_name, why)


def _rate(
    claim: Any,
    transform: Transform,
    name: str,
    member: str,
    clean: dict[str, Any],
    judged: list[_Draw],
    applied: list[_Draw],
    kept: list[_Draw],
    summary: dict[str, Any],
) -> None:
    if transform.rate is None:
        due = [d for d in judged if always(transform, clean[d.key])]
        claim.examined(len(due))
        missed = [d for d in due if d.outcomes[transform.field] == "kept"]
        if not due:
            claim.inconclusive(f"declared {name}: no sample's {member} is one it applies to")
        elif missed:
            claim.problem(
                f"declared {name}: it applies to every sample it can, but {len(missed)} of {len(due)} kept "
                f"their value (e.g. {missed[0].key!r}: {_show(clean[missed[0].key])})"
            )
        return
    trials = len(applied) + len(kept)
    claim.examined(trials)
    p_value = binomial_p_value(len(applied), trials, transform.rate)
    summary["p_value"] = p_value
    if p_value < ALPHA:
        low, high = binomial_range(trials, transform.rate, ALPHA)
        claim.problem(
            f"declared {name}: it applied to {len(applied)} of {trials} samples ({len(applied) / trials:.1%}), "
            f"each under its own per-sample seed; at the declared rate {transform.rate:g} between {low} and "
            f"{high} are expected (two-sided binomial test, p = {p_value:.2g} < {ALPHA:g})"
            + _constant_hint(applied, kept)
        )


def _constant_hint(applied: list[_Draw], kept: list[_Draw]) -> str:
    if applied and kept:
        return ""
    return (
        f" (it {'always' if applied else 'never'} applied: a draw seeded from a constant, or not drawn per sample, "
        "gives every sample the same decision)"
    )


def _deterministic(ctx: CheckContext, claims: ClaimRecorder, draws: list[_Draw], crude: list[dict]) -> None:
    """The first draws cooked again, in reverse order, each after the global generators were put into a
    state of their own: every declared field must come out the same."""
    with rngs.saved():  # the caller's generators as they were (the Python API runs in the caller's process)
        _recook(ctx, claims, draws, crude)


def _recook(ctx: CheckContext, claims: ClaimRecorder, draws: list[_Draw], crude: list[dict]) -> None:
    with claims.claim("deterministic") as claim:
        again = list(reversed(draws[:RECOOKED]))
        samples = {str(s["__key__"]): s for s in crude}
        differ = []
        for draw in again:
            rngs.plant(0x7A5F + draw.index)
            output = _first_stage(ctx, samples[draw.key], draw.index)
            claim.examined()
            for path, value in draw.values.items():
                if not same(value, field_at(output, path)):
                    differ.append((draw, path, field_at(output, path)))
        if differ:
            draw, path, other = differ[0]
            fields = sorted({p for _, p, _ in differ})
            claim.problem(
                f"{len(differ)} of {len(again)} samples cooked a second time at the same sample index and seed "
                f"got another draw of {fields} (e.g. {draw.key!r} at sample index {draw.index}: "
                f"{_show(draw.values[path])} the first time, {_show(other)} the second): the draw depends on what "
                "ran before or on the global random generators, so a resumed or repeated run trains on other data"
            )


def _redrawn(claims: ClaimRecorder, transform: Transform, name: str, judged: list[_Draw]) -> None:
    """Fails when no sample met several times got different draws, while independent draws at the declared
    rate would give some almost surely (probability of none below ALPHA)."""
    by_key: dict[str, set[str | None]] = {}
    for draw in judged:
        by_key.setdefault(draw.key, set()).add(draw.outcomes[transform.field])
    counts: dict[str, int] = {}
    for draw in judged:
        counts[draw.key] = counts.get(draw.key, 0) + 1
    repeated = [k for k, n in counts.items() if n > 1]
    with claims.claim("redrawn") as claim:
        claim.examined(len(repeated))
        rate = transform.rate or 0.0
        p_none = 1.0
        for key in repeated:
            n = counts[key]
            p_none *= rate**n + (1 - rate) ** n
        mixed = [k for k in repeated if len(by_key[k]) > 1]
        if not repeated or p_none >= ALPHA:
            claim.inconclusive(
                f"declared {name}: too few samples met more than once to tell a draw per seed from one per key"
            )
        elif not mixed:
            claim.problem(
                f"declared {name}: each of {len(repeated)} samples met {max(counts.values())} times under other "
                f"per-sample seeds got the same draw every time (independent draws at rate {rate:g} give that with "
                f"probability {p_none:.2g}): the draw is fixed per sample key, so the same samples are transformed "
                "every epoch"
            )


def _only_declared(
    claims: ClaimRecorder,
    transform: Transform,
    transforms: Sequence[Transform],
    name: str,
    judged: list[_Draw],
) -> None:
    """When the transform applies, the sample's other payloads are those of a draw of the same sample where
    it did not (payloads that differ between two draws with the same outcomes, random augmentation, aside)."""
    by_key: dict[str, list[_Draw]] = {}
    for draw in judged:
        by_key.setdefault(draw.key, []).append(draw)

    def others(draw: _Draw) -> dict[str, Any]:
        return {
            p.path: identity(p)
            for p in payloads(draw.output)
            if p.path != KEY and not p.path.startswith("__") and not any(t.covers(p.path) for t in transforms)
        }

    def outcomes(draw: _Draw) -> tuple:
        return tuple(draw.outcomes.get(t.field) for t in transforms)

    seeded: set[str] = set()
    pairs: list[tuple[_Draw, _Draw]] = []
    for group in by_key.values():
        for i, a in enumerate(group):
            for b in group[i + 1 :]:
                if outcomes(a) == outcomes(b):
                    mine, theirs = others(a), others(b)
                    seeded |= {p for p in mine.keys() | theirs.keys() if mine.get(p) != theirs.get(p)}
        applied = [d for d in group if d.outcomes.get(transform.field) == "applied"]
        kept = [d for d in group if d.outcomes.get(transform.field) == "kept"]
        if applied and kept:
            pairs.append((applied[0], kept[0]))
    with claims.claim("only_declared") as claim:
        if not pairs:
            claim.inconclusive(f"declared {name}: no sample was met both with and without the transform")
            return
        changed: dict[str, list[str]] = {}
        for applied, kept in pairs:
            claim.examined()
            mine, theirs = others(applied), others(kept)
            for path in sorted(mine.keys() | theirs.keys()):
                if path not in seeded and mine.get(path) != theirs.get(path):
                    changed.setdefault(path, []).append(applied.key)
        for path, keys in changed.items():
            sample = next(a for a, _ in pairs if a.key == keys[0])
            kept_draw = next(k for a, k in pairs if a.key == keys[0])
            hint = recognise(_payload(kept_draw.output, path), _payload(sample.output, path))
            also = (
                f"; {declaration_hint(path, hint.replace('RATE', f'{transform.rate:g}') if transform.rate else hint)}"
                if hint
                else ""
            )
            claim.problem(
                f"declared {name}: when it applies, field {path!r} changes too ({len(keys)} of {len(pairs)} samples, "
                f"e.g. {keys[0]!r}: {_show(_payload(sample.output, path))} instead of "
                f"{_show(_payload(kept_draw.output, path))}){also}"
            )


def _payload(output: Any, path: str) -> Any:
    for payload in payloads(output):
        if payload.path == path:
            return payload.value
    return MISSING


def _show(value: Any) -> str:
    if value is MISSING:
        return "(nothing)"
    if isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1)[:4].tolist()
        return f"tensor {str(value.dtype).removeprefix('torch.')} {list(value.shape)} {flat}{'...' if value.numel() > 4 else ''}"
    if isinstance(value, np.ndarray):
        return f"array {value.dtype} {list(value.shape)}"
    return f"{value!r:.80}"
