"""Throughput of `primus_energon.datasets.validate_dataset` beside a raw read of the same shards, in the same run.

    python benchmarks/bench_validate.py                          # 'guide' preset, workers 1 and 2
    python benchmarks/bench_validate.py --preset flux --samples 64 --workers 1,2,4,8 --min-ratio 0.25

Presets (float32 unless --dtype; the shapes of ``primus_energon.formats.SIZES``): ``guide`` = latents
[64, 32, 32], prompt_embeds [77, 4096], pooled [768] (about 1.5 MB a sample); ``flux`` = bf16 latents
[16, 64, 64], prompt_embeds [512, 4096], pooled [768] (about 4.3 MB a sample); ``small`` = [16, 32, 32],
[77, 256], [768].

Per pass, with the shards in the page cache (a raw read warms them first):

* raw read: one pass of :func:`primus_energon.rawread.read_once`, every shard read in order with
  ``readinto`` one reused buffer (the I/O floor);
* validate: the whole ``validate_dataset(workers=W)`` call (metadata, every member decoded and checked,
  whole-dataset analysis), once per worker count. The forkserver is started before timing (a warm-up call).

Passes alternate raw read / validate, so background load on a shared machine affects both alike. Reported:
best and median MB/s of each, the ratio of the best validate to the best raw read, and the median of each
validate pass over the raw read just before it. Target: validate (1 worker) >= 0.25 x raw read, rising
with workers (as far as the machine has cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from primus_energon.datasets.validate import validate_dataset
from primus_energon.formats import SIZE_DTYPES, SIZES
from primus_energon.rawread import read_buffer, read_once
from primus_energon.synthetic import generate_dataset

PRESETS = {name: (dict(SIZES[name]), SIZE_DTYPES[name]) for name in ("guide", "flux", "small")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="guide")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--samples", type=int, default=128, help="samples (default 128)")
    parser.add_argument("--shard-size", type=int, default=16)
    parser.add_argument("--variable-shapes", action="store_true", help="resolution buckets for the latents")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    parser.add_argument("--repeat", type=int, default=3, help="passes of each (default 3)")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir, removed after)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--min-ratio",
        type=float,
        default=None,
        help="exit 1 if best validate (1 worker) / best raw read is below",
    )
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    shapes, dtype = PRESETS[args.preset]
    dtype = args.dtype or dtype

    scratch = Path(args.dir or tempfile.mkdtemp(prefix="bench-validate-"))
    scratch.mkdir(parents=True, exist_ok=True)
    root = scratch / "ds"
    try:
        t0 = time.perf_counter()
        generate_dataset(
            root,
            num_samples=args.samples,
            shard_size=args.shard_size,
            shapes=shapes,
            dtype=dtype,
            variable_shapes=args.variable_shapes,
            overwrite=True,
        )
        shards = sorted(root.glob("*.tar"))
        total = sum(p.stat().st_size for p in shards)
        print(
            f"dataset: {args.preset} {dtype}, {args.samples} samples in {len(shards)} shards, {total / 1e6:.1f} MB "
            f"(generated in {time.perf_counter() - t0:.1f} s); {len(os.sched_getaffinity(0))} usable CPUs",
            flush=True,
        )
        buffer = read_buffer(shards)
        read_once(shards, buffer)  # page cache
        warm = validate_dataset(root, workers=max(workers))  # imports, forkserver start
        if not warm.ok:
            print(
                "the generated dataset does not validate clean:",
                [p.code for p in warm.problems],
                file=sys.stderr,
            )
            return 1
        raw_times: list[float] = []
        val_times: dict[int, list[float]] = {w: [] for w in workers}
        paired: dict[int, list[float]] = {w: [] for w in workers}
        for _ in range(args.repeat):
            for w in workers:
                t = time.perf_counter()
                read_once(shards, buffer)
                raw_s = time.perf_counter() - t
                raw_times.append(raw_s)
                t = time.perf_counter()
                validate_dataset(root, workers=w)
                val_s = time.perf_counter() - t
                val_times[w].append(val_s)
                paired[w].append(raw_s / val_s)
        best_raw = total / min(raw_times) / 1e6
        print(
            f"raw read      best {best_raw:9.0f} MB/s  median {total / statistics.median(raw_times) / 1e6:9.0f} MB/s"
        )
        results = {
            "preset": args.preset,
            "dtype": dtype,
            "samples": args.samples,
            "bytes": total,
            "cpus": len(os.sched_getaffinity(0)),
            "raw_read_mb_s": {"best": best_raw, "median": total / statistics.median(raw_times) / 1e6},
            "validate": {},
        }
        for w in workers:
            best = total / min(val_times[w]) / 1e6
            med = total / statistics.median(val_times[w]) / 1e6
            ratio = best / best_raw
            print(
                f"validate w={w:<3} best {best:9.0f} MB/s  median {med:9.0f} MB/s  "
                f"best/best raw {ratio:.3f}  median paired ratio {statistics.median(paired[w]):.3f}  "
                f"({args.samples / min(val_times[w]):.0f} samples/s)"
            )
            results["validate"][str(w)] = {
                "best_mb_s": best,
                "median_mb_s": med,
                "ratio_best": ratio,
                "ratio_median_paired": statistics.median(paired[w]),
                "samples_per_s": args.samples / min(val_times[w]),
            }
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        if args.min_ratio is not None and 1 in workers:
            if results["validate"]["1"]["ratio_best"] < args.min_ratio:
                print(f"FAIL: 1-worker ratio below {args.min_ratio}", file=sys.stderr)
                return 1
        return 0
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
