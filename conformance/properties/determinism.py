"""Property 5, determinism across fresh processes: two new processes with different ``PYTHONHASHSEED`` and
the same seed deliver identical batches (keys and the bytes of every tensor and field), and another seed
changes the order; for 0, 1 and 2 workers (the profile's ``determinism_workers``).

Two children (the runner's ``determinism``, :func:`run_child` below, each forked from the fork server of its
hash seed: :func:`~primus_energon.conformance.processes.children.start_runner`) run concurrently: seed S with
``PYTHONHASHSEED=1``; seed S, then seed S+1, with ``PYTHONHASHSEED=2``. Each builds the target from its
spec and reads the first batches of a train-mode loader for every worker count in turn. Energon's order
depends on ``num_workers``, so batches are compared per worker count, never across.

"Another seed gives another order" is asked of a target only where Energon itself gives one: on a user's
dataset (``--conformance-dataset``) the second child also reads, under the same loader settings, the
suite's pass-through reference (:class:`~primus_energon.conformance.data.workspace.KeyReader`), for both seeds.
Energon's training order shuffles the shard slices each worker reads; a worker with a single slice (one
train shard, or as many workers as train shards) reads it in one order for any seed. For a worker count
where the reference delivers the user's dataset in one order for both seeds, the claim is checked on a
dataset derived from the user's own samples instead (:data:`FALLBACK_SAMPLES` samples in shards of
:data:`FALLBACK_SHARD_SIZE`), and the report says so; where Energon's order does not depend on the seed
there either, the claim does not apply (skipped, with the reason).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from primus_energon.storage import dataset_path

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..core.results import Inconclusive, PropertySkipped
from ..data.workspace import is_metadataset
from ..engine.context import CheckContext
from ..engine.target import Target
from ..oracles.fingerprint import first_difference, parse_fingerprint
from ..processes.children import HASHSEEDS, Background, child_target_args, finish
from ._common import batch_keys

CLAIMS = claims_of(
    "determinism",
    (
        "fresh_processes",
        "two fresh processes (different PYTHONHASHSEED) with the same seed deliver identical batches, for 0, "
        "1 and 2 workers (quick: 0 and 2)",
        Harm.DETERMINISM,
        "a cooked sample must depend only on the sample and the loader's seed: not on hash() of str/bytes, "
        "the process id, the time, or an unseeded RNG (draw augmentation in @stateless(restore_seeds=True))",
    ),
    (
        "seed",
        "another seed delivers another order",
        Harm.DETERMINISM,
        "do not replace Energon's seeded shuffling with a fixed order",
    ),
)

BATCHES = 6
BATCH_SIZE = 4
#: the generated dataset (in the user's format) the seed claim falls back to: shards small enough that
#: every worker of the profile reads several slices, so Energon's own order depends on the seed
FALLBACK_SAMPLES = 24
FALLBACK_SHARD_SIZE = 2


def prestart(ctx: CheckContext) -> Background:
    """Start the two children (see the module docstring); each writes ``<label>.json`` into the
    background's directory. ``PropertySkipped`` when the target cannot be rebuilt in a fresh process."""
    base = child_target_args(ctx.target)
    datasets = [ctx.main_dataset(encoding) for encoding in ctx.encodings()]
    common = ["--workers", ",".join(map(str, ctx.profile.determinism_workers)), "--batches", str(BATCHES)]
    common += ["--batch-size", str(BATCH_SIZE)]
    packing = _packing_buffer(ctx)
    if packing:
        from ..engine.calls import packing_settings

        # the settings the target's packing loaders need (--conformance-packing-buffer-size / -batch-size,
        # the TaskEncoder's own packing_buffer_size), which a fresh process rebuilding it from its spec lacks
        buffer, packs_per_batch = packing_settings(
            ctx.target, ctx.target.make_task_encoder(), packing, BATCH_SIZE
        )
        common += ["--packing", str(buffer), "--packing-batch-size", str(packs_per_batch)]
    for dataset in datasets:
        common += ["--dataset", str(dataset)]
    try:
        fallback = _fallback(ctx)
        fallback_problem = ""
    except Inconclusive as error:  # the target cannot cook the derived dataset: only the seed claim needs it
        fallback, fallback_problem = None, error.reason
    background = Background("conformance-determinism-")
    try:
        for label, (seeds, hashseed) in _runs(ctx.seed).items():
            seed_args = [arg for seed in seeds for arg in ("--seed", str(seed))]
            if fallback is not None and len(seeds) > 1:  # the child that reads both seeds
                seed_args += ["--reference", "--fallback", str(fallback)]
            out = background.dir / f"{label}.json"
            background.start_runner(
                label,
                "determinism",
                [*base, *common, *seed_args, "--out", str(out)],
                servers=ctx.fork_servers,
                hashseed=hashseed,
                show_env=["PYTHONHASHSEED"],
            )
    except BaseException:
        background.close()
        raise
    background.info["datasets"] = datasets
    background.info["packing"] = packing
    background.info["fallback"] = fallback
    background.info["fallback_problem"] = fallback_problem
    return background


