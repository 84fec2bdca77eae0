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

from ..core.claims import Harm

__all__ = ["SCHEMA", "describe_derived", "environment", "write_reports"]

SCHEMA = "primus-energon/conformance-report/v2"


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
            "multi-storage-client": _version("multi-storage-client"),
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


#: harm labels in report order (worst first)
_HARM_ORDER = {harm.label: harm.value for harm in Harm}


def _cell(text: Any, limit: int) -> str:
    flat = " ".join(str(text or "").split())
    return (flat[:limit] + ("..." if len(flat) > limit else "")).replace("|", "\\|")


def write_reports(
    directory: str | Path,
    *,
    results: list[dict[str, Any]],
    targets: list[dict[str, Any]],
    profile: str,
    seed: int,
    exitstatus: int | None = None,
    strict: bool = False,
    transforms: list[str] | None = None,
) -> dict[str, Any]:
    """Write ``report.json`` and ``report.md`` into ``directory``; returns the JSON document.

    ``report.json`` (schema v2): ``results`` (one per target and property, each with its ``claims``: id,
    harm, verdict, message, fix, examined), ``targets`` (each with the data ``formats`` it was checked on and
    those it declares but was not), ``claims`` (the tally of claim verdicts), ``advice`` (every
    advice claim that reported something: target, claim id, message, fix), ``inconclusive`` (every claim
    the suite could not judge: target, claim id, message) and ``failures`` (every failed claim, worst
    first)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ordered = sorted(results, key=lambda r: (r["target"], r.get("number", 0)))
    claims = [(r["target"], c) for r in ordered for c in r.get("claims", [])]
    advice = [
        {"target": t, "claim": c["id"], "message": c["message"], "fix": c.get("fix", "")}
        for t, c in claims
        if c["verdict"] == "advice"
    ]
    inconclusive = [
        {"target": t, "claim": c["id"], "message": c["message"]}
        for t, c in claims
        if c["verdict"] == "inconclusive"
    ]
    failures = sorted(
        (
            {
                "target": t,
                "claim": c["id"],
                "harm": c["harm"],
                "message": c["message"],
                "fix": c.get("fix", ""),
            }
            for t, c in claims
            if c["verdict"] in ("fail", "error")
        ),
        key=lambda f: (_HARM_ORDER.get(f["harm"], 99), f["target"], f["claim"]),
    )
    document = {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "profile": profile,
        "seed": seed,
        "strict": strict,
        "transforms": list(transforms or []),
        **environment(),
        "targets": targets,
        "summary": dict(Counter(r["verdict"] for r in ordered)),
        "claims": dict(Counter(c["verdict"] for _, c in claims)),
        "exitstatus": exitstatus,
        "failures": failures,
        "advice": advice,
        "inconclusive": inconclusive,
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
    if failures:
        lines += ["## Failures, worst first", ""]
        lines += [
            f"- **{f['claim']}** ({f['harm']}) on `{f['target']}`: {_cell(f['message'], 400)}"
            for f in failures
        ]
        lines.append("")
    if advice:
        lines += [
            "## Advice (reported, not failures"
            + (": failures under --conformance-strict)" if strict else ")"),
            "",
        ]
        lines += [
            f"- **{a['claim']}** on `{a['target']}`: "
            + " ".join(_cell(line, 300) for line in (a["message"] or "").splitlines()[:8])
            + f" Fix: {a['fix']}"
            for a in advice
        ]
        lines.append("")
    if inconclusive:
        lines += [
            "## Inconclusive (not verdicts: the suite could not exercise these claims"
            + ("; failures under --conformance-strict)" if strict else ")"),
            "",
        ]
        lines += [f"- **{i['claim']}** on `{i['target']}`: {_cell(i['message'], 300)}" for i in inconclusive]
        lines.append("")
    for target in targets:
        rows = [r for r in ordered if r["target"] == target["target"]]
        lines += [f"## {target['kind']} `{target['target']}`", ""]
        formats = target.get("formats") or {}
        if formats.get("checked"):
            lines.append(
                "Formats checked: "
                + ", ".join(f"`{f['encoding']}` ({f['source']})" for f in formats["checked"])
                + "."
            )
        for missing in formats.get("not_checked", []):
            lines.append(f"Not checked: `{missing['encoding']}`: {missing['why']}.")
        if formats.get("derived"):
            lines.append(f"Data: {describe_derived(formats['derived'])}.")
        lines += [
            "",
            "| # | claim | verdict | examined | message |",
            "|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r.get('number', '')} | **{r['property']}** | **{r['verdict']}** | | {_cell(r.get('message', ''), 200)} |"
            )
            for c in r.get("claims", []):
                lines.append(
                    f"| | {c['id']} | {c['verdict']} | {c.get('examined', '')} | {_cell(c.get('message', ''), 200)} |"
                )
        lines.append("")
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    return document


def describe_derived(derived: dict[str, Any]) -> str:
    """One line: which datasets were derived from how many of the user's samples."""
    datasets = derived.get("datasets", [])
    shown = ", ".join(
        f"{d['variant']} ({d['samples']} samples"
        + (f", faults {', '.join(d['faults'])}" if d.get("faults") else "")
        + (f", {d['dtype']}" if d.get("dtype") else "")
        + ")"
        for d in datasets
    )
    return (
        f"{len(datasets)} dataset(s) derived from {derived.get('source_samples')} of your samples of "
        f"{derived.get('from')}: {shown}"
    )
