"""Smoke test of the benchmarks: the throughput harness runs end to end in ``--quick`` mode on tiny data
and writes valid JSON; the GPU session skips with a reason where there is no GPU; the conformance-speed
benchmark writes its summary for one target. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ("reference", "floor", "guide", "webdataset", "tarfile")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The JSON of one ``--quick`` run on the tiny payload: every pipeline but the diagnostic one, nw=0."""
    out = tmp_path_factory.mktemp("bench") / "smoke.json"
    command = [
        sys.executable, "-m", "benchmarks.throughput", "--json", str(out), "--quick", "--sizes", "tiny",
        "--pipelines", ",".join(PIPELINES), "--no-plot", "--no-decode", "--passes", "1", "--max-foreign", "-1",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"harness failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
    assert out.with_suffix(".md").is_file()
    return json.loads(out.read_text())


@pytest.mark.slow
def test_quick_run_writes_every_pipeline_and_ceiling(report: dict) -> None:
    assert report["quick"] is True and report["errors"] == []
    rows = {(r["pipeline"], r["num_workers"]): r for r in report["rows"] if r["size"] == "tiny"}
    for name in (*PIPELINES, "raw_read", "memcpy"):
        assert (name, 0) in rows, f"no result for {name}"
        assert rows[(name, 0)]["samples_per_s"] > 0
    assert rows[("reference", 0)]["batch"]["latents"] == [[4, 4, 8, 8], "float32"]
    assert rows[("floor", 0)]["batch"]["latents"][1] == "uint8"
    assert report["machine"]["cpus_usable"] >= 1 and "load_avg_start" in report


@pytest.mark.slow
def test_quick_run_names_its_ratios(report: dict) -> None:
    ratios = report["ratios"]["tiny"]
    for other in ("raw_read", "memcpy", "floor", "guide", "webdataset", "tarfile"):
        assert ratios[f"nw=0: reference/{other}"]["ratio"] > 0
    assert [t["target"] for t in report["targets"]], "targets are listed even when their size did not run"


@pytest.mark.slow
def test_plot_writes_a_png(report: dict, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks.plot import plot_results

    png = plot_results(report, tmp_path / "plot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gpu_session_skips_with_a_reason_without_cuda(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the GPU session would run, not skip")
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--json", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "SKIPPED" in done.stdout
    result = json.loads(out.read_text())
    assert result["skipped"] is True and "cuda" in result["reason"].lower()


@pytest.mark.slow
def test_conformance_speed_benchmark_writes_its_summary(tmp_path: Path) -> None:
    """One fast zoo target in the quick profile: the JSON has a run record, the profile's median against its
    limit, a target verdict and the machine; a markdown table beside it. No timing is asserted."""
    out = tmp_path / "speed.json"
    command = [
        sys.executable, "-m", "benchmarks.bench_conformance", "--profile", "quick", "--targets", "PlainWrapper",
        "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), f"benchmark failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
    report = json.loads(out.read_text())
    assert out.with_suffix(".md").is_file()
    (run,) = report["runs"]
    assert run["profile"] == "quick" and run["spec"] == "tests.conformance_zoo.wrappers:PlainWrapper"
    assert run["completed"] is True and isinstance(run["seconds"], float)
    assert {"exit_status", "passed", "outcome", "command"} <= run.keys()
    quick = report["profiles"]["quick"]
    assert quick["runs"] == quick["completed"] == 1 and quick["limit_s"] == 20.0
    assert {"median_s", "min_s", "max_s", "met"} <= quick.keys()
    (target,) = report["targets"]
    assert target["profile"] == "quick" and target["limit_s"] == 20.0 and "met" in target
    assert report["machine"]["cpus_usable"] >= 1 and "errors" in report


def test_conformance_speed_holds_each_real_sized_target_to_the_limit() -> None:
    """The zoo's real-sized targets (several formats, packing, an own decoder) are listed; each gets a
    target of its own (its median over repeats against the limit), beside the median over all targets."""
    from benchmarks.bench_conformance import summarize, zoo_targets
    from benchmarks.tables import conformance_markdown

    real = [t for t in zoo_targets() if t.real_sized]
    assert any("packing" in t.real_sized and "two formats" in t.real_sized for t in real)
    assert {"two formats", "packing", "own decoder"} <= {f for t in real for f in t.real_sized.split(", ")}

    def run(target: str, seconds: float | None, real_sized: str | None) -> dict:
        done = seconds is not None
        return {"profile": "ci", "target": target, "kind": "task_encoder", "seconds": seconds,
                "completed": done, "passed": done, "failed": [], "exit_status": 0 if done else None,
                "real_sized": real_sized}  # fmt: skip

    runs = [
        run("small", 10.0, None), run("small", 12.0, None),
        run("packed", 40.0, "packing"), run("packed", 50.0, "packing"), run("packed", 44.0, "packing"),
        run("never", None, "own decoder"),
    ]  # fmt: skip
    summary = summarize(runs, ["ci"])
    assert summary["profiles"]["ci"]["median_s"] == 27.5  # median of the per-target medians 11 and 44
    each = {t["real_sized"]: t for t in summary["targets"] if t.get("real_sized")}
    assert each["packed"]["value"] == 44.0 and each["packed"]["met"] is True  # each within 45 s
    assert summary["profiles"]["ci"]["limit_s"] == 20.0 and summary["profiles"]["ci"]["met"] is False
    assert "(median of 3 run(s))" in each["packed"]["target"] and "(packing)" in each["packed"]["target"]
    assert each["never"]["value"] is None and each["never"]["met"] is False
    table = conformance_markdown(runs, summary, ["ci"])
    assert "44.0 (40.0-50.0, 3/3 runs)" in table and "Each real-sized target" in table
