"""``primus-energon preview DIR``: the first samples as the reference TaskEncoder hands them to batch().

Exit status: 0, 1 when a cooker rejected a previewed sample (or reading stopped early), 2 when DIR is not a
directory.
"""

from __future__ import annotations

import argparse
import sys

from ...cli_types import positive_int
from .common import error

__all__ = ["DESCRIPTION", "HELP", "NAME", "add_arguments", "run"]

NAME = "preview"
HELP = "print the first samples as the reference TaskEncoder sees them"
DESCRIPTION = (
    "Print the first N samples of DIR as the reference TaskEncoder (MultiFormatTaskEncoder, dispatched "
    "by subflavors.encoding, no decoder) hands them to batch(): each field's dtype, shape and value range, "
    "images' size and pixel range, the caption. Samples the cooker rejects are shown with the reason."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """DIR, ``-n``, ``--split``, ``--max-chars``."""
    p.add_argument("dir", metavar="DIR", help="dataset directory, local or remote (msc://PROFILE/PREFIX)")
    p.add_argument("-n", type=positive_int, default=4, metavar="N", help="samples to show (default: 4)")
    p.add_argument("--split", default="train", help="split part to read (default: train)")
    p.add_argument(
        "--max-chars", type=positive_int, default=100, metavar="C", help="caption characters shown"
    )


def run(args: argparse.Namespace) -> int:
    """Print the preview of ``args.dir``; the exit status."""
    from ...storage import RemoteStorageError, dataset_dir
    from ..preview import preview_dataset, render_preview

    try:
        if not dataset_dir(args.dir).is_dir():
            return error(NAME, f"{args.dir!r} is not a directory")
    except RemoteStorageError as exc:
        return error(NAME, str(exc))
    items, stop = preview_dataset(args.dir, n=args.n, split=args.split, max_chars=args.max_chars)
    sys.stdout.write(render_preview(items, stop))
    return 1 if stop or any(i.error for i in items) else 0
