"""The same command gives the same verdict: targets whose behaviour depends on the state of the global
generators, or that crash in a loader worker, are run several times as users run them (``pytest
--cooker/--task-encoder``, supervised, fresh processes forked) and must get identical verdicts, claim by
claim, every time (slow tier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[1]
RUNS = 3

#: option, spec, properties (empty: the quick profile's all), why its verdict could depend on luck
TARGETS = {
    "packs shuffled with the global random (Bridge WAN before #4237)": (
        "--task-encoder",
        "tests.conformance_zoo.packing:GlobalShufflePacksTaskEncoder",
        ["accepted", "packing", "determinism"],
    ),
    "jitter from the global random in a cook": (
        "--cooker",
        "tests.conformance_zoo.determinism_broken:cook_unseeded_jitter",
        ["accepted", "purity", "determinism", "resume"],
    ),
    "a global torch draw it ignores": (
        "--cooker",
        "tests.conformance_zoo.broken:cook_draws_from_global_torch",
        ["accepted", "purity", "determinism"],
    ),
    "an unseeded augmentation in encode_sample": (
        "--task-encoder",
        "tests.conformance_zoo.broken:UnseededAugmentationTaskEncoder",
        ["accepted", "fidelity", "resume", "restart"],
    ),
    "a segfault in loader workers only": (
        "--task-encoder",
        "tests.conformance_zoo.unruly:SegfaultsInWorkers",
        [],
    ),
}


def _verdicts(cwd: Path, option: str, spec: str, properties: list[str]) -> dict[str, str]:
    report = cwd / "report"
    selected = [arg for prop in properties for arg in ("--conformance-property", prop)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_XDIST_WORKER", None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--conformance-profile", "quick",
         option, spec, *selected, "--conformance-report", str(report)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads((report / "report.json").read_text())
    verdicts = {claim["id"]: claim["verdict"] for result in data["results"] for claim in result["claims"]}
    assert "error" not in verdicts.values(), run.stdout[-3000:]
    return verdicts


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_run_gives_the_same_verdict_claim_by_claim(name: str, tmp_path: Path) -> None:
    option, spec, properties = TARGETS[name]
    runs = []
    for index in range(RUNS):
        folder = tmp_path / f"run{index}"
        folder.mkdir()
        runs.append(_verdicts(folder, option, spec, properties))
    assert "fail" in runs[0].values(), runs[0]  # each of them has a defect to catch, every time
    for index, verdicts in enumerate(runs[1:], start=1):
        differ = {c: (runs[0].get(c), verdicts.get(c)) for c in runs[0].keys() | verdicts.keys()
                  if runs[0].get(c) != verdicts.get(c)}  # fmt: skip
        assert not differ, f"run {index} differs from run 0: {differ}"
