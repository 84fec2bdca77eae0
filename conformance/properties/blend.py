"""Property 8, weight ratios: through a weighted blend of 2 to 5 datasets, the samples that reach
``batch()`` come from each dataset in the proportions of the weights (Pearson chi-square goodness of fit
at alpha = 1e-6, with enough draws for 99% power against a Cohen effect of 0.1 (0.05 in the ``thorough``
profile, 0.15 in ``quick``; in a blend of two equal weights, one source losing about a fifth of its samples
is w = 0.1, a tenth is w = 0.05), counted across 2
workers on each of 2 ranks); every cooked sample carries its blend entry's subflavors; and a dataset
that appears twice in a blend is reported.

How it counts: the datasets are generated (16 samples each, distinct key prefixes ``blend<i>``) and
blended by a MetadatasetV2 whose entries add ``blend_entry: i`` to each dataset's own subflavors. Every
cooker and ``batch()`` of a fresh TaskEncoder is wrapped to record, from every worker process, each
cooked sample (key, ``blend_entry`` in and out) and each batch (the keys of the samples it batched;
``batch()`` still runs, but unless the TaskEncoder post-processes batches the loader gets only their
size, so nothing large is shipped). Energon draws each worker's blend sequence i.i.d. from the weights,
so the first ``n`` samples each worker batched (``n`` fixed in advance) are a multinomial sample when
the target keeps every sample; one that filters samples of one source after the blend
(``encode_sample``, ``batch``) shifts the fractions. (A cooker cannot: Energon cooks each dataset
before blending, so a sample a cooker skips is replaced by the next one of the same dataset.) Blended
datasets repeat, so none runs dry. The two ranks' loaders run side by side. For a target that cooks
several formats, the datasets of a blend take them in turn, so batches mix them as a blend of the user's
datasets would (unless batch/mixed_formats failed: then each blend has one format, and that claim says why).

A cooker target (``--cooker``) runs in Energon's default TaskEncoder, which adds nothing after the blend:
Energon cooks each dataset before blending it, so nothing a cooker does can move the ratios, and
blend/ratios does not apply (it would test Energon's sampler, at tens of thousands of draws). Its blend is
read for :data:`SUBFLAVOR_BATCHES` batches per worker, enough to check the subflavors of every entry.

Duplicates: a user's metadataset (``--dataset x.yaml``) whose leaves (nested YAMLs resolved, paths
relative to each YAML) name one dataset twice (same split part and subset) fails. Energon 7.4.1 gives
both entries the same sample stream (NVIDIA/Megatron-Energon#266, github.com/NVIDIA/Megatron-Energon/issues/266; measured: every blended dataset of the same shard
layout is shuffled with the same worker seed). For generated data the suite blends one dataset under two
entries and records in ``details["duplicate_entry"]`` whether Energon gave them identical streams; that
is Energon's behaviour, not the target's, so it is reported, not failed.
"""

from __future__ import annotations

import copy
import math
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from megatron.energon import DefaultTaskEncoder, TaskEncoder

from primus_energon.datasets.metadataset import Leaf, duplicate_leaves
from primus_energon.energon_compat import overrides
from primus_energon.synthetic import Schema

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..core.rendering import describe_error
from ..data.workspace import infer_schema, metadataset_leaves
from ..engine.calls import build_loader, closing, target_call
from ..engine.context import CheckContext
from ..engine.recording import instrument, read_records
from ..oracles.stats import chi_square_test, cohen_w, required_n
from ._common import MISSING, fail, get_field

__all__ = ["check", "CLAIMS", "ALPHA", "POWER"]

