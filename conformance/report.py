"""Conformance reports: ``report.json`` (schema v1) and ``report.md``, beside pytest's ``junit.xml``."""

from __future__ import annotations

import datetime as _dt
import json
import platform
import sys
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA", "environment", "write_reports"]

SCHEMA = "primus-energon/conformance-report/v1"


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Versions and platform, for the report and the pytest header."""
    return {
        "versions": {
            "python": platform.python_version(),
            "primus-energon": _version("primus-energon"),
            "megatron-energon": _version("megatron-energon"),
            "torch": _version("torch"),
            "webdataset": _version("webdataset"),
            "hypothesis": _version("hypothesis"),
        },
        "platform": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "python_implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
    }


def write_reports(
    directory: str | Path,
    *,
    results: list[dict[str, Any]],
    targets: list[dict[str, Any]],
    profile: str,
    seed: int,
    exitstatus: int | None = None,
) -> dict[str, Any]:
    """Write ``report.json`` and ``report.md`` into ``directory``; returns the JSON document."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ordered = sorted(results, key=lambda r: (r["target"], r.get("number", 0)))
    document = {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "profile": profile,
        "seed": seed,
        **environment(),
        "targets": targets,
        "summary": dict(Counter(r["verdict"] for r in ordered)),
        "exitstatus": exitstatus,
        "results": ordered,
    }
    (out / "report.json").write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    lines = [
        "# Conformance report",
        "",
        f"Profile `{profile}`, seed {seed}; megatron-energon {document['versions']['megatron-energon']}, "
        f"torch {document['versions']['torch']}, Python {document['versions']['python']}.",
        "",
    ]
    for target in targets:
        rows = [r for r in ordered if r["target"] == target["target"]]
        lines += [
            f"## {target['kind']} `{target['target']}`",
            "",
            "| # | property | verdict | seconds | message |",
            "|---|---|---|---|---|",
        ]
        for r in rows:
            message = " ".join(str(r.get("message", "")).split())[:300].replace("|", "\\|")
            lines.append(
                f"| {r.get('number', '')} | {r['property']} | **{r['verdict']}** | {r.get('seconds', '')} | {message} |"
            )
        lines.append("")
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    return document
