"""Generation throughput of `primus_energon.synthetic.generate_dataset` beside a plain write of the same bytes, in the same run.

    python benchmarks/bench_generate.py                       # FLUX-sized preencoded, bf16, 96 samples
    python benchmarks/bench_generate.py --samples 200 --repeat 5 --min-ratio 0.5

FLUX-sized preencoded samples: bf16 latents [16, 64, 64], prompt_embeds [512, 4096], pooled_prompt_embeds [768]
(about 4.3 MB a sample). Per pass, in a fresh directory after `os.sync()`:

* generate: the whole `generate_dataset` call (payloads, torch.save, tar, sha256 digests, Energon's
  preparation, faults, manifest), single process unless --workers;
* plain write: the same number of bytes, as files of the same sizes, one `write` each from a ready buffer.

Each is reported twice: "cached" (returns once the bytes are in the page cache) and "durable" (the time plus the
`os.sync()` that puts them on disk). Passes alternate generate / plain write; the report gives the ratio of the
best passes and the median ratio of each generate pass to the plain write right after it, so background load on
a shared machine affects both alike. Target: generate >= 0.5 x plain write.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from primus_energon.formats import SIZES
from primus_energon.synthetic import generate_dataset

FLUX_SHAPES = dict(SIZES["flux"])


def _timed(fn) -> tuple[float, float]:
    """(seconds until `fn` returns, seconds until its bytes are synced)."""
    os.sync()
    start = time.perf_counter()
    fn()
    cached = time.perf_counter() - start
    os.sync()
    return cached, time.perf_counter() - start


def _plain_write(directory: Path, sizes: list[int], payload: memoryview) -> None:
    directory.mkdir(parents=True)
    for i, size in enumerate(sizes):
        with open(directory / f"plain-{i:06d}.bin", "wb") as f:
            f.write(payload[:size])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=96, help="samples per pass (default 96, ~410 MB)")
    parser.add_argument("--shard-size", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="passes of each (default 3)")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir, removed after)")
    parser.add_argument(
        "--min-ratio", type=float, default=None, help="exit 1 if the cached ratio is below this"
    )
    args = parser.parse_args(argv)

    scratch = Path(args.dir or tempfile.mkdtemp(prefix="bench-generate-"))
    scratch.mkdir(parents=True, exist_ok=True)
    gen: list[tuple[float, float]] = []
    plain: list[tuple[float, float]] = []
    total = 0
    try:
        # warm-up: imports, the normal pool, Energon's first preparation
        generate_dataset(scratch / "warm", num_samples=2, shard_size=2, dtype=args.dtype, shapes=FLUX_SHAPES)
        shutil.rmtree(scratch / "warm")
        for rep in range(args.repeat):
            out = scratch / f"gen-{rep}"
            result = {}

            def run_generate(out=out, rep=rep, result=result) -> None:
                result["m"] = generate_dataset(
                    out,
                    num_samples=args.samples,
                    shard_size=args.shard_size,
                    seed=rep,
                    dtype=args.dtype,
                    shapes=FLUX_SHAPES,
                    workers=args.workers,
                )

            gen.append(_timed(run_generate))
            sizes = [s.size for s in result["m"].shards]
            total = sum(sizes)
            payload = memoryview(os.urandom(max(sizes)))
            plain.append(
                _timed(
                    lambda rep=rep, sizes=sizes, payload=payload: _plain_write(
                        scratch / f"plain-{rep}", sizes, payload
                    )
                )
            )
            shutil.rmtree(out)
            shutil.rmtree(scratch / f"plain-{rep}")
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)

    mb = total / 1e6
    print(
        f"FLUX-sized preencoded ({args.dtype} latents [16,64,64], prompt_embeds [512,4096], pooled [768]): "
        f"{args.samples} samples, {args.shard_size}/shard, workers={args.workers}, {mb:.0f} MB per pass, "
        f"{args.repeat} passes"
    )
    ratios = {}
    for i, mode in enumerate(("cached", "durable")):
        g = [t[i] for t in gen]
        p = [t[i] for t in plain]
        g_rate, p_rate = mb / min(g), mb / min(p)
        ratios[mode] = g_rate / p_rate
        paired = statistics.median(pt / gt for gt, pt in zip(g, p, strict=True))
        print(
            f"  {mode:<8} generate {g_rate:6.0f} MB/s (median {mb / statistics.median(g):5.0f})   "
            f"plain write {p_rate:6.0f} MB/s (median {mb / statistics.median(p):5.0f})   "
            f"ratio of bests {ratios[mode]:.2f}, median of paired ratios {paired:.2f}  (target >= 0.50)"
        )
    if args.min_ratio is not None and ratios["cached"] < args.min_ratio:
        print(f"cached ratio {ratios['cached']:.2f} is below --min-ratio {args.min_ratio}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
