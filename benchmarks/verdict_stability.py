"""Same command, same verdict: every zoo target (``tests/conformance_zoo``: the correct ones and the broken
ones) checked ``--runs`` times, each run in a fresh interpreter, and the verdicts compared claim by claim.

    python -m benchmarks.verdict_stability --runs 5 --out benchmarks/results/verdict-stability.json

One run is one fresh ``python -c`` that checks every target in turn with the Python API, in process, on the
properties the zoo's own tests use (a correct target on ``tests/test_conformance_zoo.FAST_PROPERTIES``, a
broken one on the property of the claim meant for it), ``quick`` profile, each target in a workspace of its
own; ``--parallel`` runs go side by side. A target is *stable* when every run
gives it the same verdict on every claim; the report lists each unstable one with the claims that differed
and their verdicts per run. (The properties that start fresh processes are covered, three runs each, by
``tests/test_conformance_same_verdict.py`` for the targets whose verdict could depend on luck.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .jobs import REPO_ROOT
from .report import machine_description

__all__ = ["main"]

_ONE_RUN = r"""
import json, sys, tempfile, warnings
warnings.simplefilter("ignore")
from primus_energon.conformance import check_cooker, check_task_encoder, check_wrapper
from tests.conformance_zoo.broken import BROKEN_TARGETS
from tests.conformance_zoo.correct import CORRECT_TARGETS
from tests.test_conformance_zoo import FAST_PROPERTIES
check = {"cooker": check_cooker, "task_encoder": check_task_encoder, "wrapper": check_wrapper}
targets = {f"correct: {n}": (k, s, o, FAST_PROPERTIES) for n, (k, s, o) in CORRECT_TARGETS.items()}
targets.update({f"broken: {n}": (k, f"tests.conformance_zoo.broken:{a}" if ":" not in a else f"tests.conformance_zoo.{a}", o,
                [claim.partition("/")[0]]) for n, (k, a, o, claim, _) in BROKEN_TARGETS.items()})
wanted = set(json.loads(sys.argv[1])) or set(targets)
out = {}
for name in sorted(wanted & set(targets)):
    kind, spec, options, properties = targets[name]
    with tempfile.TemporaryDirectory() as workdir:
        try:
            results = check[kind](spec, properties=properties, profile="quick", workdir=workdir, **options)
            out[name] = {c.id: c.verdict for r in results for c in r.claims}
        except Exception as error:
            out[name] = {"(run)": f"raised {type(error).__name__}: {error}"[:300]}
    print(json.dumps({"target": name, "verdicts": out[name]}), flush=True)
"""


def _one_run(targets: list[str], timeout: float) -> dict[str, dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with tempfile.TemporaryDirectory(prefix="verdict-stability-") as cwd:
        run = subprocess.run(
            [sys.executable, "-c", _ONE_RUN, json.dumps(targets)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    out = {}
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            out[record["target"]] = record["verdicts"]
    if run.returncode != 0:
        out["(run)"] = {"(exit)": f"status {run.returncode}: {run.stderr[-500:]}"}
    return out


def _unstable(runs: list[dict[str, dict[str, str]]]) -> dict[str, dict[str, list[str | None]]]:
    out: dict[str, dict[str, list[str | None]]] = {}
    for target in sorted(set().union(*runs)):
        claims = sorted(set().union(*(run.get(target, {}) for run in runs)))
        differ = {
            claim: [run.get(target, {}).get(claim) for run in runs]
            for claim in claims
            if len({run.get(target, {}).get(claim) for run in runs}) > 1
        }
        if differ:
            out[target] = differ
    return out


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Verdict stability: the zoo, run after run",
        "",
        f"{result['runs']} runs, each a fresh interpreter checking every zoo target in process (quick profile, "
        f"the zoo tests' properties); {result['created']}; {result['seconds']:.0f} s.",
        "",
        f"- targets: {result['targets']}; claims compared: {result['claims']}",
        f"- stable (the same verdict on every claim in every run): {result['targets'] - len(result['unstable'])}",
        f"- unstable: {len(result['unstable'])}",
    ]
    for target, claims in result["unstable"].items():
        lines.append(f"  - {target}: " + "; ".join(f"{c} {v}" for c, v in claims.items()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.verdict_stability", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--parallel", type=int, default=1, help="runs side by side (default 1)")
    parser.add_argument("--targets", default="", help="comma-separated zoo target names (default: all)")
    parser.add_argument("--timeout", type=float, default=5400.0, help="seconds one run may take")
    parser.add_argument("--out", type=Path)
    options = parser.parse_args(argv)
    targets = [t for t in options.targets.split(",") if t]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, options.parallel)) as pool:
        runs = list(pool.map(lambda _: _one_run(targets, options.timeout), range(options.runs)))
    unstable = _unstable(runs)
    result = {
        "runs": options.runs,
        "targets": len(set().union(*runs)),
        "claims": sum(len(v) for v in runs[0].values()),
        "unstable": unstable,
        "seconds": time.monotonic() - started,
        "created": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_description(),
        "verdicts": runs[0],
    }
    print(_markdown(result))
    if options.out:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(json.dumps(result, indent=2) + "\n")
        options.out.with_suffix(".md").write_text(_markdown(result))
    return 1 if unstable else 0


if __name__ == "__main__":
    raise SystemExit(main())
