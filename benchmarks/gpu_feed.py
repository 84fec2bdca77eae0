"""One GPU feed configuration, measured in the process it runs in: the reference loader feeding a GPU step of
fixed cost, against the pinned-copy ceiling (:func:`run_config`; the session is :mod:`benchmarks.gpu`).

For one payload size and ``num_workers``, and each way of getting batches into pinned memory:

* ``loader``: Energon's loader pins every batch itself (``SavableDataLoader`` always passes
  ``pin_memory=True``; with workers torch's pin thread does it, at nw=0 the main thread);
* ``ring``: the loader's pinning is switched off and the main thread copies each batch into one of
  three preallocated pinned buffers (reused; a slot is refilled only after its copy finished);

it measures, after one warm-up epoch:

1. the loader's own time per batch (host side, nothing on the GPU): ``t_load``;
2. a synthetic GPU step of fixed cost, a loop of bf16 matmuls calibrated to ``factor x t_load`` (the
   job's ``factors``);
3. the fed loop: batch i+1 is fetched and copied to the device with ``non_blocking=True`` on a side
   stream while step i runs (one batch ahead, ``record_stream`` on the main stream), and the host runs at
   most one step ahead of the GPU. CUDA events on the main stream give the gap before each step (the
   time the step waited for data); **stall % = sum of gaps / wall time of the steps**. Events around
   each copy on the side stream give the **host-to-device GB/s**, compared with the **pinned-copy
   ceiling** measured first in the same process: the same tensors' sizes, copied the same way from
   pinned buffers, with nothing else running.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["BATCH_SIZE", "device_description", "pattern_ceiling", "run_config", "skip_reason"]

BATCH_SIZE = 4
GB = 1e9
RING_DEPTH = 3
MATMUL_SIZE = 4096
#: Where batches go, and whether host buffers are pinned (module constants so that a test can redirect them).
DEVICE = "cuda"
PIN = True


def skip_reason() -> str | None:
    """Why the GPU session cannot run here, or None."""
    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a build without CUDA")
        return f"torch.cuda.is_available() is False ({build}); the GPU session needs a CUDA device"
    return None


def device_description() -> dict[str, Any]:
    """The CUDA device the session runs on: name, memory, multiprocessors, CUDA and torch versions, usable CPUs."""
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "memory_gb": round(props.total_memory / 1e9, 1),
        "multiprocessors": props.multi_processor_count,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }


# --- pieces of one configuration -------------------------------------------------------------------------


def _tensors(batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}


def pattern_ceiling(sizes: list[int], repeats: int = 30) -> dict[str, float]:
    """GB/s of copying pinned buffers of ``sizes`` bytes (one batch's tensors) to the device on a side
    stream, back to back, timed with CUDA events: the ceiling for the fed loop's copies."""
    device = torch.device(DEVICE)
    sources = [torch.empty(n, dtype=torch.uint8, pin_memory=PIN).fill_(1) for n in sizes]
    targets = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
    stream = torch.cuda.Stream()
    timings: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    with torch.cuda.stream(stream):
        for rep in range(repeats + 3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for source, target in zip(sources, targets, strict=True):
                target.copy_(source, non_blocking=True)
            end.record(stream)
            if rep >= 3:
                timings.append((start, end))
    stream.synchronize()
    seconds = [s.elapsed_time(e) / 1e3 for s, e in timings]
    return {
        "bytes": sum(sizes),
        "gb_per_s_median": sum(sizes) / statistics.median(seconds) / GB,
        "gb_per_s_best": sum(sizes) / min(seconds) / GB,
    }


class _PinnedRing:
    """``RING_DEPTH`` sets of pinned buffers shaped like one batch; a set is refilled only once the
    device copy that last read it has finished."""

    def __init__(self, template: Mapping[str, torch.Tensor]) -> None:
        self.slots = [
            {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=PIN) for k, v in template.items()}
            for _ in range(RING_DEPTH)
        ]
        self.done: list[torch.cuda.Event | None] = [None] * RING_DEPTH
        self.next = 0

    def fill(self, tensors: Mapping[str, torch.Tensor]) -> tuple[int, dict[str, torch.Tensor]]:
        index = self.next
        self.next = (self.next + 1) % RING_DEPTH
        if self.done[index] is not None:
            self.done[index].synchronize()
        slot = self.slots[index]
        for k, v in tensors.items():
            slot[k].copy_(v)
        return index, slot


class _Feeder:
    """Next batch -> pinned (loader's or ring) -> device on a side stream; host seconds spent fetching."""

    def __init__(self, iterator: Iterator[Any], mode: str) -> None:
        self.iterator = iterator
        self.mode = mode
        self.ring: _PinnedRing | None = None
        self.stream = torch.cuda.Stream()
        self.host_s = 0.0
        self.copies: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] = []
        self.unpinned = 0

    def host_batch(self) -> tuple[int | None, dict[str, torch.Tensor]]:
        """The next batch's tensors in pinned memory (host side only)."""
        tensors = _tensors(next(self.iterator))
        if self.mode == "ring":
            if self.ring is None:
                self.ring = _PinnedRing(tensors)
            return self.ring.fill(tensors)
        self.unpinned += sum(not t.is_pinned() for t in tensors.values())
        return None, tensors

    def fetch(self) -> tuple[dict[str, torch.Tensor], torch.cuda.Event, int]:
        t0 = time.perf_counter()
        slot, tensors = self.host_batch()
        self.host_s += time.perf_counter() - t0
        start, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            start.record(self.stream)
            on_device = {k: v.to(DEVICE, non_blocking=True) for k, v in tensors.items()}
            done.record(self.stream)
        if slot is not None and self.ring is not None:
            self.ring.done[slot] = done
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        self.copies.append((nbytes, start, done))
        samples = next(iter(tensors.values())).shape[0]
        return on_device, done, samples


