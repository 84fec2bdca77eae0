"""Validation over object storage: ``validate msc://...`` beside a plain boto3 read of the same objects, and
``torchrun`` validation's scaling from 1 to 4 ranks, in the same run against the same server.

    python -m benchmarks.bench_remote --out reports/benchmarks/remote.json
    python -m benchmarks.bench_remote --samples 32 --ranks 1,2 --repeat 2

The server is `primus_energon.synthetic.LoopbackObjectStore` (moto's S3 server on 127.0.0.1, in this
process), holding one generated dataset (``guide`` shapes: latents [64, 32, 32], prompt_embeds [77, 4096],
pooled [768], float32; about 1.5 MB a sample). Per pass, in this order:

* plain read: every shard object fetched whole with boto3 ``get_object`` and read to the end, one after
  another (the transfer floor of this server; no parsing);
* validate: ``validate_path("msc://...", workers=1)`` in this process: listing, metadata, every shard
  streamed with ranged reads, every member decoded and checked;
* ranks: for each rank count K, ``torchrun --standalone --nproc-per-node K -m primus_energon validate URL
  --workers 1``: MB/s over the validation's own seconds as rank 0 reports them (its rate line: listing
  to report, the ranks' reads included), and over the whole job's wall seconds (interpreter starts
  included). 1 rank is the plain single-process command under torchrun.

Reported: best and median MB/s of each, validate's best over the plain read's best, and each rank count's
best MB/s over 1 rank's. The server runs in this process's Python threads, so on a small machine it is
the bottleneck for every reader alike; the ratios, not the absolute rates, carry over to real storage.
Speed is measured here, never asserted in a test.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .cli import scratch_dir, session_parser
from .jobs import REPO_ROOT
from .report import machine_description, markdown_rows, write_report

__all__ = ["main"]

_SHAPES = {"latents": (64, 32, 32), "prompt_embeds": (77, 4096), "pooled_prompt_embeds": (768,)}


def _plain_read(store: Any, prefix: str) -> int:
    """Every shard object of `prefix` read whole with boto3; the bytes read."""
    s3 = store.client()
    total = 0
    for key in store.keys(prefix + "/"):
        if key.endswith(".tar"):
            body = s3.get_object(Bucket=store.bucket, Key=key)["Body"]
            while chunk := body.read(1 << 20):
                total += len(chunk)
    return total


_RATE_LINE = re.compile(r"\(([\d.]+) MB in ([\d.]+) s, ")


def _rank_job(ranks: int, url: str, report: Path) -> tuple[float, float]:
    """(wall seconds of the torchrun job, seconds of the validation itself as rank 0 reports it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        "-m",
        "primus_energon",
        "validate",
        url,
        "--workers",
        "1",
        "--no-progress",
        "--json",
        str(report),
    ]
    t0 = time.perf_counter()
    done = subprocess.run(
        cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False
    )
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"torchrun with {ranks} ranks failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rate = _RATE_LINE.search(done.stderr)
    if rate is None:
        raise RuntimeError(f"rank 0 printed no rate line:\n{done.stderr[-3000:]}")
    return seconds, float(rate.group(2))


def _stats(rates: list[float]) -> dict[str, float]:
    return {"best_mb_s": max(rates), "median_mb_s": statistics.median(rates)}


