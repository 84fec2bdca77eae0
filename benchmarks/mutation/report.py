"""The mutation report: the mutant x claim matrix, the kill rates overall and per operator, and the
survivors with their diffs (``REPORT.md``, and ``mutation.json`` with everything in it).

Rates are over the *scored* mutants: those judged (their target's baseline completed), less the ones
marked equivalent by hand in ``equivalent.txt`` (``MUTANT_ID  # reason``; a mutant listed without a reason
is an error, so none is dropped silently). Three rates:

* **failed as meant** (the score, goal >= 95 %): a defect claim the mutant names as meant for it failed (or
  errored). Counted by failing claims only: advice never counts as a kill. Mutants whose every meant claim
  is advice (an error message without the sample's key) are scored apart, as **advised as meant**;
* **killed as meant**: a claim meant for the mutant reported it (failed, errored, or, for an advice claim,
  advised);
* **killed**: any defect claim failed where it passed on the baseline;
* **detected**: killed, or reported by advice claims only.
"""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..report import machine_description, markdown_rows, write_json

__all__ = ["read_marked", "summarize", "write"]

GOAL = 0.95
HERE = Path(__file__).resolve().parent
EQUIVALENT_FILE = HERE / "equivalent.txt"
NOTES_FILE = HERE / "notes.txt"


