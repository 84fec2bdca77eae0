"""Conformance speed: the wall seconds of the conformance suite on one target, for each of the zoo's correct
targets (``tests/conformance_zoo``), in the ``ci`` and ``quick`` profiles.

    python -m benchmarks.bench_conformance --out reports/benchmarks/conformance_speed.json --repeat 3

    python -m benchmarks.bench_conformance --out reports/benchmarks/conformance_speed.json
    python -m benchmarks.bench_conformance --profile quick --targets DATACLASS_COOKER,PlainWrapper
    python -m benchmarks.bench_conformance --list

The project's speed targets, on 2 cores: the median over the zoo's correct targets measured at most 20 s
wall in the ``ci`` profile and in ``quick`` (``LIMIT_S``); and each *real-sized* target
(``tests.conformance_zoo.correct.REAL_SIZED``: two formats, packing, a decoder of its own, and one that has
all three) on its own, the median of its ``--repeat`` runs, at most 45 s in ``ci`` and 20 s in ``quick``
(``EACH_LIMIT_S``). (``nox -s conformance``
on the reference targets within 3 minutes from a warm environment is a target too; this command does not
measure it.) Speed is measured here, never asserted in a test.

How it measures: each (profile, target) is one ``python -m pytest -p no:cacheprovider
--conformance-profile P --cooker|--task-encoder|--wrapper SPEC`` (plus the target's options from the zoo,
e.g. ``--conformance-encoding preencoded``) in a fresh interpreter, started from a new empty temporary
directory (pytest collects only the suite there, and no project configuration applies) with the
repository root first on ``PYTHONPATH`` (so ``tests.conformance_zoo`` imports). Its seconds run from the
start of the process to its exit: interpreter start, imports, data generation and every property. The runs
go one at a time, profile by profile, targets in the zoo's order.

A run *completed* when pytest ran the suite to its end: exit status 0 (every property passed) or 1 (one
failed; its ``FAILED`` lines are kept). The median is over the completed runs; a run that did not
complete (timed out, or pytest could not start the suite) is listed as an error. The load guard
(:mod:`benchmarks.guard`; off unless ``--max-foreign``) records, per run, the cores other processes used
meanwhile.

Writes the JSON (``--out``) and a markdown table beside it (``.md``); prints the table. Exit status 1 if
a run did not pass, and, with ``--check-targets``, if a median is over its target.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .cli import add_guard_options, exit_status, guard_from_args, session_parser
from .guard import Guard, run_guarded
from .jobs import REPO_ROOT
from .report import machine_description, missed_targets, write_report
from .tables import conformance_markdown

__all__ = ["EACH_LIMIT_S", "LIMIT_S", "ZooTarget", "main", "pytest_command", "summarize", "zoo_targets"]

#: The project's speed targets: seconds of one target's run, the median over the zoo's correct targets...
LIMIT_S: dict[str, float] = {"ci": 20.0, "quick": 20.0}
#: ... and each real-sized target's own median over its runs.
EACH_LIMIT_S: dict[str, float] = {"ci": 45.0, "quick": 20.0}
DEFAULT_PROFILES = ("ci", "quick")
_KIND_OPTION = {"cooker": "--cooker", "task_encoder": "--task-encoder", "wrapper": "--wrapper"}
#: pytest's exit statuses for "the suite ran to its end": all passed, some failed.
_COMPLETED = (0, 1)


@dataclass(frozen=True)
class ZooTarget:
    """One correct target of the zoo: its name, kind, ``MODULE:ATTR`` spec and the suite's options for it."""

    name: str
    kind: str
    spec: str
    options: Mapping[str, Any]
    #: what makes it real-sized (``REAL_SIZED``), or None
    real_sized: str | None = None

    @property
    def attr(self) -> str:
        return self.spec.rpartition(":")[2]


def zoo_targets() -> list[ZooTarget]:
    """The zoo's correct targets (``tests.conformance_zoo.correct.CORRECT_TARGETS``), in its order."""
    from tests.conformance_zoo.correct import CORRECT_TARGETS, REAL_SIZED

    return [
        ZooTarget(name, kind, spec, dict(options), REAL_SIZED.get(name))
        for name, (kind, spec, options) in CORRECT_TARGETS.items()
    ]