CLAIMS = claims_of(
    "blend",
    (
        "ratios",
        "the samples that reach batch() come from each dataset of a weighted blend in the proportions of "
        "the weights (chi-square, alpha 1e-6, 99% power at Cohen's w 0.1; 0.05 in the thorough profile, 0.15 "
        "in quick), across workers and ranks; a TaskEncoder's claim (a cooker runs before the blend)",
        Harm.DATA,
        "do not skip, drop or duplicate samples of one source after the blend (encode_sample, batch)",
    ),
    (
        "subflavors",
        "every sample carries its blend entry's subflavors (merged by Energon into __subflavors__)",
        Harm.ADVICE,
        "pass the crude sample's __subflavors__ on unchanged (**basic_sample_keys(sample)), so training can "
        "tell the blend's sources apart",
    ),
    (
        "duplicates",
        "the user's metadataset (--conformance-dataset x.yaml) lists no dataset twice",
        Harm.DATA,
        "list each dataset once and give it the summed weight (Energon 7.4.1 gives both entries the same "
        "sample stream, NVIDIA/Megatron-Energon#266)",
    ),
)

ALPHA = 1e-6
POWER = 0.99
WORLD_SIZE = 2
NUM_WORKERS = 2
BATCH_SIZE = 64
SUBFLAVOR = "blend_entry"
#: samples per generated blend dataset: 2 shards of 8, so each of the 4 workers holds samples of each
SAMPLES_PER_DATASET = 16
#: batches per worker read from a cooker target's blend (subflavors only; ratios do not apply to a cooker)
SUBFLAVOR_BATCHES = 2
#: why blend/ratios does not apply to a cooker target
COOKER_RATIOS = (
    "a cooker cannot change the blend's ratios: Energon cooks each dataset before blending it (a sample a "
    "cooker skips is replaced by the next one of the same dataset) and Energon's default TaskEncoder adds "
    "nothing after the blend; the ratios of a TaskEncoder that filters, drops or repeats samples in "
    "encode_sample, batch() or packing are checked with --task-encoder"
)


# --- recording ---------------------------------------------------------------------------------------


def _entry_of(subflavors: Any) -> Any:
    """The ``blend_entry`` subflavor: an int, or "missing" (no ``__subflavors__``), "absent" (no such key)."""
    if subflavors is MISSING or subflavors is None:
        return "missing"
    if not isinstance(subflavors, Mapping):
        return f"not a mapping: {subflavors!r:.80}"
    return subflavors.get(SUBFLAVOR, "absent")


def _describe_cooked(sample: dict, output: Any) -> dict[str, Any]:
    subflavors = get_field(output, "__subflavors__")
    return {
        "in": _entry_of(sample.get("__subflavors__")),
        "out": _entry_of(subflavors),
        "out_subflavors": repr(subflavors)[:200],
    }


def _describe_batch(samples: list[Any]) -> dict[str, Any]:
    return {"entries": [_entry_of(get_field(s, "__subflavors__")) for s in samples]}


def _instrumented(ctx: CheckContext, sink: Path, *, ship: bool = False) -> TaskEncoder:
    """A fresh TaskEncoder of the target (an instance target is copied) that records what it cooked and
    batched into ``sink`` (:func:`~primus_energon.conformance.engine.recording.instrument`). Unless ``ship`` or the
    TaskEncoder post-processes batches, batches are not shipped from the workers (counts come from records)."""
    task_encoder = ctx.target.make_task_encoder()
    if task_encoder is ctx.target.obj:  # a TaskEncoder instance target: instrument a copy, not the user's
        task_encoder = copy.copy(task_encoder)
    return instrument(
        task_encoder,
        sink,
        cooked_only=True,
        describe_cooked=_describe_cooked,
        batches=True,
        describe_batch=_describe_batch,
        ship_batches=ship or _converts_batches(task_encoder),
    )


def _converts_batches(task_encoder: TaskEncoder) -> bool:
    """True when the TaskEncoder post-processes what ``batch()`` returns: its own ``encode_batch``, or a
    ``DefaultTaskEncoder`` converting raw batches to a ``batch_type``."""
    if overrides(task_encoder, "encode_batch", bases=(TaskEncoder, DefaultTaskEncoder)):
        return True
    batch_type = getattr(task_encoder, "_batch_type", None)
    return batch_type is not None and batch_type != getattr(task_encoder, "_raw_batch_type", None)


# --- duplicate leaves in a user's metadataset ----------------------------------------------------------


