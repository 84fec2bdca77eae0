"""One measurement in a fresh interpreter: the harnesses (``throughput``, ``gpu``) run each job as
``python -m MODULE --job JSON``, which prints its result as one ``RESULT {json}`` line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["REPO_ROOT", "emit_result", "spawn_job"]

REPO_ROOT = Path(__file__).resolve().parents[1]
_PREFIX = "RESULT "


def emit_result(result: Mapping[str, Any]) -> None:
    """Print a job's result where :func:`spawn_job` finds it."""
    print(_PREFIX + json.dumps(result), flush=True)


def spawn_job(module: str, job: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """Run ``python -m module --job JSON`` in a fresh interpreter; its result, or ``{"error": ...}`` with the
    exit status and the last lines of its output."""
    command = [sys.executable, "-m", module, "--job", json.dumps(job)]
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith(_PREFIX)]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
        return {"error": f"exit status {done.returncode}: " + "\n".join(tail)}
    return json.loads(lines[-1].removeprefix(_PREFIX))