def read_marked(path: Path, known: set[str]) -> dict[str, str]:
    """``id -> reason`` from a ``MUTANT_ID  # reason`` file; raises ``ValueError`` for an unknown id or a
    missing reason."""
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        ident, _, reason = line.partition("#")
        ident, reason = ident.strip(), reason.strip()
        if ident not in known:
            raise ValueError(f"{path.name}:{number}: {ident!r} is not a mutant id")
        if not reason:
            raise ValueError(f"{path.name}:{number}: {ident} has no reason (write `{ident}  # why`)")
        out[ident] = reason
    return out


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def summarize(judged: Sequence[Mapping[str, Any]], equivalent: Mapping[str, str]) -> dict[str, Any]:
    """The rates overall and per operator (see the module docstring)."""

    def tally(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        scored = [
            r for r in rows if r["verdict"] not in ("unjudged", "not run") and r["id"] not in equivalent
        ]
        counts = Counter(r["verdict"] for r in rows)
        as_meant = sum(1 for r in scored if r["as_meant"])
        killed = sum(1 for r in scored if r["verdict"] == "killed")
        detected = sum(1 for r in scored if r["verdict"] in ("killed", "advised"))
        defects = [r for r in scored if not r.get("advice_meant")]
        failed = sum(1 for r in defects if r.get("failed_as_meant"))
        advice = [r for r in scored if r.get("advice_meant")]
        return {
            "mutants": len(rows),
            "equivalent": sum(1 for r in rows if r["id"] in equivalent),
            "scored": len(scored),
            "verdicts": dict(counts),
            "scored_defects": len(defects),
            "failed_as_meant": failed,
            "rate_failed_as_meant": _rate(failed, len(defects)),
            "scored_advice": len(advice),
            "advised_as_meant": sum(1 for r in advice if r["as_meant"]),
            "killed_as_meant": as_meant,
            "killed": killed,
            "detected": detected,
            "rate_as_meant": _rate(as_meant, len(scored)),
            "rate_killed": _rate(killed, len(scored)),
            "rate_detected": _rate(detected, len(scored)),
        }

    operators = list(dict.fromkeys(r["operator"] for r in judged))
    overall = tally(judged)
    overall["goal"] = GOAL
    overall["goal_met"] = (
        overall["rate_failed_as_meant"] is not None and overall["rate_failed_as_meant"] >= GOAL
    )
    return {
        "overall": overall,
        "per_operator": {op: tally([r for r in judged if r["operator"] == op]) for op in operators},
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _cell(row: Mapping[str, Any], claim: str) -> str:
    verdict = row["detected_by"].get(claim)
    meant = claim in row["meant"]
    if verdict is None:
        return "○" if meant else ""
    symbol = {"fail": "K", "error": "E", "advice": "a"}[verdict]
    return f"**{symbol}**" if meant else symbol


def _short(claim: str) -> str:
    return claim.replace("/", "/<br>")


def write(
    out: Path,
    judged: Sequence[Mapping[str, Any]],
    baselines: Mapping[str, Mapping[str, Any]],
    *,
    profile: str,
    equivalent: Mapping[str, str],
    notes: Mapping[str, str],
    command: str,
    subset: bool,
) -> dict[str, Any]:
    """Write ``REPORT.md`` and ``mutation.json`` into ``out``; returns the JSON document."""
    summary = summarize(judged, equivalent)
    machine = machine_description()
    document = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "profile": profile,
        "subset": subset,
        "machine": machine,
        "summary": summary,
        "equivalent": dict(equivalent),
        "baselines": baselines,
        "mutants": [
            {**r, "equivalent": equivalent.get(r["id"]), "note": notes.get(r["id"], "")} for r in judged
        ],
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "mutation.json", document)
    (out / "REPORT.md").write_text(_markdown(document), encoding="utf-8")
    return document


def _markdown(document: Mapping[str, Any]) -> str:
    overall = document["summary"]["overall"]
    machine = document["machine"]
    mutants = document["mutants"]
    not_run = [m for m in mutants if m["verdict"] == "not run"]
    lines = [
        "# Mutation analysis of the reference targets",
        "",
        "How strong is the conformance suite? Each mutant below is one realistic defect put into a copy of a "
        "reference cooker, TaskEncoder or wrapper (or the zoo's correct packing TaskEncoder), checked by the "
        "suite in a fresh process. Written by `python -m benchmarks.mutation` (see its `--help`).",
        "",
        f"- Date: {document['created']}; profile `{document['profile']}`"
        + (" (a subset of the mutants)" if document["subset"] else ""),
        f"- Commit: `{machine.get('git_commit')}`",
        f"- Machine: {machine.get('cpu')}, {machine.get('cpus_usable')} usable cores, "
        f"{machine.get('memory_gb')} GB; Python {machine.get('python')}, torch {machine.get('torch')}, "
        f"megatron-energon {machine.get('megatron_energon')}",
        f"- Command: `{document['command']}`",
        "",
        "## Score",
        "",
        f"**{_pct(overall['rate_failed_as_meant'])} failed by a defect claim meant for them** "
        f"({overall['failed_as_meant']} of {overall['scored_defects']} scored mutants whose defect is data, "
        f"determinism, resume, a crash or safety; advice counts as no kill; goal {_pct(overall['goal'])}: "
        f"{'met' if overall['goal_met'] else '**not met**'}). Scored apart: {overall['scored_advice']} mutants "
        f"whose defect is advice by design, {overall['advised_as_meant']} of them advised as meant. Killed or "
        f"advised by a claim meant for them: {_pct(overall['rate_as_meant'])} ({overall['killed_as_meant']} of "
        f"{overall['scored']}). Killed by any defect claim: "
        f"{_pct(overall['rate_killed'])}; detected (killed or advised): {_pct(overall['rate_detected'])}. "
        f"{overall['mutants']} mutants, {overall['equivalent']} marked equivalent; verdicts: "
        + ", ".join(f"{v} {n}" for v, n in sorted(overall["verdicts"].items()))
        + ".",
        "",
        *(
            [
                f"**{len(not_run)} mutants were not run** (the session was stopped before them); the rates are "
                "over the mutants that ran. Run them with `python -m benchmarks.mutation` (finished runs are "
                "cached). Not run: " + ", ".join(f"`{m['id']}`" for m in not_run) + ".",
                "",
            ]
            if not_run
            else []
        ),
        "## Per operator",
        "",
        *markdown_rows(
            [
                "operator",
                "mutants",
                "equivalent",
                "scored",
                "failed as meant",
                "killed as meant",
                "killed",
                "detected",
                "rate failed as meant",
            ],
            [
                [
                    op,
                    t["mutants"],
                    t["equivalent"],
                    t["scored"],
                    t["failed_as_meant"],
                    t["killed_as_meant"],
                    t["killed"],
                    t["detected"],
                    _pct(t["rate_failed_as_meant"]),
                ]
                for op, t in document["summary"]["per_operator"].items()
            ],
        ),
        "",
    ]
    open_rows = [
        m
        for m in mutants
        if not m["equivalent"]
        and m["verdict"] != "not run"
        and (m["verdict"] not in ("killed", "advised") or not m["as_meant"])
    ]
    lines += ["## Survivors, and kills by a claim not meant for them", ""]
    if not open_rows:
        lines += ["None.", ""]
    for m in open_rows:
        what = "survived" if m["verdict"] not in ("killed", "advised") else f"{m['verdict']}, not as meant"
        lines += [
            f"### `{m['id']}` ({m['operator']}, {what})",
            "",
            f"{m['description']}. Target `{m['target']}`; meant: {', '.join(f'`{c}`' for c in m['meant'])}; "
            f"reported by: {', '.join(f'`{c}` ({v})' for c, v in m['detected_by'].items()) or 'nothing'}.",
            "",
        ]
        if m["note"]:
            lines += [f"Why: {m['note']}", ""]
        lines += ["```diff", m["diff"].rstrip(), "```", ""]
    equivalent = [m for m in mutants if m["equivalent"]]
    if equivalent:
        lines += ["## Marked equivalent (by hand, `benchmarks/mutation/equivalent.txt`)", ""]
        lines += [
            f"- `{m['id']}`: {m['equivalent']} (verdict {m['verdict']}"
            + (f"; reported by {', '.join(m['detected_by'])}" if m["detected_by"] else "")
            + ")"
            for m in equivalent
        ]
        lines.append("")
    claims = list(dict.fromkeys(c for m in mutants for c in [*m["meant"], *m["detected_by"]]))
    claims.sort()
    lines += [
        "## Matrix (mutant x claim)",
        "",
        "K: the defect claim failed; E: it errored; a: the advice claim reported it; bold: a claim meant for "
        "the mutant; ○: meant, but it passed. Only claims that are meant for a mutant or reported one are "
        "columns.",
        "",
        *markdown_rows(
            ["mutant", "verdict", *[_short(c) for c in claims]],
            [
                [
                    f"`{m['id']}`",
                    m["verdict"] + (" (eq.)" if m["equivalent"] else ""),
                    *[_cell(m, c) for c in claims],
                ]
                for m in mutants
            ],
        ),
        "",
        "## Baselines (each target unmutated, run the same way)",
        "",
        *markdown_rows(
            ["target", "status", "seconds", "claims not passing"],
            [
                [
                    t,
                    b["status"],
                    b["seconds"],
                    ", ".join(
                        f"{c} ({v})" for c, v in b["claims"].items() if v in ("fail", "error", "advice")
                    )
                    or "none",
                ]
                for t, b in document["baselines"].items()
            ],
        ),
        "",
        "## Every mutant",
        "",
        *markdown_rows(
            ["mutant", "operator", "target", "verdict", "seconds", "description"],
            [
                [f"`{m['id']}`", m["operator"], m["target"], m["verdict"], m["seconds"], m["description"]]
                for m in mutants
            ],
        ),
        "",
    ]
    return "\n".join(lines)
