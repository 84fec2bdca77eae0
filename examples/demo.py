"""An end-to-end run of the reference data path on generated data: ``python examples/demo.py`` (``make demo``).

It generates a small preencoded dataset, a raw one and a blend of both, then checks, printing one
line per check: batches stack with the right shapes; two epochs cover every sample; a loader restored
from a checkpoint continues exactly like the uninterrupted one; the raw path yields RGB images; a
blend dispatches each dataset to its cooker; a shard with a code-running payload is refused and the
payload never runs. Exit status 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from primus_energon import (
    EncodedDiffusionTaskEncoder,
    MultiFormatTaskEncoder,
    PayloadDecodeError,
    RawDiffusionTaskEncoder,
    get_loader,
)
from primus_energon.energon_compat import energon_key
from primus_energon.synthetic import generate_dataset, write_metadataset

__all__ = ["add_arguments", "run", "main"]

SHAPES = {"latents": (16, 32, 32), "prompt_embeds": (77, 256), "pooled_prompt_embeds": (768,)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the datasets here (default: a temporary directory, removed afterwards)",
    )
    parser.add_argument(
        "--samples", type=int, default=96, help="samples in the preencoded dataset (default: 96)"
    )
    parser.add_argument("--batch-size", type=int, default=8, help="batch size (default: 8)")
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes (default: 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed for generation and loading (default: 0)")


def _fingerprint(batch: dict) -> tuple:
    tensors = tuple(
        batch[f].contiguous().view(torch.uint8).numpy().tobytes()
        for f in ("latents", "prompt_embeds", "pooled_prompt_embeds")
    )
    return tuple(batch["__key__"]), tensors


def run(args: argparse.Namespace) -> int:
    """Run the demo; return the process exit status."""
    if args.samples < 2 * args.batch_size:
        raise SystemExit(f"demo: --samples must be at least 2 x --batch-size ({2 * args.batch_size})")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        return _run(args, args.out)
    with tempfile.TemporaryDirectory(prefix="primus-energon-demo-") as tmp:
        return _run(args, Path(tmp))


def _run(args: argparse.Namespace, root: Path) -> int:
    results: list[tuple[str, bool, str]] = []

    def check(name: str, body: Callable[[], tuple[bool, str]]) -> None:
        try:
            ok, detail = body()
        except Exception as error:  # a demo check that crashes is a failed check, reported as such
            ok, detail = False, f"{type(error).__name__}: {error}"
        results.append((name, ok, detail))
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)

    started = time.perf_counter()
    pre = generate_dataset(
        root / "preencoded",
        encoding="preencoded",
        num_samples=args.samples,
        shard_size=16,
        seed=args.seed,
        shapes=SHAPES,
        dtype="bfloat16",
        overwrite=True,
    )
    generate_dataset(
        root / "raw",
        encoding="raw",
        num_samples=32,
        shard_size=16,
        seed=args.seed + 1,
        image_format="jpg",
        image_size=(64, 64),
        overwrite=True,
    )
    blend = write_metadataset(
        root / "blend.yaml",
        [(root / "preencoded", 0.7, {"source": "laion"}), (root / "raw", 0.3, {"source": "coco"})],
    )
    print(
        f"generated {args.samples} preencoded + 32 raw samples under {root} in {time.perf_counter() - started:.1f}s"
    )
    all_keys = {energon_key(s.shard, s.key) for s in pre.samples}  # as Energon names them
    steps_per_epoch = args.samples // args.batch_size

    def build(**overrides):
        options = dict(batch_size=args.batch_size, num_workers=args.workers, seed=args.seed)
        return get_loader(root / "preencoded", EncodedDiffusionTaskEncoder, **{**options, **overrides})

    def shapes() -> tuple[bool, str]:
        batch = next(build(num_workers=0))
        got = {f: (tuple(batch[f].shape), str(batch[f].dtype)) for f in SHAPES}
        want = {f: ((args.batch_size, *s), "torch.bfloat16") for f, s in SHAPES.items()}
        return got == want, ", ".join(
            f"{f} {list(s)} {d.removeprefix('torch.')}" for f, (s, d) in got.items()
        )

    def epochs() -> tuple[bool, str]:
        loader = build()
        t0 = time.perf_counter()
        batches = [next(loader) for _ in range(2 * steps_per_epoch)]
        rate = len(batches) * args.batch_size / (time.perf_counter() - t0)
        first = [k for b in batches[:steps_per_epoch] for k in b["__key__"]]
        second = [k for b in batches[steps_per_epoch:] for k in b["__key__"]]
        ok = sorted(first) == sorted(all_keys) == sorted(second)
        return (
            ok,
            f"each of 2 epochs covers all {len(all_keys)} samples once ({rate:.0f} samples/s, {args.workers} workers)",
        )

    def resume() -> tuple[bool, str]:
        save_at, compare = steps_per_epoch - 1, 4  # the continuation crosses the epoch boundary
        loader = build()
        for _ in range(save_at):
            next(loader)
        state = loader.save_state()
        expected = [_fingerprint(next(loader)) for _ in range(compare)]
        restored = build()
        restored.restore_state(state)
        got = [_fingerprint(next(restored)) for _ in range(compare)]
        return (
            got == expected,
            f"saved after batch {save_at}, restored into a fresh loader: next {compare} batches identical (keys and tensor bytes)",
        )

    def raw() -> tuple[bool, str]:
        batch = next(
            get_loader(root / "raw", RawDiffusionTaskEncoder, batch_size=4, num_workers=0, seed=args.seed)
        )
        ok = len(batch["images"]) == 4 and all(
            img.mode == "RGB" and img.size == (64, 64) for img in batch["images"]
        )
        return ok, f"4 RGB images {batch['images'][0].size}, captions like {batch['txt'][0][:40]!r}"

    def dispatch() -> tuple[bool, str]:
        loader = get_loader(blend, MultiFormatTaskEncoder, batch_size=1, num_workers=0, seed=args.seed)
        counts = {"laion": 0, "coco": 0}
        for _ in range(200):
            batch = next(loader)
            counts["laion" if "latents" in batch else "coco"] += 1
        share = counts["laion"] / 200
        return (
            0.6 <= share <= 0.8,
            f"blend 0.7/0.3 gave {counts['laion']}/{counts['coco']} preencoded/raw of 200, each cooked by its own cooker",
        )

    def safety() -> tuple[bool, str]:
        marker = root / "PAYLOAD_RAN"
        generate_dataset(
            root / "malicious",
            encoding="preencoded",
            num_samples=8,
            shard_size=4,
            seed=args.seed,
            shapes=SHAPES,
            faults={"malicious-pickle": 1},
            marker_path=marker,
            overwrite=True,
        )
        loader = get_loader(
            root / "malicious",
            EncodedDiffusionTaskEncoder,
            batch_size=1,
            num_workers=0,
            mode="val",
            split_part="train",
        )
        try:
            for _ in range(8):
                next(loader)
        except PayloadDecodeError as error:
            return not marker.exists(), f"refused ({error.key!r}, {error.member}) and the payload never ran"
        return False, "the malicious sample was not refused"

    for name, body in [
        ("batch shapes", shapes),
        ("epochs", epochs),
        ("resume", resume),
        ("raw images", raw),
        ("blend dispatch", dispatch),
        ("malicious shard", safety),
    ]:
        check(name, body)
    failed = [name for name, ok, _ in results if not ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python examples/demo.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    # Energon always asks torch for pinned memory; without an accelerator torch warns once per loader.
    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator", category=UserWarning)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
