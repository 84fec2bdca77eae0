"""Property 12, throughput (reported; pass/fail only with ``--min-samples-per-s``): on a generated
64-sample dataset of each encoding the target cooks, in one run,

* the bare cook time per sample (the target's matching cooker over the first 16 crude samples, median of 5
  passes),
* the loader's samples/s and MB/s (Energon's savable loader with a fresh TaskEncoder of the target, train
  mode, ``num_workers=0``, batch 8, exactly 2 epochs from ``iter()``; MB are the shards' member bytes
  those 2 epochs read, twice the dataset's): end to end, and in steady state, i.e. after the first batch
  (whose latency, mostly opening shards, is reported on its own). The steady rate is the one compared
  with ``--min-samples-per-s``: a 128-sample run end to end mostly measures start-up, not the target; and
* a raw sequential read of the same shard files (``readinto`` a reused buffer, page cache warm), the
  ceiling no loader reaches.

Nothing here is asserted on timing except the loader rate against ``ctx.min_samples_per_s``.
"""

from __future__ import annotations

import copy
import statistics
import tarfile
import time
from pathlib import Path
from typing import Any

from primus_energon.rawread import time_reads

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..engine.calls import build_loader, closing, matching_cooker, take, target_call, worker_context
from ..engine.context import CheckContext
from ._common import fail

__all__ = ["check", "CLAIMS", "NUM_SAMPLES", "BATCH_SIZE", "EPOCHS"]

CLAIMS = claims_of(
    "throughput",
    (
        "rate",
        "cook time per sample, loader samples/s and MB/s are measured beside a raw read of the same shards; "
        "with --min-samples-per-s the loader reaches that rate",
        Harm.PERFORMANCE,
        "profile the cooker (the bare cook time is reported beside the loader's rate)",
    ),
)

NUM_SAMPLES = 64
SHARD_SIZE = 16
BATCH_SIZE = 8
EPOCHS = 2
COOK_PASSES = 5
#: samples the bare cook time is measured on (the first of the dataset)
COOK_SAMPLES = 16
#: raw read: at least this many passes and this many seconds, whichever takes longer, at most RAW_MAX_PASSES
RAW_MIN_PASSES = 3
RAW_MIN_SECONDS = 0.2
RAW_MAX_PASSES = 50
MB = 1e6


def _shards(path: Path) -> list[Path]:
    return sorted(path.glob("*.tar"))


def _member_bytes(shards: list[Path]) -> int:
    """Payload bytes of every member of the shards (tar headers and padding excluded)."""
    total = 0
    for shard in shards:
        with tarfile.open(shard) as tar:
            total += sum(info.size for info in tar if info.isfile())
    return total


def _raw_read(shards: list[Path]) -> dict[str, float]:
    """Raw read of the shard files (:mod:`primus_energon.rawread`; its first, untimed pass warms the page
    cache): MB/s over the timed passes, their number, and the MB one pass reads."""
    measured = time_reads(
        shards, min_passes=RAW_MIN_PASSES, min_seconds=RAW_MIN_SECONDS, max_passes=RAW_MAX_PASSES
    )
    return {
        "mb_per_s": measured.bytes_per_s / MB,
        "passes": len(measured.seconds),
        "file_mb": measured.bytes_per_pass / MB,
    }


def _cook_time(ctx: CheckContext, crude: list[dict[str, Any]], cookers: list) -> float:
    """Median over passes of the mean seconds per sample of the bare cook call."""
    chosen = [cookers[matching_cooker(cookers, s) or 0] for s in crude]
    per_pass = []
    for _ in range(COOK_PASSES):
        elapsed = 0.0
        for index, (sample, cooker) in enumerate(zip(crude, chosen, strict=True)):
            # Energon hands every cook a dict of its own: a cooker that pops members from its input must
            # not find them gone on the next pass (copied before the clock starts, one at a time, so that
            # large samples are held once or twice, never a pass's worth over).
            fresh = copy.deepcopy(sample)
            with (
                target_call(f"cooking the clean sample {sample.get('__key__')!r}"),
                worker_context(ctx.seed, index),
            ):
                started = time.perf_counter()
                cooked = cooker.cook(fresh)
                elapsed += time.perf_counter() - started
            del fresh, cooked
        per_pass.append(elapsed / len(crude))
    return statistics.median(per_pass)


