"""Energon's own preparation of a directory of ``.tar`` shards, and the ``dataset.yaml`` it does not write.

`prepare_shards` runs ``WebdatasetPreparator.prepare_dataset``, which writes ``.nv-meta/.info.json``,
``split.yaml``, ``index.sqlite``, ``index.uuid`` and a ``.tar.idx`` beside each shard, with its prints and
log lines captured. `write_dataset_yaml` writes ``.nv-meta/dataset.yaml``: a ``CrudeWebdataset`` of module
``megatron.energon`` with the given subflavors, e.g.::

    __module__: megatron.energon
    __class__: CrudeWebdataset
    subflavors:
      encoding: preencoded

Used by `primus_energon.datasets.finalize` (user shards, split by ratios) and the synthetic generator (its
shards, each split named). Works on Energon 7.0 through 7.4.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["SPLIT_NAMES", "EnergonExited", "dataset_yaml_text", "prepare_shards", "write_dataset_yaml"]

#: Energon's split parts, in the order split ratios give them
SPLIT_NAMES: tuple[str, str, str] = ("train", "val", "test")


class EnergonExited(Exception):
    """``prepare_dataset`` called ``sys.exit`` (it does on duplicate sample keys, after printing why).

    `status` is its exit code, `lines` the non-blank lines it printed or logged, stripped."""

    def __init__(self, status: Any, lines: list[str]) -> None:
        super().__init__(f"Energon's prepare_dataset exited with status {status}")
        self.status = status
        self.lines = lines


def _exact_pattern(names: Sequence[str]) -> str:
    """A split pattern matching exactly `names` (none: nothing)."""
    # Energon brace-expands patterns, which strips backslashes, so dots are escaped as [.]
    if not names:
        return "^$"
    return "^(" + "|".join(n.replace(".", "[.]") for n in names) + ")$"


def prepare_shards(
    root: Path,
    shards: Sequence[str],
    *,
    ratios: Sequence[float] | None = None,
    shard_splits: Sequence[str] | None = None,
    shuffle_seed: int | None = None,
    workers: int = 1,
) -> set[str]:
    """Prepare the `shards` (paths relative to `root`) with Energon; returns the split parts it found.

    Exactly one of `ratios` ((train, val, test) ratios; Energon assigns whole shards, in shard order unless
    `shuffle_seed`) and `shard_splits` (the split of each shard, one of `SPLIT_NAMES`) says the split.
    `workers` is clamped to 1..len(shards). Raises `EnergonExited` when Energon calls ``sys.exit``; any
    other exception of Energon's propagates as it is.
    """
    from megatron.energon.flavors.webdataset.prepare import WebdatasetPreparator

    split: dict[str, Any]
    if ratios is not None and shard_splits is None:
        split = {"split_parts_ratio": list(zip(SPLIT_NAMES, ratios, strict=True))}
    elif shard_splits is not None and ratios is None:
        named = list(zip(shards, shard_splits, strict=True))
        patterns = [(part, _exact_pattern([n for n, sp in named if sp == part])) for part in SPLIT_NAMES]
        split = {"split_parts_patterns": patterns}
    else:
        raise TypeError("prepare_shards takes exactly one of ratios and shard_splits")
    captured = io.StringIO()
    energon_logger = logging.getLogger("megatron.energon")
    handler = logging.StreamHandler(captured)
    energon_logger.addHandler(handler)
    try:
        with contextlib.redirect_stdout(captured):
            result = WebdatasetPreparator.prepare_dataset(
                root,
                list(shards),
                **split,
                shuffle_seed=shuffle_seed,
                workers=max(1, min(workers, len(shards))),
            )
    except SystemExit as exc:
        lines = [ln.strip() for ln in captured.getvalue().splitlines() if ln.strip()]
        raise EnergonExited(exc.code, lines) from None
    finally:
        energon_logger.removeHandler(handler)
    parts = result[0] if isinstance(result, tuple) else result  # 7.4 also returns the duplicates it saw
    return set(parts or ())


def dataset_yaml_text(subflavors: Mapping[str, Any]) -> str:
    """The ``dataset.yaml`` of a CrudeWebdataset with `subflavors` (in their order)."""
    doc = {"__module__": "megatron.energon", "__class__": "CrudeWebdataset", "subflavors": dict(subflavors)}
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, default_flow_style=False)


def write_dataset_yaml(root: Path, subflavors: Mapping[str, Any]) -> Path:
    """Write `dataset_yaml_text` to ``root/.nv-meta/dataset.yaml`` (making ``.nv-meta``); returns its path."""
    path = root / ".nv-meta" / "dataset.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(dataset_yaml_text(subflavors), encoding="utf-8")
    return path
