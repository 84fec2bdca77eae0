"""Property 5, determinism across fresh processes: two new processes with different ``PYTHONHASHSEED`` and
the same seed deliver identical batches (keys and the bytes of every tensor and field), and another seed
changes the order; for 0, 1 and 2 workers (the profile's ``determinism_workers``).

Two children (``python -m primus_energon.conformance.runner determinism``, :func:`run_child` below) run
concurrently: seed S with
``PYTHONHASHSEED=1``; seed S, then seed S+1, with ``PYTHONHASHSEED=2``. Each builds the target from its
spec and reads the first batches of a train-mode loader for every worker count in turn. Energon's order
depends on ``num_workers``, so batches are compared per worker count, never across.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from primus_energon.storage import dataset_path

from ..claims import ClaimRecorder, Harm, claims_of
from ..context import CheckContext
from ..fingerprint import first_difference
from ..results import PropertySkipped
from ..subprocesses import Background, child_env, child_target_args, finish, runner_command
from ..target import Target
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


def prestart(ctx: CheckContext) -> Background:
    """Start the two children (see the module docstring); each writes ``<label>.json`` into the
    background's directory. ``PropertySkipped`` when the target cannot be rebuilt in a fresh process."""
    base = child_target_args(ctx.target)
    datasets = [ctx.main_dataset(encoding) for encoding in ctx.encodings()]
    common = ["--workers", ",".join(map(str, ctx.profile.determinism_workers)), "--batches", str(BATCHES)]
    common += ["--batch-size", str(BATCH_SIZE)]
    for dataset in datasets:
        common += ["--dataset", str(dataset)]
    background = Background("conformance-determinism-")
    try:
        for label, (seeds, hashseed) in _runs(ctx.seed).items():
            seed_args = [arg for seed in seeds for arg in ("--seed", str(seed))]
            out = background.dir / f"{label}.json"
            command = runner_command("determinism", [*base, *common, *seed_args, "--out", str(out)])
            background.start(label, command, env=child_env(hashseed), show_env=["PYTHONHASHSEED"])
    except BaseException:
        background.close()
        raise
    background.info["datasets"] = datasets
    return background


def _runs(seed: int) -> dict[str, tuple[list[int], int]]:
    """The two children: label -> (the seeds it reads, its PYTHONHASHSEED)."""
    return {"a": ([seed], 1), "b": ([seed, seed + 1], 2)}


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


def _compare_same_seed(ctx: CheckContext, dataset: str, nw: int, a: dict, b: dict) -> str | None:
    first, second = a["batches"], b["batches"]
    where = (
        f"two fresh processes with seed {ctx.seed} (PYTHONHASHSEED=1 and 2), num_workers={nw}, dataset "
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
            f"{where}: expected identical batches, observed batch {index} of {len(first)} differs ({detail})"
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


def _compare_runs(claim: Any, first: dict, second: dict, ctx: CheckContext, compare: Any) -> None:
    """``compare`` every (dataset, worker count) of two runs; each problem goes to ``claim``."""
    for dataset in first:
        for nw in ctx.profile.determinism_workers:
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
    with claims.claim("seed") as claim:
        a, other = runs["a"]["results"][str(ctx.seed)], runs["b"]["results"][str(ctx.seed + 1)]
        _compare_runs(claim, a, other, ctx, _compare_other_seed)
    return {
        "datasets": len(datasets),
        "workers": list(ctx.profile.determinism_workers),
        "batches": BATCHES,
        "batch_size": BATCH_SIZE,
        "child_seconds": seconds,
    }


# --- the child half: python -m primus_energon.conformance.runner determinism ---------------------------------


def add_child_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, action="append", required=True, help="loader seed (repeatable)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", default="0,1,2", help="comma-separated num_workers values")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--out", required=True)


def run_child(target: Target, options: argparse.Namespace) -> None:
    """Write ``{"pid", "hashseed", "results": {seed: {dataset: {num_workers: {"batches": [{"digest", "keys",
    "fingerprint"}], "cook_order": [[key, ...] per process]}}}}}`` to ``--out``."""
    from ..execution import build_loader, closing
    from ..fingerprint import digest, fingerprint
    from ..recording import cook_order, instrument, read_records

    workers = [int(w) for w in options.workers.split(",") if w != ""]
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="conformance-determinism-") as tmp:
        for seed in options.seed:
            per_seed: dict[str, dict[str, Any]] = {}
            for d_index, dataset in enumerate(options.dataset):
                per_dataset: dict[str, Any] = {}
                for num_workers in workers:
                    sink = Path(tmp) / f"cooked-{seed}-{d_index}-{num_workers}.jsonl"
                    task_encoder = instrument(target.make_task_encoder(), sink, cooked_only=True)
                    loader = build_loader(
                        target,
                        dataset,
                        batch_size=options.batch_size,
                        num_workers=num_workers,
                        seed=seed,
                        mode="train",
                        task_encoder=task_encoder,
                    )
                    batches = []
                    with closing(loader):
                        for batch in loader:
                            batches.append(
                                {
                                    "digest": digest(batch),
                                    "keys": batch_keys(batch),
                                    "fingerprint": repr(fingerprint(batch)),
                                }
                            )
                            if len(batches) >= options.batches:
                                break
                    per_process = (len(batches) // max(num_workers, 1)) * options.batch_size
                    per_dataset[str(num_workers)] = {
                        "batches": batches,
                        "cook_order": cook_order(read_records(sink), per_process),
                    }
                per_seed[str(dataset)] = per_dataset
            results[str(seed)] = per_seed
    record = {"pid": os.getpid(), "hashseed": os.environ.get("PYTHONHASHSEED")}
    Path(options.out).write_text(json.dumps({**record, "results": results}), encoding="utf-8")


def parse_fingerprint(text: str | None) -> Any:
    """A fingerprint back from its ``repr`` (as :func:`run_child` writes it), or None."""
    if text is None:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
