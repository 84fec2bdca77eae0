"""Scanning one shard: every member of every sample, read once, checked, and summarised.

`scan_shard` is the unit of parallel work: a pure function of the shard's bytes (so any worker count gives
the same results). It reports what one shard shows on its own (truncation, payload problems); what needs
the whole dataset (duplicate keys, missing members, shape consistency) is decided from its `ShardScan` by
`primus_energon.datasets.analysis`.

Samples are grouped like Energon groups them: consecutive members with the same key form one sample. A
member name that repeats within a run starts a new sample with the same key (a duplicate key written twice
in a row; Energon's index sees two samples there too).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..storage import DatasetPath, dataset_path
from .checks import check_member
from .problems import Problem
from .tarscan import TarCorrupt, TarReader, TarTruncated, open_shard, split_name

__all__ = ["MemberSig", "SampleRecord", "ShardScan", "scan_from_dict", "scan_shard", "scan_to_dict"]

#: (member name, kind, dtype, shape); dtype/shape None when the member holds no readable tensor or image
MemberSig = tuple[str, str, str | None, tuple[int, ...] | None]


@dataclass(slots=True)
class SampleRecord:
    """One sample as found: key, byte offset of its first header, and its members in tar order."""

    key: str
    offset: int
    members: tuple[MemberSig, ...]
    #: True for the last sample of a truncated shard (its later members were cut off)
    partial: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m[0] for m in self.members)


@dataclass
class ShardScan:
    """What scanning one shard found. `end_offset` is where the last sample ends (Energon's last index
    entry); None when the shard is truncated or corrupt."""

    name: str
    size: int
    samples: list[SampleRecord] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    end_offset: int | None = None
    truncated: bool = False
    corrupt: bool = False
    ignored_entries: int = 0
    #: member -> [min, max] of finite values over the shard's floating tensors
    ranges: dict[str, list[float]] = field(default_factory=dict)

    @property
    def broken(self) -> bool:
        return self.truncated or self.corrupt


def scan_to_dict(scan: ShardScan) -> dict[str, Any]:
    """`scan` as plain JSON data (what one rank of a distributed validation sends rank 0)."""
    return {
        "name": scan.name,
        "size": scan.size,
        "samples": [[r.key, r.offset, [list(m) for m in r.members], r.partial] for r in scan.samples],
        "problems": [
            [p.code, p.shard, p.key, p.member, p.message, p.hint, p.severity, p.dataset, p.detail]
            for p in scan.problems
        ],
        "end_offset": scan.end_offset,
        "truncated": scan.truncated,
        "corrupt": scan.corrupt,
        "ignored_entries": scan.ignored_entries,
        "ranges": scan.ranges,
    }


def scan_from_dict(doc: dict[str, Any]) -> ShardScan:
    """The inverse of `scan_to_dict`: an equal `ShardScan` (member signatures as tuples, layouts shared)."""
    interned: dict[tuple[MemberSig, ...], tuple[MemberSig, ...]] = {}
    samples = []
    for key, offset, members, partial in doc["samples"]:
        sigs = tuple((m[0], m[1], m[2], None if m[3] is None else tuple(m[3])) for m in members)
        samples.append(SampleRecord(key, offset, interned.setdefault(sigs, sigs), partial))
    return ShardScan(
        name=doc["name"],
        size=doc["size"],
        samples=samples,
        problems=[Problem(*fields) for fields in doc["problems"]],
        end_offset=doc["end_offset"],
        truncated=doc["truncated"],
        corrupt=doc["corrupt"],
        ignored_entries=doc["ignored_entries"],
        ranges={k: list(v) for k, v in doc["ranges"].items()},
    )


class _Builder:
    def __init__(self, scan: ShardScan) -> None:
        self.scan = scan
        self.interned: dict[tuple[MemberSig, ...], tuple[MemberSig, ...]] = {}
        self.key: str | None = None
        self.offset = 0
        self.members: list[MemberSig] = []
        self.names: set[str] = set()

    def add(self, key: str, part: str, offset: int, sig: MemberSig) -> None:
        if key != self.key or part in self.names:
            self.flush()
            self.key, self.offset = key, offset
        self.members.append(sig)
        self.names.add(part)

    def flush(self, *, partial: bool = False) -> None:
        if self.key is not None and (self.members or partial):
            members = tuple(self.members)
            members = self.interned.setdefault(members, members)  # most samples share one layout
            self.scan.samples.append(SampleRecord(self.key, self.offset, members, partial))
        self.key, self.members, self.names = None, [], set()


def scan_shard(
    root: str | os.PathLike[str] | DatasetPath,
    name: str,
    *,
    decode: bool = True,
    max_samples: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> ShardScan:
    """Read shard `name` (relative to `root`) member by member and check every payload.

    `decode=False` only lists samples and members (no payload checks). `max_samples` stops after that many
    samples (for `info`; the shard then counts as unfinished: no `end_offset`). `on_bytes(n)` is called as
    bytes are consumed (progress). Never raises for bad data: problems are in the result.
    """
    path = dataset_path(root) / name
    try:
        size = path.stat().st_size
        data = open_shard(path)
    except OSError as exc:
        scan = ShardScan(name=name, size=0)
        scan.corrupt = True
        scan.problems.append(
            Problem("unreadable-shard", name, None, None, f"cannot read the shard: {exc.strerror or exc}")
        )
        return scan
    scan = ShardScan(name=name, size=size)
    if size == 0:
        scan.problems.append(
            Problem("empty-shard", name, None, None, "the file is empty (0 bytes)", detail={"size": 0})
        )
        scan.end_offset = 0
        return scan
    builder = _Builder(scan)
    sig_cache: dict[MemberSig, MemberSig] = {}
    current: tuple[str, str] | None = None
    last_report = 0
    reader = TarReader(data, read_data=decode)
    try:
        for member, payload in reader:
            if member.key is None or member.part is None:
                scan.ignored_entries += 1
                continue
            if (
                max_samples is not None
                and (member.key != builder.key or member.part in builder.names)
                and len(scan.samples) + (builder.key is not None) >= max_samples
            ):
                break
            current = (member.key, member.part)
            result = check_member(member.part, payload if payload is not None else b"", decode=decode)
            payload = None
            sig: MemberSig = (member.part, result.kind, result.dtype, result.shape)
            sig = sig_cache.setdefault(sig, sig)
            builder.add(member.key, member.part, member.offset, sig)
            if result.code is not None:
                scan.problems.append(
                    Problem(
                        result.code, name, member.key, member.part, result.message, detail=result.detail or {}
                    )
                )
            if result.vmin is not None and result.vmax is not None:
                rng = scan.ranges.get(member.part)
                if rng is None:
                    scan.ranges[member.part] = [result.vmin, result.vmax]
                else:
                    rng[0] = min(rng[0], result.vmin)
                    rng[1] = max(rng[1], result.vmax)
            end = member.data_offset + member.size
            if on_bytes is not None and end - last_report >= (1 << 22):
                on_bytes(end - last_report)
                last_report = end
        scan.end_offset = reader.end_offset
    except TarTruncated as exc:
        scan.truncated = True
        where = split_name(exc.name) if exc.name else None
        key, part = where if where else (None, None)
        if where is None:
            builder.flush(partial=True)  # the last sample may have lost members we cannot name
        elif builder.key == key and part not in builder.names:
            builder.flush(partial=True)
        else:
            builder.flush()
            scan.samples.append(SampleRecord(key, exc.offset, (), partial=True))  # type: ignore[arg-type]
        n = sum(not s.partial for s in scan.samples)
        message = (
            f"{exc}; {n} sample(s) before that point are readable, everything after it is lost"
            if exc.name
            else f"{exc} (after {n} sample(s)); samples after that point may be lost"
        )
        scan.problems.append(
            Problem(
                "truncated-shard",
                name,
                key,
                part,
                message,
                detail={
                    "offset": exc.offset,
                    "expected": exc.expected,
                    "available": exc.available,
                    "size": size,
                },
            )
        )
    except OSError as exc:  # a read that failed part-way (remote storage, a failing disk)
        scan.corrupt = True
        builder.flush()
        scan.problems.append(
            Problem(
                "unreadable-shard",
                name,
                current[0] if current else None,
                None,
                f"reading the shard failed after {len(scan.samples)} sample(s): {exc.strerror or exc}",
            )
        )
    except TarCorrupt as exc:
        scan.corrupt = True
        builder.flush()
        scan.problems.append(
            Problem(
                "corrupt-shard",
                name,
                current[0] if current else None,
                None,
                f"{exc}; {len(scan.samples)} sample(s) before it are readable",
                detail={"offset": exc.offset},
            )
        )
    else:
        builder.flush()
        if not scan.samples and max_samples is None:
            scan.problems.append(
                Problem(
                    "empty-shard",
                    name,
                    None,
                    None,
                    f"a valid tar with no samples ({size} bytes"
                    + (f", {scan.ignored_entries} entries Energon ignores" if scan.ignored_entries else "")
                    + ")",
                    detail={"size": size},
                )
            )
    finally:
        close = getattr(data, "close", None)
        if close is not None:
            with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with it
                close()
    if on_bytes is not None and size - last_report > 0:
        on_bytes(size - last_report)
    return scan
