"""One CPU measurement, in the fresh process it was started in: a pipeline's steady-state samples/s, or the
ceilings of one dataset.

:func:`run_job` takes a job of :mod:`benchmarks.plan` and returns its result (what
``python -m benchmarks.throughput --job JSON`` prints for the parent):

* ``kind == "pipeline"``: the loader is built, one epoch (``warmup_epochs``) warms it up, then
  ``passes`` passes of ``epochs_per_pass`` epochs each are timed: samples/s per pass (``rates``), the
  build and first-batch seconds, per-batch latency percentiles (ms) and the first batch's tensors;
* ``kind == "ceilings"``: raw read and memcpy (``rates`` in samples/s and ``gb_per_s`` per pass), plus the
  decode cost per member per format when ``decode``; numpy only unless decoding, so the process starts
  fast.

Every result carries ``load_avg_1min`` at its start.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["run_job"]

GB = 1e9


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
    """Raw read, then memcpy, plus the decode costs when ``job["decode"]``; numpy only
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