def _check_user_metadataset(claims: ClaimRecorder, yaml_path: str, split: str = "train") -> list[Leaf]:
    """The ``split`` leaves of the user's metadataset (resolved as ``primus-energon validate`` resolves
    them); blend/duplicates fails for a dataset split and subset listed twice. A metadataset that does not
    resolve is refused with the resolver's problems."""
    leaves = metadataset_leaves(yaml_path, split)
    with claims.claim("duplicates") as claim:
        claim.examined(len(leaves))
        for first, again in duplicate_leaves(leaves):
            claim.problem(
                f"{str(first.path)!r} is listed at {first.where} and again at {again.where} in {yaml_path!r}: "
                "Energon 7.4.1 gives both entries the same worker seed, so they yield identical sample streams "
                "and that dataset's samples arrive in pairs"
            )
    return leaves


# --- the blends ------------------------------------------------------------------------------------------


def _draw_blend(rng: random.Random) -> list[int]:
    """k in 2..5 datasets with integer weights 1..9 (not all equal, so the weights matter)."""
    k = rng.randint(2, 5)
    while True:
        weights = [rng.randint(1, 9) for _ in range(k)]
        if len(set(weights)) > 1:
            return weights


def _data_source(ctx: CheckContext, claims: ClaimRecorder) -> tuple[list[str | None], Schema | None]:
    """The encodings to blend, and the schema when the user's data is a metadataset (whose first leaf
    describes the format)."""
    dataset = ctx.workspace.dataset
    if dataset and str(dataset).endswith((".yaml", ".yml")):
        leaves = _check_user_metadataset(claims, str(dataset))
        first = next((leaf.path for leaf in leaves if leaf.path.is_dir()), None)
        if first is None:
            raise ValueError(
                f"metadataset {dataset!r} names no local dataset directory to infer the format from"
            )
        schema = infer_schema(first)
        return [schema.encoding], schema
    return ctx.encodings(), None


def _dataset(
    ctx: CheckContext, encoding: str | None, schema: Schema | None, name: str, **options: Any
) -> Path:
    options = {"num_samples": SAMPLES_PER_DATASET, "shard_size": 8, "key_prefix": name, **options}
    return ctx.generated(encoding, name, schema=schema, **options)


def _counts_per_worker(records: list[dict[str, Any]], prefixes: dict[str, int], per_worker: int) -> dict:
    """Per worker pid: the blend entries of its first ``per_worker`` batched samples (by key), or of its
    first cooked samples when batched samples carry no recognisable key."""
    batched: dict[int, list[Any]] = defaultdict(list)
    cooked: dict[int, list[Any]] = defaultdict(list)
    for record in records:
        if record["stage"] == "batch":
            for key, entry in zip(record["keys"], record["entries"], strict=True):
                by_key = prefixes.get(key.rsplit("_", 1)[0]) if key else None
                batched[record["pid"]].append(by_key if by_key is not None else entry)
        else:
            cooked[record["pid"]].append(prefixes.get(str(record["key"]).rsplit("_", 1)[0], record["in"]))
    entries = set(prefixes.values())
    usable = all(all(e in entries for e in seq) for seq in batched.values()) and batched
    source = batched if usable else cooked
    return {
        "stage": "batch" if usable else "cook",
        "workers": {pid: seq[:per_worker] for pid, seq in source.items()},
    }


def _check_subflavors(records: list[dict[str, Any]], prefixes: dict[str, int], problems: list[str]) -> int:
    """Compare every record's blend entry with the sample's; appends what differs to ``problems``."""
    checked = 0
    for record in records:
        if record["stage"] == "cook":
            expected = record["in"]
            if not isinstance(expected, int):
                continue  # Energon did not merge the entry's subflavors: not the target's doing
            if record["out"] != expected and len(problems) < 4:
                problems.append(
                    f"sample {record['key']!r} came from blend entry {expected} (its crude __subflavors__ hold "
                    f"{SUBFLAVOR}: {expected}, the metadataset entry's subflavors), but the cooker's output has "
                    f"__subflavors__ {record['out_subflavors']} ({SUBFLAVOR}: {record['out']})"
                )
            checked += 1
        else:
            for key, entry in zip(record["keys"], record["entries"], strict=True):
                expected = prefixes.get(key.rsplit("_", 1)[0]) if key else None
                if expected is None or entry == "missing":
                    continue  # the batched type has no __subflavors__ field: nothing to compare
                if entry != expected and len(problems) < 4:
                    problems.append(
                        f"sample {key!r} of blend entry {expected} reached batch() with {SUBFLAVOR}: {entry} in its "
                        f"__subflavors__ (expected {expected}); something between the cooker and batch() replaced them"
                    )
    return checked