def _loader_rate(ctx: CheckContext, path: Path) -> dict[str, float]:
    batches = EPOCHS * NUM_SAMPLES // BATCH_SIZE
    with closing(
        build_loader(ctx.target, path, batch_size=BATCH_SIZE, num_workers=0, seed=ctx.seed, mode="train")
    ) as loader:
        started = time.perf_counter()
        iterator = iter(loader)
        take(iterator, 1, what="the loader's first batch")
        first = time.perf_counter() - started
        take(iterator, batches - 1, what="iterating the loader")
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "first_batch_s": first, "samples": batches * BATCH_SIZE}


def _measure(ctx: CheckContext, encoding: str | None) -> dict[str, Any]:
    path = ctx.generated(encoding, "throughput", num_samples=NUM_SAMPLES, shard_size=SHARD_SIZE)
    shards = _shards(path)
    member_bytes = _member_bytes(shards)
    task_encoder = ctx.target.make_task_encoder()
    crude = ctx.crude(path, limit=COOK_SAMPLES, keep=False)  # read for this measure only
    if not crude:
        fail(f"no sample of {path.name} could be read, so nothing was measured: {ctx.unreadable()}")
    cook_s = _cook_time(ctx, crude, list(task_encoder.cookers))
    loader = _loader_rate(ctx, path)
    raw = _raw_read(shards)
    sample_bytes = member_bytes / NUM_SAMPLES
    end_to_end = loader["samples"] / loader["seconds"]
    steady = (loader["samples"] - BATCH_SIZE) / (loader["seconds"] - loader["first_batch_s"])
    return {
        "encoding": encoding,
        "dataset": str(path),
        "samples": NUM_SAMPLES,
        "sample_kb": round(member_bytes / NUM_SAMPLES / 1e3, 3),
        "cook_us_per_sample": round(cook_s * 1e6, 1),
        "loader_samples_per_s": round(steady, 1),
        "loader_mb_per_s": round(steady * sample_bytes / MB, 3),
        "loader_first_batch_s": round(loader["first_batch_s"], 4),
        "loader_end_to_end_samples_per_s": round(end_to_end, 1),
        "loader_end_to_end_mb_per_s": round(EPOCHS * member_bytes / MB / loader["seconds"], 3),
        "loader_seconds": round(loader["seconds"], 4),
        "raw_read_mb_per_s": round(raw["mb_per_s"], 1),
        "raw_read_samples_per_s": round(raw["mb_per_s"] * NUM_SAMPLES / raw["file_mb"], 1),
        "loader_fraction_of_raw": round(steady * sample_bytes / MB / raw["mb_per_s"], 6),
        "cook_fraction_of_loader_time": round(min(1.0, cook_s * steady), 3),
        "setup": f"train, num_workers 0, batch {BATCH_SIZE}, {EPOCHS} epochs of {NUM_SAMPLES} samples from iter()",
    }


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    details: dict[str, Any] = {}
    with claims.claim("rate") as claim:
        measured = []
        for encoding in ctx.encodings():
            measured.append(_measure(ctx, encoding))
            claim.examined(measured[-1]["samples"])
        details["summary"] = "; ".join(
            f"{m['encoding'] or 'data'} ({m['sample_kb']:.1f} kB/sample): cook {m['cook_us_per_sample']:.0f} us/sample, "
            f"loader {m['loader_samples_per_s']:.0f} samples/s = {m['loader_mb_per_s']:.2f} MB/s "
            f"after a first batch of {m['loader_first_batch_s'] * 1e3:.0f} ms ({m['loader_end_to_end_samples_per_s']:.0f} samples/s end to end), raw read {m['raw_read_mb_per_s']:.0f} MB/s"
            for m in measured
        )
        details.update({**measured[0], "measurements": measured})
        if ctx.min_samples_per_s is not None:
            slowest = min(measured, key=lambda m: m["loader_samples_per_s"])
            details["min_samples_per_s"] = ctx.min_samples_per_s
            if slowest["loader_samples_per_s"] < ctx.min_samples_per_s:
                fail(
                    f"loader throughput on {slowest['encoding'] or 'the'} data is {slowest['loader_samples_per_s']:.1f} "
                    f"samples/s (steady state, after the first batch), below --min-samples-per-s {ctx.min_samples_per_s:g} ({slowest['setup']}; "
                    f"{slowest['sample_kb']:.1f} kB/sample). Measured beside it: the bare cook takes "
                    f"{slowest['cook_us_per_sample']:.0f} us/sample, the loader moves {slowest['loader_mb_per_s']:.2f} MB/s "
                    f"and a raw read of the same shards {slowest['raw_read_mb_per_s']:.0f} MB/s"
                )
    return details
