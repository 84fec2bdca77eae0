"""CPU throughput of the reference data path against its ceilings and the alternatives, in one run.

    python -m benchmarks.throughput --json results.json            # full run (about 9 minutes on 2 cores)
    python -m benchmarks.throughput --json results.json --quick    # fewer samples, one repetition, nw=0
    python -m benchmarks.throughput --json r.json --sweep          # also sweep the loader settings

How it measures (steady state):

* every pipeline of :mod:`benchmarks.pipelines` reads the same generated shards (page cache warm);
* each measurement runs in a fresh process of its own (``--job``): it builds the loader, takes one
  epoch to warm up, then times ``--passes`` passes of ``epochs_per_pass`` epochs each (2) and reports
  the samples/s of each pass;
* measurements are interleaved: repetition after repetition, every pipeline once per repetition, in an
  order that rotates, so that drifting background load hits every pipeline alike;
* a pipeline's figure is the median over all its passes; the ratios are ratios of those medians (the
  median of the per-repetition ratios is reported beside them);
* the ceilings (raw sequential read, memcpy of the same bytes) are measured in the same run, in
  processes of their own, interleaved with the pipelines; the decode cost per member per format once;
* on a shared machine (Linux), a guard waits for a quiet machine before each measurement, measures the
  CPU other processes used while it ran (machine busy time from ``/proc/stat`` minus the measurement's
  own), and repeats a measurement that others disturbed by more than ``--max-foreign`` cores (0.5 by
  default; the JSON records, per measurement, that load and the number of tries).

Modules: :mod:`benchmarks.plan` (the jobs, in order), :mod:`benchmarks.measure` (one job, in its fresh
process), :mod:`benchmarks.guard` (the load guard), :mod:`benchmarks.analysis` (medians, ratios, targets),
:mod:`benchmarks.tables` (the markdown), :mod:`benchmarks.report` (the files); this module runs the session.

Writes the JSON (``--json``), a markdown table next to it (``.md``) and a plot (``.png``, with
matplotlib); prints the table. Exit status 1 if a measurement failed (the JSON is written anyway), and,
with ``--check-targets``, if a target is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import cli
from .analysis import summarize
from .guard import Guard, run_guarded
from .jobs import spawn_job
from .measure import run_job
from .plan import BATCH_SIZE, plan_jobs, settings_label
from .report import machine_description, missed_targets, write_report
from .tables import cpu_markdown

__all__ = ["main"]


def _print_progress(i: int, n: int, job: Mapping[str, Any], result: Mapping[str, Any]) -> None:
    what = job.get("pipeline", job["kind"])
    extra = f" nw={job['num_workers']} {settings_label(job['settings'])}" if job["kind"] == "pipeline" else ""
    if "error" in result:
        status = "ERROR " + result["error"].splitlines()[-1][:160]
    elif "rates" in result:
        status = f"{statistics.median(result['rates']):10.1f} samples/s"
    else:
        status = ", ".join(
            f"{k} {statistics.median(result[k]['gb_per_s']):.1f} GB/s" for k in ("raw_read", "memcpy")
        )
    print(
        f"[{i + 1:3d}/{n}] rep {job['rep']} {job['size']:<5} {what:<20}{extra:<12} {status} "
        f"(load {result.get('load_avg_1min', float('nan')):.2f}, others {result.get('foreign_cores', float('nan')):.2f} "
        f"cores, try {result.get('attempts', 1)}{', DISTURBED' if result.get('contaminated') else ''})",
        file=sys.stderr,
        flush=True,
    )


def _parser() -> argparse.ArgumentParser:
    parser = cli.session_parser(
        "python -m benchmarks.throughput",
        __doc__,
        output_help="write the results here (plus .md and .png beside it)",
    )
    cli.add_fresh_process_options(parser, quick_help="fewer samples, one repetition, nw=0 (about 1 minute)")
    parser.add_argument("--sizes", default=None, help="payload sizes, comma-separated (default small,flux)")
    parser.add_argument("--pipelines", default=None, help="pipelines, comma-separated (default: all)")
    parser.add_argument("--workers", default=None, help="num_workers values (default 0,1,2; --quick: 0)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions at nw=0 (default 4; --quick: 1)")
    parser.add_argument("--worker-reps", type=int, default=None, help="repetitions at nw>0 (default 2)")
    parser.add_argument("--passes", type=int, default=None, help="timed passes per process (default 3)")
    parser.add_argument(
        "--sweep", action="store_true", help="also sweep loader settings for floor and reference"
    )
    parser.add_argument("--no-decode", action="store_true", help="skip the per-member decode timings")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="torch.set_num_threads in every pipeline process"
    )
    cli.add_guard_options(parser, default_note="default 0.5, --quick: off")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per measurement process")
    return parser


def _measure_all(
    jobs: Sequence[Mapping[str, Any]], timeout: float, guard: Guard | None
) -> list[dict[str, Any]]:
    """Every job in a fresh process, in order, under the load guard; progress on stderr."""
    results = []
    for i, job in enumerate(jobs):
        results.append(run_guarded(lambda job=job: spawn_job("benchmarks.throughput", job, timeout), guard))
        _print_progress(i, len(jobs), job, results[-1])
    return results


def _prepare(data_dir: Path, sizes: Sequence[str], specs: Mapping[str, Any]) -> tuple[dict, dict]:
    """Generate (or reuse) each size's dataset and read it into the page cache: paths, shard bytes per sample."""
    from .pipelines import make_dataset, shard_paths

    paths, bytes_per_sample = {}, {}
    for size in sizes:
        t0 = time.perf_counter()
        paths[size] = make_dataset(data_dir, specs[size])
        shards = shard_paths(paths[size])
        total = 0
        for shard in shards:  # into the page cache
            total += len(shard.read_bytes())
        bytes_per_sample[size] = total / specs[size].num_samples
        print(
            f"dataset {size}: {specs[size].num_samples} samples, {len(shards)} shards, {total / 1e6:.0f} MB "
            f"({time.perf_counter() - t0:.1f} s)",
            file=sys.stderr,
        )
    return paths, bytes_per_sample


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if cli.run_job_mode(args, run_job):
        return 0
    out = cli.require_output(parser, args)

    from .pipelines import PAYLOADS, PIPELINES, QUICK_PAYLOADS

    specs = QUICK_PAYLOADS if args.quick else PAYLOADS
    sizes = (args.sizes or "small,flux").split(",")
    pipelines = list(PIPELINES) if args.pipelines in (None, "all") else args.pipelines.split(",")
    unknown = [s for s in sizes if s not in specs] + [p for p in pipelines if p not in PIPELINES]
    if unknown:
        parser.error(f"unknown size or pipeline: {', '.join(unknown)}")
    args.workers = [int(w) for w in (args.workers or ("0" if args.quick else "0,1,2")).split(",")]
    args.reps = args.reps or (1 if args.quick else 4)
    args.worker_reps = args.worker_reps or (1 if args.quick else 2)
    args.passes = args.passes or (2 if args.quick else 3)
    timeout = args.timeout or (180.0 if args.quick else 600.0)
    guard = cli.guard_from_args(args, default_max_foreign=None if args.quick else 0.5)

    started = time.time()
    load_start = os.getloadavg()
    with cli.scratch_dir(args.data_dir, "bench-throughput-") as data_dir:
        paths, bytes_per_sample = _prepare(data_dir, sizes, specs)
        jobs = plan_jobs(args, sizes, pipelines, paths, specs)
        results = _measure_all(jobs, timeout, guard)

    summary = summarize(jobs, results, bytes_per_sample)
    report = {
        "benchmark": "primus-energon CPU throughput",
        "quick": args.quick,
        "batch_size": BATCH_SIZE,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_s": time.time() - started,
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "machine": machine_description(),
        "payloads": {s: {**asdict(specs[s]), "shard_bytes_per_sample": bytes_per_sample[s]} for s in sizes},
        "pipelines": {p: PIPELINES[p].description for p in pipelines},
        "method": {
            "reps_nw0": args.reps,
            "reps_workers": args.worker_reps,
            "passes_per_process": args.passes,
            "warmup_epochs": 1,
            "workers": args.workers,
            "sweep": args.sweep,
            "torch_threads": args.torch_threads or "torch default (machine description: torch_threads)",
            "max_foreign_cores": args.max_foreign,
            "retries": args.retries,
        },
        **summary,
        "raw": [{"job": job, "result": result} for job, result in zip(jobs, results, strict=True)],
    }
    write_report(out, report, cpu_markdown(summary, specs))
    print(
        f"wall {report['wall_s']:.0f} s; load average {load_start[0]:.2f} at start, {report['load_avg_end'][0]:.2f} "
        f"at end; JSON {out}",
    )
    if not args.no_plot:
        try:
            from .plot import plot_results

            plot_results(report, out.with_suffix(".png"))
        except ImportError as error:
            print(f"no plot ({error}); pip install matplotlib", file=sys.stderr)
    for error in summary["errors"]:
        print(
            f"FAILED {error['job'].get('pipeline', error['job']['kind'])}: {error['error']}", file=sys.stderr
        )
    missed = bool(missed_targets(summary["targets"]))
    return cli.exit_status(failed=bool(summary["errors"]), missed=missed, check_targets=args.check_targets)


if __name__ == "__main__":
    sys.exit(main())
