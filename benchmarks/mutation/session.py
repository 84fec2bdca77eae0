"""Running mutants against the conformance suite, one fresh ``pytest`` process each.

For each mutant a temporary directory receives a copy of the library modules of ``primus_energon`` as the
package :data:`~benchmarks.mutation.operators.MUTANT_PACKAGE` and a copy of each zoo module that is mutated
(:data:`~benchmarks.mutation.operators.ZOO_SUBJECTS`: the packing and raw-pipeline TaskEncoders, whose
``primus_energon`` imports are pointed at the mutant package), with the mutant's file replaced by its mutated text. That directory goes first on
``PYTHONPATH``, and ``python -m pytest --conformance-profile P --cooker|--task-encoder|--wrapper
MODULE:ATTR --conformance-report DIR`` runs from an empty working directory (no project configuration
applies; the suite's own child processes inherit the path). The claims' verdicts are read back from
``DIR/report.json``.

Each target is first run unmutated the same way (the *baseline*): a claim that does not pass on the
baseline cannot kill a mutant of that target (it is reported as baseline noise), and a baseline that does
not complete makes its mutants unjudged rather than killed.

Verdicts of one mutant: ``killed`` (a defect claim failed, or errored, where it passed on the baseline),
``advised`` (only advice claims reported it), ``survived`` (every claim as on the baseline), ``timeout``
(the run did not finish within ``timeout`` seconds: the suite hung, which it must never do, so it is not
counted as a kill) or ``broken`` (pytest could not start the suite: a usage error, reported with its
output; not a kill either). A mutant's result is cached in ``RESULTS/mutants/<id>.json`` keyed by the hash of its mutated
source and the profile, so an interrupted session goes on where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .operators import (
    MUTANT_PACKAGE,
    REPO_ROOT,
    TARGETS,
    ZOO_SUBJECTS,
    Mutant,
    mutant_diff,
    mutated_source,
)

__all__ = ["RunResult", "build_tree", "run_target", "run_mutant", "run_baseline", "judge"]

LIBRARY = REPO_ROOT / "primus_energon"
#: claim verdicts that mean "this claim reported something"
_REPORTED = ("fail", "error", "advice")


@dataclass
class RunResult:
    """One pytest run of a target (mutated or not)."""

    id: str
    target: str
    profile: str
    status: str  # completed | timeout | broken | not run
    seconds: float
    returncode: int | None
    #: claim id -> verdict (from report.json)
    claims: dict[str, str] = field(default_factory=dict)
    #: claim id -> first line of its message, for the claims that reported something
    messages: dict[str, str] = field(default_factory=dict)
    output_tail: str = ""
    key: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _copy_library(destination: Path) -> None:
    shutil.copytree(
        LIBRARY,
        destination / MUTANT_PACKAGE,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "synthetic", "conformance"),
    )
    for path, module in ZOO_SUBJECTS.items():
        text = (REPO_ROOT / path).read_text(encoding="utf-8")
        (destination / f"{module}.py").write_text(_retarget(text), encoding="utf-8")


def _retarget(text: str) -> str:
    """A zoo module, importing what it takes from the library from the mutant package."""
    return text.replace("from primus_energon import", f"from {MUTANT_PACKAGE} import")


def build_tree(destination: Path, mutant: Mutant | None) -> None:
    """Write the importable copy into ``destination``, with ``mutant`` applied (None: unmutated)."""
    _copy_library(destination)
    if mutant is None:
        return
    text = mutated_source(mutant)
    if mutant.file in ZOO_SUBJECTS:
        (destination / f"{ZOO_SUBJECTS[mutant.file]}.py").write_text(_retarget(text), encoding="utf-8")
    else:
        relative = Path(mutant.file).relative_to("primus_energon")
        (destination / MUTANT_PACKAGE / relative).write_text(text, encoding="utf-8")


def _target_args(target: str) -> list[str]:
    option, module, attr = TARGETS[target]
    return [f"{option}={module}:{attr}"]


def run_target(
    run_id: str,
    target: str,
    mutant: Mutant | None,
    *,
    profile: str,
    timeout: float,
    properties: Sequence[str] = (),
    nice: int = 10,
) -> RunResult:
    """One fresh pytest process on ``target`` (mutated by ``mutant``, or the baseline)."""
    with tempfile.TemporaryDirectory(prefix=f"mutation-{run_id}-") as tmp:
        root = Path(tmp)
        tree, work, report = root / "tree", root / "work", root / "report"
        tree.mkdir()
        work.mkdir()
        build_tree(tree, mutant)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(tree), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
        )
        env.pop("PYTEST_ADDOPTS", None)
        env.pop("PYTEST_XDIST_WORKER", None)
        command = [
            *(["nice", "-n", str(nice)] if nice and shutil.which("nice") else []),
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--rootdir={work}",
            f"--conformance-profile={profile}",
            f"--conformance-report={report}",
            *_target_args(target),
            *[f"--conformance-property={p}" for p in properties],
        ]
        started = time.monotonic()
        # its own session, so a timeout ends the suite's child processes too
        process = subprocess.Popen(
            command,
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=timeout)
            status = "completed"
        except subprocess.TimeoutExpired:
            _kill_group(process)
            output, _ = process.communicate()
            status = "timeout"
        seconds = round(time.monotonic() - started, 1)
        result = RunResult(
            run_id, target, profile, status, seconds, process.returncode, output_tail=output[-3000:]
        )
        report_file = report / "report.json"
        if status == "completed" and report_file.is_file():
            document = json.loads(report_file.read_text(encoding="utf-8"))
            for entry in document.get("results", []):
                for claim in entry.get("claims", []):
                    result.claims[claim["id"]] = claim["verdict"]
                    if claim["verdict"] in _REPORTED:
                        first = (claim.get("message") or "").strip().splitlines()
                        result.messages[claim["id"]] = (first[0] if first else "")[:300]
        elif status == "completed":
            result.status = "broken"  # pytest did not run the suite (usage error, crash at start)
        return result


def _kill_group(process: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()


def _key(mutant: Mutant | None, target: str, profile: str, properties: Sequence[str]) -> str:
    """What a cached result must match: the mutated source (and the library it is copied from), the profile."""
    digest = hashlib.sha256()
    for path in sorted(LIBRARY.glob("*.py")) + [REPO_ROOT / p for p in ZOO_SUBJECTS]:
        digest.update(path.read_bytes())
    if mutant is not None:
        digest.update(mutated_source(mutant).encode())
    digest.update(f"{target}|{profile}|{','.join(properties)}".encode())
    return digest.hexdigest()[:16]


def _cached(path: Path, key: str) -> RunResult | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("key") != key:
        return None
    return RunResult(**data)


def _run_cached(
    path: Path,
    run_id: str,
    target: str,
    mutant: Mutant | None,
    *,
    profile: str,
    timeout: float,
    properties: Sequence[str],
    fresh: bool,
    log: Callable[[str], None],
    cached_only: bool = False,
) -> RunResult | None:
    key = _key(mutant, target, profile, properties)
    cached = None if fresh else _cached(path, key)
    if cached is not None or cached_only:
        return cached
    result = run_target(run_id, target, mutant, profile=profile, timeout=timeout, properties=properties)
    result.key = key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    return result


def run_baseline(target: str, results_dir: Path, **options: Any) -> RunResult | None:
    """The unmutated target, run the same way as its mutants (cached like them; with ``cached_only``, the
    cached result or None)."""
    return _run_cached(
        results_dir / "baselines" / f"{target}.json", f"baseline-{target}", target, None, **options
    )


def run_mutant(mutant: Mutant, results_dir: Path, **options: Any) -> RunResult | None:
    """One mutant (cached: see the module docstring; with ``cached_only``, the cached result or None)."""
    return _run_cached(
        results_dir / "mutants" / f"{mutant.id}.json", mutant.id, mutant.target, mutant, **options
    )


def judge(mutant: Mutant, result: RunResult, baseline: RunResult, advice_claims: set[str]) -> dict[str, Any]:
    """The verdict on one mutant from its run and its target's baseline (see the module docstring)."""
    detected = {}
    if result.status == "completed" and baseline.status == "completed":
        for claim, verdict in result.claims.items():
            if verdict in _REPORTED and baseline.claims.get(claim) not in _REPORTED:
                detected[claim] = verdict
    defects = sorted(c for c, v in detected.items() if v in ("fail", "error") and c not in advice_claims)
    advice = sorted(c for c in detected if c not in defects)
    if result.status == "not run":
        verdict = "not run"
    elif baseline.status != "completed":
        verdict = "unjudged"
    elif result.status == "timeout":
        verdict = "timeout"
    elif result.status == "broken":
        verdict = "broken"
    elif defects:
        verdict = "killed"
    elif advice:
        verdict = "advised"
    else:
        verdict = "survived"
    by_meant = sorted(set(mutant.meant) & set(detected))
    return {
        "id": mutant.id,
        "operator": mutant.operator,
        "target": mutant.target,
        "file": mutant.file,
        "description": mutant.description,
        "meant": list(mutant.meant),
        "verdict": verdict,
        "status": result.status,
        "seconds": result.seconds,
        "detected_by": detected,
        "killed_by": defects,
        "advised_by": advice,
        "by_meant": by_meant,
        "as_meant": verdict in ("killed", "advised") and bool(by_meant),
        # the score counts failing claims only: a defect claim meant for the mutant failed (or errored)
        "failed_as_meant": bool(set(mutant.meant) & set(defects)),
        # a mutant whose every meant claim is advice is scored apart (its defect is advice by design)
        "advice_meant": bool(mutant.meant) and all(c in advice_claims for c in mutant.meant),
        "messages": {c: result.messages.get(c, "") for c in detected},
        "noise": sorted(c for c, v in baseline.claims.items() if v in _REPORTED),
        "diff": mutant_diff(mutant),
        "output_tail": result.output_tail if verdict in ("broken", "unjudged", "survived") else "",
    }
