"""Reading a prepared dataset's metadata the way Energon 7.4 reads it, collecting problems instead of raising.

Files (Energon 7.4.1, flavors/webdataset/metadata.py): ``.nv-meta/.info.json`` (``.info.yaml`` fallback) with ``shard_counts``; ``split.yaml``
(``split.json`` fallback) with ``split_parts`` (brace-expanded shard names) and ``exclude``;
``dataset.yaml`` (``__module__``/``__class__``/``subflavors``); ``<shard>.tar.idx`` beside each shard
(count + 1 native uint64 offsets: sample starts, then the end of the last sample).
"""

from __future__ import annotations

import json
import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..storage import DatasetPath, RemotePath, dataset_path
from .problems import Problem

__all__ = [
    "META_DIR",
    "DatasetMeta",
    "list_shard_files",
    "read_index",
    "read_metadata",
]

META_DIR = ".nv-meta"
_COMPRESSED_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")


def _expand(pattern: str) -> list[str]:
    import braceexpand  # an Energon dependency; expands shard-{000..003}.tar like Energon does

    return list(braceexpand.braceexpand(pattern))


@dataclass
class DatasetMeta:
    """What the metadata says. Fields are None where the file is missing or unreadable (see `problems`)."""

    root: DatasetPath
    has_meta_dir: bool = False
    info_file: str | None = None
    shard_counts: dict[str, int] | None = None
    split_file: str | None = None
    split_parts: dict[str, list[str]] | None = None
    exclude_shards: set[str] = field(default_factory=set)
    exclude_samples: set[str] = field(default_factory=set)
    dataset_yaml: dict[str, Any] | None = None
    has_sqlite: bool = False
    problems: list[Problem] = field(default_factory=list)

    @property
    def declared_encoding(self) -> str | None:
        sub = (self.dataset_yaml or {}).get("subflavors")
        enc = sub.get("encoding") if isinstance(sub, dict) else None
        return None if enc is None else str(enc)

    @property
    def subflavors(self) -> dict[str, Any]:
        sub = (self.dataset_yaml or {}).get("subflavors")
        return dict(sub) if isinstance(sub, dict) else {}

    def split_of(self) -> dict[str, list[str]]:
        """shard -> the split parts listing it."""
        out: dict[str, list[str]] = {}
        for part, shards in (self.split_parts or {}).items():
            for s in shards:
                out.setdefault(s, []).append(part)
        return out


def _problem(code: str, message: str, **kw: Any) -> Problem:
    return Problem(code, kw.pop("shard", None), None, None, message, **kw)


def _load(path: DatasetPath) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    return yaml.safe_load(text)


def _read_info(meta: DatasetMeta, nv: DatasetPath) -> None:
    for fname in (".info.json", ".info.yaml"):
        p = nv / fname
        if not p.is_file():
            continue
        meta.info_file = fname
        try:
            doc = _load(p)
        except (ValueError, yaml.YAMLError, UnicodeDecodeError) as exc:
            meta.problems.append(_problem("bad-metadata", f"{META_DIR}/{fname} cannot be parsed: {exc}"))
            return
        counts = doc.get("shard_counts") if isinstance(doc, dict) else None
        if not isinstance(counts, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in counts.items()
        ):
            meta.problems.append(
                _problem(
                    "bad-metadata", f"{META_DIR}/{fname} has no 'shard_counts' mapping of shard name to count"
                )
            )
            return
        meta.shard_counts = dict(counts)
        return
    meta.problems.append(
        _problem(
            "missing-metadata",
            f"{META_DIR}/.info.json is missing: Energon does not recognise the directory as a dataset",
        )
    )


