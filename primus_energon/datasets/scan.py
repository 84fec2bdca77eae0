"""Scanning one shard: every member of every sample, read once, checked, and summarised.

`scan_shard` is the unit of parallel work: a pure function of the shard's bytes (so any worker count gives
the same results). It reports what one shard shows on its own (truncation, payload problems); what needs
the whole dataset (duplicate keys, missing members, shape consistency) is decided from its `ShardScan` by
`primus_energon.datasets.analysis`.

Samples are grouped like Energon groups them: consecutive members with the same key form one sample. A
member name that repeats within a run starts a new sample with the same key (a duplicate key written twice
in a row; Energon's index sees two samples there too).

Hostile input: every member is checked inside one net (`primus_energon.datasets.limits`): any exception a
check raises (MemoryError, RecursionError, OverflowError, anything) becomes a problem of that shard, key and
member (``limit-exceeded`` for a time, memory or depth limit, naming it; ``check-failed`` otherwise), and
the scan goes on with the next member. Entries whose names escape the extraction directory (absolute, or
with ``..``), links, devices and FIFOs, and names with control characters are problems of their own kinds.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..storage import DatasetPath, dataset_path
from .checks import MemberCheck, check_member
from .limits import DEFAULT_LIMITS, MemberTimeout, ScanLimits, failure_problem_fields, member_deadline
from .problems import Problem
from .tarscan import (
    TarCorrupt,
    TarMember,
    TarReader,
    TarTruncated,
    control_characters,
    open_shard,
    split_name,
    unsafe_path,
)

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


def _entry_problems(name: str, member: TarMember, reported_keys: set[str]) -> list[Problem]:
    """Problems of an entry's name and type: an escaping path, a link, a device or FIFO, control
    characters (once per sample key)."""
    out: list[Problem] = []
    why = unsafe_path(member.name)
    if why is not None:
        out.append(
            Problem(
                "unsafe-path",
                name,
                member.key,
                member.part,
                f"the entry {member.name[:200]!r} has an {why}: extracting the shard would write it outside "
                "the extraction directory",
                detail={"name": member.name, "reason": why},
            )
        )
    if member.type in ("symlink", "hardlink"):
        out.append(
            Problem(
                "link-member",
                name,
                member.key,
                member.part,
                f"the entry {member.name[:200]!r} is a {member.type} to {str(member.linkname)[:200]!r} "
                "(Energon skips it; extracting the shard would create the link)",
                detail={"name": member.name, "type": member.type, "target": member.linkname},
            )
        )
    elif member.type in ("character-device", "block-device", "fifo"):
        out.append(
            Problem(
                "special-member",
                name,
                member.key,
                member.part,
                f"the entry {member.name[:200]!r} is a {member.type} (Energon skips it; extracting the shard "
                "would create it)",
                detail={"name": member.name, "type": member.type},
            )
        )
    found = control_characters(member.name)
    if found:
        in_key = member.key is not None and control_characters(member.key)
        if not in_key or member.key not in reported_keys:
            if in_key:
                reported_keys.add(member.key)  # type: ignore[arg-type]
            out.append(
                Problem(
                    "control-character",
                    name,
                    member.key,
                    None if in_key else member.part,
                    f"the {'sample key' if in_key else 'entry name'} {member.name[:200]!r} holds control "
                    f"character(s) {', '.join(found)}",
                    detail={"name": member.name, "characters": found},
                )
            )
    return out


def _checked(part: str, payload: Any, decode: bool, seconds: float | None) -> tuple[MemberCheck, bool]:
    """`check_member` inside the net: (result, True), or (a result carrying the failure, False)."""
    try:
        with member_deadline(seconds if decode else None):
            return check_member(part, payload, decode=decode), True
    except (Exception, MemberTimeout) as exc:  # noqa: BLE001 - the net: every failure becomes a problem
        code, message, detail = failure_problem_fields(exc)
        from ..formats import member_kind

        return MemberCheck(member_kind(part), code, message, detail=detail), False


def scan_shard(
    root: str | os.PathLike[str] | DatasetPath,
    name: str,
    *,
    decode: bool = True,
    max_samples: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
    limits: ScanLimits = DEFAULT_LIMITS,
) -> ShardScan:
    """Read shard `name` (relative to `root`) member by member and check every payload.

    `decode=False` only lists samples and members (no payload checks). `max_samples` stops after that many
    samples (for `info`; the shard then counts as unfinished: no `end_offset`). `on_bytes(n)` is called as
    bytes are consumed (progress). `limits`: the time budget per member (see `primus_energon.datasets.limits`).
    Never raises for bad data: problems are in the result.
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
    reader = TarReader(data, read_data=decode, special=True)
    reported_keys: set[str] = set()
    try:
        for member, payload in reader:
            if member.type != "file" or unsafe_path(member.name) or control_characters(member.name):
                scan.problems.extend(_entry_problems(name, member, reported_keys))
                if member.type != "file":
                    continue
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
            result, _ = _checked(
                member.part, payload if payload is not None else b"", decode, limits.member_seconds
            )
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
    except Exception as exc:  # noqa: BLE001 - reading the tar itself failed in a way not foreseen
        scan.corrupt = True
        builder.flush()
        scan.problems.append(
            Problem(
                "corrupt-shard",
                name,
                current[0] if current else None,
                None,
                f"reading the tar failed ({type(exc).__name__}: {str(exc)[:160]}); {len(scan.samples)} "
                "sample(s) before it are readable",
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
