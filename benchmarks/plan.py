"""The CPU run's plan: every measurement job of ``python -m benchmarks.throughput``, in the order they run.

Repetitions are outermost; within one, each payload size gets its ceilings job (raw read, memcpy; the
decode costs in the first repetition) and then every pipeline configuration once, in an order that rotates
from one repetition to the next, so that drifting background load hits every pipeline alike. A job is a
JSON-able dict that :func:`benchmarks.measure.run_job` runs in a fresh process.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["BATCH_SIZE", "SWEEP", "plan_jobs", "settings_label"]

BATCH_SIZE = 4

#: The loader settings ``--sweep`` adds, for the floor and the reference: (settings, worker counts).
SWEEP: tuple[tuple[dict[str, Any], tuple[int, ...]], ...] = (
    ({"torch_threads": 1}, (0,)),
    ({"gc_collect_every_n_steps": 10}, (0, 2)),  # Energon's default (the factory's is 0: off)
    ({"gc_collect_every_n_steps": 100}, (0,)),
    ({"prefetch_factor": 1}, (2,)),
    ({"prefetch_factor": 4}, (2,)),
    ({"watchdog_timeout_seconds": None}, (0,)),
)
_SHORT = {
    "gc_collect_every_n_steps": "gc",
    "prefetch_factor": "pf",
    "torch_threads": "threads",
    "watchdog_timeout_seconds": "watchdog",
}


def settings_label(settings: Mapping[str, Any]) -> str:
    """``"default"`` or e.g. ``"gc=0,pf=4"``."""
    if not settings:
        return "default"
    return ",".join(f"{_SHORT.get(k, k)}={v}" for k, v in sorted(settings.items()))


def plan_jobs(
    args: argparse.Namespace,
    sizes: Sequence[str],
    pipelines: Sequence[str],
    paths: Mapping[str, Path],
    specs: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Every job of the run, in the order they run: repetitions outermost, pipelines rotating within.

    ``args`` carries the run's choices: ``workers``, ``reps``, ``worker_reps``, ``passes``, ``sweep``,
    ``quick``, ``no_decode`` and ``torch_threads``.
    """
    configs: list[tuple[str, int, dict[str, Any], int]] = []  # (pipeline, num_workers, settings, reps)
    from .pipelines import PIPELINES

    for nw in args.workers:
        reps = args.reps if nw == 0 else args.worker_reps
        # the diagnostic pipelines answer "what would fix the reference" and are measured at nw=0 only
        configs += [(p, nw, {}, reps) for p in pipelines if nw == 0 or not PIPELINES[p].diagnostic]
    if args.sweep:
        swept = [p for p in ("floor", "reference") if p in pipelines]
        for settings, workers in SWEEP:
            for nw in workers:
                configs += [(p, nw, dict(settings), args.worker_reps) for p in swept]
    jobs: list[dict[str, Any]] = []
    max_reps = max([args.reps] + [c[3] for c in configs])
    for rep in range(max_reps):
        for size in sizes:
            spec = specs[size]
            common = {"size": size, "path": str(paths[size]), "num_samples": spec.num_samples, "rep": rep}
            if rep < args.reps:
                jobs.append(
                    {
                        **common,
                        "kind": "ceilings",
                        "passes": 5,
                        "min_seconds": 0.3 if args.quick else 0.5,
                        "decode": rep == 0 and not args.no_decode,
                    }
                )
            todo = [c for c in configs if rep < c[3]]
            shift = rep % len(todo) if todo else 0
            for pipeline, nw, settings, _ in todo[shift:] + todo[:shift]:
                jobs.append(
                    {
                        **common,
                        "kind": "pipeline",
                        "pipeline": pipeline,
                        "num_workers": nw,
                        "settings": settings,
                        "batch_size": BATCH_SIZE,
                        "warmup_epochs": 1,
                        "epochs_per_pass": spec.epochs_per_pass,
                        "passes": args.passes,
                        "torch_threads": args.torch_threads,
                    }
                )
    return jobs
