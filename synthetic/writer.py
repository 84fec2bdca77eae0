"""One shard at a time: the unit of work that worker processes and ranks split between them.

`primus_energon.synthetic.plan.DatasetPlan` is everything a shard's bytes depend on; `write_shard(plan, s)` writes shard `s`
and returns its manifest records. Shards are independent, so any assignment of shards to processes gives the
same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .damage import apply_member_fault, dotted_key_fault
from .faults import dotted_key
from .manifest import FaultRecord, MemberRecord, SampleRecord
from .payloads import PayloadFactory
from .plan import DatasetPlan
from .tar import TarShardWriter

__all__ = ["ShardResult", "write_shard"]


@dataclass
class ShardResult:
    """What writing one shard produced, before dataset-level faults."""

    shard: int
    size: int
    samples: list[SampleRecord]
    faults: list[FaultRecord]


def write_shard(plan: DatasetPlan, s: int, on_sample: Callable[[], None] | None = None) -> ShardResult:
    """Write shard `s` of `plan` into `plan.out_dir` (atomically) with its sample-level faults applied."""
    schema = plan.schema
    factory = PayloadFactory(schema, plan.seed, variable_shapes=plan.variable_shapes)
    shard_name = plan.shard_names[s]
    split = plan.shard_splits[s]
    writer = TarShardWriter(Path(plan.out_dir) / shard_name)
    digests: dict[tuple[int, str], str] = {}
    pending: list[tuple[int, str, list[tuple[str, str, str | None, tuple[int, ...] | None, int]]]] = []
    faults: list[FaultRecord] = []
    try:
        for index in plan.shard_range(s):
            key = plan.key(index)
            planned = plan.fault_plan.samples.get(index)
            stored_key = key
            if planned is not None and planned.kind == "dotted-key":
                stored_key = dotted_key(key)
                faults.append(dotted_key_fault(shard_name, key, schema.members))
            members: list[tuple[str, str, str | None, tuple[int, ...] | None, int]] = []
            for name, spec in schema.members.items():
                payload = factory.payload(name, spec, index, key)
                if planned is not None and planned.member == name and planned.kind != "duplicate-key":
                    damaged, detail = apply_member_fault(
                        planned, factory, index, key, payload, marker_path=plan.marker_path
                    )
                    faults.append(FaultRecord(planned.kind, shard_name, key, name, detail))
                    if damaged is None:
                        continue
                    if planned.kind in ("garbage-payload", "malicious-pickle", "non-utf8-caption"):
                        damaged.dtype, damaged.shape = None, None
                    payload = damaged
                data = payload.data
                size = len(data) if isinstance(data, bytes) else data.nbytes
                members.append((name, payload.kind, payload.dtype, payload.shape, size))
                writer.add(
                    f"{stored_key}.{name}",
                    data,
                    lambda digest, k=(index, name): digests.__setitem__(k, digest),
                )
            pending.append((index, key, members))
            if on_sample is not None:
                on_sample()
        size = writer.close()
    except BaseException:
        writer.abort()
        raise
    samples = [
        SampleRecord(
            key=key,
            index=index,
            shard=shard_name,
            split=split,
            members={
                name: MemberRecord(kind, dtype, shape, size, digests[(index, name)])
                for name, kind, dtype, shape, size in members
            },
        )
        for index, key, members in pending
    ]
    return ShardResult(shard=s, size=size, samples=samples, faults=faults)
