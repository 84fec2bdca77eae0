"""Property 14, sequence packing (TaskEncoders that override both ``select_samples_to_pack`` and
``pack_selected_samples``; Energon runs them when a loader has ``packing_buffer_size``): over one epoch
every sample is packed exactly once, across ranks too (Energon drops the samples of a buffer the selector
leaves out); every sample's tensors and texts are in the pack made from it, bit for bit; two loaders with
the same seed give the same packed batches; and a checkpoint restored into a fresh loader continues with
the same packed batches, with 0 and 2 workers.

How: a fresh TaskEncoder of the target whose ``pack_selected_samples`` records its input samples' keys and
compares each input sample with the pack it returns (a tensor is held when its bytes occur, contiguous, in
a tensor of the pack, as concatenation along the sequence dimension or stacking keep them; a text when it
occurs in a string of the pack). Energon's loaders run with ``packing_buffer_size`` and the generated
preencoded (or the user's) data.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from typing import Any

from megatron.energon import TaskEncoder

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..core.rendering import describe_error
from ..engine import rngs
from ..engine.calls import build_loader, closing, packing_settings, target_call
from ..engine.context import CheckContext
from ..oracles.expectations import required_values
from ..oracles.fingerprint import fingerprint, first_difference
from ..oracles.payloads import Trace, padding_problems, required_by, trace
from ._common import fail, get_field
from ._packing import DEFAULT_BUFFER, cannot_pack_as_built, packing_configured, packs

CLAIMS = claims_of(
    "packing",
    (
        "loads",
        "a loader with packing_buffer_size goes through an epoch on 1 and on 2 ranks (pack_selected_samples "
        "and batch() accept what the packing stage hands them)",
        Harm.CRASH,
        "carry every field batch() reads into the pack pack_selected_samples returns, and batch packs as "
        "samples (the reproduce command shows the error)",
    ),
    (
        "exactly_once",
        "with packing on, every sample of an epoch is packed exactly once, on one rank and across 2 ranks",
        Harm.DATA,
        "return every sample of the buffer from select_samples_to_pack, each in exactly one group (Energon "
        "drops what the selector leaves out)",
    ),
    (
        "payload",
        "every sample's tensors and texts are in the pack made from it, bit for bit",
        Harm.DATA,
        "build the pack from every sample given to pack_selected_samples (concatenate, do not overwrite or "
        "truncate)",
    ),
    (
        "batch_rows",
        "batch() of packs keeps every sample of every pack it is given: each sample's tensors and texts are in "
        "the batch (a batch holds batch_size packs, so its samples are counted through its packs, not its rows)",
        Harm.DATA,
        "batch the packs as samples: one row (or list entry) per pack, every pack kept",
    ),
    (
        "unmatched",
        "every field of the samples reaches the pack and the batch of packs (a field of no required data, such "
        "as a caption next to embeddings, may be left out)",
        Harm.ADVICE,
        "carry the field into the pack if the model needs it; a provenance field left out on purpose needs "
        "nothing",
    ),
    (
        "determinism",
        "two loaders with the same seed (2 workers) give the same packed batches",
        Harm.DETERMINISM,
        "make the selection depend only on the samples (sort with a stable key; no set or dict-order tricks)",
    ),
    (
        "resume",
        "a checkpoint restored into a fresh loader with packing continues with the same packed batches (0 and "
        "2 workers)",
        Harm.RESUME,
        "keep select_samples_to_pack and pack_selected_samples free of state outside the samples",
    ),
)

BUFFER = DEFAULT_BUFFER
BATCH_SIZE = 2
NUM_SAMPLES = 32
SAVE_AT = 2
CONTINUATION = 3


def _lost(result: Trace, required: Any, lacked: dict[str, set[str]] | None = None) -> list[tuple[str, str]]:
    """``(key, problem)`` for what an output (a pack, a batch of packs) loses of its samples: payloads
    lost (see :meth:`Trace.lost`; what a sample's pack already lacked, ``lacked``, is not lost again),
    fields of different samples mixed up, padding with no length or mask beside it."""
    out = [
        (key, f"sample {key!r}: {why}")
        for key, path, why in result.lost(required)
        if lacked is None or path not in lacked.get(key, set())
    ]
    out += [("", problem) for problem in result.mixed()]
    out += [("", problem) for problem in padding_problems(result)]
    return out


@dataclasses.dataclass
class _Record:
    """What the recording pack_selected_samples saw: the keys of each pack it made, the samples it
    compared with their pack, what was missing, and the first error it raised."""

    packed: list[list[str]] = dataclasses.field(default_factory=list)
    compared: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)
    #: fields of no required data that a pack or a batch leaves out for every sample (advice)
    unmatched: list[str] = dataclasses.field(default_factory=list)
    error: str = ""
    #: required(key, payload): the one definition of required data, for this dataset's samples
    required: Any = None
    #: id(pack) -> (pack, its samples, the payload paths of each sample the pack lacks); the pack is
    #: kept so that its id is not reused
    packs: dict[int, tuple[Any, list[Any], list[set[str]]]] = dataclasses.field(default_factory=dict)
    #: per batch() call: (packs, samples of those packs)
    batches: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    batch_problems: list[str] = dataclasses.field(default_factory=list)


def _recording(ctx: CheckContext, record: _Record) -> TaskEncoder:
    task_encoder = ctx.target.make_task_encoder()
    original = task_encoder.pack_selected_samples

    def pack_selected_samples(samples: list[Any]) -> Any:
        keys = [str(get_field(s, "__key__")) for s in samples]
        try:
            pack = original(samples)
        except Exception as error:  # Energon logs and skips it; the verdict needs the cause
            record.error = record.error or (f"pack_selected_samples raised {describe_error(error, 300)}")
            raise
        record.packed.append(keys)
        result = trace(samples, pack, keys)
        record.compared += len(samples)
        for _key, problem in _lost(result, record.required):
            record.problems.append(f"the pack of {keys}: {problem}")
        for path in result.dropped(record.required):
            record.unmatched.append(f"the pack of {keys} leaves out the samples' {path!r}")
        lacking = [set(s.missing()) for s in result.samples]
        record.packs[id(pack)] = (pack, list(samples), lacking)
        return pack

    original_batch = task_encoder.batch

    def batch(packs: list[Any]) -> Any:
        try:
            result = original_batch(packs)
        except Exception as error:
            record.error = record.error or (
                f"batch() of {len(packs)} packs raised {describe_error(error, 300)}"
            )
            raise
        # the samples of the batch are the packs' samples: each must keep in the batch what its pack held
        # (what the pack already lacked is packing/payload's finding)
        members: list[Any] = []
        lacked: dict[str, set[str]] = {}
        pack_of: dict[str, int] = {}
        for index, pack in enumerate(packs):
            _, samples, lacking = record.packs.get(id(pack), (None, [], []))
            for sample, missing in zip(samples, lacking, strict=True):
                key = str(get_field(sample, "__key__"))
                members.append(sample)
                lacked[key] = missing
                pack_of[key] = index
        if members:
            found = trace(members, result, [str(get_field(s, "__key__")) for s in members])
            for key, problem in _lost(found, record.required, lacked):
                where = f" (in pack {pack_of[key]})" if key in pack_of else ""
                record.batch_problems.append(f"the batch of {len(packs)} packs: {problem}{where}")
            for path in found.dropped(record.required):
                if not all(path in missing for missing in lacked.values()):
                    record.unmatched.append(
                        f"the batch of {len(packs)} packs leaves out the samples' {path!r}"
                    )
        record.batches.append((len(packs), len(members)))
        return result

    # Instance attributes (plain functions) are what Energon's build_batch picks up.
    task_encoder.pack_selected_samples = pack_selected_samples
    task_encoder.batch = batch
    return task_encoder


def _buffer(ctx: CheckContext) -> int:
    """The packing buffer the loaders here run with (the target's own, where it has one)."""
    return ctx.cached(
        "packing-buffer",
        lambda: packing_settings(ctx.target, ctx.target.make_task_encoder(), BUFFER, BATCH_SIZE)[0],
    )


def _num_samples(ctx: CheckContext) -> int:
    """Samples of the packing dataset: at least :data:`NUM_SAMPLES`, and at least three pack selections of
    the buffer for each of two ranks (or workers), so that a selection after the first is always seen."""
    return max(NUM_SAMPLES, 3 * 2 * _buffer(ctx))


#: packed batches compared after a restore, at most
MAX_CONTINUATION = 64


def _continuation(ctx: CheckContext) -> int:
    """Packed batches compared after a restore: enough to reach past several pack selections even where
    every pack holds one sample (a selection of ``buffer`` samples is then ``buffer / packs per batch``
    batches), so that a selection drawn from state the checkpoint does not hold is met more than once (a
    shuffle of two packs matches by chance half the time)."""
    buffer = _buffer(ctx)
    packs_per_batch = ctx.cached(
        "packing-batch",
        lambda: packing_settings(ctx.target, ctx.target.make_task_encoder(), BUFFER, BATCH_SIZE)[1],
    )
    return min(MAX_CONTINUATION, max(CONTINUATION, -(-4 * buffer // max(1, packs_per_batch))))


def _path(ctx: CheckContext) -> Any:
    encoding = ctx.encodings()[0]
    return ctx.generated(encoding, "packing", num_samples=_num_samples(ctx), shard_size=8)


def _epoch(ctx: CheckContext, rank: int, world_size: int, record: _Record) -> None:
    loader = build_loader(
        ctx.target,
        _path(ctx),
        batch_size=BATCH_SIZE,
        num_workers=0,
        seed=ctx.seed,
        rank=rank,
        world_size=world_size,
        mode="val",
        packing_buffer_size=BUFFER,
        task_encoder=_recording(ctx, record),
    )
    what = f"iterating one epoch with packing (rank {rank} of {world_size})"
    try:
        with closing(loader), target_call(what):
            for _ in loader:
                pass
    except Exception as error:
        if record.error:  # the error Energon turned into something else: say the cause
            fail(f"{what}: {record.error}")
        raise error


def _batches(ctx: CheckContext, num_workers: int, count: int, state: Any = None) -> tuple[list, Any]:
    loader = build_loader(
        ctx.target,
        _path(ctx),
        batch_size=BATCH_SIZE,
        num_workers=num_workers,
        seed=ctx.seed,
        packing_buffer_size=BUFFER,
    )
    saved = None
    with closing(loader):
        if state is not None:
            loader.restore_state_rank(copy.deepcopy(state))
        iterator = iter(loader)
        out = []
        for index in range(count):
            if state is None and index == SAVE_AT:
                saved = copy.deepcopy(loader.save_state_rank())
            with target_call(f"iterating packed batches (num_workers={num_workers}, batch {index})"):
                out.append(fingerprint(next(iterator)))
    return out, saved


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    task_encoder = ctx.target.make_task_encoder()
    if not packs(task_encoder):
        for claim in CLAIMS:
            claims.not_applicable(
                claim.name,
                "the TaskEncoder does not pack (no select_samples_to_pack and "
                "pack_selected_samples of its own)",
            )
        return {}
    if packing_configured(ctx.target, task_encoder) is False:
        for claim in CLAIMS:
            claims.not_applicable(
                claim.name,
                f"the TaskEncoder is built with packing_buffer_size={task_encoder.packing_buffer_size!r}, so "
                "the loaders training builds with it do not pack; pass --conformance-packing-buffer-size N to "
                "check its packing",
            )
        return {}
    unavailable = cannot_pack_as_built(ctx, task_encoder)
    if unavailable is not None:
        claims.inconclusive(
            "loads",
            f"the TaskEncoder does not say whether it packs (no packing_buffer_size attribute, no "
            f"--conformance-packing-buffer-size) and {unavailable}: a training run built this way does not "
            "pack. To check its packing, build it as the training that packs does (module:Class(arg=...)) "
            "and pass --conformance-packing-buffer-size N",
        )
        for claim in CLAIMS:
            claims.inconclusive(claim.name, "not packed as built: see packing/loads")
        return {"not_packed_as_built": unavailable}
    keys = sorted(s["__key__"] for s in ctx.raw(_path(ctx)))
    details: dict[str, Any] = {"buffer": BUFFER, "samples": len(keys)}
    schema = ctx.workspace.schema(ctx.encodings()[0])
    required = required_by({s["__key__"]: required_values(schema, s) for s in ctx.raw(_path(ctx))})
    records = {world_size: _Record(required=required) for world_size in (1, 2)}
    with claims.claim("loads") as claim:
        for world_size, record in records.items():
            for rank in range(world_size):
                claim.examined()
                _epoch(ctx, rank, world_size, record)
    if claims.failed("loads"):
        for name in ("exactly_once", "payload", "batch_rows", "unmatched", "determinism", "resume"):
            claims.not_applicable(name, "blocked by packing/loads: a loader with packing yields no batches")
        return details
    with claims.claim("exactly_once") as claim:
        for world_size, record in records.items():
            claim.examined(len(keys))
            counts = Counter(key for group in record.packed for key in group)
            lost = [k for k in keys if counts[k] == 0]
            repeated = sorted(k for k, n in counts.items() if n > 1)
            if lost or repeated:
                parts = []
                if lost:
                    parts.append(f"{len(lost)} of {len(keys)} samples were never packed ({lost[:6]})")
                if repeated:
                    parts.append(f"{len(repeated)} were packed more than once ({repeated[:6]})")
                claim.problem(
                    f"one epoch with packing_buffer_size={BUFFER} on {world_size} rank(s): {'; '.join(parts)}"
                )
            details[f"packs (world size {world_size})"] = len(record.packed)
    with claims.claim("payload") as claim:
        problems = [p for record in records.values() for p in record.problems]
        claim.examined(sum(record.compared for record in records.values()))
        claim.nothing_because("no pack was made")
        for problem in problems[:6]:
            claim.problem(problem)
        if len(problems) > 6:
            claim.problem(f"... and {len(problems) - 6} more samples")
    with claims.claim("batch_rows") as claim:
        problems = [p for record in records.values() for p in record.batch_problems]
        claim.examined(sum(n for record in records.values() for _, n in record.batches))
        claim.nothing_because("batch() was never called with packs")
        for problem in problems[:6]:
            claim.problem(problem)
        if len(problems) > 6:
            claim.problem(f"... and {len(problems) - 6} more samples")
        details["samples per packed batch"] = [samples for _, samples in records[1].batches]
    with claims.claim("unmatched") as claim:
        claim.examined(sum(record.compared for record in records.values()))
        for problem in dict.fromkeys(p for record in records.values() for p in record.unmatched):
            claim.problem(
                f"{problem} (no required data of the format): if the model needs it, carry it into the pack"
            )
            break
    continuation = _continuation(ctx)
    with claims.claim("determinism") as claim:
        # each loader under other global generator states: a selection drawn from them differs every time
        with rngs.planted(1):
            first, _ = _batches(ctx, 2, SAVE_AT + continuation)
        with rngs.planted(2):
            second, _ = _batches(ctx, 2, SAVE_AT + continuation)
        claim.examined(len(first))
        if first != second:
            at = next(i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b)
            fail(
                f"packed batch {at} differs between two loaders with the same seed: {first_difference(first[at], second[at])}"
            )
    with claims.claim("resume") as claim:
        for num_workers in (0, 2):
            with rngs.planted(3 + num_workers):
                reference, state = _batches(ctx, num_workers, SAVE_AT + continuation)
            with rngs.planted(4 + num_workers):
                restored, _ = _batches(ctx, num_workers, continuation, state=state)
            claim.examined(continuation)
            expected = reference[SAVE_AT:]
            if restored != expected:
                at = next(i for i, (a, b) in enumerate(zip(restored, expected, strict=True)) if a != b)
                claim.problem(
                    f"num_workers={num_workers}: restored at packed batch {SAVE_AT}, batch {at} after the restore "
                    f"differs from the uninterrupted run: {first_difference(expected[at], restored[at])}"
                )
    return details
