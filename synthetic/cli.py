"""``primus-synth`` / ``python -m primus_energon.synthetic``: generate datasets and metadatasets from the command line.

Exit status: 0 on success, 2 on a bad argument or a refused output directory (one ``error:`` line on stderr),
1 on an unexpected failure (with a traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from primus_energon.cli_types import non_negative_int, positive_int
from primus_energon.environment import add_version_option, refuse_broken_environment

from .errors import SyntheticError
from .faults import FAULT_KINDS, parse_faults
from .metadataset import parse_blend

__all__ = ["build_parser", "main"]

_FAULT_HELP = {
    "truncated-shard": "a shard cut mid-member after preparation; it and later samples of the shard are lost",
    "garbage-payload": "a tensor/image/json member replaced by random bytes starting with NUL",
    "missing-member": "one member left out of a sample",
    "duplicate-key": "a sample stored under another sample's key (after preparation)",
    "dotted-key": "a sample key with a dot, so Energon sees members 'v2.<member>'",
    "empty-shard": "a shard replaced by an empty tar after preparation",
    "malicious-pickle": "a .pth whose unpickling (weights_only=False) creates the marker file",
    "non-utf8-caption": "a caption stored as cp1252 bytes that are not valid UTF-8",
    "nan-tensor": "a float tensor with a few NaN elements",
    "wrong-dtype": "a tensor saved with another dtype (e.g. float32 -> float64)",
    "wrong-shape": "a tensor one longer along its first axis that is not 1",
}


class _Parser(argparse.ArgumentParser):
    """Reports a bad argument as one line and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _fault(text: str) -> str:
    try:
        parse_faults([text])
    except SyntheticError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _dims(text: str, what: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.replace(",", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{what} {text!r} must be integers joined by 'x', e.g. 4x8x8"
        ) from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"{what} {text!r} must be positive integers joined by 'x'")
    return dims


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--shape {text!r} must be NAME=DIMS, e.g. latents=4x8x8")
    return name, _dims(dims, "--shape")


def _image_size(text: str) -> tuple[int, int]:
    dims = _dims(text, "--image-size")
    if len(dims) == 1:
        return dims[0], dims[0]
    if len(dims) != 2:
        raise argparse.ArgumentTypeError(f"--image-size {text!r} must be HEIGHTxWIDTH, e.g. 32x48")
    return dims[0], dims[1]


def _split(text: str) -> tuple[float, float, float]:
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--split {text!r} must be TRAIN,VAL,TEST ratios, e.g. 0.8,0.1,0.1"
        ) from None
    if len(parts) != 3 or any(p < 0 for p in parts) or sum(parts) <= 0:
        raise argparse.ArgumentTypeError(
            f"--split {text!r} must be three non-negative ratios TRAIN,VAL,TEST with a positive sum"
        )
    return parts  # type: ignore[return-value]


