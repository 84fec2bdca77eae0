"""Conformance memory and temporary data: the peak memory of a suite run summed over its whole process tree,
and the peak size of the data it writes, on a user's own WAN-sized dataset.

    python -m benchmarks.bench_conformance_memory --out benchmarks/results/conformance-memory.json
    python -m benchmarks.bench_conformance_memory --profile ci --samples 8

What it runs: ``primus-synth generate`` writes the dataset (default: 8 samples of WAN 2.1's sizes in
bfloat16, ``latents=16x21x60x104`` and ``prompt_embeds=512x4096``: 64 MB), then ``python -m pytest
--conformance-profile P --task-encoder primus_energon:EncodedDiffusionTaskEncoder --conformance-dataset DIR``
runs in a fresh interpreter, from an empty folder, with ``TMPDIR`` a fresh folder of its own (so every
temporary file of the run and its children lands there).

How it measures, every ``--interval`` seconds while the run lasts:

* memory: the sum of every live process of the run's tree (pytest, the supervised processes, fork servers
  and their children, loader workers) of its proportional set size (``Pss`` in ``/proc/PID/smaps_rollup``:
  pages shared between processes, as forked ones share, count once in the sum); the largest sum seen is the
  peak. The largest single process is reported beside it;
* temporary data: the bytes of the files under the run's ``TMPDIR`` and its folder (allocated blocks); the
  largest total seen is the peak.

The project's targets (issue: "Numbers that mean what they say"): the ``quick`` run on the default data at
most 4 GB summed over the tree and 1.5 GB of temporary data, with the same verdicts. Measured here, never
asserted in a test. Writes the JSON (``--out``) and a markdown table beside it (``.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .jobs import REPO_ROOT
from .report import machine_description

__all__ = ["LIMITS", "main", "measure", "tree"]

#: the targets: peak bytes summed over the process tree, peak bytes of temporary data (quick, default data)
LIMITS = {"memory_bytes": 4e9, "temporary_bytes": 1.5e9}
WAN_SHAPES = ("latents=16x21x60x104", "prompt_embeds=512x4096")


def tree(root: int) -> list[int]:
    """``root`` and every live descendant (by parent links in /proc, whatever session they moved to)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as stat:
                parent = int(stat.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, []))
    return out


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _disk_bytes(folders: list[Path]) -> int:
    total = 0
    for folder in folders:
        for path, _, files in os.walk(folder):
            for name in files:
                try:
                    total += os.lstat(os.path.join(path, name)).st_blocks * 512
                except OSError:
                    pass
    return total


def measure(
    command: list[str], *, cwd: Path, env: dict[str, str], interval: float, timeout: float
) -> dict[str, Any]:
    """Run ``command`` and sample its tree's memory and its folders' bytes until it exits."""
    folders = [cwd, Path(env["TMPDIR"])]
    peak = {"memory_bytes": 0, "largest_process_bytes": 0, "processes": 0, "temporary_bytes": 0}
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(process.stdout or []), daemon=True)
    reader.start()
    while process.poll() is None:
        pids = tree(process.pid)
        sizes = [_pss(pid) for pid in pids]
        peak["memory_bytes"] = max(peak["memory_bytes"], sum(sizes))
        peak["largest_process_bytes"] = max(peak["largest_process_bytes"], max(sizes, default=0))
        peak["processes"] = max(peak["processes"], len(pids))
        peak["temporary_bytes"] = max(peak["temporary_bytes"], _disk_bytes(folders))
        if time.monotonic() - started > timeout:
            process.kill()
            break
        time.sleep(interval)
    process.wait()
    reader.join(5)
    text = "".join(output)
    summary = [line for line in text.splitlines() if " passed" in line or " failed" in line][-1:]
    failed = sorted({line.split()[1] for line in text.splitlines() if line.startswith("[") and "]" in line})
    return {
        **peak,
        "seconds": round(time.monotonic() - started, 1),
        "exit_status": process.returncode,
        "summary": summary[0].strip("= ") if summary else "",
        "failed_claims": failed,
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_conformance_memory", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--profile", default="quick", choices=["quick", "ci", "thorough"])
    parser.add_argument("--samples", type=int, default=8, help="samples of the generated dataset (default 8)")
    parser.add_argument("--shape", action="append", help="NAME=DIMS (default WAN 2.1's sizes)")
    parser.add_argument(
        "--target", default="primus_energon:EncodedDiffusionTaskEncoder", help="TaskEncoder spec"
    )
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between samples (default 0.2)")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, help="JSON file to write (and a .md beside it)")
    return parser


def _machine(machine: dict[str, Any]) -> str:
    return (
        f"{machine.get('cpu')}, {machine.get('cpus_usable')} cores, {machine.get('memory_gb')} GB; torch "
        f"{machine.get('torch')}, megatron-energon {machine.get('megatron_energon')}; commit "
        f"{str(machine.get('git_commit'))[:10]}"
    )


def _markdown(result: dict[str, Any]) -> str:
    gb = 1e9
    lines = [
        "# Conformance memory and temporary data",
        "",
        _machine(result["machine"]) + f"; {result['created']}",
        "",
        f"`{' '.join(result['command'])}` on {result['samples']} samples ({', '.join(result['shapes'])}, bfloat16, "
        f"{result['dataset_bytes'] / 1e6:.0f} MB)",
        "",
        "| profile | peak memory, process tree (PSS) | largest process | processes | peak temporary data | seconds | result |",
        "|---|---|---|---|---|---|---|",
        f"| {result['profile']} | {result['memory_bytes'] / gb:.2f} GB (limit {LIMITS['memory_bytes'] / gb:.1f}) "
        f"| {result['largest_process_bytes'] / gb:.2f} GB | {result['processes']} "
        f"| {result['temporary_bytes'] / gb:.2f} GB (limit {LIMITS['temporary_bytes'] / gb:.1f}) "
        f"| {result['seconds']} | {result['summary']} |",
        "",
        f"Claims that did not pass: {', '.join(result['failed_claims']) or 'none'}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    shapes = options.shape or list(WAN_SHAPES)
    scratch = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    try:
        data = scratch / "data"
        generate = [sys.executable, "-m", "primus_energon.synthetic", "generate", str(data), "--samples", str(options.samples),
                    "--dtype", "bfloat16", "--quiet", *[arg for shape in shapes for arg in ("--shape", shape)]]  # fmt: skip
        subprocess.run(generate, check=True)
        dataset_bytes = sum(p.stat().st_size for p in data.rglob("*.tar"))
        run_dir, tmp = scratch / "run", scratch / "tmp"
        run_dir.mkdir()
        tmp.mkdir()
        env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO_ROOT)}
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--conformance-profile", options.profile,
                   "--task-encoder", options.target, "--conformance-dataset", str(data)]  # fmt: skip
        result = measure(command, cwd=run_dir, env=env, interval=options.interval, timeout=options.timeout)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result.update(
        profile=options.profile,
        samples=options.samples,
        shapes=shapes,
        dataset_bytes=dataset_bytes,
        command=[
            "pytest",
            "--conformance-profile",
            options.profile,
            "--task-encoder",
            options.target,
            "--conformance-dataset",
            "DATA",
        ],  # fmt: skip
        machine=machine_description(),
        created=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        limits=LIMITS,
    )
    print(_markdown(result))
    if options.out:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(json.dumps(result, indent=2) + "\n")
        options.out.with_suffix(".md").write_text(_markdown(result))
    return 0 if result["exit_status"] in (0, 1) else 1


if __name__ == "__main__":
    raise SystemExit(main())
