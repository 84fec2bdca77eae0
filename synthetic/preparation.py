"""Turning written shards into a dataset Energon loads: its own `prepare_dataset`, then ``dataset.yaml``.

`prepare_dataset` writes ``.nv-meta/{.info.json, split.yaml, index.sqlite, index.uuid}`` and a ``.tar.idx``
next to each shard; it does not write ``dataset.yaml``, so that is written here with the schema's
subflavors. Shards are assigned to splits by exact-name patterns, so the split is exactly the planned one.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .errors import SyntheticError

__all__ = ["SPLIT_NAMES", "assign_splits", "prepare_with_energon", "write_dataset_yaml"]

SPLIT_NAMES: tuple[str, str, str] = ("train", "val", "test")


def assign_splits(num_shards: int, ratios: Sequence[float]) -> list[str]:
    """The split of each shard: contiguous train, val, test runs sized by largest remainder, every split with a
    positive ratio getting at least one shard."""
    try:
        r = [float(x) for x in ratios]
    except (TypeError, ValueError):
        raise SyntheticError(f"split must be three numbers (train, val, test), got {ratios!r}") from None
    if len(r) != 3 or any(x < 0 for x in r) or sum(r) <= 0:
        raise SyntheticError(
            f"split must be three non-negative numbers (train, val, test) with a positive sum, got {ratios!r}"
        )
    total = sum(r)
    exact = [num_shards * x / total for x in r]
    counts = [int(e) for e in exact]
    for i in sorted(range(3), key=lambda i: (-(exact[i] - counts[i]), i))[: num_shards - sum(counts)]:
        counts[i] += 1
    wanted = sum(1 for x in r if x > 0)
    if wanted > num_shards:
        raise SyntheticError(
            f"split {list(ratios)} needs at least {wanted} shards (one per non-empty split) but there are "
            f"{num_shards}; use more samples or a smaller shard size"
        )
    for i in range(3):
        if r[i] > 0 and counts[i] == 0:
            donor = max(range(3), key=lambda j: (counts[j], -j))
            counts[donor] -= 1
            counts[i] += 1
    return [name for name, n in zip(SPLIT_NAMES, counts, strict=True) for _ in range(n)]


def _pattern(names: Sequence[str]) -> str:
    # Energon brace-expands patterns, which strips backslashes, so dots are escaped as [.]
    if not names:
        return "^$"
    return "^(" + "|".join(n.replace(".", "[.]") for n in names) + ")$"


def prepare_with_energon(
    root: Path, shard_names: Sequence[str], shard_splits: Sequence[str], *, workers: int = 1
) -> None:
    """Run ``WebdatasetPreparator.prepare_dataset`` on `root` (quietly; its prints are captured)."""
    from megatron.energon.flavors.webdataset.prepare import WebdatasetPreparator

    patterns = [
        (part, _pattern([n for n, sp in zip(shard_names, shard_splits, strict=True) if sp == part]))
        for part in SPLIT_NAMES
    ]
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            WebdatasetPreparator.prepare_dataset(
                root,
                list(shard_names),
                split_parts_patterns=patterns,
                shuffle_seed=None,
                workers=max(1, min(workers, len(shard_names))),
            )
    except SystemExit as exc:  # duplicate keys make it call sys.exit(1)
        lines = " | ".join(line for line in captured.getvalue().splitlines() if line.strip())
        raise SyntheticError(
            f"Energon's prepare_dataset refused the shards in {root} (exit {exc.code}): {lines}"
        ) from None


def write_dataset_yaml(root: Path, subflavors: Mapping[str, Any]) -> Path:
    """Write ``.nv-meta/dataset.yaml`` for a CrudeWebdataset with `subflavors`."""
    path = root / ".nv-meta" / "dataset.yaml"
    doc = {"__module__": "megatron.energon", "__class__": "CrudeWebdataset", "subflavors": dict(subflavors)}
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path
