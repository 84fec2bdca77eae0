"""The dataset subcommands of ``primus-energon``: finalize, validate, info, preview.

Wiring into an existing argparse CLI::

    from primus_energon.datasets.cli import register
    register(commands)            # `commands` = parser.add_subparsers(...); each sets `handler`

Standalone: ``python -m primus_energon.datasets.cli COMMAND ...``. Exit status: 0 clean, 1 problems found
(or a cooker rejected a previewed sample), 2 refused (bad arguments, nothing to validate).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "main", "register"]

_EPILOG_CODES = (
    "Problem codes: truncated-shard, empty-shard, corrupt-shard, unreadable-shard, missing-member, "
    "garbage-payload, malicious-pickle, non-utf8-caption, nan-tensor, wrong-dtype, wrong-shape, duplicate-key, "
    "dotted-key; metadata: missing-metadata, bad-metadata, count-mismatch, missing-index, index-mismatch, "
    "missing-shard, unlisted-shard, compressed-shard, split-mismatch, encoding-mismatch, missing-sqlite "
    "(warning); metadatasets: bad-metadataset, missing-path, bad-weight, duplicate-leaf. "
    "Exit status: 0 clean, 1 problems found, 2 refused."
)


def _wrap(text: str) -> str:
    """Paragraphs (split at blank lines) filled to 100 columns, for the raw help formatter."""
    return "\n\n".join(textwrap.fill(par, 100) for par in text.split("\n\n"))


def _workers(text: str) -> int:
    if text == "auto":
        from .validate import default_workers

        return default_workers()
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'auto', got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'auto', got {text!r}")
    return n


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return n


def _subflavor(text: str) -> tuple[str, Any]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    if isinstance(parsed, (dict, list)):
        parsed = value
    return key.strip(), parsed


def _add_progress(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--progress", dest="progress", action="store_true", default=None, help="always show a progress bar"
    )
    g.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no progress bar (default: only on a terminal)",
    )


def _add_validate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        type=_workers,
        default="auto",
        metavar="W",
        help="processes scanning shards in parallel; the report is the same for any W (default: auto, "
        "the usable CPUs up to 8)",
    )
    p.add_argument(
        "--json", metavar="FILE", default=None, help="also write the JSON report to FILE ('-': stdout)"
    )
    p.add_argument("--strict", action="store_true", help="warnings fail validation too")
    p.add_argument(
        "--max-lines",
        type=_positive,
        default=20,
        metavar="N",
        help="problem lines shown per code (default: 20)",
    )
    _add_progress(p)


def register(commands: Any) -> None:
    """Add ``finalize``, ``validate``, ``info`` and ``preview`` to an argparse subparsers object; each
    subparser sets ``handler`` (a function of the parsed args returning the exit status)."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = commands.add_parser(
        "finalize",
        help="prepare a directory of .tar shards for Energon (non-interactive), then validate it",
        description=_wrap(
            "Prepare DIR for Energon through its own API (WebdatasetPreparator.prepare_dataset: .info.json, "
            "split.yaml, index.sqlite, a .tar.idx per shard), write .nv-meta/dataset.yaml (CrudeWebdataset with "
            "subflavors: {encoding: E, ...}), then run `validate` on the result. Compressed shards (.tar.gz) are "
            "refused with an explanation unless --decompress."
        ),
        epilog=_wrap(_EPILOG_CODES),
        formatter_class=fmt,
    )
    p.add_argument("dir", metavar="DIR", type=Path, help="the dataset directory holding the .tar shards")
    p.add_argument(
        "--encoding",
        required=True,
        metavar="E",
        help="subflavors.encoding: preencoded, raw, or your own format's name",
    )
    p.add_argument(
        "--split",
        default="1,0,0",
        metavar="TRAIN,VAL,TEST",
        help="split ratios over whole shards: three non-negative numbers summing to 1 (default: 1,0,0)",
    )
    p.add_argument(
        "--subflavor",
        action="append",
        type=_subflavor,
        default=[],
        metavar="KEY=VALUE",
        help="another dataset.yaml subflavor (repeatable)",
    )
    p.add_argument("--force", action="store_true", help="prepare again a directory that is already prepared")
    p.add_argument(
        "--decompress",
        action="store_true",
        help="write the .tar beside each .tar.gz/.tgz/.tar.bz2/.tar.xz shard first",
    )
    p.add_argument(
        "--shuffle-seed",
        type=int,
        default=None,
        metavar="N",
        help="shuffle shards with this seed before splitting (default: keep shard order)",
    )
    _add_validate_options(p)
    p.set_defaults(handler=run_finalize)

    p = commands.add_parser(
        "validate",
        help="check every sample of a dataset (or every leaf of a metadataset) before training",
        description=_wrap(
            "Validate PATH: a prepared dataset directory, or a metadataset .yaml (MetadatasetV2 or legacy "
            "Metadataset), whose leaves are resolved (normalised weights, effective subflavors) and each "
            "validated.\n\nChecks metadata (.info.json counts against every shard, split.yaml, dataset.yaml "
            "class and encoding against the data, a matching .tar.idx per shard) and every sample of every "
            "shard: required members, tensor payloads (decoded without unpickling anything but tensors), "
            "dtype and shape consistency (resolution buckets allowed), NaN/Inf, UTF-8 captions, duplicate and "
            "dotted keys, empty and truncated shards. Prints a summary naming each problem's shard, key and "
            "member; exit status 0 only when clean."
        ),
        epilog=_wrap(_EPILOG_CODES),
        formatter_class=fmt,
    )
    p.add_argument("path", metavar="PATH", type=Path, help="dataset directory or metadataset .yaml")
    p.add_argument(
        "--encoding",
        metavar="E",
        default=None,
        help="check against this encoding (default: dataset.yaml's subflavors.encoding, else detected)",
    )
    _add_validate_options(p)
    p.set_defaults(handler=run_validate)

    p = commands.add_parser(
        "info",
        help="samples and shards per split, encoding, sizes, members, tensor shapes and dtypes",
        description=_wrap(
            "Describe DIR: samples and shards per split and sizes on disk (from .nv-meta), the encoding, and the "
            "members with their dtypes and shapes from the first N samples (--full: every sample)."
        ),
        formatter_class=fmt,
    )
    p.add_argument("dir", metavar="DIR", type=Path)
    p.add_argument(
        "-n", "--samples", type=_positive, default=16, metavar="N", help="samples to inspect (default: 16)"
    )
    p.add_argument("--full", action="store_true", help="inspect every sample (lists every distinct shape)")
    p.add_argument(
        "--workers", type=_workers, default="auto", metavar="W", help="processes for --full (default: auto)"
    )
    p.add_argument(
        "--json", metavar="FILE", default=None, help="also write the information as JSON ('-': stdout)"
    )
    _add_progress(p)
    p.set_defaults(handler=run_info)

    p = commands.add_parser(
        "preview",
        help="print the first samples as the reference TaskEncoder sees them",
        description=_wrap(
            "Print the first N samples of DIR as the reference TaskEncoder (MultiFormatTaskEncoder, dispatched "
            "by subflavors.encoding, no decoder) hands them to batch(): each field's dtype, shape and value range, "
            "images' size and pixel range, the caption. Samples the cooker rejects are shown with the reason."
        ),
        formatter_class=fmt,
    )
    p.add_argument("dir", metavar="DIR", type=Path)
    p.add_argument("-n", type=_positive, default=4, metavar="N", help="samples to show (default: 4)")
    p.add_argument("--split", default="train", help="split part to read (default: train)")
    p.add_argument("--max-chars", type=_positive, default=100, metavar="C", help="caption characters shown")
    p.set_defaults(handler=run_preview)


