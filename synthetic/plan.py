"""The resolved options of one dataset: validated once, a pure value every worker and rank shares.

Light on purpose (no torch): the CLI and `generate_dataset` reject bad options before loading anything heavy.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

from .errors import SyntheticError
from .faults import FaultPlan, parse_faults, plan_faults
from .preparation import assign_splits
from .schema import Schema, builtin_schema, load_schema

__all__ = ["DatasetPlan", "build_plan", "fingerprint", "positive_int", "resolve_schema"]

_KEY_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class DatasetPlan:
    """The resolved options of one dataset: a pure value, identical on every worker and rank."""

    out_dir: str
    schema: Schema
    seed: int
    num_samples: int
    shard_size: int
    key_prefix: str
    variable_shapes: bool
    shard_names: tuple[str, ...]
    shard_splits: tuple[str, ...]
    fault_plan: FaultPlan = field(default_factory=FaultPlan)
    marker_path: str | None = None

    @property
    def num_shards(self) -> int:
        return len(self.shard_names)

    @property
    def key_width(self) -> int:
        return max(6, len(str(self.num_samples - 1)))

    def key(self, index: int) -> str:
        """The key of sample `index`: ``<prefix>_<zero-padded index>`` (all keys have the same length)."""
        return f"{self.key_prefix}_{index:0{self.key_width}d}"

    def shard_range(self, s: int) -> range:
        return range(s * self.shard_size, min((s + 1) * self.shard_size, self.num_samples))


def positive_int(value: Any, name: str, *, minimum: int = 1) -> int:
    """`value` as an int, or `SyntheticError` if it is not an integer >= `minimum` (bools are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise SyntheticError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def resolve_schema(
    encoding: str | None,
    schema: Schema | str | PathLike[str] | None,
    dtype: str | None,
    shapes: Mapping[str, Sequence[int]] | None,
    image_format: str | None,
    image_size: tuple[int, int] | None,
) -> Schema:
    """The schema to generate: the built-in one of `encoding`, or `schema` (object or file), with overrides."""
    if schema is None:
        if image_format is not None and (encoding or "preencoded") != "raw":
            raise SyntheticError("image_format applies to the raw encoding only; add encoding='raw'")
        return builtin_schema(
            encoding or "preencoded",
            dtype=dtype,
            shapes=shapes,
            image_format=image_format or "jpg",
            image_size=image_size,
        )
    if not isinstance(schema, Schema):
        schema = load_schema(schema)
    if encoding is not None and encoding != schema.encoding:
        raise SyntheticError(
            f"encoding {encoding!r} does not match the schema's encoding {schema.encoding!r}; drop one of them"
        )
    if image_format is not None:
        raise SyntheticError(
            "image_format applies to the built-in raw encoding; in a schema, name the image member by its extension"
        )
    return schema.with_overrides(dtype=dtype, shapes=shapes, image_size=image_size)


def build_plan(
    out_dir: Path,
    *,
    encoding: str | None,
    schema: Schema | str | PathLike[str] | None,
    num_samples: int,
    shard_size: int,
    seed: int,
    dtype: str | None,
    shapes: Mapping[str, Sequence[int]] | None,
    image_format: str | None,
    image_size: tuple[int, int] | None,
    variable_shapes: bool,
    split: Sequence[float],
    faults: Mapping[str, int] | Iterable[str] | None,
    marker_path: str | PathLike[str] | None,
    key_prefix: str | None,
) -> tuple[DatasetPlan, dict[str, Any]]:
    """Validate every option and resolve them into a `DatasetPlan` plus the options the manifest records."""
    num_samples = positive_int(num_samples, "num_samples")
    shard_size = positive_int(shard_size, "shard_size")
    seed = positive_int(seed, "seed", minimum=0)
    resolved = resolve_schema(encoding, schema, dtype, shapes, image_format, image_size)
    prefix = f"s{seed}" if key_prefix is None else key_prefix
    if not isinstance(prefix, str) or not _KEY_PREFIX_RE.match(prefix):
        raise SyntheticError(
            f"key_prefix {prefix!r} may contain only letters, digits, '_' and '-' (no dots: Energon splits "
            "member names at the first dot)"
        )
    num_shards = -(-num_samples // shard_size)
    width = max(6, len(str(num_shards - 1)))
    shard_names = tuple(f"shard-{s:0{width}d}.tar" for s in range(num_shards))
    shard_splits = tuple(assign_splits(num_shards, split))
    fault_counts = parse_faults(faults)
    fault_plan = plan_faults(resolved, num_samples, shard_size, fault_counts, seed)
    marker = None
    if "malicious-pickle" in fault_counts:
        marker = str(
            Path(marker_path).absolute() if marker_path else out_dir.parent / f"{out_dir.name}.PWNED"
        )
    plan = DatasetPlan(
        out_dir=str(out_dir),
        schema=resolved,
        seed=seed,
        num_samples=num_samples,
        shard_size=shard_size,
        key_prefix=prefix,
        variable_shapes=bool(variable_shapes),
        shard_names=shard_names,
        shard_splits=shard_splits,
        fault_plan=fault_plan,
        marker_path=marker,
    )
    total = sum(float(x) for x in split)
    options = {
        "dtype": dtype,
        "shapes": None if shapes is None else {k: list(v) for k, v in shapes.items()},
        "image_format": image_format,
        "image_size": None if image_size is None else list(image_size),
        "variable_shapes": bool(variable_shapes),
        "split": [float(x) / total for x in split],
        "faults": fault_counts,
        "key_prefix": prefix,
    }
    return plan, options


def fingerprint(plan: DatasetPlan, options: dict[str, Any]) -> str:
    doc = {"options": options, "schema": plan.schema.to_dict(), "seed": plan.seed, "n": plan.num_samples}
    doc["shard_size"] = plan.shard_size
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