def measure(
    samples: int, shard_size: int, ranks: list[int], repeat: int, data_dir: Path | None
) -> dict[str, Any]:
    from primus_energon.datasets import validate_path
    from primus_energon.datasets.validate import shutdown_pools
    from primus_energon.synthetic import LoopbackObjectStore, generate_dataset

    with scratch_dir(data_dir, "bench-remote-") as scratch:
        root = scratch / "ds"
        if not (root / "manifest.json").exists():
            generate_dataset(
                root, num_samples=samples, shard_size=shard_size, shapes=_SHAPES, seed=1, overwrite=True
            )
        size = sum(p.stat().st_size for p in root.glob("*.tar"))
        plain: list[float] = []
        validate: list[float] = []
        by_ranks: dict[int, list[float]] = {k: [] for k in ranks}
        walls: dict[int, list[float]] = {k: [] for k in ranks}
        with LoopbackObjectStore(profile="bench") as store:
            url = store.upload(root, "ds")
            validate_path(url, workers=1)  # warm-up: imports, the storage client
            for _ in range(repeat):
                t0 = time.perf_counter()
                got = _plain_read(store, "ds")
                plain.append(got / (time.perf_counter() - t0) / 1e6)
                t0 = time.perf_counter()
                report = validate_path(url, workers=1)
                validate.append(report.bytes_scanned / (time.perf_counter() - t0) / 1e6)
                if not report.ok or got != size:
                    raise RuntimeError(
                        f"the benchmark dataset did not validate clean ({got} of {size} bytes)"
                    )
                for k in ranks:
                    wall, seconds = _rank_job(k, url, scratch / f"report-{k}.json")
                    by_ranks[k].append(size / seconds / 1e6)
                    walls[k].append(size / wall / 1e6)
        shutdown_pools()
    base = max(by_ranks[ranks[0]]) if ranks else None
    return {
        "dataset": {"samples": samples, "shard_size": shard_size, "bytes": size, "shapes": _SHAPES},
        "repeat": repeat,
        "plain_read": _stats(plain),
        "validate": _stats(validate),
        "validate_over_plain_read": max(validate) / max(plain),
        "ranks": {
            str(k): {
                **_stats(r),
                "over_first": max(r) / base if base else None,
                "wall_best_mb_s": max(walls[k]),
            }
            for k, r in by_ranks.items()
        },
    }


def markdown(result: dict[str, Any]) -> str:
    ds = result["dataset"]
    lines = [
        f"Validation over object storage (loopback S3), {ds['samples']} samples, {ds['bytes'] / 1e6:.0f} MB, "
        f"best of {result['repeat']}",
        "",
        *markdown_rows(
            ("reader", "best MB/s", "median MB/s", "ratio"),
            [
                (
                    "boto3 plain read",
                    f"{result['plain_read']['best_mb_s']:.1f}",
                    f"{result['plain_read']['median_mb_s']:.1f}",
                    "1.00",
                ),
                (
                    "validate msc:// (1 process, 1 worker)",
                    f"{result['validate']['best_mb_s']:.1f}",
                    f"{result['validate']['median_mb_s']:.1f}",
                    f"{result['validate_over_plain_read']:.2f} of plain read",
                ),
                *[
                    (
                        f"torchrun validate, {k} rank{'s' if k != '1' else ''} (rank 0's validation time)",
                        f"{r['best_mb_s']:.1f}",
                        f"{r['median_mb_s']:.1f}",
                        (f"{r['over_first']:.2f} x first" if r["over_first"] else "")
                        + f"; {r['wall_best_mb_s']:.1f} MB/s over the whole job",
                    )
                    for k, r in result["ranks"].items()
                ],
            ],
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = session_parser(
        "python -m benchmarks.bench_remote",
        __doc__,
        output_help="write the JSON here (and a .md table beside it)",
        output_flags=("--out",),
    )
    parser.add_argument("--samples", type=int, default=64, help="samples in the dataset (default 64)")
    parser.add_argument("--shard-size", type=int, default=8, help="samples per shard (default 8)")
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts (default 1,2,4)")
    parser.add_argument("--repeat", type=int, default=3, help="passes (default 3)")
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="keep (and reuse) the generated data here"
    )
    args = parser.parse_args(argv)
    ranks = [int(k) for k in args.ranks.split(",") if k]
    result = measure(args.samples, args.shard_size, ranks, args.repeat, args.data_dir)
    report = {"benchmark": "remote", "machine": machine_description(), **result}
    text = markdown(result)
    if args.json is not None:
        write_report(args.json, report, text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