#: the key of the packed run among a child's worker counts
PACKED = "packed"


def _packing_buffer(ctx: CheckContext) -> int | None:
    """The packing buffer of the packed runs, for a TaskEncoder that packs (else None): packs built in
    each process must be the same packs."""
    if ctx.target.kind != "task_encoder":
        return None
    from ._packing import DEFAULT_BUFFER as BUFFER
    from ._packing import cannot_pack_as_built, packing_configured

    task_encoder = ctx.target.make_task_encoder()
    if packing_configured(ctx.target, task_encoder) is False:
        return None  # it does not pack, or is built not to (packing_buffer_size None)
    if cannot_pack_as_built(ctx, task_encoder) is not None:
        return (
            None  # it says nothing, and as built its packer refuses clean samples: judged as it runs unpacked
        )
    return BUFFER  # build_loader takes the target's or the TaskEncoder's own buffer size first


def _fallback(ctx: CheckContext) -> Path | None:
    """On a user's dataset: the dataset derived from its samples that the seed claim falls back to where
    Energon gives the user's dataset one order for any seed (see the module docstring); else None."""
    if not ctx.workspace.dataset:
        return None
    encoding = ctx.encodings()[0]
    return ctx.generated(
        encoding, "determinism", num_samples=FALLBACK_SAMPLES, shard_size=FALLBACK_SHARD_SIZE
    )


def _runs(seed: int) -> dict[str, tuple[list[int], int]]:
    """The two children: label -> (the seeds it reads, its PYTHONHASHSEED)."""
    return {"a": ([seed], HASHSEEDS[0]), "b": ([seed, seed + 1], HASHSEEDS[1])}


def _describe_keys(keys: list[str] | None) -> str:
    return "?" if keys is None else "[" + ", ".join(keys) + "]"


def _readable(diff: str | None) -> str | None:
    """``first_difference`` of two fingerprints, with a tensor's digest (item 3) named as its bytes."""
    if diff is None:
        return None
    match = re.match(r"^(.*)\[3\]: expected '[0-9a-f]+', observed '[0-9a-f]+'$", diff)
    return f"{match.group(1)}: tensor bytes differ (same dtype and shape)" if match else diff


def _order(run: dict[str, Any]) -> Any:
    """The key order a run delivered: batch keys if the batches expose them, else the cookers' order per
    process, else the batch digests."""
    batches = run["batches"]
    if batches and all(b["keys"] is not None for b in batches):
        return [b["keys"] for b in batches]
    if any(run.get("cook_order") or []):
        return run["cook_order"]
    return [b["digest"] for b in batches]


def _compare_same_seed(ctx: CheckContext, dataset: str, nw: int | str, a: dict, b: dict) -> str | None:
    first, second = a["batches"], b["batches"]
    setting = "num_workers=0, packing" if nw == PACKED else f"num_workers={nw}"
    where = (
        f"two fresh processes with seed {ctx.seed} (PYTHONHASHSEED=1 and 2), {setting}, dataset "
        f"{dataset_path(dataset).name}"
    )
    if len(first) != len(second):
        return f"{where}: expected the same number of batches, observed {len(first)} and {len(second)}"
    for index, (x, y) in enumerate(zip(first, second, strict=True)):
        if x["digest"] == y["digest"]:
            continue
        if x["keys"] != y["keys"]:
            detail = f"keys {_describe_keys(x['keys'])} vs {_describe_keys(y['keys'])}"
        else:
            fx, fy = parse_fingerprint(x["fingerprint"]), parse_fingerprint(y["fingerprint"])
            diff = first_difference(fx, fy) if fx is not None and fy is not None else None
            detail = f"same keys {_describe_keys(x['keys'])}, but {_readable(diff) or 'different contents'}"
        return (
            f"{where}: expected identical batches, observed batch {index} of {len(first)} differs ({detail}). "
            "The processes differ in nothing the data should depend on: their PYTHONHASHSEED (so iteration over "
            "a set, or hash() of a str or bytes), their pid and the time"
        )
    return None