def pytest_command(target: ZooTarget, profile: str) -> list[str]:
    """The command that checks ``target`` in ``profile``: each zoo option ``NAME`` as ``--conformance-NAME``
    (a list value: the option once per item)."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--conformance-profile", profile]
    command += [_KIND_OPTION[target.kind], target.spec]
    for name, value in target.options.items():
        option = _CLI_NAMES.get(name, name.replace("_", "-"))
        for item in value if isinstance(value, list | tuple) else [value]:
            command += [f"--conformance-{option}", str(item)]
    return command


#: API keywords whose command-line option is spelled otherwise (a repeatable option, one item each)
_CLI_NAMES = {"transforms": "transform"}


def _outcome(output: str) -> str:
    """pytest's last summary line (e.g. ``2 failed, 8 passed in 32.39s``), without the ``=`` rule."""
    lines = [line.strip("= ").strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_one(target: ZooTarget, profile: str, timeout: float) -> dict[str, Any]:
    """Check ``target`` in ``profile`` in a fresh process from a new empty folder; the run's record:
    ``seconds`` (None if it timed out), ``exit_status``, ``completed``, ``passed``, pytest's ``outcome``
    line, its ``failed`` lines, and ``error`` where it did not complete."""
    command = pytest_command(target, profile)
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    record: dict[str, Any] = {
        "profile": profile,
        "target": target.name,
        "kind": target.kind,
        "spec": target.spec,
        "real_sized": target.real_sized,
        "command": ["python", *command[1:]],
        "seconds": None,
        "exit_status": None,
        "completed": False,
        "passed": False,
        "outcome": "",
        "failed": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-conformance-") as cwd:
        started = time.perf_counter()
        try:
            done = subprocess.run(
                command,
                cwd=cwd,
                env={**os.environ, "PYTHONPATH": pythonpath},
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {**record, "error": f"timed out after {timeout:.0f} s"}
        seconds = time.perf_counter() - started
    record.update(
        seconds=seconds,
        exit_status=done.returncode,
        completed=done.returncode in _COMPLETED,
        passed=done.returncode == 0,
        outcome=_outcome(done.stdout),
        failed=[line for line in done.stdout.splitlines() if line.startswith("FAILED")],
    )
    if not record["completed"]:
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        record["error"] = f"exit status {done.returncode}: " + "\n".join(tail)
    return record


def summarize(runs: Sequence[Mapping[str, Any]], profiles: Sequence[str]) -> dict[str, Any]:
    """Per profile: runs, completed, passed, disturbed (the guard's retries ran out: other processes used
    more than ``--max-foreign`` cores), the most cores other processes used during one run, median/min/max
    seconds of the completed runs, the limit and whether the median meets it (None without a limit or a
    completed run); the target verdicts; an error (profile, target, exit status, what failed) per run that
    did not pass."""
    per_profile: dict[str, dict[str, Any]] = {}
    targets = []
    for profile in profiles:
        mine = [r for r in runs if r["profile"] == profile]
        per_target = _per_target_medians(mine)
        seconds = [r["seconds"] for r in mine if r["completed"]]
        median = statistics.median(per_target.values()) if per_target else None
        limit = LIMIT_S.get(profile)
        met = None if median is None or limit is None else median <= limit
        per_profile[profile] = {
            "runs": len(mine),
            "completed": len(seconds),
            "passed": sum(r["passed"] for r in mine),
            "disturbed": sum(bool(r.get("contaminated")) for r in mine),
            "foreign_cores_max": max((r.get("foreign_cores", 0.0) for r in mine), default=None),
            "median_s": median,
            "min_s": min(seconds) if seconds else None,
            "max_s": max(seconds) if seconds else None,
            "limit_s": limit,
            "met": met,
        }
        if limit is not None:
            targets.append(
                {
                    "target": f"{profile}: one target in at most {limit:g} s wall (median over the zoo's correct targets)",
                    "profile": profile,
                    "value": median,
                    "limit_s": limit,
                    "met": met,
                }
            )
            targets += _real_sized_targets(mine, per_target, profile, EACH_LIMIT_S.get(profile, limit))
    errors = [
        {
            "profile": r["profile"],
            "target": r["target"],
            "exit_status": r["exit_status"],
            "error": r.get("error") or "\n".join(r["failed"]),
        }
        for r in runs
        if not r["passed"]
    ]
    return {"profiles": per_profile, "targets": targets, "errors": errors}


def _per_target_medians(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per target: the median seconds of its completed runs (its ``--repeat`` repetitions)."""
    seconds: dict[str, list[float]] = {}
    for run in runs:
        if run["completed"]:
            seconds.setdefault(run["target"], []).append(run["seconds"])
    return {name: statistics.median(values) for name, values in seconds.items()}


def _real_sized_targets(
    runs: Sequence[Mapping[str, Any]], per_target: Mapping[str, float], profile: str, limit: float
) -> list[dict[str, Any]]:
    """One speed target per real-sized target run in ``profile``: its median within ``limit``; a target none
    of whose runs completed has no value and does not meet it."""
    out = []
    for name in dict.fromkeys(r["target"] for r in runs if r.get("real_sized")):
        features = next(r["real_sized"] for r in runs if r["target"] == name)
        repeats = sum(r["target"] == name for r in runs)
        value = per_target.get(name)
        out.append(
            {
                "target": f"{profile}: {name} ({features}) in at most {limit:g} s (median of {repeats} run(s))",
                "profile": profile,
                "real_sized": name,
                "value": value,
                "limit_s": limit,
                "met": value is not None and value <= limit,
            }
        )
    return out


def _select(parser: argparse.ArgumentParser, wanted: str | None) -> list[ZooTarget]:
    """The zoo targets named by ``--targets`` (attribute, ``MODULE:ATTR`` or full name), or all of them."""
    zoo = zoo_targets()
    if not wanted:
        return zoo
    chosen = []
    for item in (w.strip() for w in wanted.split(",") if w.strip()):
        found = [t for t in zoo if item in (t.attr, t.spec, t.name)]
        if not found:
            parser.error(f"--targets: no correct zoo target {item!r}; see --list")
        chosen += [t for t in found if t not in chosen]
    return chosen


def _parser() -> argparse.ArgumentParser:
    parser = session_parser(
        "python -m benchmarks.bench_conformance",
        __doc__,
        output_help="write the results here as JSON (and a .md table beside it); default: print only",
        output_flags=("--out", "--json"),
    )
    parser.add_argument(
        "--profile", default=",".join(DEFAULT_PROFILES), help="profiles, comma-separated (default ci,quick)"
    )
    parser.add_argument(
        "--targets",
        default=None,
        help="zoo targets, comma-separated, by attribute or MODULE:ATTR (e.g. DATACLASS_COOKER); default: all",
    )
    parser.add_argument("--list", action="store_true", help="list the zoo's correct targets and exit")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run (default 600)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of each (profile, target), interleaved (default 1)"
    )
    add_guard_options(parser, default_note="default: off")
    return parser


def _run_all(
    targets: Sequence[ZooTarget],
    profiles: Sequence[str],
    timeout: float,
    guard: Guard | None,
    repeat: int = 1,
) -> list[dict[str, Any]]:
    """Every (profile, target) run ``repeat`` times, repetition by repetition, under the guard; progress on
    stderr."""
    runs = []
    total = len(targets) * len(profiles) * repeat
    for profile, target in ((p, t) for _ in range(repeat) for p in profiles for t in targets):
        runs.append(run_guarded(lambda t=target, p=profile: run_one(t, p, timeout), guard))
        run = runs[-1]
        status = "error" if not run["completed"] else run["outcome"]
        seconds = "-" if run["seconds"] is None else f"{run['seconds']:.1f} s"
        print(
            f"[{len(runs)}/{total}] {profile:<5} {target.attr:<36} {seconds:>8}  {status} "
            f"(others {run.get('foreign_cores', float('nan')):.2f} cores, try {run['attempts']}"
            f"{', DISTURBED' if run.get('contaminated') else ''})",
            file=sys.stderr,
            flush=True,
        )
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        for target in zoo_targets():
            real = f"  [real-sized: {target.real_sized}]" if target.real_sized else ""
            print(f"{target.attr:<36} {target.kind:<13} {target.name}{real}")
        return 0
    from primus_energon.conformance.core.profiles import PROFILES

    profiles = [p.strip() for p in args.profile.split(",") if p.strip()]
    unknown = [p for p in profiles if p not in PROFILES]
    if unknown or not profiles:
        parser.error(f"--profile: use {', '.join(PROFILES)} (comma-separated), not {args.profile!r}")
    targets = _select(parser, args.targets)
    guard = guard_from_args(args, default_max_foreign=None)

    started = time.time()
    load_start = os.getloadavg()
    if args.repeat < 1:
        parser.error("--repeat: at least 1")
    runs = _run_all(targets, profiles, args.timeout, guard, args.repeat)
    summary = summarize(runs, profiles)
    report = {
        "benchmark": "primus-energon conformance speed",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_s": time.time() - started,
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "machine": machine_description(),
        "method": {
            "command": "python -m pytest -p no:cacheprovider --conformance-profile P --<kind> SPEC [options]",
            "cwd": "a new empty temporary directory per run",
            "pythonpath": str(REPO_ROOT),
            "timeout_s": args.timeout,
            "repeat": args.repeat,
            "max_foreign_cores": args.max_foreign,
        },
        "limits_s": {p: LIMIT_S[p] for p in profiles if p in LIMIT_S},
        "each_limits_s": {p: EACH_LIMIT_S[p] for p in profiles if p in EACH_LIMIT_S},
        **summary,
        "runs": runs,
    }
    table = conformance_markdown(runs, summary, profiles)
    if args.json is None:
        print(table)
    else:
        write_report(args.json, report, table)
    missed = bool(missed_targets(summary["targets"]))
    return exit_status(failed=bool(summary["errors"]), missed=missed, check_targets=args.check_targets)


if __name__ == "__main__":
    sys.exit(main())
