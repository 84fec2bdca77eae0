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

Writes the JSON (``--json``), a markdown table next to it (``.md``) and a plot (``.png``, with
matplotlib); prints the table. Exit status 1 if a measurement failed (the JSON is written anyway), and,
with ``--check-targets``, if a target is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

__all__ = ["main", "run_job", "summarize", "TARGETS", "markdown_table"]

from .jobs import REPO_ROOT, emit_result, spawn_job

BATCH_SIZE = 4
GB = 1e9

#: The throughput targets: (name, payload size, numerator, denominator, minimum ratio). Measured at nw=0.
TARGETS: tuple[tuple[str, str, str, str, float], ...] = (
    ("reference >= 0.85 x floor (small)", "small", "reference", "floor", 0.85),
    ("reference >= 0.85 x floor (FLUX)", "flux", "reference", "floor", 0.85),
    ("reference >= 1.2 x guide (small)", "small", "reference", "guide", 1.2),
    ("reference >= 1.3 x guide (FLUX)", "flux", "reference", "guide", 1.3),
    ("reference > webdataset (FLUX)", "flux", "reference", "webdataset", 1.0),
)

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


# --- one measurement, in its own process -------------------------------------------------------------------


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _describe_batch(batch: Any) -> dict[str, Any]:
    import torch

    items = batch.items() if isinstance(batch, dict) else enumerate(batch)
    return {
        str(k): [list(v.shape), str(v.dtype).removeprefix("torch.")]
        for k, v in items
        if isinstance(v, torch.Tensor)
    }


def _run_pipeline(job: Mapping[str, Any]) -> dict[str, Any]:
    from .pipelines import PIPELINES, batch_size_of, quiet_warnings

    quiet_warnings()
    settings = dict(job["settings"])
    threads = settings.pop("torch_threads", None) or job.get("torch_threads")
    if threads:
        import torch

        torch.set_num_threads(threads)
    pipeline = PIPELINES[job["pipeline"]]
    batches_per_epoch = math.ceil(job["num_samples"] / job["batch_size"])
    started = time.perf_counter()
    iterator, close = pipeline.build(Path(job["path"]), job["num_workers"], job["batch_size"], settings)
    built = time.perf_counter()
    try:
        first = next(iterator)
        first_batch_s = time.perf_counter() - built
        described = _describe_batch(first)
        del first
        for _ in range(max(0, batches_per_epoch * job["warmup_epochs"] - 1)):
            next(iterator)
        rates: list[float] = []
        batch_ms: list[float] = []
        per_pass = batches_per_epoch * job["epochs_per_pass"]
        for _ in range(job["passes"]):
            samples = 0
            t0 = last = time.perf_counter()
            for _ in range(per_pass):
                samples += batch_size_of(next(iterator))
                now = time.perf_counter()
                batch_ms.append((now - last) * 1e3)
                last = now
            rates.append(samples / (last - t0))
    finally:
        close()
    return {
        "rates": rates,
        "build_s": built - started,
        "first_batch_s": first_batch_s,
        "batch_ms": {
            "p50": statistics.median(batch_ms),
            "p90": _percentile(batch_ms, 0.9),
            "p99": _percentile(batch_ms, 0.99),
            "max": max(batch_ms),
        },
        "batch": described,
    }


def _run_ceilings(job: Mapping[str, Any]) -> dict[str, Any]:
    """Raw read and memcpy (alternating passes), plus the decode costs when ``job["decode"]``; numpy only
    unless decoding, so that the process starts fast."""
    from . import ceilings

    shards = ceilings.shard_paths(Path(job["path"]))
    result: dict[str, Any] = {}
    for kind, measure in (("raw_read", ceilings.raw_read), ("memcpy", ceilings.memcpy)):
        measured = measure(shards, passes=job["passes"], min_seconds=job["min_seconds"])
        seconds = measured["seconds"]
        result[kind] = {
            "rates": [job["num_samples"] / s for s in seconds],
            "gb_per_s": [measured["bytes_per_pass"] / s / GB for s in seconds],
        }
    if job.get("decode"):
        result["decode_us"] = ceilings.decode_costs(shards[0])
    return result