def _compare_other_seed(ctx: CheckContext, dataset: str, nw: int, a: dict, other: dict) -> str | None:
    if _order(a) == _order(other):
        keys = [b["keys"] for b in a["batches"][:2]]
        shown = ", ".join(_describe_keys(k) for k in keys)
        return (
            f"seed has no effect on the order for num_workers={nw}: seeds {ctx.seed} and {ctx.seed + 1} "
            f"delivered the same samples in the same order (first batches {shown}; dataset "
            f"{dataset_path(dataset).name}); expected a different order for another seed"
        )
    return None


def _seed_plan(ctx: CheckContext, b: dict, fallback: str | None) -> tuple[list[tuple[str, int]], list[str]]:
    """Which (dataset, num_workers) the seed claim compares, and notes on what it left out and why.

    Without a reference (generated data, whose shards the suite chose), every dataset and worker count.
    With one: those where Energon itself delivers the reference in another order for the other seed; for
    a worker count where no user dataset does, the fallback dataset if Energon's order depends on the seed
    there."""
    seed, other = str(ctx.seed), str(ctx.seed + 1)
    datasets = [str(d) for d in b["results"][seed] if d != fallback]
    reference = b.get("reference")
    workers = [str(nw) for nw in ctx.profile.determinism_workers]
    if not reference:
        return [(d, int(nw)) for d in datasets for nw in workers], []

    def varies(dataset: str, nw: str) -> bool | None:
        try:
            return reference[seed][dataset][nw] != reference[other][dataset][nw]
        except KeyError:
            return None

    pairs: list[tuple[str, int]] = []
    notes: list[str] = []
    for nw in workers:
        fixed = [d for d in datasets if varies(d, nw) is False]
        pairs += [(d, int(nw)) for d in datasets if varies(d, nw) is not False]
        if not fixed:
            continue
        names = ", ".join(dataset_path(d).name for d in fixed)
        shape = "; ".join(_split_shape(d) for d in fixed)
        why = (
            f"num_workers={nw}: Energon itself delivers {names} in one order for seeds {ctx.seed} and "
            f"{ctx.seed + 1} (the suite's pass-through reference read it under the same loader settings; "
            f"{shape}; Energon's training order shuffles the shard slices each worker reads, and a worker "
            "with a single slice reads it in one order for any seed)"
        )
        if len(fixed) < len(datasets):
            notes.append(why)
        elif fallback is not None and varies(fallback, nw):
            pairs.append((fallback, int(nw)))
            notes.append(
                f"{why}; checked on a dataset derived from your samples instead "
                f"({FALLBACK_SAMPLES} samples in shards of {FALLBACK_SHARD_SIZE})"
            )
        elif fallback is None:
            notes.append(why)
        else:
            notes.append(
                f"{why}; on a dataset derived from your samples Energon's order did not depend on the seed either"
            )
    return pairs, notes


def _split_shape(dataset: str) -> str:
    """``its train split: N samples in M shards`` for a dataset directory (what decides Energon's slices)."""
    from primus_energon.datasets.metadata import read_metadata

    if is_metadataset(dataset):
        return "a metadataset"
    try:
        meta = read_metadata(dataset)
        shards = (meta.split_parts or {}).get("train") or []
        samples = sum((meta.shard_counts or {}).get(shard, 0) for shard in shards)
    except Exception:  # the description is only a help; the reference's verdict stands without it
        return "its train split"
    return f"its train split has {samples} samples in {len(shards)} shard{'s' if len(shards) != 1 else ''}"


