"""Named faults: their kinds, how a request is parsed, and where each one goes (a seeded `FaultPlan`).

What each fault does to the bytes is in `primus_energon.synthetic.damage`. Each sample carries at most one fault, and sample
faults never land in a shard that a shard fault hits, so every fault's damage is exactly what its manifest
record says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import SyntheticError
from .rng import fault_rng
from .schema import FLOAT_DTYPES, ImageSpec, JsonSpec, Schema, TensorSpec, TextSpec

__all__ = [
    "DOTTED_SUFFIX",
    "FAULT_KINDS",
    "POST_PREPARE_FAULTS",
    "SHARD_FAULTS",
    "FaultPlan",
    "PlannedFault",
    "dotted_key",
    "parse_faults",
    "plan_faults",
]

FAULT_KINDS: tuple[str, ...] = (
    "truncated-shard",
    "garbage-payload",
    "missing-member",
    "duplicate-key",
    "dotted-key",
    "empty-shard",
    "malicious-pickle",
    "non-utf8-caption",
    "nan-tensor",
    "wrong-dtype",
    "wrong-shape",
)
SHARD_FAULTS = frozenset({"truncated-shard", "empty-shard"})
POST_PREPARE_FAULTS = frozenset({"truncated-shard", "empty-shard", "duplicate-key"})
_KEY_FAULTS = frozenset({"duplicate-key", "dotted-key"})
#: suffix appended to a key by ``dotted-key``: Energon then sees the clean key and members ``v2.<member>``
DOTTED_SUFFIX = ".v2"


def _eligible_members(kind: str, schema: Schema) -> list[str]:
    m = schema.members
    if kind == "missing-member":
        return list(m) if len(m) > 1 else []
    if kind in ("malicious-pickle", "wrong-dtype", "wrong-shape"):
        return [n for n, s in m.items() if isinstance(s, TensorSpec)]
    if kind == "nan-tensor":
        return [n for n, s in m.items() if isinstance(s, TensorSpec) and s.dtype in FLOAT_DTYPES]
    if kind == "garbage-payload":
        return [n for n, s in m.items() if isinstance(s, (TensorSpec, ImageSpec, JsonSpec))]
    if kind == "non-utf8-caption":
        return [n for n, s in m.items() if isinstance(s, TextSpec)]
    return []


_NEEDS = {
    "missing-member": "at least two members",
    "malicious-pickle": "a tensor member",
    "wrong-dtype": "a tensor member",
    "wrong-shape": "a tensor member",
    "nan-tensor": "a floating-point tensor member",
    "garbage-payload": "a tensor, image or json member",
    "non-utf8-caption": "a text member",
}


def parse_faults(spec: Mapping[str, int] | Iterable[str] | None) -> dict[str, int]:
    """Normalise ``{"kind": count}`` or ``["kind", "kind:count", ...]`` to a dict in `FAULT_KINDS` order."""
    counts: dict[str, int] = {}
    if spec is None:
        return counts
    if isinstance(spec, str):
        raise SyntheticError(
            f"faults must be a list like ['{spec}'] or a dict like {{'{spec}': 1}}, not a string"
        )
    items: Iterable[tuple[str, Any]]
    if isinstance(spec, Mapping):
        items = spec.items()
    else:
        parsed = []
        for entry in spec:
            if not isinstance(entry, str):
                raise SyntheticError(f"fault {entry!r} must be a string KIND or KIND:COUNT")
            kind, _, count = entry.partition(":")
            parsed.append((kind, count or "1"))
        items = parsed
    for kind, count in items:
        if kind not in FAULT_KINDS:
            raise SyntheticError(f"unknown fault kind {kind!r}; known kinds: {', '.join(FAULT_KINDS)}")
        try:
            n = int(count)
        except (TypeError, ValueError):
            raise SyntheticError(f"fault {kind!r}: count must be a positive integer, got {count!r}") from None
        if n < 0 or isinstance(count, bool):
            raise SyntheticError(f"fault {kind!r}: count must be a positive integer, got {count!r}")
        if n:
            counts[kind] = counts.get(kind, 0) + n
    return {k: counts[k] for k in FAULT_KINDS if k in counts}


@dataclass(frozen=True)
class PlannedFault:
    """Where one fault goes. `partner`: the sample whose key a ``duplicate-key`` copies; `position`/`member`/
    `fraction`: which sample, member and point of it a ``truncated-shard`` cuts."""

    kind: str
    member: str | None = None
    partner: int | None = None
    position: int | None = None
    fraction: float = 0.5


@dataclass(frozen=True)
class FaultPlan:
    """Sample faults by global sample index and shard faults by shard index; a pure function of the options."""

    samples: Mapping[int, PlannedFault] = field(default_factory=dict)
    shards: Mapping[int, PlannedFault] = field(default_factory=dict)
    partners: frozenset[int] = frozenset()


def plan_faults(
    schema: Schema, num_samples: int, shard_size: int, faults: Mapping[str, int], seed: int
) -> FaultPlan:
    """Choose seeded positions for `faults`; raise `SyntheticError` if they do not fit the dataset."""
    if not faults:
        return FaultPlan()
    rng = fault_rng(seed, 0)
    num_shards = -(-num_samples // shard_size)
    shard_kinds = [k for k in faults if k in SHARD_FAULTS]
    n_shard_faults = sum(faults[k] for k in shard_kinds)
    if n_shard_faults > num_shards:
        raise SyntheticError(
            f"{n_shard_faults} shard fault(s) ({', '.join(shard_kinds)}) need as many shards, but there are "
            f"{num_shards}; use more samples or a smaller shard size"
        )
    shard_order = [int(i) for i in rng.permutation(num_shards)]
    shards: dict[int, PlannedFault] = {}
    for kind in shard_kinds:
        for _ in range(faults[kind]):
            s = shard_order.pop(0)
            n_in_shard = min(shard_size, num_samples - s * shard_size)
            members = list(schema.members)
            shards[s] = PlannedFault(
                kind,
                member=members[int(rng.integers(len(members)))] if kind == "truncated-shard" else None,
                position=int(rng.integers(n_in_shard)) if kind == "truncated-shard" else None,
                fraction=float(rng.random()),
            )
    free = [i for i in range(num_samples) if i // shard_size not in shards]
    needed = sum(n * (2 if k == "duplicate-key" else 1) for k, n in faults.items() if k not in SHARD_FAULTS)
    if needed > len(free):
        raise SyntheticError(
            f"the requested sample faults need {needed} distinct samples outside faulted shards, but only "
            f"{len(free)} are available; use more samples (each sample carries at most one fault)"
        )
    order = [free[int(i)] for i in rng.permutation(len(free))]
    samples: dict[int, PlannedFault] = {}
    partners: set[int] = set()
    for kind, count in faults.items():
        if kind in SHARD_FAULTS:
            continue
        members = _eligible_members(kind, schema)
        if kind not in _KEY_FAULTS and not members:
            raise SyntheticError(
                f"fault {kind!r} needs {_NEEDS[kind]}, and the {schema.encoding!r} schema has none "
                f"(members: {', '.join(schema.members)})"
            )
        for _ in range(count):
            index = order.pop(0)
            member = members[int(rng.integers(len(members)))] if members else None
            partner = None
            if kind == "duplicate-key":
                partner = order.pop(0)
                partners.add(partner)
            samples[index] = PlannedFault(kind, member=member, partner=partner)
    return FaultPlan(samples=samples, shards=shards, partners=frozenset(partners))


def dotted_key(key: str) -> str:
    """The key a ``dotted-key`` fault stores (Energon cuts it at the dot)."""
    return key + DOTTED_SUFFIX
