"""`dataset_info`: what a dataset holds, from its metadata plus a look at its first samples (or all of them).

Replaces ``energon info``, which raises ``KeyError: 'sample_type'`` on a CrudeWebdataset (megatron-energon 7.4.1: its dataset.yaml has no sample_type). Splits
and sample counts come from ``.nv-meta`` (or from reading the shards when there is no metadata); member
names, dtypes and shapes from the first `samples` samples (``full=True``: every sample, listing every
distinct shape). Nothing here judges the data; run `validate` for that.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..storage import dataset_dir
from .analysis import MemberSummary, analyze
from .metadata import META_DIR, list_shard_files, read_metadata
from .report import human_bytes, member_lines
from .scan import ShardScan, scan_shard

__all__ = ["DatasetInfo", "dataset_info", "render_info"]

INFO_FORMAT = "primus-energon-info"
INFO_VERSION = 1


@dataclass
class DatasetInfo:
    path: str
    encoding: str | None
    encoding_source: str
    subflavors: dict[str, Any]
    shards: list[dict[str, Any]]  # name, size, samples, splits
    splits: dict[str, dict[str, int]]  # part -> shards, samples, bytes
    members: dict[str, MemberSummary]
    samples_inspected: int
    full: bool
    meta_bytes: int
    counts_from: str
    notes: list[str] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        return sum(s["samples"] for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s["size"] for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": INFO_FORMAT,
            "version": INFO_VERSION,
            "path": self.path,
            "encoding": self.encoding,
            "encoding_source": self.encoding_source,
            "subflavors": self.subflavors,
            "samples": self.num_samples,
            "bytes": self.total_bytes,
            "metadata_bytes": self.meta_bytes,
            "counts_from": self.counts_from,
            "splits": self.splits,
            "shards": self.shards,
            "members": {n: m.to_dict() for n, m in self.members.items()},
            "samples_inspected": self.samples_inspected,
            "full": self.full,
            "notes": self.notes,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False, default=str) + "\n"


def dataset_info(
    path: str | os.PathLike[str],
    *,
    samples: int = 16,
    full: bool = False,
    workers: int = 1,
    progress: bool | None = False,
) -> DatasetInfo:
    """Describe the dataset at `path` (a directory, local or remote). `samples`: how many samples to inspect for members,
    dtypes and shapes (from the first shards on); `full`: inspect every sample (in parallel over `workers`)."""
    root = dataset_dir(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{str(root)!r} is not a directory")
    meta = read_metadata(root)
    tars, compressed = list_shard_files(root)
    notes = [p.message for p in meta.problems]
    if compressed:
        notes.append(f"{len(compressed)} compressed shard(s) that Energon ignores, e.g. {compressed[0]}")
    if meta.shard_counts is not None:
        names = [n for n in meta.shard_counts if (root / n).is_file()]
        missing = [n for n in meta.shard_counts if n not in names]
        if missing:
            notes.append(f"{len(missing)} shard(s) listed in .info.json are missing, e.g. {missing[0]}")
        extra = sorted(set(tars) - set(meta.shard_counts))
        if extra:
            notes.append(
                f"{len(extra)} .tar file(s) are not in .info.json (Energon ignores them), e.g. {extra[0]}"
            )
    else:
        names = tars
    scans: list[ShardScan] = []
    if full:
        from .validate import scan_shards

        scans = scan_shards(
            root, names, workers=workers, decode=True, progress=progress, desc=f"info {root.name}"
        )
    else:
        left = samples
        for n in names:
            if left <= 0:
                break
            scan = scan_shard(root, n, decode=True, max_samples=left)
            scans.append(scan)
            left -= len(scan.samples)
    inspected = sum(len(s.samples) for s in scans)
    analysis = analyze(scans, encoding=meta.declared_encoding)
    counted = {s.name: sum(not r.partial for r in s.samples) for s in scans} if full else {}
    owners = meta.split_of()
    shards = []
    for n in names:
        size = (root / n).stat().st_size
        if meta.shard_counts is not None and not full:
            count = meta.shard_counts[n]
        else:
            count = counted.get(n)
            if count is None:
                count = sum(not r.partial for r in scan_shard(root, n, decode=False).samples)
        shards.append({"name": n, "size": size, "samples": count, "splits": owners.get(n, [])})
    splits: dict[str, dict[str, int]] = {}
    by_name = {s["name"]: s for s in shards}
    for part, part_names in (meta.split_parts or {}).items():
        use = [by_name[n] for n in part_names if n in by_name and n not in meta.exclude_shards]
        splits[part] = {
            "shards": len(use),
            "samples": sum(s["samples"] for s in use),
            "bytes": sum(s["size"] for s in use),
        }
    meta_bytes = 0
    nv = root / META_DIR
    if nv.is_dir():
        meta_bytes = sum(p.stat().st_size for p in nv.iterdir() if p.is_file())
    meta_bytes += sum((root / (n + ".idx")).stat().st_size for n in names if (root / (n + ".idx")).is_file())
    encoding = meta.declared_encoding or analysis.detected_encoding
    source = "dataset.yaml" if meta.declared_encoding else ("detected" if encoding else "unknown")
    return DatasetInfo(
        path=str(root),
        encoding=encoding,
        encoding_source=source,
        subflavors=meta.subflavors,
        shards=shards,
        splits=splits,
        members=analysis.members,
        samples_inspected=inspected,
        full=full,
        meta_bytes=meta_bytes,
        counts_from="shards" if full or meta.shard_counts is None else f"{META_DIR}/{meta.info_file}",
        notes=notes,
    )


def render_info(info: DatasetInfo) -> str:
    """The human-readable form of `info`."""
    n = info.num_samples
    lines = [
        f"Dataset {info.path}",
        f"  encoding: {info.encoding or 'unknown'} ({info.encoding_source})"
        + (f"; subflavors {info.subflavors}" if info.subflavors else ""),
        f"  {n} samples in {len(info.shards)} shards (counts from {info.counts_from}); "
        f"{human_bytes(info.total_bytes)} of shards"
        + (f", {human_bytes(info.total_bytes / n)} per sample" if n else "")
        + f"; {human_bytes(info.meta_bytes)} of metadata and indexes",
    ]
    if info.splits:
        lines.append("  splits:")
        width = max(len(p) for p in info.splits)
        for part, s in info.splits.items():
            lines.append(
                f"    {part:<{width}}  {s['samples']:>8} samples  {s['shards']:>5} shards  {human_bytes(s['bytes'])}"
            )
    scope = "every sample" if info.full else f"the first {info.samples_inspected} samples"
    lines.append(f"  members (from {scope}):")
    lines.extend(member_lines(info.members, indent="    "))
    for note in info.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines) + "\n"