def _compare_runs(claim: Any, first: dict, second: dict, ctx: CheckContext, compare: Any) -> None:
    """``compare`` every (dataset, worker count) of two runs; each problem goes to ``claim``."""
    for dataset in first:
        counts: list[int | str] = list(ctx.profile.determinism_workers)
        if PACKED in first[dataset]:
            counts.append(PACKED)
        for nw in counts:
            claim.examined(len(first[dataset][str(nw)]["batches"]))
            problem = compare(ctx, dataset, nw, first[dataset][str(nw)], second[dataset][str(nw)])
            if problem:
                claim.problem(problem)


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    try:
        background = ctx.started("determinism", lambda: prestart(ctx))
    except PropertySkipped as skipped:
        claims.blocked(str(skipped))
        return {}
    datasets = background.info["datasets"]
    runs: dict[str, Any] | None = None
    seconds: dict[str, float] = {}
    with claims.claim("fresh_processes") as claim:
        for label, child in background.children.items():
            finish(
                child, what=f"the determinism child process ({label})", reproduce="", timeout=ctx.timeout_s
            )
        runs = {
            label: json.loads((background.dir / f"{label}.json").read_text(encoding="utf-8"))
            for label in background.children
        }
        seconds = {label: child.seconds for label, child in background.children.items()}
        _compare_runs(
            claim,
            runs["a"]["results"][str(ctx.seed)],
            runs["b"]["results"][str(ctx.seed)],
            ctx,
            _compare_same_seed,
        )
    if runs is None:
        claims.not_applicable(
            "seed", "blocked by determinism/fresh_processes: the child processes did not finish"
        )
        return {}
    fallback = background.info.get("fallback")
    pairs, notes = _seed_plan(ctx, runs["b"], None if fallback is None else str(fallback))
    if not pairs and background.info.get("fallback_problem"):
        claims.inconclusive(
            "seed",
            "Energon's own order does not depend on the seed on your dataset ("
            + "; ".join(notes)
            + "), and the dataset derived from your samples to check it on instead could not be used: "
            + background.info["fallback_problem"],
        )
    elif not pairs:
        claims.not_applicable(
            "seed",
            "Energon's own order does not depend on the seed here, so no target's can: " + "; ".join(notes),
        )
    else:
        with claims.claim("seed") as claim:
            b_seed, b_other = runs["b"]["results"][str(ctx.seed)], runs["b"]["results"][str(ctx.seed + 1)]
            a = runs["a"]["results"][str(ctx.seed)]
            for dataset, nw in pairs:
                first = (a if dataset in a else b_seed)[dataset][str(nw)]
                claim.examined(len(first["batches"]))
                problem = _compare_other_seed(ctx, dataset, nw, first, b_other[dataset][str(nw)])
                if problem:
                    claim.problem(problem)
            for note in notes:
                claim.note(note)
    return {
        "seed_compared": [f"{dataset_path(d).name} num_workers={nw}" for d, nw in pairs],
        "seed_notes": notes,
        "datasets": len(datasets),
        "workers": list(ctx.profile.determinism_workers),
        "packing_buffer_size": background.info.get("packing"),
        "batches": BATCHES,
        "batch_size": BATCH_SIZE,
        "child_seconds": seconds,
    }


# --- the child half: python -m primus_energon.conformance.processes.runner determinism ---------------------------------


def add_child_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, action="append", required=True, help="loader seed (repeatable)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", default="0,1,2", help="comma-separated num_workers values")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument(
        "--reference",
        action="store_true",
        help="also read each dataset with the suite's pass-through reference (the order Energon delivers)",
    )
    parser.add_argument(
        "--fallback",
        help="with --reference and two seeds: a dataset also read for each worker count where the "
        "reference gives every --dataset one order for both seeds",
    )
    parser.add_argument(
        "--packing", type=int, default=None, help="also read one loader that packs with this buffer size"
    )
    parser.add_argument("--packing-batch-size", type=int, default=None, help="packs per batch of that loader")
    parser.add_argument("--out", required=True)


