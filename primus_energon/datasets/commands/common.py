"""What several dataset commands share: help text filling, the ``--workers`` type, ``--progress`` flags,
the one-line error and JSON output. Standard library only (``--help`` imports nothing heavy)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from ...cli_types import positive_int_or_auto

__all__ = ["add_progress", "error", "workers", "wrap", "write_json"]


def wrap(text: str) -> str:
    """Paragraphs (split at blank lines) filled to 100 columns, for the raw help formatter."""
    return "\n\n".join(textwrap.fill(par, 100) for par in text.split("\n\n"))


def _auto_workers() -> int:
    from ..validate import default_workers

    return default_workers()


#: ``--workers W``: a positive integer, or ``auto`` (the usable CPUs up to 8).
workers = positive_int_or_auto(_auto_workers)


def add_progress(p: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` into ``args.progress`` (True, False; None: only on a terminal)."""
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


def error(command: str, message: str, status: int = 2) -> int:
    """Print ``primus-energon COMMAND: error: MESSAGE`` on stderr; returns `status` (the exit status)."""
    print(f"primus-energon {command}: error: {message}", file=sys.stderr)
    return status


def write_json(target: str | None, text: str) -> None:
    """Write `text` to the ``--json`` target: nothing for None, stdout for ``-``, else the file (its parent
    directories made)."""
    if target is None:
        return
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(text, encoding="utf-8")
