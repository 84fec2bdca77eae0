"""Metadataset YAML: a weighted blend of datasets with per-entry subflavors (MetadatasetV2, or the legacy form).

Current form (``MetadatasetV2``)::

    __module__: megatron.energon
    __class__: MetadatasetV2
    splits:
      train:
        blend:
          - {weight: 0.7, path: dsA, subflavors: {source: a}}

Legacy form (``Metadataset``, `legacy=True`): the same with ``datasets:`` instead of ``blend:``. Energon
resolves relative paths against the YAML's directory; entry subflavors override the dataset's own.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import yaml

from .errors import SyntheticError

__all__ = ["BlendEntry", "parse_blend", "write_metadataset"]

#: (path, weight) or (path, weight, subflavors)
BlendEntry = tuple[str | PathLike[str], float] | tuple[str | PathLike[str], float, Mapping[str, Any]]


def parse_blend(text: str) -> tuple[str, float, dict[str, str]]:
    """Parse the CLI form ``PATH:WEIGHT[:key=value,...]`` (PATH may itself contain ':')."""
    parts = text.split(":")
    subflavors: dict[str, str] = {}
    if len(parts) >= 3 and "=" in parts[-1]:
        for item in parts.pop().split(","):
            k, sep, v = item.partition("=")
            if not sep or not k.strip():
                raise SyntheticError(
                    f"--blend {text!r}: subflavors must be key=value[,key=value...], got {item!r}"
                )
            subflavors[k.strip()] = v.strip()
    if len(parts) < 2 or not parts[-1].strip():
        raise SyntheticError(
            f"--blend {text!r}: expected PATH:WEIGHT[:key=value,...], e.g. data/a:0.7:source=a"
        )
    weight_text = parts.pop()
    try:
        weight = float(weight_text)
    except ValueError:
        raise SyntheticError(f"--blend {text!r}: weight {weight_text!r} is not a number") from None
    return ":".join(parts), weight, subflavors


def _yaml_path(dataset: Path, yaml_dir: Path) -> str:
    """Relative to the YAML's directory when the dataset lies below it, else absolute."""
    try:
        return dataset.relative_to(yaml_dir).as_posix()
    except ValueError:
        return str(dataset)


def write_metadataset(
    out_yaml: str | PathLike[str],
    entries: Iterable[BlendEntry],
    *,
    legacy: bool = False,
    splits: Sequence[str] = ("train",),
    check: bool = True,
) -> Path:
    """Write a metadataset blending `entries` ``(path, weight[, subflavors])`` and return its path.

    `legacy`: write the legacy ``Metadataset``/``datasets:`` form instead of ``MetadatasetV2``/``blend:``.
    `splits`: the split names that get this blend (each entry reads the same-named split of its dataset).
    `check`: require each path to be a prepared dataset (``.nv-meta/``) or a metadataset ``.yaml``.
    """
    out = Path(out_yaml).absolute()
    if out.suffix not in (".yaml", ".yml"):
        raise SyntheticError(
            f"metadataset file {str(out_yaml)!r} must end in .yaml (Energon picks the loader by it)"
        )
    items = []
    for entry in entries:
        if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
            raise SyntheticError(
                f"blend entry {entry!r} must be (path, weight) or (path, weight, subflavors)"
            )
        path, weight = Path(entry[0]).absolute(), entry[1]
        subflavors = dict(entry[2]) if len(entry) == 3 and entry[2] else {}
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float))
            or not math.isfinite(weight)
            or weight <= 0
        ):
            raise SyntheticError(
                f"blend entry {str(entry[0])!r}: weight must be a positive number, got {weight!r}"
            )
        if check and not (
            (path / ".nv-meta").is_dir() or (path.is_file() and path.suffix in (".yaml", ".yml"))
        ):
            raise SyntheticError(
                f"blend entry {str(entry[0])!r} is not a prepared dataset (no .nv-meta/) or metadataset .yaml; "
                "generate it first or pass check=False"
            )
        item: dict[str, Any] = {"weight": float(weight), "path": _yaml_path(path, out.parent)}
        if subflavors:
            item["subflavors"] = subflavors
        items.append(item)
    if not items:
        raise SyntheticError("a metadataset needs at least one blend entry")
    if not splits:
        raise SyntheticError("splits must name at least one split, e.g. ('train',)")
    group = "datasets" if legacy else "blend"
    doc = {
        "__module__": "megatron.energon",
        "__class__": "Metadataset" if legacy else "MetadatasetV2",
        "splits": {name: {group: copy.deepcopy(items)} for name in splits},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")
    os.replace(tmp, out)
    return out
