"""Turning written shards into a dataset Energon loads: the split of each shard, then the library's
preparation (`primus_energon.datasets.preparation`: Energon's own `prepare_dataset`, then ``dataset.yaml``).

`prepare_dataset` writes ``.nv-meta/{.info.json, split.yaml, index.sqlite, index.uuid}`` and a ``.tar.idx``
next to each shard; ``dataset.yaml`` is written with the schema's subflavors. Each shard is assigned to its
planned split by name, so the split is exactly the planned one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from primus_energon.datasets.preparation import SPLIT_NAMES, EnergonExited, prepare_shards, write_dataset_yaml

from .errors import SyntheticError

__all__ = ["SPLIT_NAMES", "assign_splits", "prepare_with_energon", "write_dataset_yaml"]


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


def prepare_with_energon(
    root: Path, shard_names: Sequence[str], shard_splits: Sequence[str], *, workers: int = 1
) -> None:
    """Prepare `root` with Energon (quietly), shard ``shard_names[i]`` in split ``shard_splits[i]``;
    `SyntheticError` when Energon refuses the shards (it exits on duplicate keys)."""
    try:
        prepare_shards(root, shard_names, shard_splits=shard_splits, workers=workers)
    except EnergonExited as exc:
        raise SyntheticError(
            f"Energon's prepare_dataset refused the shards in {root} (exit {exc.status}): {' | '.join(exc.lines)}"
        ) from None
