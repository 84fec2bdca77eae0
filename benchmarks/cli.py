"""The command-line skeleton every benchmark session shares (``benchmarks.throughput``, ``benchmarks.gpu``,
``benchmarks.bench_conformance``).

* :func:`session_parser`: the parser, with the output file and ``--check-targets``;
* :func:`add_fresh_process_options`: ``--quick``, ``--data-dir`` and the hidden ``--job JSON`` with which
  a session runs one measurement in a fresh process (:mod:`benchmarks.jobs`); :func:`run_job_mode` answers
  it; :func:`scratch_dir` is the generated data's folder (kept only when ``--data-dir`` names it);
* :func:`add_guard_options` / :func:`guard_from_args`: the load guard's options (:mod:`benchmarks.guard`);
* :func:`exit_status`: 1 if a measurement failed, or a target was missed under ``--check-targets``; else 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .guard import Guard
from .jobs import emit_result

__all__ = [
    "add_fresh_process_options",
    "add_guard_options",
    "exit_status",
    "guard_from_args",
    "require_output",
    "run_job_mode",
    "scratch_dir",
    "session_parser",
]


def session_parser(
    prog: str, description: str | None, *, output_help: str, output_flags: tuple[str, ...] = ("--json",)
) -> argparse.ArgumentParser:
    """A session's parser (``description`` shown as written): the output file, stored as ``args.json``,
    and ``--check-targets``."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(*output_flags, dest="json", type=Path, metavar="FILE", help=output_help)
    parser.add_argument("--check-targets", action="store_true", help="exit 1 if a target is missed")
    return parser


def add_fresh_process_options(parser: argparse.ArgumentParser, *, quick_help: str) -> None:
    """``--quick``, ``--data-dir`` and the hidden ``--job`` (one measurement, in this process)."""
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--data-dir", type=Path, default=None, help="keep (and reuse) generated data here")
    parser.add_argument("--job", help=argparse.SUPPRESS)


def add_guard_options(parser: argparse.ArgumentParser, *, default_note: str) -> None:
    """``--max-foreign``, ``--retries`` and ``--max-wait``; ``default_note`` says when the guard is on."""
    defaults = Guard()
    parser.add_argument(
        "--max-foreign",
        type=float,
        default=None,
        help=f"cores other processes may use during a measurement before it is retried ({default_note}; "
        "a negative value turns the guard off)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=defaults.retries,
        help=f"retries of a disturbed measurement (default {defaults.retries})",
    )
    parser.add_argument(
        "--max-wait",
        type=float,
        default=defaults.max_wait,
        help="seconds to wait for a quiet machine before each try",
    )


def guard_from_args(args: argparse.Namespace, default_max_foreign: float | None) -> Guard | None:
    """The guard the options ask for: ``--max-foreign`` or else ``default_max_foreign`` cores; None (off)
    where that is None or negative. Sets ``args.max_foreign`` to the value in force (None when off)."""
    value = default_max_foreign if args.max_foreign is None else args.max_foreign
    if value is None or value < 0:
        args.max_foreign = None
        return None
    args.max_foreign = value
    return Guard(max_foreign=value, retries=args.retries, max_wait=args.max_wait)


def run_job_mode(args: argparse.Namespace, run: Callable[[Mapping[str, Any]], Mapping[str, Any]]) -> bool:
    """Under ``--job JSON``: run that one measurement with ``run`` and print its result for the parent
    (:func:`benchmarks.jobs.emit_result`); True if it did."""
    if not args.job:
        return False
    emit_result(run(json.loads(args.job)))
    return True


def require_output(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Path:
    """The output path; exits with a usage error (status 2) when it was not given."""
    if args.json is None:
        parser.error("--json FILE is required")
    return args.json


@contextmanager
def scratch_dir(keep: Path | None, prefix: str) -> Iterator[Path]:
    """``keep`` (created, left in place), or a new temporary folder removed afterwards."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def exit_status(*, failed: bool, missed: bool, check_targets: bool) -> int:
    """1 if a measurement ``failed``, or a target was ``missed`` and ``check_targets`` asks; else 0."""
    return 1 if failed or (check_targets and missed) else 0