def run_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """Run one measurement described by ``job`` in this process and return its result (see ``--job``)."""
    load_before = os.getloadavg()[0]
    if job["kind"] == "pipeline":
        result = _run_pipeline(job)
    elif job["kind"] == "ceilings":
        result = _run_ceilings(job)
    else:
        raise ValueError(f"unknown job kind {job['kind']!r}")
    result["load_avg_1min"] = load_before
    return result


def _spawn(job: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """Run ``job`` in a fresh interpreter; its result, or ``{"error": ...}``."""
    return spawn_job("benchmarks.throughput", job, timeout)


# --- other people's load ------------------------------------------------------------------------------


def _machine_busy_s() -> float | None:
    """CPU-seconds the whole machine has been busy since boot (``/proc/stat``), or None where unavailable."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _wait_for_quiet(max_foreign: float, max_wait: float) -> float:
    """Poll half-second windows (nothing of this harness runs meanwhile) until the machine's busy CPU is under
    ``max_foreign`` cores or ``max_wait`` seconds have passed; returns the seconds waited."""
    waited = 0.0
    while waited < max_wait:
        before = _machine_busy_s()
        if before is None:
            return waited
        time.sleep(0.5)
        waited += 0.5
        if _machine_busy_s() - before <= 0.5 * max_foreign:
            return waited - 0.5
    return waited


def _measure(job: Mapping[str, Any], timeout: float, guard: Mapping[str, float] | None) -> dict[str, Any]:
    """Run ``job`` in a fresh process; with ``guard``, first wait for a quiet machine, measure the CPU that
    other processes used while it ran (machine busy CPU minus this job's own, in cores), and run it again
    (up to ``guard["retries"]`` times) when that exceeds ``guard["max_foreign"]``."""
    attempts = 1 + int(guard["retries"]) if guard else 1
    waited = 0.0
    result: dict[str, Any] = {}
    for attempt in range(1, attempts + 1):
        if guard:
            waited += _wait_for_quiet(guard["max_foreign"], guard["max_wait"])
        busy, own, started = _machine_busy_s(), _children_cpu_s(), time.perf_counter()
        result = _spawn(job, timeout)
        elapsed = time.perf_counter() - started
        if busy is not None:
            foreign = (_machine_busy_s() - busy - (_children_cpu_s() - own)) / elapsed
            result["foreign_cores"] = max(0.0, foreign)
        result.update(attempts=attempt, waited_s=waited)
        if not guard or "error" in result or result.get("foreign_cores", 0.0) <= guard["max_foreign"]:
            return result
    result["contaminated"] = True
    return result


# --- the run -------------------------------------------------------------------------------------------


def machine_description() -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, memory, versions, load."""
    from importlib.metadata import version

    import numpy
    import torch
    import webdataset

    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    memory = (
        next(
            (
                line.split()[1]
                for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")
            ),
            "0",
        )
        if Path("/proc/meminfo").exists()
        else "0"
    )
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {
        "cpu": cpu,
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "memory_gb": round(int(memory) / 1e6, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "megatron_energon": version("megatron-energon"),
        "webdataset": getattr(webdataset, "__version__", version("webdataset")),
        "numpy": numpy.__version__,
        "git_commit": commit,
    }


def _plan(
    args: argparse.Namespace,
    sizes: Sequence[str],
    pipelines: Sequence[str],
    paths: Mapping[str, Path],
    specs: Any,
) -> list[dict[str, Any]]:
    """Every job of the run, in the order they run: repetitions outermost, pipelines rotating within."""
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


def _median(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def _add(
    groups: dict[tuple[str, str, int, str], dict[str, Any]],
    job: Mapping[str, Any],
    name: str,
    result: Mapping[str, Any],
    load: float,
) -> None:
    """Add one process's passes of ``name`` to its group (size, name, workers, settings)."""
    kind = "pipeline" if job["kind"] == "pipeline" else "ceiling"
    key = (job["size"], name, job.get("num_workers", 0), settings_label(job.get("settings", {})))
    group = groups.setdefault(
        key,
        {
            "size": key[0],
            "pipeline": name,
            "kind": kind,
            "num_workers": key[2],
            "settings": job.get("settings", {}),
            "label": key[3],
            "passes": [],
            "rep_medians": {},
            "first_batch_s": [],
            "build_s": [],
            "batch_ms": [],
            "load_avg_1min": [],
        },
    )
    if result.get("contaminated"):  # kept apart: used only if the group has no undisturbed measurement
        group.setdefault("disturbed_passes", []).extend(result["rates"])
        group.setdefault("disturbed_rep_medians", {})[job["rep"]] = statistics.median(result["rates"])
    else:
        group["passes"] += result["rates"]
        group["rep_medians"][job["rep"]] = statistics.median(result["rates"])
    group["load_avg_1min"].append(load)
    group.setdefault("foreign_cores", []).append(result.get("foreign_cores"))
    group.setdefault("attempts", []).append(result.get("attempts", 1))
    if "gb_per_s" in result:
        group.setdefault("measured_gb_per_s", []).extend(result["gb_per_s"])
    for k in ("first_batch_s", "build_s", "batch_ms"):
        if k in result:
            group[k].append(result[k])
    if "batch" in result:
        group["batch"] = result["batch"]


def summarize(
    jobs: Sequence[Mapping[str, Any]],
    results: Sequence[Mapping[str, Any]],
    bytes_per_sample: Mapping[str, float],
) -> dict[str, Any]:
    """Medians per (size, pipeline, workers, settings), ceilings, named ratios and target verdicts."""
    groups: dict[tuple[str, str, int, str], dict[str, Any]] = {}
    decode: dict[str, Any] = {}
    errors: list[dict[str, Any]] = []
    for job, result in zip(jobs, results, strict=True):
        if "error" in result:
            errors.append({"job": job, "error": result["error"]})
            continue
        if job["kind"] == "ceilings":
            if "decode_us" in result:
                decode[job["size"]] = result["decode_us"]
            for kind in ("raw_read", "memcpy"):
                extra = {k: result[k] for k in ("foreign_cores", "attempts", "contaminated") if k in result}
                _add(groups, job, kind, {**result[kind], **extra}, result["load_avg_1min"])
            continue
        _add(groups, job, job["pipeline"], result, result["load_avg_1min"])
    rows = []
    for group in groups.values():
        if not group["passes"]:  # every measurement of it was disturbed: report them, flagged
            group["passes"], group["rep_medians"] = group["disturbed_passes"], group["disturbed_rep_medians"]
            group["disturbed_only"] = True
        rate = statistics.median(group["passes"])
        row = {
            **group,
            "samples_per_s": rate,
            "gb_per_s": rate * bytes_per_sample[group["size"]] / GB,
            "min_samples_per_s": min(group["passes"]),
            "max_samples_per_s": max(group["passes"]),
            "first_batch_s": _median(group["first_batch_s"]),
            "build_s": _median(group["build_s"]),
            "batch_ms": {k: _median(b[k] for b in group["batch_ms"]) for k in ("p50", "p90", "p99", "max")}
            if group["batch_ms"]
            else None,
        }
        rows.append(row)
    index = {(r["size"], r["pipeline"], r["num_workers"], r["label"]): r for r in rows}

    def ratio(size: str, a: str, b: str, nw: int, label_a: str = "default") -> dict[str, Any] | None:
        ra = index.get((size, a, nw if a not in ("raw_read", "memcpy") else 0, label_a))
        rb = index.get((size, b, nw if b not in ("raw_read", "memcpy") else 0, "default"))
        if ra is None or rb is None:
            return None
        paired = [
            ra["rep_medians"][rep] / rb["rep_medians"][rep]
            for rep in ra["rep_medians"]
            if rep in rb["rep_medians"]
        ]
        return {
            "ratio": ra["samples_per_s"] / rb["samples_per_s"],
            "paired_median": statistics.median(paired) if paired else None,
            "numerator_samples_per_s": ra["samples_per_s"],
            "denominator_samples_per_s": rb["samples_per_s"],
        }

    ratios: dict[str, dict[str, dict[str, Any]]] = {}
    pairs = [
        ("reference", "raw_read"),
        ("reference", "memcpy"),
        ("reference", "floor"),
        ("reference", "guide"),
        ("reference", "webdataset"),
        ("reference", "tarfile"),
        ("floor", "raw_read"),
        ("reference_copying", "floor"),
        ("reference_uncached", "floor"),
        ("reference", "reference_copying"),
        ("reference", "reference_uncached"),
    ]
    for size, nw in sorted({(r["size"], r["num_workers"]) for r in rows if r["kind"] == "pipeline"}):
        for a, b in pairs:
            found = ratio(size, a, b, nw)
            if found is not None:
                ratios.setdefault(size, {})[f"nw={nw}: {a}/{b}"] = found
        for r in rows:  # settings sweeps: against the same pipeline with default settings
            if r["size"] == size and r["num_workers"] == nw and r["label"] != "default":
                found = ratio(size, r["pipeline"], r["pipeline"], nw, label_a=r["label"])
                if found is not None:
                    ratios[size][f"nw={nw}: {r['pipeline']}[{r['label']}]/{r['pipeline']}[default]"] = found
    targets = []
    for name, size, a, b, minimum in TARGETS:
        found = ratios.get(size, {}).get(f"nw=0: {a}/{b}")
        value = None if found is None else found["ratio"]
        targets.append(
            {
                "target": name,
                "size": size,
                "ratio": value,
                "paired_median": None if found is None else found["paired_median"],
                "minimum": minimum,
                "met": None if value is None else (value > minimum if minimum == 1.0 else value >= minimum),
            }
        )
    return {"rows": rows, "ratios": ratios, "targets": targets, "decode_us": decode, "errors": errors}


# --- output --------------------------------------------------------------------------------------------


def _fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def markdown_table(summary: Mapping[str, Any], specs: Mapping[str, Any]) -> str:
    """The results as markdown: per payload size, samples/s per pipeline and worker count, ratios, targets."""
    rows = summary["rows"]
    out: list[str] = []
    for size in [s for s in specs if any(r["size"] == s for r in rows)]:
        spec = specs[size]
        sized = [r for r in rows if r["size"] == size]
        workers = sorted({r["num_workers"] for r in sized if r["kind"] == "pipeline"})
        floor = {
            r["num_workers"]: r["samples_per_s"]
            for r in sized
            if r["pipeline"] == "floor" and r["label"] == "default"
        }
        out.append(f"#### {spec.label} ({spec.num_samples} samples, batch {BATCH_SIZE})\n")
        head = (
            "| pipeline | settings | "
            + " | ".join(f"nw={nw} samples/s (GB/s, x floor)" for nw in workers)
            + " |"
        )
        out += [head, "|---|---|" + "---|" * len(workers)]
        order = ["raw_read", "memcpy"] + [r["pipeline"] for r in sized if r["kind"] == "pipeline"]
        seen: set[tuple[str, str]] = set()
        for name in order:
            for label in sorted(
                {r["label"] for r in sized if r["pipeline"] == name}, key=lambda x: x != "default"
            ):
                if (name, label) in seen:
                    continue
                seen.add((name, label))
                cells = []
                for nw in workers:
                    r = next(
                        (
                            r
                            for r in sized
                            if r["pipeline"] == name
                            and r["label"] == label
                            and (r["num_workers"] == nw if r["kind"] == "pipeline" else nw == workers[0])
                        ),
                        None,
                    )
                    if r is None:
                        cells.append("")
                        continue
                    versus = f", {r['samples_per_s'] / floor[nw]:.3f}" if floor.get(nw) else ""
                    flag = " (disturbed)" if r.get("disturbed_only") else ""
                    cells.append(f"{_fmt_rate(r['samples_per_s'])} ({r['gb_per_s']:.2f}{versus}){flag}")
                out.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
        out.append("")
    if summary["targets"]:
        out += ["#### Targets (nw=0, ratio of medians; median of per-repetition ratios in brackets)\n"]
        out += ["| target | ratio | met |", "|---|---|---|"]
        for t in summary["targets"]:
            value = "-" if t["ratio"] is None else f"{t['ratio']:.3f} ({t['paired_median']:.3f})"
            met = "-" if t["met"] is None else ("yes" if t["met"] else "**no**")
            out.append(f"| {t['target']} | {value} | {met} |")
        out.append("")
    if summary["decode_us"]:
        out += ["#### Decode time per member (µs, best of 5)\n"]
        for size, members in summary["decode_us"].items():
            formats = [k for k in next(iter(members.values())) if k != "bytes"]
            out += [f"{specs[size].label}\n", "| member | bytes | " + " | ".join(formats) + " |"]
            out.append("|---|---|" + "---|" * len(formats))
            for member, row in members.items():
                out.append(
                    f"| {member} | {row['bytes']:,.0f} | "
                    + " | ".join(f"{row[f]:.1f}" for f in formats)
                    + " |"
                )
            out.append("")
    return "\n".join(out)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", type=Path, help="write the results here (plus .md and .png beside it)")
    parser.add_argument(
        "--quick", action="store_true", help="fewer samples, one repetition, nw=0 (about 1 minute)"
    )
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
    parser.add_argument("--data-dir", type=Path, default=None, help="keep (and reuse) generated data here")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    parser.add_argument("--check-targets", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="torch.set_num_threads in every pipeline process"
    )
    parser.add_argument(
        "--max-foreign",
        type=float,
        default=None,
        help="cores other processes may use during a measurement before it is retried (default 0.5, "
        "--quick: off; a negative value turns the guard off)",
    )
    parser.add_argument(
        "--retries", type=int, default=2, help="retries of a disturbed measurement (default 2)"
    )
    parser.add_argument(
        "--max-wait", type=float, default=120.0, help="seconds to wait for a quiet machine before each try"
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds per measurement process")
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.job:
        result = run_job(json.loads(args.job))
        emit_result(result)
        return 0
    if args.json is None:
        parser.error("--json FILE is required")

    from .pipelines import PAYLOADS, PIPELINES, QUICK_PAYLOADS, make_dataset, shard_paths

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
    if args.max_foreign is None:
        args.max_foreign = None if args.quick else 0.5
    elif args.max_foreign < 0:
        args.max_foreign = None

    import shutil
    import tempfile

    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    load_start = os.getloadavg()
    try:
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
        jobs = _plan(args, sizes, pipelines, paths, specs)
        results = []
        guard = (
            None
            if args.max_foreign is None
            else {"max_foreign": args.max_foreign, "retries": args.retries, "max_wait": args.max_wait}
        )
        for i, job in enumerate(jobs):
            results.append(_measure(job, timeout, guard))
            _print_progress(i, len(jobs), job, results[-1])
    finally:
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)

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
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, default=str))
    table = markdown_table(summary, specs)
    args.json.with_suffix(".md").write_text(table + "\n")
    print(table)
    print(
        f"wall {report['wall_s']:.0f} s; load average {load_start[0]:.2f} at start, {report['load_avg_end'][0]:.2f} "
        f"at end; JSON {args.json}",
    )
    if not args.no_plot:
        try:
            from .plot import plot_results

            plot_results(report, args.json.with_suffix(".png"))
        except ImportError as error:
            print(f"no plot ({error}); pip install matplotlib", file=sys.stderr)
    for error in summary["errors"]:
        print(
            f"FAILED {error['job'].get('pipeline', error['job']['kind'])}: {error['error']}", file=sys.stderr
        )
    if summary["errors"]:
        return 1
    if args.check_targets and any(t["met"] is False for t in summary["targets"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
