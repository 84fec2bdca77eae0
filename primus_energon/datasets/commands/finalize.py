"""``primus-energon finalize DIR --encoding E``: prepare a directory of ``.tar`` shards for Energon, write
``dataset.yaml``, then validate the result.

Exit status: 0 clean, 1 problems found (or Energon refused the shards), 2 refused (bad arguments, compressed
shards without ``--decompress``, a directory already prepared without ``--force``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .common import error
from .validate import EPILOG, add_validate_options, apply_limits, emit

__all__ = ["DESCRIPTION", "EPILOG", "HELP", "NAME", "add_arguments", "run", "subflavor"]

NAME = "finalize"
HELP = "prepare a directory of .tar shards for Energon (non-interactive), then validate it"
DESCRIPTION = (
    "Prepare DIR for Energon through its own API (WebdatasetPreparator.prepare_dataset: .info.json, "
    "split.yaml, index.sqlite, a .tar.idx per shard), write .nv-meta/dataset.yaml (CrudeWebdataset with "
    "subflavors: {encoding: E, ...}), then run `validate` on the result. Compressed shards (.tar.gz) are "
    "refused with an explanation unless --decompress."
)

#: what a failed preparation leaves unprepared; not reported when validating its shards to show the fault
_UNPREPARED = {"missing-metadata", "bad-metadata", "missing-index", "missing-sqlite", "count-mismatch"}


def subflavor(text: str) -> tuple[str, Any]:
    """``--subflavor KEY=VALUE`` -> (KEY, VALUE read as a YAML scalar; a mapping or list stays text)."""
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """DIR, the preparation options and the validate options."""
    p.add_argument("dir", metavar="DIR", help="the local dataset directory holding the .tar shards")
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
        type=subflavor,
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
    add_validate_options(p)


def run(args: argparse.Namespace) -> int:
    """Prepare ``args.dir``, write dataset.yaml, validate; the exit status. When Energon refuses the shards,
    the shards are validated to show which samples are at fault."""
    from ..finalize import FinalizeError, finalize_dataset, parse_split
    from ..validate import validate_dataset

    apply_limits(args)
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
        status = error(NAME, str(exc), exc.exit_code)
        if status == 1 and Path(args.dir).is_dir():
            print("validating the shards to show where:", file=sys.stderr)
            report = validate_dataset(
                args.dir, encoding=args.encoding, workers=args.workers, progress=args.progress
            )
            report.problems = [p for p in report.problems if p.code not in _UNPREPARED]
            emit(report, args)
        return status
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
    return emit(report, args)