def _run_blend(
    ctx: CheckContext,
    claims: ClaimRecorder,
    index: int,
    weights: list[int],
    encodings: list[str | None],
    schema: Schema | None,
) -> dict[str, Any]:
    k = len(weights)
    paths = [_dataset(ctx, encodings[i], schema, f"blend{i}") for i in range(k)]
    prefixes = {f"blend{i}": i for i in range(k)}
    entries = [
        (path, weight, {**ctx.workspace.subflavors(path), SUBFLAVOR: i})
        for i, (path, weight) in enumerate(zip(paths, weights, strict=True))
    ]
    mds = ctx.workspace.metadataset(f"blend-{index}-{'-'.join(map(str, weights))}", entries)
    effect = ctx.profile.blend_effect
    counts_ratios = ctx.target.kind != "cooker"
    if counts_ratios:
        n = required_n(k, alpha=ALPHA, power=POWER, w=effect)
        per_worker = math.ceil(n / (WORLD_SIZE * NUM_WORKERS))
    else:  # subflavors only: see the module docstring
        per_worker = SUBFLAVOR_BATCHES * BATCH_SIZE
        n = per_worker * WORLD_SIZE * NUM_WORKERS
    started = time.perf_counter()
    sinks = [ctx.workspace.root / f"blend-records-{uuid.uuid4().hex}.jsonl" for _ in range(WORLD_SIZE)]
    try:
        batches = _consume(ctx, mds, sinks, per_worker)
        records = [read_records(sink) for sink in sinks]
    finally:
        for sink in sinks:
            sink.unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    all_counts: Counter[int] = Counter()
    stages = set()
    checked = 0
    subflavor_problems: list[str] = []
    for rank_records in records:
        checked += _check_subflavors(rank_records, prefixes, subflavor_problems)
    with claims.claim("subflavors") as claim:
        claim.examined(checked)
        if not checked:
            claim.nothing_because("no cooked sample carried the blend entry (Energon merged no subflavors)")
        for problem in subflavor_problems:
            claim.problem(problem)
    for rank, rank_records in enumerate(records):
        counted = _counts_per_worker(rank_records, prefixes, per_worker)
        stages.add(counted["stage"])
        for pid, seq in counted["workers"].items():
            if len(seq) < per_worker:
                fail(
                    f"blend {weights}: worker pid {pid} of rank {rank} delivered only {len(seq)} samples in "
                    f"{batches[rank]} batches of {BATCH_SIZE}, expected at least {per_worker}"
                )
            all_counts.update(seq)
    counts = [all_counts.get(i, 0) for i in range(k)]
    total = sum(counts)
    if not counts_ratios:
        return {
            "weights": weights,
            "encodings": [e or "preencoded" for e in encodings],
            "n": total,
            "counts": counts,
            "ratios": "not applicable to a cooker",
            "counted_at": "/".join(sorted(stages)),
            "subflavor_samples_checked": checked,
            "batches": batches,
            "seconds": round(seconds, 2),
        }
    statistic, p_value = chi_square_test(counts, weights)
    fractions = [c / total for c in counts]
    expected = [w / sum(weights) for w in weights]
    result = {
        "weights": weights,
        "encodings": [e or "preencoded" for e in encodings],
        "n": total,
        "required_n": n,
        "counts": counts,
        "fractions": [round(f, 5) for f in fractions],
        "expected": [round(e, 5) for e in expected],
        "statistic": round(statistic, 4),
        "p_value": p_value,
        "cohen_w": round(cohen_w(fractions, weights), 5),
        "counted_at": "/".join(sorted(stages)),
        "subflavor_samples_checked": checked,
        "batches": batches,
        "seconds": round(seconds, 2),
    }
    if p_value < ALPHA:
        rows = "\n".join(
            f"  entry {i} (dataset blend{i}, weight {weights[i]}/{sum(weights)}): observed {fractions[i]:.4f} "
            f"({counts[i]} samples), expected {expected[i]:.4f} ({expected[i] * total:.0f})"
            for i in range(k)
        )
        fail(
            f"blend of {k} datasets with weights {weights}: the realised fractions differ from the weights "
            f"(chi-square goodness of fit: N={total}, statistic {statistic:.2f} on {k - 1} df, p={p_value:.3g} < "
            f"alpha {ALPHA:g}; Cohen's w {result['cohen_w']:.4f}; this N has {POWER:.0%} power against "
            f"w={effect} (the {ctx.profile.name} profile's)):\n{rows}\ncounted: the first {per_worker} samples that reached batch() on each of "
            f"{NUM_WORKERS} workers x {WORLD_SIZE} ranks. A cooker or TaskEncoder that skips, drops or duplicates "
            "samples of one dataset changes the blend the user asked for"
        )
    return result


