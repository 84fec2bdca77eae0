"""``primus-energon info DIR``: samples and shards per split, encoding, sizes, members, shapes and dtypes.

Exit status: 0, or 2 when DIR is not a dataset.
"""

from __future__ import annotations

import argparse
import sys

from ...cli_types import positive_int
from .common import add_progress, error, workers, write_json

__all__ = ["DESCRIPTION", "HELP", "NAME", "add_arguments", "run"]

NAME = "info"
HELP = "samples and shards per split, encoding, sizes, members, tensor shapes and dtypes"
DESCRIPTION = (
    "Describe DIR: samples and shards per split and sizes on disk (from .nv-meta), the encoding, and the "
    "members with their dtypes and shapes from the first N samples (--full: every sample)."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """DIR, ``-n``, ``--full``, ``--workers``, ``--json`` and the progress flags."""
    p.add_argument("dir", metavar="DIR", help="dataset directory, local or remote (msc://PROFILE/PREFIX)")
    p.add_argument(
        "-n", "--samples", type=positive_int, default=16, metavar="N", help="samples to inspect (default: 16)"
    )
    p.add_argument("--full", action="store_true", help="inspect every sample (lists every distinct shape)")
    p.add_argument(
        "--workers", type=workers, default="auto", metavar="W", help="processes for --full (default: auto)"
    )
    p.add_argument(
        "--json", metavar="FILE", default=None, help="also write the information as JSON ('-': stdout)"
    )
    add_progress(p)


def run(args: argparse.Namespace) -> int:
    """Describe ``args.dir`` (on stderr when the JSON goes to stdout); the exit status."""
    from ..info import dataset_info, render_info

    try:
        info = dataset_info(
            args.dir, samples=args.samples, full=args.full, workers=args.workers, progress=args.progress
        )
    except OSError as exc:  # not a directory, or a remote location that cannot be listed
        return error(NAME, str(exc))
    out = sys.stderr if args.json == "-" else sys.stdout
    out.write(render_info(info))
    out.flush()
    write_json(args.json, info.to_json())
    return 0
