"""examples/demo.py, run as a user runs it: a fresh interpreter, small sizes, every check reported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).parents[1] / "examples" / "demo.py"

pytestmark = pytest.mark.slow


def test_the_demo_passes_every_check(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(DEMO),
            "--out",
            str(tmp_path),
            "--samples",
            "16",
            "--batch-size",
            "4",
            "--workers",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    checks = [line for line in run.stdout.splitlines() if line.startswith("[")]
    names = [line.partition("] ")[2].partition(":")[0] for line in checks]
    assert names == ["batch shapes", "epochs", "resume", "raw images", "blend dispatch", "malicious shard"]
    assert all(line.startswith("[PASS]") for line in checks), checks


def test_the_demo_refuses_too_few_samples() -> None:
    run = subprocess.run(
        [sys.executable, str(DEMO), "--samples", "4", "--batch-size", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0 and "--samples must be at least 2 x --batch-size (8)" in run.stderr