def _tally(sink: Path) -> dict[int, int]:
    out: dict[int, int] = defaultdict(int)
    for record in read_records(sink):
        if record["stage"] == "batch":
            out[record["pid"]] += len(record["keys"])
    return out


def _consume(ctx: CheckContext, mds: Path, sinks: list[Path], per_worker: int) -> list[int]:
    """Pull batches on every rank, one rank's loader after the other (one loader's workers alive at a
    time: each holds its shuffle buffer and prefetched samples, which for large samples is most of the
    memory), until each worker has batched ``per_worker`` samples; returns the batches pulled per rank.
    The ranks' streams are the same whether read side by side or in turn: each is a function of its rank,
    the world size, the seed and the worker."""
    rounds = math.ceil(per_worker / BATCH_SIZE)
    consumed = [0] * len(sinks)
    for rank, sink in enumerate(sinks):
        loader = build_loader(
            ctx.target,
            mds,
            batch_size=BATCH_SIZE,
            num_workers=NUM_WORKERS,
            seed=ctx.seed,
            rank=rank,
            world_size=WORLD_SIZE,
            task_encoder=_instrumented(ctx, sink),
        )
        with closing(loader):
            iterator = iter(loader)
            planned = NUM_WORKERS * rounds
            while True:
                while consumed[rank] < planned:
                    with target_call(f"iterating rank {rank}'s loader over the blend"):
                        next(iterator)
                    consumed[rank] += 1
                tally = _tally(sink)
                if len(tally) >= NUM_WORKERS and min(tally.values()) >= per_worker:
                    break
                if planned >= 4 * NUM_WORKERS * rounds:
                    break  # the caller reports the worker that fell short
                planned += NUM_WORKERS
    return consumed


def _duplicate_entry(ctx: CheckContext, encoding: str | None, schema: Schema | None) -> dict[str, Any]:
    """Blend one dataset (8 shards of 2, so its order is shuffled) under two entries on one process and
    report whether Energon gave both entries the same sample stream (NVIDIA/Megatron-Energon#266)."""
    path = _dataset(ctx, encoding, schema, "blenddup", shard_size=2)
    subflavors = ctx.workspace.subflavors(path)
    mds = ctx.workspace.metadataset(
        "blend-duplicate",
        [(path, 1, {**subflavors, SUBFLAVOR: 0}), (path, 1, {**subflavors, SUBFLAVOR: 1})],
    )
    sink = ctx.workspace.root / f"blend-records-{uuid.uuid4().hex}.jsonl"
    try:
        task_encoder = _instrumented(ctx, sink)
        with closing(
            build_loader(
                ctx.target, mds, batch_size=8, num_workers=0, seed=ctx.seed, task_encoder=task_encoder
            )
        ) as loader:
            iterator = iter(loader)
            for _ in range(12):
                next(iterator)
        records = [r for r in read_records(sink) if r["stage"] == "cook"]
    finally:
        sink.unlink(missing_ok=True)
    streams: dict[Any, list[str]] = defaultdict(list)
    for record in records:
        streams[record["in"]].append(record["key"])
    length = min(len(streams[0]), len(streams[1]))
    identical = length > 0 and streams[0][:length] == streams[1][:length]
    return {
        "identical_streams": identical,
        "compared": length,
        "note": (
            "Energon gave both entries of the duplicated dataset the same sample stream (NVIDIA/Megatron-Energon#266): a dataset "
            "listed twice in a blend is sampled in identical pairs, not at twice the weight with fresh samples"
            if identical
            else "Energon gave the two entries of the duplicated dataset different sample streams"
        ),
    }