def _blend(text: str) -> tuple[str, float, dict[str, str]]:
    try:
        return parse_blend(text)
    except SyntheticError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="primus-synth",
        description="Generate deterministic, Energon-ready CrudeWebdataset datasets (optionally with faults) "
        "and metadatasets blending them.",
    )
    add_version_option(parser, "primus-synth")
    sub = parser.add_subparsers(dest="command", metavar="{generate,metadataset}", parser_class=_Parser)
    sub.required = True

    faults_text = "\n".join(f"  {k:<17} {v}" for k, v in _FAULT_HELP.items())
    gen = sub.add_parser(
        "generate",
        help="write a prepared dataset with manifest.json",
        description="Write a prepared CrudeWebdataset (tar shards, .nv-meta/, dataset.yaml) and manifest.json to "
        "OUT_DIR. The output is a pure function of the options: same seed and options, same bytes, whatever "
        "--workers or the rank split (RANK/WORLD_SIZE, e.g. under torchrun).",
        epilog=f"fault kinds (--fault KIND[:COUNT]):\n{faults_text}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gen.add_argument(
        "out_dir", metavar="OUT_DIR", help="dataset directory to create (must be empty or absent)"
    )
    gen.add_argument(
        "--encoding",
        choices=("preencoded", "raw"),
        default=None,
        help="built-in format: preencoded (latents/prompt_embeds/pooled_prompt_embeds .pth + caption.txt) or "
        "raw (image + txt); default preencoded; with --schema, optional and must match the schema",
    )
    gen.add_argument(
        "--samples", type=positive_int, default=64, metavar="N", help="number of samples (default 64)"
    )
    gen.add_argument(
        "--shard-size", type=positive_int, default=16, metavar="K", help="samples per shard (default 16)"
    )
    gen.add_argument(
        "--seed", type=non_negative_int, default=0, metavar="S", help="random seed, >= 0 (default 0)"
    )
    gen.add_argument("--schema", metavar="FILE", help="YAML/JSON schema file describing a custom format")
    gen.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16", "float64"),
        help="dtype of every floating-point tensor (default: the schema's; built-in preencoded: float32)",
    )
    gen.add_argument(
        "--shape",
        type=_shape,
        action="append",
        default=[],
        metavar="NAME=DIMS",
        help="tensor shape by member name or stem, e.g. latents=16x64x64 (repeatable)",
    )
    gen.add_argument(
        "--image-format", choices=("jpg", "jpeg", "png", "webp"), help="raw: image member (default jpg)"
    )
    gen.add_argument(
        "--image-size", type=_image_size, metavar="HxW", help="image height x width (default 32x32)"
    )
    gen.add_argument(
        "--variable-shapes",
        action="store_true",
        help="resolution buckets: per-sample image/latent height and width",
    )
    gen.add_argument(
        "--split",
        type=_split,
        default=(1.0, 0.0, 0.0),
        metavar="TRAIN,VAL,TEST",
        help="split ratios (default 1,0,0)",
    )
    gen.add_argument(
        "--fault",
        type=_fault,
        action="append",
        default=[],
        metavar="KIND[:COUNT]",
        help=f"inject COUNT (default 1) faults of KIND (repeatable); KIND is one of: {', '.join(FAULT_KINDS)}",
    )
    gen.add_argument(
        "--marker-path",
        metavar="PATH",
        help="malicious-pickle: file its payload creates if unpickled (default OUT_DIR.PWNED)",
    )
    gen.add_argument("--key-prefix", metavar="P", help="sample keys are P_<index> (default s<seed>); no dots")
    gen.add_argument(
        "--workers", type=positive_int, default=1, metavar="W", help="parallel shard-writing processes"
    )
    gen.add_argument("--overwrite", action="store_true", help="replace the dataset in a non-empty OUT_DIR")
    gen.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    gen.add_argument(
        "--distributed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="split the shards across ranks (RANK/WORLD_SIZE, e.g. torchrun; default: when WORLD_SIZE > 1 is "
        "set); --no-distributed ignores them",
    )
    gen.add_argument("--quiet", action="store_true", help="print nothing on success")

    meta = sub.add_parser(
        "metadataset",
        help="write a metadataset YAML blending datasets",
        description="Write an Energon metadataset blending datasets with weights and per-entry subflavors, in the "
        "MetadatasetV2 form (splits.train.blend) or, with --legacy, the Metadataset form (splits.train.datasets).",
    )
    meta.add_argument("out_yaml", metavar="OUT.yaml", help="metadataset file to write")
    meta.add_argument(
        "--blend",
        type=_blend,
        action="append",
        required=True,
        metavar="PATH:WEIGHT[:key=value,...]",
        help="a dataset, its weight and optional subflavors, e.g. data/a:0.7:source=a (repeatable)",
    )
    meta.add_argument("--legacy", action="store_true", help="write the legacy Metadataset (datasets:) form")
    meta.add_argument(
        "--split",
        dest="splits",
        action="append",
        choices=("train", "val", "test"),
        metavar="NAME",
        help="split that gets the blend (repeatable; default train)",
    )
    meta.add_argument(
        "--no-check", action="store_true", help="do not require the paths to be prepared datasets"
    )
    return parser


def _generate(args: argparse.Namespace) -> int:
    from .generate import generate_dataset

    progress = sys.stderr.isatty() if args.progress is None else args.progress
    manifest = generate_dataset(
        args.out_dir,
        encoding=args.encoding,
        schema=args.schema,
        num_samples=args.samples,
        shard_size=args.shard_size,
        seed=args.seed,
        dtype=args.dtype,
        shapes=dict(args.shape) or None,
        image_format=args.image_format,
        image_size=args.image_size,
        variable_shapes=args.variable_shapes,
        split=args.split,
        faults=args.fault or None,
        marker_path=args.marker_path,
        key_prefix=args.key_prefix,
        workers=args.workers,
        overwrite=args.overwrite,
        progress=progress,
        distributed=args.distributed,
    )
    if not args.quiet:
        size = sum(s.size for s in manifest.shards)
        faults = ", ".join(f"{k}:{v}" for k, v in manifest.options["faults"].items()) or "none"
        print(
            f"wrote {len(manifest.samples)} {manifest.encoding} samples in {len(manifest.shards)} shards "
            f"({size / 1e6:.1f} MB) to {args.out_dir}; faults: {faults}"
        )
    return 0


def _metadataset(args: argparse.Namespace) -> int:
    from .metadataset import write_metadataset

    path = write_metadataset(
        args.out_yaml,
        args.blend,
        legacy=args.legacy,
        splits=tuple(args.splits or ("train",)),
        check=not args.no_check,
    )
    print(f"wrote {'legacy ' if args.legacy else ''}metadataset with {len(args.blend)} entries to {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    refused = refuse_broken_environment(f"primus-synth {args.command}")
    if refused is not None:
        return refused
    try:
        return _generate(args) if args.command == "generate" else _metadataset(args)
    except SyntheticError as exc:
        print(f"primus-synth {args.command}: error: {exc}", file=sys.stderr)
        return 2
