"""``primus-energon validate PATH``: check every sample of a dataset, or every leaf of a metadataset.

Exit status: 0 clean, 1 problems found, 2 refused (PATH is neither a dataset nor a metadataset). Also home
of the options and the report output that ``finalize`` shares (it validates what it prepared).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING, Any

from ...cli_types import positive_float, positive_int
from .common import add_progress, error, workers, write_json

if TYPE_CHECKING:
    from ..distributed import DistributedScanner
    from ..report import DatasetReport, MetadatasetReport

__all__ = [
    "DESCRIPTION",
    "EPILOG",
    "HELP",
    "NAME",
    "add_arguments",
    "add_validate_options",
    "apply_limits",
    "emit",
    "run",
]

NAME = "validate"
HELP = "check every sample of a dataset (or every leaf of a metadataset) before training"
DESCRIPTION = (
    "Validate PATH: a prepared dataset directory, or a metadataset .yaml (MetadatasetV2 or legacy "
    "Metadataset), whose leaves are resolved (normalised weights, effective subflavors) and each "
    "validated.\n\nChecks metadata (.info.json counts against every shard, split.yaml, dataset.yaml "
    "class and encoding against the data, a matching .tar.idx per shard) and every sample of every "
    "shard: required members, tensor payloads (decoded without unpickling anything but tensors), "
    "dtype and shape consistency (resolution buckets allowed), NaN/Inf, UTF-8 captions, duplicate and "
    "dotted keys, empty and truncated shards. Prints a summary naming each problem's shard, key and "
    "member; exit status 0 only when clean."
)
#: the problem codes a validation reports, and the exit statuses (also ``finalize``'s epilog)
EPILOG = (
    "Problem codes: truncated-shard, empty-shard, corrupt-shard, unreadable-shard, missing-member, "
    "garbage-payload, malicious-pickle, non-utf8-caption, nan-tensor, wrong-dtype, wrong-shape, duplicate-key, "
    "dotted-key, unsafe-path, link-member, special-member, control-character, limit-exceeded, check-failed; "
    "metadata: missing-metadata, bad-metadata, count-mismatch, missing-index, index-mismatch, "
    "missing-shard, unlisted-shard, compressed-shard, split-mismatch, encoding-mismatch, missing-sqlite "
    "(warning); metadatasets: bad-metadataset, missing-path, bad-weight, duplicate-leaf. "
    "Exit status: 0 clean, 1 problems found, 2 refused."
)


def add_validate_options(p: argparse.ArgumentParser) -> None:
    """``--workers``, ``--json``, ``--strict``, ``--max-lines`` and the progress flags, which `emit` and the
    validation read."""
    p.add_argument(
        "--workers",
        type=workers,
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
        "--member-timeout",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="time budget in seconds for checking one member; past it the member is a limit-exceeded "
        "problem and the run goes on (default: 60)",
    )
    p.add_argument(
        "--worker-memory",
        type=positive_float,
        default=None,
        metavar="GIB",
        help="address space in GiB a scanner process may take beyond the shard it maps (setrlimit "
        "RLIMIT_AS); past it the member is a limit-exceeded problem (default: physical memory / workers)",
    )
    p.add_argument(
        "--max-lines",
        type=positive_int,
        default=20,
        metavar="N",
        help="problem lines shown per code (default: 20)",
    )
    add_progress(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """PATH, ``--encoding`` and the validate options."""
    p.add_argument(
        "path",
        metavar="PATH",
        help="dataset directory or metadataset .yaml, local or remote (msc://PROFILE/PREFIX)",
    )
    p.add_argument(
        "--encoding",
        metavar="E",
        default=None,
        help="check against this encoding (default: dataset.yaml's subflavors.encoding, else detected)",
    )
    add_validate_options(p)
    p.add_argument(
        "--rank-timeout",
        type=positive_float,
        default=300.0,
        metavar="S",
        help="under torchrun: fail the run when a rank sends no heartbeat for S seconds (default: 300)",
    )


def emit(report: DatasetReport | MetadatasetReport, args: argparse.Namespace) -> int:
    """Print the summary (on stderr when the JSON goes to stdout) and the scan rate, write ``--json``;
    returns the exit status: 0 when the report is ok, else 1."""
    from ..report import render_summary

    out = sys.stderr if args.json == "-" else sys.stdout
    out.write(render_summary(report, max_per_code=args.max_lines))
    out.flush()
    if report.elapsed_s > 0 and report.bytes_scanned:
        rate = report.bytes_scanned / report.elapsed_s / 1e6
        print(
            f"({report.bytes_scanned / 1e6:.1f} MB in {report.elapsed_s:.2f} s, {rate:.1f} MB/s)",
            file=sys.stderr,
        )
    write_json(args.json, report.to_json())
    return 0 if report.ok else 1


def apply_limits(args: argparse.Namespace) -> None:
    """Make ``--member-timeout`` and ``--worker-memory`` the limits of this process's scans."""
    from ..limits import ScanLimits, set_limits

    memory = getattr(args, "worker_memory", None)
    set_limits(
        ScanLimits(
            member_seconds=getattr(args, "member_timeout", 60.0),
            worker_memory=None if memory is None else int(memory * (1 << 30)),
            cap_in_process=True,
        )
    )


def _validate(args: argparse.Namespace, scanner: DistributedScanner | None = None) -> Any:
    """`validate_path` with the command's options (`scanner`: the ranks of a torchrun job)."""
    from ..validate import validate_path

    return validate_path(
        args.path,
        encoding=args.encoding,
        workers=args.workers,
        progress=args.progress,
        strict=args.strict,
        scanner=scanner,
    )


def _run_ranks(args: argparse.Namespace) -> int:
    """One rank of a torchrun job: rank 0 validates and reports, the others read the shards it assigns."""
    from ..distributed import DistributedScanner, RankFailure, RankGroup, serve
    from ..validate import ValidationError

    try:
        group = RankGroup(args.rank_timeout)
    except RankFailure as exc:
        return error(NAME, str(exc), 3)
    try:
        if group.rank != 0:
            return serve(group, workers=args.workers)
        scanner = DistributedScanner(group, progress=args.progress)

        def stopped(signum: int, frame: object) -> None:
            # torchrun stops every rank with SIGTERM when one rank exits (it crashed, or was killed)
            raise RankFailure(
                f"the job was stopped (signal {signum}; torchrun stops every rank when one exits): "
                f"{scanner.unfinished()}"
            )

        signal.signal(signal.SIGTERM, stopped)
        try:
            report = _validate(args, scanner)
        except (ValidationError, RankFailure) as exc:
            status = error(NAME, str(exc), 2 if isinstance(exc, ValidationError) else 3)
            scanner.abort(str(exc))
            return status
        except BaseException as exc:
            scanner.abort(f"rank 0 failed: {type(exc).__name__}: {exc}")
            raise
        status = emit(report, args)
        scanner.finish()
        return status
    finally:
        group.close()


def run(args: argparse.Namespace) -> int:
    """Validate ``args.path``; the exit status. Under torchrun (world size > 1) the ranks share the
    shards and rank 0 writes the report."""
    from ..distributed import torchrun_world
    from ..validate import ValidationError

    apply_limits(args)
    if torchrun_world() is not None:
        return _run_ranks(args)
    try:
        report = _validate(args)
    except ValidationError as exc:
        return error(NAME, str(exc))
    return emit(report, args)