def _mixes_formats(ctx: CheckContext) -> bool:
    """Whether the target's formats can share a batch (batch/mixed_formats holds): then one blend mixes
    them. A target whose mixed batches fail is told so by that claim once; its blends take one format each."""
    from ._mixed_formats import mixed_format_problems

    try:
        return not mixed_format_problems(ctx)["problems"]
    except Exception:  # the batch property reports why the formats could not be batched
        return False


def _per_dataset(
    encodings: list[str | None], weights: list[int], index: int, mixing: bool
) -> list[str | None]:
    """The encoding of each dataset of blend ``index``: the target's formats in turn when they can share a
    batch, else one format per blend."""
    if mixing:
        return [encodings[i % len(encodings)] for i in range(len(weights))]
    return [encodings[index % len(encodings)]] * len(weights)


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    encodings, schema = _data_source(ctx, claims)
    if not (ctx.workspace.dataset and str(ctx.workspace.dataset).endswith((".yaml", ".yml"))):
        claims.not_applicable("duplicates", "applies to a user's metadataset (--conformance-dataset x.yaml)")
    rng = random.Random(f"conformance-blend-{ctx.seed}")
    mixing = len(encodings) > 1 and _mixes_formats(ctx)
    blends = []
    if ctx.target.kind == "cooker":
        claims.not_applicable("ratios", COOKER_RATIOS)
        weights = _draw_blend(rng)
        blends.append(
            _run_blend(ctx, claims, 0, weights, _per_dataset(encodings, weights, 0, mixing), schema)
        )
    else:
        with claims.claim("ratios") as claim:
            claim.note(
                ctx.workspace.generated_note(
                    f"blends of 2 to 5 datasets of {SAMPLES_PER_DATASET} samples in shards of 8",
                    "the ratios are counted by the source of each sample, so every blended dataset is "
                    "generated with keys of its own",
                )
            )
            for index in range(ctx.profile.blends):
                weights = _draw_blend(rng)
                per_dataset = _per_dataset(encodings, weights, index, mixing)
                blends.append(_run_blend(ctx, claims, index, weights, per_dataset, schema))
                claim.examined(blends[-1]["n"])
    claims.not_applicable("subflavors", "blocked by blend/ratios: the blend could not be read")
    try:
        duplicate = _duplicate_entry(ctx, encodings[0], schema)
    except Exception as error:  # Energon's behaviour is only reported here; the target's failure is in ratios
        duplicate = {
            "identical_streams": False,
            "compared": 0,
            "note": f"not measured: {describe_error(error)}",
        }
    summary = "; ".join(
        f"weights {b['weights']}: N={b['n']}, p={b['p_value']:.3g}, fractions {b['fractions']} "
        f"({b['seconds']:.1f} s)"
        if "p_value" in b
        else f"weights {b['weights']}: {b['n']} samples read for their subflavors, ratios not applicable to a "
        f"cooker ({b['seconds']:.1f} s)"
        for b in blends
    )
    return {
        "blends": blends,
        "mixed_formats": mixing,
        "duplicate_entry": duplicate,
        "summary": summary
        + (
            " | duplicated dataset: identical streams (NVIDIA/Megatron-Energon#266)"
            if duplicate["identical_streams"]
            else ""
        ),
    }
