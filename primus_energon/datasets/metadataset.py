"""Resolving a metadataset YAML to its leaf datasets, and validating each leaf.

Both forms Energon 7.4 loads (MetadatasetV2 `blend:` and the legacy `datasets:`) are read with ``yaml.safe_load``, without Energon (which stops at the
first missing path):

* ``MetadatasetV2``: ``splits: {split: node}`` where a node is a dataset reference (``path``, optional
  ``split_part``, ``subflavors``), ``blend: [{weight, path | join...}]``, ``blend_epochized:
  [{repetitions, path}]`` or ``join``;
* legacy ``Metadataset`` (also a file without ``__class__``): ``splits: {split: {datasets: [{weight, path,
  subflavors, subflavor}]}}``.

A ``path`` is relative to the YAML's directory (or a remote ``msc://`` location, and the YAML itself may be
remote) and may name another metadataset (nested; its split is the
entry's ``split_part`` or the current one). Weights default to 1 and are normalised within each blend, and
multiplied through nesting. Effective subflavors follow Energon: an entry's subflavors are overridden by the
outer levels', and the result overrides the dataset's own ``dataset.yaml`` subflavors.

Reported: unreadable structure (``bad-metadataset``), paths that are neither a prepared dataset nor a YAML
(``missing-path``), non-positive weights (``bad-weight``), the same dataset split and subset reached twice
within a split (``duplicate-leaf``: an error with equal effective subflavors, since Energon then draws the same samples
in the same order twice; a warning when the subflavors differ), and every leaf's own problems (tagged with the
leaf path in ``dataset``).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import yaml

from ..storage import DatasetPath, dataset_path
from .metadata import META_DIR
from .problems import Problem
from .report import DatasetReport, LeafReport, MetadatasetReport

if TYPE_CHECKING:
    from .distributed import DistributedScanner

__all__ = ["Leaf", "duplicate_leaves", "resolve_metadataset", "validate_metadataset"]

_MAX_DEPTH = 16


@dataclass
class Leaf:
    """One leaf dataset as a split of the metadataset reaches it."""

    split: str
    path: DatasetPath
    split_part: str
    weight: float | None  # the weight written in the entry (None for blend_epochized)
    normalized_weight: float | None  # its share of the split (product through nesting)
    subflavors: dict[str, Any]  # the metadataset's effective subflavors for this leaf
    repetitions: float | None = None
    via: list[str] = field(default_factory=list)  # the metadataset files passed through
    #: the entry's ``subset`` (JSON, keys sorted), None for the whole split part
    subset: str | None = None
    #: where the entry is written: ``FILE: splits.SPLIT.blend[INDEX]`` (or ``.datasets[...]``, ``.join[...]``)
    where: str = ""

    @property
    def identity(self) -> tuple[str, DatasetPath, str, str | None]:
        """What a sample stream is made of: two leaves of one split with one identity draw the same samples."""
        return (self.split, self.path.resolve(), self.split_part, self.subset)


def duplicate_leaves(leaves: list[Leaf]) -> list[tuple[Leaf, Leaf]]:
    """(first listing, repeated listing) for each leaf whose split reaches the same dataset, split part
    and subset as an earlier one."""
    first: dict[tuple, Leaf] = {}
    pairs = []
    for leaf in leaves:
        if leaf.identity in first:
            pairs.append((first[leaf.identity], leaf))
        else:
            first[leaf.identity] = leaf
    return pairs


@dataclass(frozen=True)
class _Walk:
    """Where the traversal is: the metadataset file being read, the split read there and the top-level split
    it serves, the share of that split (None under blend_epochized), the subflavors set by outer levels, and
    the files passed through."""

    where: DatasetPath
    split: str
    top_split: str
    share: float | None
    inherited: dict[str, Any]
    via: list[str]


class _Resolver:
    def __init__(self, top: DatasetPath) -> None:
        self.top = top
        self.problems: list[Problem] = []
        self.leaves: list[Leaf] = []
        self.form = "unknown"

    def problem(self, code: str, message: str, where: DatasetPath) -> None:
        self.problems.append(Problem(code, None, None, None, message, dataset=str(where)))

    # -- files ---------------------------------------------------------------------------------------------
    def load(self, path: DatasetPath) -> dict[str, Any] | None:
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
            self.problem("bad-metadataset", f"cannot read {path}: {exc}", path)
            return None
        if not isinstance(doc, dict):
            self.problem("bad-metadataset", f"{path} is not a YAML mapping", path)
            return None
        cls = doc.get("__class__")
        if cls not in (None, "Metadataset", "MetadatasetV2"):
            self.problem(
                "bad-metadataset",
                f"{path}: __class__ {cls!r} is not Metadataset or MetadatasetV2",
                path,
            )
            return None
        if not isinstance(doc.get("splits"), dict):
            hint = ""
            if "blend" in doc or "datasets" in doc:
                hint = " (the top-level 'blend:'/'datasets:' must be inside 'splits: {train: ...}')"
            self.problem("bad-metadataset", f"{path} has no 'splits' mapping{hint}", path)
            return None
        return doc

    def resolve_file(self, path: DatasetPath, split: str, at: _Walk) -> None:
        """The ``split`` of the metadataset file ``path``, reached from ``at`` (its file, share, subflavors)."""
        if len(at.via) > _MAX_DEPTH or str(path) in at.via:
            self.problem("bad-metadataset", f"{path} nests itself (via {' -> '.join(at.via)})", path)
            return
        doc = self.load(path)
        if doc is None:
            return
        v2 = doc.get("__class__") == "MetadatasetV2"
        if not at.via:
            self.form = "MetadatasetV2" if v2 else "Metadataset (legacy)"
        splits = doc["splits"]
        if split not in splits:
            self.problem(
                "bad-metadataset",
                f"{path} has no split {split!r} (it has {', '.join(map(str, splits)) or 'none'})",
                path,
            )
            return
        inside = replace(at, where=path, split=split, via=[*at.via, str(path)])
        (self.node_v2 if v2 else self.node_v1)(splits[split], inside)

    # -- entries -------------------------------------------------------------------------------------------
    def weight_of(self, entry: dict[str, Any], key: str, where: DatasetPath) -> float | None:
        raw = entry.get(key, 1.0)
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) or raw <= 0:
            self.problem(
                "bad-weight",
                f"{where}: entry {entry.get('path')!r} has {key} {raw!r}; it must be a positive number",
                where,
            )
            return None
        return float(raw)

    def entry(
        self,
        entry: Any,
        at: _Walk,
        location: str,
        *,
        weight: float | None = None,
        repetitions: float | None = None,
    ) -> None:
        """One dataset reference (``path``, optional ``split_part``, ``subflavors``, ``subset``) written at
        ``location``: a leaf, or a nested metadataset file to resolve."""
        where = at.where
        if not isinstance(entry, dict) or "path" not in entry:
            self.problem("bad-metadataset", f"{where}: entry {entry!r} has no 'path'", where)
            return
        sub = entry.get("subflavors") or {}
        if not isinstance(sub, dict):
            self.problem(
                "bad-metadataset", f"{where}: subflavors of {entry['path']!r} must be a mapping", where
            )
            sub = {}
        sub = dict(sub)
        if entry.get("subflavor") is not None and "__subflavor__" not in sub:
            sub = {"__subflavor__": entry["subflavor"], **sub}
        effective = {**sub, **at.inherited}  # outer levels override inner ones (Energon's traversal)
        # an entry may name a remote location (msc://...), also from a local metadataset, as Energon allows
        raw_path = dataset_path(str(entry["path"]))
        path = raw_path if raw_path.is_absolute() else where.parent / raw_path
        part = str(entry.get("split_part") or at.split)
        if path.suffix in (".yaml", ".yml") and path.is_file():
            nested = replace(at, share=at.share if at.share is not None else 1.0, inherited=effective)
            self.resolve_file(path, part, nested)
            return
        if not (path / META_DIR).is_dir():
            what = "does not exist" if not path.exists() else "is not a prepared dataset (no .nv-meta/)"
            self.problem("missing-path", f"{where}: entry path {entry['path']!r} ({path}) {what}", where)
            return
        subset = entry.get("subset")
        self.leaves.append(
            Leaf(
                at.top_split,
                path,
                part,
                weight,
                at.share,
                effective,
                repetitions=repetitions,
                via=list(at.via),
                subset=None if subset is None else json.dumps(subset, sort_keys=True, default=str),
                where=location,
            )
        )

    def blend(self, items: Any, key: str, at: _Walk) -> None:
        """A weighted list (``blend``, legacy ``datasets``) or a list with repetitions (``blend_epochized``)."""
        where = at.where
        if not isinstance(items, list) or not items:
            self.problem(
                "bad-metadataset", f"{where}: split {at.split!r}: '{key}' must be a non-empty list", where
            )
            return
        weight_key = "repetitions" if key == "blend_epochized" else "weight"
        weights = [self.weight_of(e, weight_key, where) if isinstance(e, dict) else None for e in items]
        total = sum(w for w in weights if w is not None)
        for index, (e, w) in enumerate(zip(items, weights, strict=True)):
            location = f"{where}: splits.{at.split}.{key}[{index}]"
            if w is None and isinstance(e, dict) and "path" in e:
                continue
            if key == "blend_epochized":
                part = replace(at, share=None)
            else:
                part = replace(
                    at, share=at.share * (w or 0) / total if total and at.share is not None else None
                )
            if isinstance(e, dict) and "join" in e and "path" not in e:
                self.join(e["join"], part, f"{location}.join")
            elif key == "blend_epochized":
                self.entry(e, part, location, repetitions=w)
            else:
                self.entry(e, part, location, weight=w)

    def join(self, items: Any, at: _Walk, location: str) -> None:
        """Datasets read side by side: each leaf gets the join's whole share."""
        entries = list(items.values()) if isinstance(items, dict) else items
        if not isinstance(entries, list) or not entries:
            self.problem("bad-metadataset", f"{at.where}: 'join' must list datasets", at.where)
            return
        for index, e in enumerate(entries):
            self.entry(e, at, f"{location}[{index}]")

    def node_v2(self, node: Any, at: _Walk) -> None:
        where, split = at.where, at.split
        if not isinstance(node, dict):
            self.problem("bad-metadataset", f"{where}: split {split!r} must be a mapping", where)
            return
        sub = node.get("subflavors") if ("blend" in node or "blend_epochized" in node) else None
        if isinstance(sub, dict):
            at = replace(at, inherited={**sub, **at.inherited})
        if "blend" in node:
            self.blend(node["blend"], "blend", at)
        elif "blend_epochized" in node:
            self.blend(node["blend_epochized"], "blend_epochized", at)
        elif "join" in node:
            self.join(node["join"], at, f"{where}: splits.{split}.join")
        elif "path" in node:
            self.entry(node, at, f"{where}: splits.{split}")
        elif "datasets" in node:
            self.problem(
                "bad-metadataset",
                f"{where}: split {split!r} uses the legacy 'datasets:' list under __class__: MetadatasetV2; "
                "use 'blend:' (or __class__: Metadataset)",
                where,
            )
        else:
            self.problem(
                "bad-metadataset",
                f"{where}: split {split!r} has none of path, blend, blend_epochized, join",
                where,
            )

    def node_v1(self, node: Any, at: _Walk) -> None:
        where, split = at.where, at.split
        if not isinstance(node, dict) or "datasets" not in node:
            extra = (
                " (that is the MetadatasetV2 form: set __class__: MetadatasetV2)"
                if isinstance(node, dict) and "blend" in node
                else ""
            )
            self.problem("bad-metadataset", f"{where}: split {split!r} has no 'datasets:' list{extra}", where)
            return
        self.blend(node["datasets"], "datasets", at)


