"""Validation reports: the JSON document for machines (versioned) and the human summary.

JSON (``format: primus-energon-validate``, ``version: 1``)::

    {"format", "version", "kind": "dataset" | "metadataset", "path", "ok", "strict",
     "summary": {"shards", "samples", "bytes", "errors", "warnings", "by_code": {code: n}},
     "encoding": {"requested", "declared", "detected", "used", "note"}, "subflavors",
     "splits": {part: {"shards", "samples"}}, "shards": [{"name", "size", "samples", "listed", "splits"}],
     "members": {name: {"kind", "samples", "dtypes", "shapes": [{"shape", "samples"}], "bucketed", "min", "max"}},
     "problems": [{"code", "severity", "shard", "key", "member", "message", "hint", "dataset"?, "detail"?}],
     "leaves": [...]}                                   # metadatasets only; each leaf holds its dataset report

The document is a pure function of the data: the same for any worker count (no timings in it).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .analysis import MemberSummary
from .problems import Problem

__all__ = [
    "REPORT_FORMAT",
    "REPORT_VERSION",
    "DatasetReport",
    "LeafReport",
    "MetadatasetReport",
    "ShardSummary",
    "render_summary",
]

REPORT_FORMAT = "primus-energon-validate"
REPORT_VERSION = 1


def _count(problems: list[Problem], strict: bool) -> tuple[int, int]:
    errors = sum(1 for p in problems if p.severity == "error" or strict)
    return errors, len(problems) - errors


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


@dataclass
class ShardSummary:
    name: str
    size: int
    samples: int
    listed: int | None
    splits: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "size": self.size,
            "samples": self.samples,
            "listed": self.listed,
            "splits": self.splits,
        }


@dataclass
class DatasetReport:
    """The result of validating one dataset directory."""

    path: str
    encoding: dict[str, str | None]
    subflavors: dict[str, Any]
    shards: list[ShardSummary]
    splits: dict[str, dict[str, int]]
    members: dict[str, MemberSummary]
    problems: list[Problem]
    strict: bool = False
    elapsed_s: float = 0.0
    bytes_scanned: int = 0
    #: under torchrun: ``{"world_size": W, "ranks": {shard: rank that read it}}``; None in one process
    distributed: dict[str, Any] | None = None

    kind = "dataset"

    @property
    def num_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error" or self.strict]

    @property
    def ok(self) -> bool:
        """True when no problem is an error (with `strict`, when there is no problem at all)."""
        return not self.errors

    def summary(self) -> dict[str, Any]:
        errors, warnings = _count(self.problems, self.strict)
        return {
            "shards": len(self.shards),
            "samples": self.num_samples,
            "bytes": self.total_bytes,
            "errors": errors,
            "warnings": warnings,
            "by_code": dict(sorted(Counter(p.code for p in self.problems).items())),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": REPORT_FORMAT,
            "version": REPORT_VERSION,
            "kind": self.kind,
            "path": self.path,
            "ok": self.ok,
            "strict": self.strict,
            "summary": self.summary(),
            "encoding": dict(self.encoding),
            "subflavors": self.subflavors,
            "splits": self.splits,
            "shards": [s.to_dict() for s in self.shards],
            "members": {n: m.to_dict() for n, m in self.members.items()},
            "problems": [p.to_dict() for p in self.problems],
            **({} if self.distributed is None else {"distributed": self.distributed}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False, ensure_ascii=False, default=str) + "\n"


@dataclass
class LeafReport:
    """One leaf dataset of a metadataset: where the blend puts it and what validating it found."""

    split: str
    path: str
    split_part: str
    weight: float | None
    normalized_weight: float | None
    subflavors: dict[str, Any]
    via: list[str] = field(default_factory=list)
    repetitions: float | None = None
    report: DatasetReport | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "path": self.path,
            "split_part": self.split_part,
            "weight": self.weight,
            "normalized_weight": self.normalized_weight,
            "repetitions": self.repetitions,
            "subflavors": self.subflavors,
            "via": self.via,
            "ok": None if self.report is None else self.report.ok,
            "report": None if self.report is None else self.report.to_dict(),
        }


@dataclass
class MetadatasetReport:
    """The result of validating a metadataset: its own problems plus every leaf's (tagged with `dataset`)."""

    path: str
    form: str
    leaves: list[LeafReport]
    problems: list[Problem]
    strict: bool = False
    elapsed_s: float = 0.0
    #: under torchrun: ``{"world_size": W}`` (each leaf's report says which rank read which shard)
    distributed: dict[str, Any] | None = None

    kind = "metadataset"

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error" or self.strict]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def bytes_scanned(self) -> int:
        seen: set[int] = set()
        total = 0
        for leaf in self.leaves:
            if leaf.report is not None and id(leaf.report) not in seen:
                seen.add(id(leaf.report))
                total += leaf.report.bytes_scanned
        return total

    def summary(self) -> dict[str, Any]:
        errors, warnings = _count(self.problems, self.strict)
        return {
            "leaves": len(self.leaves),
            "errors": errors,
            "warnings": warnings,
            "by_code": dict(sorted(Counter(p.code for p in self.problems).items())),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": REPORT_FORMAT,
            "version": REPORT_VERSION,
            "kind": self.kind,
            "path": self.path,
            "form": self.form,
            "ok": self.ok,
            "strict": self.strict,
            "summary": self.summary(),
            "leaves": [leaf.to_dict() for leaf in self.leaves],
            "problems": [p.to_dict() for p in self.problems],
            **({} if self.distributed is None else {"distributed": self.distributed}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False, default=str) + "\n"


# -- human summary ---------------------------------------------------------------------------------------------
def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _fmt_range(ms: MemberSummary) -> str:
    if ms.vmin is None:
        return ""
    return f"  range [{ms.vmin:.4g}, {ms.vmax:.4g}]"


def member_lines(members: dict[str, MemberSummary], indent: str = "  ", max_shapes: int = 6) -> list[str]:
    """One line per member: kind, dtypes, distinct shapes with counts."""
    lines = []
    width = max((len(n) for n in members), default=0)
    for name, ms in members.items():
        text = f"{indent}{name:<{width}}  {ms.kind:<6} in {ms.count} samples"
        if ms.dtypes:
            text += "  " + ", ".join(
                f"{d}" + (f" x{n}" if len(ms.dtypes) > 1 else "") for d, n in ms.dtypes.items()
            )
        if ms.shapes:
            shapes = list(ms.shapes.items())
            if len(shapes) == 1:
                text += f"  {_fmt_shape(shapes[0][0])}"
            else:
                shown = ", ".join(f"{_fmt_shape(s)} x{n}" for s, n in shapes[:max_shapes])
                more = f", ... ({len(shapes)} distinct)" if len(shapes) > max_shapes else ""
                text += f"  {len(shapes)} shapes: {shown}{more}"
            if ms.bucketed:
                text += "  (resolution buckets)"
        text += _fmt_range(ms)
        lines.append(text)
    return lines


def _problem_lines(problems: list[Problem], max_per_code: int) -> list[str]:
    lines: list[str] = []
    by_code: dict[str, list[Problem]] = {}
    for p in problems:
        by_code.setdefault(p.code, []).append(p)
    for code, group in by_code.items():
        sev = group[0].severity.upper()
        lines.append(f"{sev} {code} ({len(group)}): {group[0].hint}")
        for p in group[:max_per_code]:
            lines.append(f"  - {p.where()}: {p.message}")
        if len(group) > max_per_code:
            lines.append(f"  ... and {len(group) - max_per_code} more (all are in the --json report)")
    return lines


def _dataset_header(r: DatasetReport) -> list[str]:
    enc = r.encoding
    source = (
        "--encoding"
        if enc.get("requested")
        else "dataset.yaml"
        if enc.get("declared")
        else "detected"
        if enc.get("detected")
        else "unknown"
    )
    lines = [
        f"Dataset {r.path}",
        f"  encoding {enc.get('used') or '?'} (from {source})"
        + (f"; subflavors {r.subflavors}" if r.subflavors else ""),
        f"  {len(r.shards)} shards, {r.num_samples} samples, {human_bytes(r.total_bytes)} on disk",
    ]
    if enc.get("note"):
        lines.insert(2, f"  note: {enc['note']}")
    if r.splits:
        parts = ", ".join(f"{k} {v['samples']} samples in {v['shards']} shards" for k, v in r.splits.items())
        lines.append(f"  splits: {parts}")
    if r.members:
        lines.append("  members:")
        lines.extend(member_lines(r.members, indent="    "))
    return lines


def render_summary(report: DatasetReport | MetadatasetReport, *, max_per_code: int = 20) -> str:
    """The human summary: what the dataset is, then every problem grouped by code (with where and what to
    do), then one result line. A clean dataset gets no problem lines."""
    lines: list[str] = []
    if isinstance(report, MetadatasetReport):
        lines.append(f"Metadataset {report.path} ({report.form}), {len(report.leaves)} leaf datasets:")
        for leaf in report.leaves:
            w = "" if leaf.normalized_weight is None else f"weight {leaf.normalized_weight:.4g}"
            if leaf.repetitions is not None:
                w = f"repetitions {leaf.repetitions:g}"
            status = "not validated" if leaf.report is None else ("ok" if leaf.report.ok else "FAILED")
            lines.append(
                f"  [{leaf.split}] {leaf.path} (split {leaf.split_part}) {w} subflavors {leaf.subflavors}: {status}"
            )
        done: set[int] = set()
        for leaf in report.leaves:
            if leaf.report is not None and id(leaf.report) not in done:
                done.add(id(leaf.report))
                lines.extend(_dataset_header(leaf.report))
    else:
        lines.extend(_dataset_header(report))
    if report.problems:
        lines.append("")
        lines.extend(_problem_lines(report.problems, max_per_code))
    errors, warnings = _count(report.problems, report.strict)
    lines.append("")
    if report.ok:
        lines.append("OK" + (f" ({warnings} warnings)" if warnings else "") + ": ready for training")
    else:
        lines.append(f"FAILED: {errors} errors" + (f", {warnings} warnings" if warnings else ""))
    return "\n".join(lines) + "\n"
