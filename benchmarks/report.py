"""Writing a benchmark session's summary, shared by every session (CPU, GPU, conformance speed).

A session's report is one JSON file (``--json``/``--out``) with its markdown table beside it (the same
name, ``.md``), and the table printed; :func:`machine_description` says what the numbers were measured on,
and :func:`markdown_rows` / :func:`met_cell` / :func:`missed_targets` are the pieces the tables and verdicts
share. A target verdict is a dict with at least ``target`` (what is promised) and ``met`` (True, False,
or None where it was not measured).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .jobs import REPO_ROOT

__all__ = [
    "machine_description",
    "markdown_rows",
    "met_cell",
    "missed_targets",
    "write_json",
    "write_report",
]


def _proc_field(path: str, prefix: str, pick: int | None) -> str | None:
    """The value of the first line of ``/proc/...`` starting with ``prefix``, or None."""
    file = Path(path)
    if not file.exists():
        return None
    for line in file.read_text().splitlines():
        if line.startswith(prefix):
            return line.split(":", 1)[1].strip() if pick is None else line.split()[pick]
    return None


def _git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def machine_description() -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, memory, versions (torch, Energon, ...), git commit."""
    from importlib.metadata import version

    import numpy
    import torch
    import webdataset

    memory_kb = _proc_field("/proc/meminfo", "MemTotal", 1) or "0"
    return {
        "cpu": _proc_field("/proc/cpuinfo", "model name", None) or platform.processor(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "memory_gb": round(int(memory_kb) / 1e6, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "megatron_energon": version("megatron-energon"),
        "webdataset": getattr(webdataset, "__version__", version("webdataset")),
        "numpy": numpy.__version__,
        "git_commit": _git_commit(),
    }


def markdown_rows(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A markdown table: the header line, the rule, one line per row (cells as ``str()``)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def met_cell(met: bool | None) -> str:
    """A verdict as a table cell: ``yes``, ``**no**``, or ``-`` where it was not measured."""
    return "-" if met is None else ("yes" if met else "**no**")


def missed_targets(targets: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The verdicts that were measured and missed (``met is False``)."""
    return [t for t in targets if t["met"] is False]


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` to ``path`` as indented JSON (values JSON lacks as ``str()``), creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


def write_report(path: Path, report: Mapping[str, Any], markdown: str) -> None:
    """The session's summary: ``report`` as JSON at ``path``, ``markdown`` beside it (``.md``), and printed."""
    write_json(path, report)
    path.with_suffix(".md").write_text(markdown + "\n")
    print(markdown)