def resolve_metadataset(path: str | os.PathLike[str]) -> tuple[str, list[Leaf], list[Problem]]:
    """(form, leaves of every split in file order, problems) for the metadataset at `path`.

    Duplicate leaves (same dataset and split part reached twice within one split) are reported, not merged.
    """
    top = dataset_path(path).absolute()
    r = _Resolver(top)
    doc = r.load(top)
    if doc is None:
        return r.form, r.leaves, r.problems
    for split in doc["splits"]:
        r.resolve_file(top, str(split), _Walk(top, str(split), str(split), 1.0, {}, []))
    for first, leaf in duplicate_leaves(r.leaves):
        same = leaf.subflavors == first.subflavors
        r.problems.append(
            Problem(
                "duplicate-leaf",
                None,
                None,
                None,
                f"split {leaf.split!r} reaches {leaf.path} (split {leaf.split_part}) more than once "
                f"(at {first.where} and again at {leaf.where})"
                + (
                    " with the same subflavors: its samples are drawn twice, in the same order"
                    if same
                    else f" with different subflavors ({first.subflavors} and {leaf.subflavors})"
                ),
                severity="error" if same else "warning",
                dataset=str(leaf.path),
            )
        )
    return r.form, r.leaves, r.problems


def validate_metadataset(
    path: str | os.PathLike[str],
    *,
    encoding: str | None = None,
    workers: int = 1,
    progress: bool | None = False,
    strict: bool = False,
    scanner: DistributedScanner | None = None,
) -> MetadatasetReport:
    """Resolve the metadataset at `path`, then validate each distinct leaf once with the encoding its
    effective subflavors give it (`encoding` overrides). The report is ok only when the metadataset and
    every leaf are. `scanner`: see `validate_dataset`."""
    from .validate import validate_dataset

    t0 = time.perf_counter()
    form, leaves, problems = resolve_metadataset(path)
    problems = list(problems)
    reports: dict[tuple[DatasetPath, str | None], DatasetReport] = {}
    checked_splits: set[Any] = set()
    out: list[LeafReport] = []
    for leaf in leaves:
        enc = encoding or leaf.subflavors.get("encoding")
        k = (leaf.path.resolve(), None if enc is None else str(enc))
        if k not in reports:
            report = validate_dataset(
                leaf.path,
                encoding=None if enc is None else str(enc),
                workers=workers,
                progress=progress,
                strict=strict,
                encoding_source="--encoding" if encoding else "the metadataset's subflavors",
                scanner=scanner,
            )
            reports[k] = report
            problems += [p.with_dataset(str(leaf.path)) for p in report.problems]
        rep = reports[k]
        if (k, leaf.split_part) in checked_splits:
            pass
        elif leaf.split_part not in rep.splits and rep.splits:
            problems.append(
                Problem(
                    "split-mismatch",
                    None,
                    None,
                    None,
                    f"the metadataset reads split {leaf.split_part!r} of {leaf.path}, which has only "
                    f"{', '.join(rep.splits)}",
                    dataset=str(leaf.path),
                )
            )
        elif rep.splits and rep.splits[leaf.split_part]["samples"] == 0:
            problems.append(
                Problem(
                    "split-mismatch",
                    None,
                    None,
                    None,
                    f"the metadataset reads split {leaf.split_part!r} of {leaf.path}, which is empty "
                    "(Energon raises EmptyDatasetError)",
                    dataset=str(leaf.path),
                )
            )
        checked_splits.add((k, leaf.split_part))
        out.append(
            LeafReport(
                split=leaf.split,
                path=str(leaf.path),
                split_part=leaf.split_part,
                weight=leaf.weight,
                normalized_weight=leaf.normalized_weight,
                subflavors={**rep.subflavors, **leaf.subflavors},
                via=leaf.via,
                repetitions=leaf.repetitions,
                report=rep,
            )
        )
    return MetadatasetReport(
        path=str(dataset_path(path)),
        form=form,
        leaves=out,
        problems=problems,
        strict=strict,
        elapsed_s=time.perf_counter() - t0,
        distributed=None if scanner is None else {"world_size": scanner.world_size},
    )
