"""The shard fuzzer (`tests/fuzz_shards.py`) with a CI-sized budget, in a subprocess capped in wall-clock
time and address space (so a hang or a runaway allocation fails this test rather than the machine).
``nox -s fuzz`` runs the same search for longer."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: examples in CI, the child's wall-clock and address-space caps
EXAMPLES = 40
TIME_CAP_S = 540
MEMORY_CAP = 6 << 30


def _cap() -> None:  # pragma: no cover - runs in the child
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def test_mutated_shards_in_a_capped_process(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "FUZZ_EXAMPLES": str(EXAMPLES),
        "FUZZ_FINDINGS": str(tmp_path),
    }
    env.pop("FUZZ_SECONDS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            str(REPO / "tests/fuzz_shards.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIME_CAP_S,
        preexec_fn=_cap,
        start_new_session=True,
    )
    findings = sorted(p.name for p in tmp_path.glob("finding-*.tar"))
    assert proc.returncode == 0, f"findings {findings}\n" + "\n".join(
        line[:300] for line in (proc.stdout + proc.stderr).splitlines()[-60:]
    )