def _read_split(meta: DatasetMeta, nv: DatasetPath) -> None:
    for fname in ("split.yaml", "split.json"):
        p = nv / fname
        if not p.is_file():
            continue
        meta.split_file = fname
        try:
            doc = _load(p)
        except (ValueError, yaml.YAMLError, UnicodeDecodeError) as exc:
            meta.problems.append(_problem("bad-metadata", f"{META_DIR}/{fname} cannot be parsed: {exc}"))
            return
        parts = doc.get("split_parts") if isinstance(doc, dict) else None
        if not isinstance(parts, dict) or not all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in parts.values()
        ):
            meta.problems.append(
                _problem(
                    "bad-metadata", f"{META_DIR}/{fname} has no 'split_parts' mapping of split to shard list"
                )
            )
            return
        meta.split_parts = {str(k): [n for pat in v for n in _expand(pat)] for k, v in parts.items()}
        excludes = doc.get("exclude") or []
        if not isinstance(excludes, list):
            meta.problems.append(_problem("bad-metadata", f"{META_DIR}/{fname}: 'exclude' must be a list"))
            excludes = []
        for pat in excludes:
            for name in _expand(str(pat)):
                (
                    meta.exclude_samples if "/" in name and not name.endswith(".tar") else meta.exclude_shards
                ).add(name)
        return
    meta.problems.append(
        _problem("missing-metadata", f"{META_DIR}/split.yaml is missing: Energon cannot find the splits")
    )


def _read_dataset_yaml(meta: DatasetMeta, nv: DatasetPath) -> None:
    p = nv / "dataset.yaml"
    if not p.is_file():
        meta.problems.append(
            _problem(
                "missing-metadata",
                f"{META_DIR}/dataset.yaml is missing: Energon cannot load the dataset (prepare_dataset does not "
                "write it)",
            )
        )
        return
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        meta.problems.append(_problem("bad-metadata", f"{META_DIR}/dataset.yaml cannot be parsed: {exc}"))
        return
    if not isinstance(doc, dict):
        meta.problems.append(_problem("bad-metadata", f"{META_DIR}/dataset.yaml is not a mapping"))
        return
    meta.dataset_yaml = doc
    cls = doc.get("__class__")
    if doc.get("__module__") != "megatron.energon" or cls != "CrudeWebdataset":
        meta.problems.append(
            _problem(
                "encoding-mismatch",
                f"{META_DIR}/dataset.yaml declares {doc.get('__module__')}.{cls}; the reference cookers need "
                "__module__: megatron.energon, __class__: CrudeWebdataset",
                detail={"class": cls, "module": doc.get("__module__")},
            )
        )
    sub = doc.get("subflavors")
    if sub is not None and not isinstance(sub, dict):
        meta.problems.append(
            _problem("bad-metadata", f"{META_DIR}/dataset.yaml: 'subflavors' must be a mapping")
        )
    # No subflavors (or no encoding among them) is valid Energon, as `energon prepare` writes it: validate
    # infers the format from the members and says so (a note, never a problem).


def read_metadata(root: str | os.PathLike[str] | DatasetPath) -> DatasetMeta:
    """Read ``.nv-meta`` of the dataset at `root` (local or remote); every defect becomes a `Problem` in
    the result."""
    root = dataset_path(root)
    meta = DatasetMeta(root=root)
    nv = root / META_DIR
    if not nv.is_dir():
        meta.problems.append(
            _problem("missing-metadata", f"{META_DIR}/ is missing: the dataset was never prepared")
        )
        return meta
    meta.has_meta_dir = True
    _read_info(meta, nv)
    _read_split(meta, nv)
    _read_dataset_yaml(meta, nv)
    meta.has_sqlite = (nv / "index.sqlite").is_file()
    return meta


def _files_below(root: DatasetPath) -> list[str]:
    """Every file below `root` as a relative POSIX path; hidden directories skipped."""
    if isinstance(root, RemotePath):
        return [
            rel for rel, _ in root.walk_files() if not any(d.startswith(".") for d in rel.split("/")[:-1])
        ]
    names: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel = Path(dirpath).relative_to(root)
        names += [(rel / fn).as_posix() for fn in filenames]
    return names


def list_shard_files(root: str | os.PathLike[str] | DatasetPath) -> tuple[list[str], list[str]]:
    """(``.tar`` files, compressed tars) below `root`, relative POSIX paths, sorted; hidden dirs skipped."""
    names = _files_below(dataset_path(root))
    tars = [n for n in names if n.endswith(".tar")]
    compressed = [n for n in names if n.endswith(_COMPRESSED_SUFFIXES)]
    return sorted(tars), sorted(compressed)


def read_index(path: str | os.PathLike[str] | DatasetPath) -> list[int] | None:
    """The offsets in a ``.tar.idx`` file (native uint64), or None if its size is not a multiple of 8."""
    raw = dataset_path(path).read_bytes()
    if len(raw) % 8:
        return None
    arr = array("Q")
    arr.frombytes(raw)
    return arr.tolist()
