"""The benchmark sessions' results as markdown tables: :func:`cpu_markdown` for ``benchmarks.throughput``,
:func:`gpu_markdown` for ``benchmarks.gpu``, :func:`conformance_markdown` for
``benchmarks.bench_conformance``. Numbers only; the reports hold the raw data."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from .plan import BATCH_SIZE
from .report import markdown_rows, met_cell

__all__ = ["conformance_markdown", "cpu_markdown", "gpu_markdown"]


def _fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def cpu_markdown(summary: Mapping[str, Any], specs: Mapping[str, Any]) -> str:
    """The CPU results (:func:`benchmarks.analysis.summarize`) as markdown: per payload size, samples/s per
    pipeline and worker count (GB/s and the ratio to the floor beside), the targets, the decode costs."""
    rows = summary["rows"]
    out: list[str] = []
    for size in [s for s in specs if any(r["size"] == s for r in rows)]:
        spec = specs[size]
        sized = [r for r in rows if r["size"] == size]
        workers = sorted({r["num_workers"] for r in sized if r["kind"] == "pipeline"})
        floor = {
            r["num_workers"]: r["samples_per_s"]
            for r in sized
            if r["pipeline"] == "floor" and r["label"] == "default"
        }
        out.append(f"#### {spec.label} ({spec.num_samples} samples, batch {BATCH_SIZE})\n")
        head = (
            "| pipeline | settings | "
            + " | ".join(f"nw={nw} samples/s (GB/s, x floor)" for nw in workers)
            + " |"
        )
        out += [head, "|---|---|" + "---|" * len(workers)]
        order = ["raw_read", "memcpy"] + [r["pipeline"] for r in sized if r["kind"] == "pipeline"]
        seen: set[tuple[str, str]] = set()
        for name in order:
            for label in sorted(
                {r["label"] for r in sized if r["pipeline"] == name}, key=lambda x: x != "default"
            ):
                if (name, label) in seen:
                    continue
                seen.add((name, label))
                cells = []
                for nw in workers:
                    r = next(
                        (
                            r
                            for r in sized
                            if r["pipeline"] == name
                            and r["label"] == label
                            and (r["num_workers"] == nw if r["kind"] == "pipeline" else nw == workers[0])
                        ),
                        None,
                    )
                    if r is None:
                        cells.append("")
                        continue
                    versus = f", {r['samples_per_s'] / floor[nw]:.3f}" if floor.get(nw) else ""
                    flag = " (disturbed)" if r.get("disturbed_only") else ""
                    cells.append(f"{_fmt_rate(r['samples_per_s'])} ({r['gb_per_s']:.2f}{versus}){flag}")
                out.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
        out.append("")
    if summary["targets"]:
        out += ["#### Targets (nw=0, ratio of medians; median of per-repetition ratios in brackets)\n"]
        out += markdown_rows(
            ("target", "ratio", "met"),
            (
                (
                    t["target"],
                    "-" if t["ratio"] is None else f"{t['ratio']:.3f} ({t['paired_median']:.3f})",
                    met_cell(t["met"]),
                )
                for t in summary["targets"]
            ),
        )
        out.append("")
    if summary["decode_us"]:
        out += ["#### Decode time per member (µs, best of 5)\n"]
        for size, members in summary["decode_us"].items():
            formats = [k for k in next(iter(members.values())) if k != "bytes"]
            out += [f"{specs[size].label}\n", "| member | bytes | " + " | ".join(formats) + " |"]
            out.append("|---|---|" + "---|" * len(formats))
            for member, row in members.items():
                out.append(
                    f"| {member} | {row['bytes']:,.0f} | "
                    + " | ".join(f"{row[f]:.1f}" for f in formats)
                    + " |"
                )
            out.append("")
    return "\n".join(out)


def gpu_markdown(report: Mapping[str, Any]) -> str:
    """The GPU session's report as markdown: per configuration and pinning mode, the loader's time per batch,
    the step's cost over it, samples/s, H2D GB/s (and the fraction of the ceiling) and stall %; an error row
    for a configuration that failed; the pinned-copy ceiling."""
    lines = [
        "| size | nw | pinning | t_load ms/batch | step / t_load | samples/s | H2D GB/s (x ceiling) | stall % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for config in report["configs"]:
        result = config.get("result", {})
        if "error" in result:
            lines.append(
                f"| {config['size']} | {config['num_workers']} | ERROR | {result['error'][:80]} |||||"
            )
            continue
        for mode, measured in result.get("modes", {}).items():
            for run in measured["runs"]:
                lines.append(
                    f"| {config['size']} | {config['num_workers']} | {mode} | {measured['t_load_ms']:.2f} | "
                    f"{run['step_over_load']:.2f} | {run['samples_per_s']:,.0f} | "
                    f"{run['h2d_gb_per_s_median']:.1f} ({run['h2d_fraction_of_ceiling']:.2f}) | "
                    f"{run['stall_pct']:.2f} |"
                )
        if "ceiling" in result:
            lines.append(
                f"| {config['size']} | {config['num_workers']} | ceiling | | | | "
                f"{result['ceiling']['gb_per_s_median']:.1f} (256 MB: {result['ceiling_256mb']['gb_per_s_median']:.1f}) | |"
            )
    return "\n".join(lines)


def _speed_cell(runs: Sequence[Mapping[str, Any]]) -> str:
    """The runs' median seconds (with the range of several, the most properties one of them failed, and
    whether the guard saw one disturbed), ``error`` if none completed, empty if not run."""
    if not runs:
        return ""
    done = sorted(r["seconds"] for r in runs if r["completed"])
    if not done:
        return "error"
    cell = f"{statistics.median(done):.1f}"
    if len(runs) > 1:
        cell += f" ({done[0]:.1f}-{done[-1]:.1f}, {len(done)}/{len(runs)} runs)"
    failed = max(len(r["failed"]) for r in runs)
    cell += f" ({failed} failed)" if failed else ""
    return cell + (" (disturbed)" if any(r.get("contaminated") for r in runs) else "")


def conformance_markdown(
    runs: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], profiles: Sequence[str]
) -> str:
    """The conformance-speed runs as markdown: seconds per target and profile (``error`` for a run that did
    not complete, the count of failed properties and ``(disturbed)`` beside a time), then the medians
    against the targets."""
    names = list(dict.fromkeys(r["target"] for r in runs))
    by_key: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for run in runs:
        by_key.setdefault((run["target"], run["profile"]), []).append(run)
    kinds = {r["target"]: r["kind"] for r in runs}
    real = {r["target"]: r.get("real_sized") for r in runs}
    out = ["#### Conformance suite, wall seconds per target (fresh process, one run at a time)\n"]
    out += markdown_rows(
        ("target", "kind", "real-sized", *(f"{p} s" for p in profiles)),
        (
            (name, kinds[name], real[name] or "", *(_speed_cell(by_key.get((name, p), [])) for p in profiles))
            for name in names
        ),
    )
    out += ["", "#### Medians against the targets\n"]
    rows = []
    for profile in profiles:
        s = summary["profiles"][profile]
        median = "-" if s["median_s"] is None else f"{s['median_s']:.1f}"
        spread = "-" if s["min_s"] is None else f"{s['min_s']:.1f}-{s['max_s']:.1f}"
        limit = "-" if s["limit_s"] is None else f"<= {s['limit_s']:g} s"
        completed = f"{s['completed']}/{s['runs']}"
        others = "-" if s["foreign_cores_max"] is None else f"{s['foreign_cores_max']:.2f}"
        rows.append((profile, completed, s["disturbed"], others, median, spread, limit, met_cell(s["met"])))
    header = (
        "profile",
        "completed",
        "disturbed",
        "others' cores (max)",
        "median s",
        "min-max s",
        "target",
        "met",
    )
    out += markdown_rows(header, rows)
    each = [t for t in summary["targets"] if t.get("real_sized")]
    if each:
        out += ["", "#### Each real-sized target against the limits\n"]
        out += markdown_rows(
            ("target", "median s", "met"),
            (
                (t["target"], "-" if t["value"] is None else f"{t['value']:.1f}", met_cell(t["met"]))
                for t in each
            ),
        )
    return "\n".join(out)