def _err(command: str, message: str) -> int:
    print(f"primus-energon {command}: error: {message}", file=sys.stderr)
    return 2


def _write_json(target: str | None, text: str) -> None:
    if target is None:
        return
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(text, encoding="utf-8")


def _emit(report: Any, args: argparse.Namespace) -> int:
    from .report import render_summary

    out = sys.stderr if args.json == "-" else sys.stdout
    out.write(render_summary(report, max_per_code=args.max_lines))
    out.flush()
    if report.elapsed_s > 0 and report.bytes_scanned:
        rate = report.bytes_scanned / report.elapsed_s / 1e6
        print(
            f"({report.bytes_scanned / 1e6:.1f} MB in {report.elapsed_s:.2f} s, {rate:.1f} MB/s)",
            file=sys.stderr,
        )
    _write_json(args.json, report.to_json())
    return 0 if report.ok else 1


def run_validate(args: argparse.Namespace) -> int:
    """``validate PATH``."""
    from .validate import ValidationError, validate_path

    try:
        report = validate_path(
            args.path,
            encoding=args.encoding,
            workers=args.workers,
            progress=args.progress,
            strict=args.strict,
        )
    except ValidationError as exc:
        return _err("validate", str(exc))
    return _emit(report, args)


def run_finalize(args: argparse.Namespace) -> int:
    """``finalize DIR --encoding E``: prepare, write dataset.yaml, validate."""
    from .finalize import FinalizeError, finalize_dataset, parse_split
    from .validate import validate_dataset

    try:
        split = parse_split(args.split)
        result = finalize_dataset(
            args.dir,
            args.encoding,
            split=split,
            subflavors=dict(args.subflavor),
            workers=args.workers,
            force=args.force,
            decompress=args.decompress,
            shuffle_seed=args.shuffle_seed,
        )
    except FinalizeError as exc:
        print(f"primus-energon finalize: error: {exc}", file=sys.stderr)
        if exc.exit_code == 1 and args.dir.is_dir():
            # Energon refused the shards: show exactly which samples are at fault
            print("validating the shards to show where:", file=sys.stderr)
            report = validate_dataset(
                args.dir, encoding=args.encoding, workers=args.workers, progress=args.progress
            )
            unprepared = {
                "missing-metadata",
                "bad-metadata",
                "missing-index",
                "missing-sqlite",
                "count-mismatch",
            }
            report.problems = [p for p in report.problems if p.code not in unprepared]  # expected here
            _emit(report, args)
        return exc.exit_code
    for name in result.decompressed:
        print(f"decompressed {name}", file=sys.stderr)
    print(
        f"prepared {len(result.shards)} shards in {result.root} (split {','.join(f'{x:g}' for x in result.split)}); "
        f"wrote {result.dataset_yaml}",
        file=sys.stderr if args.json == "-" else sys.stdout,
    )
    report = validate_dataset(
        args.dir, encoding=args.encoding, workers=args.workers, progress=args.progress, strict=args.strict
    )
    return _emit(report, args)


def run_info(args: argparse.Namespace) -> int:
    """``info DIR``."""
    from .info import dataset_info, render_info

    try:
        info = dataset_info(
            args.dir, samples=args.samples, full=args.full, workers=args.workers, progress=args.progress
        )
    except FileNotFoundError as exc:
        return _err("info", str(exc))
    out = sys.stderr if args.json == "-" else sys.stdout
    out.write(render_info(info))
    out.flush()
    _write_json(args.json, info.to_json())
    return 0


def run_preview(args: argparse.Namespace) -> int:
    """``preview DIR``."""
    from .preview import preview_dataset, render_preview

    if not args.dir.is_dir():
        return _err("preview", f"{str(args.dir)!r} is not a directory")
    items, stop = preview_dataset(args.dir, n=args.n, split=args.split, max_chars=args.max_chars)
    sys.stdout.write(render_preview(items, stop))
    return 1 if stop or any(i.error for i in items) else 0


def build_parser() -> argparse.ArgumentParser:
    """A standalone parser with the dataset subcommands (what ``primus-energon`` gets from `register`)."""
    parser = argparse.ArgumentParser(
        prog="primus-energon", description="Dataset tools for Megatron-Energon CrudeWebdatasets."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator", category=UserWarning)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