def _matmul_step() -> tuple[Callable[[int, Mapping[str, torch.Tensor]], None], float]:
    """A GPU step of ``n`` bf16 4096x4096 matmuls plus a reduction over the batch; ms per matmul."""
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=DEVICE, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    acc = torch.zeros((), device=DEVICE)

    def step(n: int, batch: Mapping[str, torch.Tensor]) -> None:
        for _ in range(n):
            torch.mm(a, b, out=c)
        for value in batch.values():
            acc.add_(value.float().mean())

    for _ in range(10):
        torch.mm(a, b, out=c)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        torch.mm(a, b, out=c)
    end.record()
    end.synchronize()
    return step, start.elapsed_time(end) / 50


def _fed_loop(
    feeder: _Feeder, step: Callable[[int, Mapping[str, torch.Tensor]], None], n_mm: int, batches: int
) -> dict[str, Any]:
    """Run ``batches`` steps fed by ``feeder`` one batch ahead; stall %, GB/s, samples/s."""
    main = torch.cuda.current_stream()
    feeder.copies.clear()
    feeder.host_s = 0.0
    starts: list[torch.cuda.Event] = []
    ends: list[torch.cuda.Event] = []
    samples = 0
    wall0 = time.perf_counter()
    pending = feeder.fetch()
    for i in range(batches):
        on_device, ready, n = pending
        samples += n
        main.wait_event(ready)
        for tensor in on_device.values():
            tensor.record_stream(main)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(main)
        step(n_mm, on_device)
        end.record(main)
        starts.append(start)
        ends.append(end)
        del on_device
        if i + 1 < batches:
            pending = feeder.fetch()
        if i >= 1:
            ends[i - 1].synchronize()  # the host stays at most one step ahead of the GPU
    torch.cuda.synchronize()
    wall = time.perf_counter() - wall0
    gaps = [ends[i - 1].elapsed_time(starts[i]) for i in range(1, batches)]
    steps = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    span = starts[0].elapsed_time(ends[-1])
    copy_s = [s.elapsed_time(e) / 1e3 for _, s, e in feeder.copies]
    copy_bytes = [b for b, _, _ in feeder.copies]
    return {
        "batches": batches,
        "samples_per_s": samples / wall,
        "stall_pct": 100 * sum(gaps) / span,
        "max_gap_ms": max(gaps) if gaps else 0.0,
        "step_ms_median": statistics.median(steps),
        "host_fetch_ms_per_batch": 1e3 * feeder.host_s / batches,
        "h2d_gb_per_s_median": statistics.median(b / s for b, s in zip(copy_bytes, copy_s, strict=True)) / GB,
        "h2d_gb_per_s_aggregate": sum(copy_bytes) / sum(copy_s) / GB,
        "bytes_per_batch": statistics.median(copy_bytes),
    }


def run_config(job: Mapping[str, Any]) -> dict[str, Any]:
    """One payload size and worker count: ceiling, then per pin mode the loader time and the fed loops."""
    from primus_energon import EncodedDiffusionTaskEncoder, get_loader

    from .pipelines import quiet_warnings

    quiet_warnings()
    step, mm_ms = _matmul_step()
    batches_per_epoch = math.ceil(job["num_samples"] / BATCH_SIZE)
    batches = max(job["min_batches"], 2 * batches_per_epoch)
    out: dict[str, Any] = {"matmul_ms": mm_ms, "modes": {}}
    for mode in job["modes"]:
        loader = get_loader(
            job["path"],
            EncodedDiffusionTaskEncoder,
            batch_size=BATCH_SIZE,
            num_workers=job["num_workers"],
            seed=0,
        )
        if mode == "ring":
            loader.dataloader.pin_memory = False  # before its first iterator: torch reads it then
        try:
            feeder = _Feeder(iter(loader), mode)
            for _ in range(batches_per_epoch):  # warm-up epoch (workers, page cache, pinned allocator)
                feeder.host_batch()
            if "ceiling" not in out:
                template = _tensors(next(loader))
                sizes = [t.numel() * t.element_size() for t in template.values()]
                out["ceiling"] = pattern_ceiling(sizes)
                out["ceiling_256mb"] = pattern_ceiling([256 << 20], repeats=10)
            t0 = time.perf_counter()
            for _ in range(batches):
                feeder.host_batch()
            t_load_ms = 1e3 * (time.perf_counter() - t0) / batches
            runs = []
            for factor in job["factors"]:
                n_mm = 0 if factor == 0 else max(1, round(factor * t_load_ms / mm_ms))
                result = _fed_loop(feeder, step, n_mm, batches)
                result.update(
                    factor=factor, matmuls=n_mm, step_over_load=result["step_ms_median"] / t_load_ms
                )
                result["h2d_fraction_of_ceiling"] = (
                    result["h2d_gb_per_s_median"] / out["ceiling"]["gb_per_s_median"]
                )
                runs.append(result)
            out["modes"][mode] = {"t_load_ms": t_load_ms, "unpinned_tensors": feeder.unpinned, "runs": runs}
        finally:
            loader.close()
    return out