def run_child(target: Target, options: argparse.Namespace) -> None:
    """Write ``{"pid", "hashseed", "results": {seed: {dataset: {num_workers: {"batches": [{"digest", "keys",
    "fingerprint"}], "cook_order": [[key, ...] per process]}}}}}`` to ``--out``; with ``--reference`` also
    ``"reference": {seed: {dataset: {num_workers: [[key, ...] per batch]}}}`` (see ``--fallback``)."""
    workers = [int(w) for w in options.workers.split(",") if w != ""]
    results: dict[str, dict[str, dict[str, Any]]] = {}
    reference: dict[str, dict[str, dict[str, Any]]] = {}
    seeds = list(options.seed)
    sinks = itertools.count()

    def read(tmp: Path, datasets: list[str], nws: list[int]) -> None:
        for seed in seeds:
            for dataset in datasets:
                for num_workers in nws:
                    sink = tmp / f"cooked-{next(sinks)}.jsonl"
                    run = _target_run(target, options, dataset, seed, num_workers, sink)
                    results.setdefault(str(seed), {}).setdefault(str(dataset), {})[str(num_workers)] = run
                    if options.reference:
                        keys = _reference_run(target, options, dataset, seed, num_workers)
                        reference.setdefault(str(seed), {}).setdefault(str(dataset), {})[str(num_workers)] = (
                            keys
                        )

    with tempfile.TemporaryDirectory(prefix="conformance-determinism-") as name:
        tmp = Path(name)
        read(tmp, list(options.dataset), workers)
        if options.packing:  # the packs too: select_samples_to_pack and pack_selected_samples, every process
            target.packing_buffer_size = options.packing
            target.batch_size = options.packing_batch_size
            for seed in seeds:
                for dataset in options.dataset:
                    sink = tmp / f"cooked-{next(sinks)}.jsonl"
                    run = _target_run(target, options, dataset, seed, 0, sink, packing=options.packing)
                    results[str(seed)][str(dataset)][PACKED] = run
        if options.reference and options.fallback and len(seeds) > 1:
            first, second = str(seeds[0]), str(seeds[1])
            fixed = [
                nw
                for nw in workers
                if all(
                    reference[first][str(d)][str(nw)] == reference[second][str(d)][str(nw)]
                    for d in options.dataset
                )
            ]
            if fixed:
                read(tmp, [options.fallback], fixed)
    record: dict[str, Any] = {"pid": os.getpid(), "hashseed": os.environ.get("PYTHONHASHSEED")}
    record["results"] = results
    if options.reference:
        record["reference"] = reference
    Path(options.out).write_text(json.dumps(record), encoding="utf-8")


def _target_run(
    target: Target,
    options: argparse.Namespace,
    dataset: str,
    seed: int,
    num_workers: int,
    sink: Path,
    packing: int | None = None,
) -> dict[str, Any]:
    """The first ``--batches`` batches of the target's train-mode loader: digests, keys, fingerprints,
    and the order its cookers saw."""
    from ..engine.calls import build_loader, closing
    from ..engine.recording import cook_order, instrument, read_records
    from ..oracles.fingerprint import digest, fingerprint

    task_encoder = instrument(target.make_task_encoder(), sink, cooked_only=True)
    loader = build_loader(
        target,
        dataset,
        batch_size=options.batch_size,
        num_workers=num_workers,
        seed=seed,
        mode="train",
        task_encoder=task_encoder,
        packing_buffer_size=packing,
    )
    batches = []
    with closing(loader):
        for batch in loader:
            batches.append(
                {"digest": digest(batch), "keys": batch_keys(batch), "fingerprint": repr(fingerprint(batch))}
            )
            if len(batches) >= options.batches:
                break
    per_process = (len(batches) // max(num_workers, 1)) * options.batch_size
    return {"batches": batches, "cook_order": cook_order(read_records(sink), per_process)}


def _reference_run(
    target: Target, options: argparse.Namespace, dataset: str, seed: int, num_workers: int
) -> list[list[str]]:
    """The keys of the first ``--batches`` batches Energon delivers for the suite's pass-through reference
    (:class:`~primus_energon.conformance.data.workspace.KeyReader`) under the target's loader settings."""
    from ..data.workspace import KeyReader
    from ..engine.calls import build_loader, closing

    loader = build_loader(
        target,
        dataset,
        batch_size=options.batch_size,
        num_workers=num_workers,
        seed=seed,
        mode="train",
        task_encoder=KeyReader(),
    )
    batches: list[list[str]] = []
    with closing(loader):
        for batch in loader:
            batches.append(list(batch))
            if len(batches) >= options.batches:
                break
    return batches
