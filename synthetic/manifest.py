"""`manifest.json`: what a generated dataset contains and exactly which faults were injected where.

Contract:

* `Manifest.samples` lists every sample the generator made, in key order, including damaged ones. A sample's
  `key` is the key it was generated with (unique, no dots); a fault that changes how the key is *stored*
  (``dotted-key``, ``duplicate-key``) says so in its `detail`.
* A `MemberRecord` describes the bytes actually stored for that member: `sha256`/`size` of those bytes, and the
  `dtype`/`shape` of the tensor they hold (``None`` when they hold no readable tensor). A member removed by a
  ``missing-member`` fault is absent from `members`.
* `Manifest.faults` lists every injected fault; `Manifest.damaged_keys()` are the samples any fault touched, and
  every other sample is byte-identical to the same sample of the clean dataset with the same seed and options.
* The JSON is deterministic: same seed and options give the same bytes, whatever the worker count or rank split.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

from .errors import SyntheticError
from .schema import Schema

__all__ = ["MANIFEST_FILENAME", "FaultRecord", "Manifest", "MemberRecord", "SampleRecord", "ShardRecord"]

MANIFEST_FILENAME = "manifest.json"
MANIFEST_FORMAT = "primus-synthetic-manifest"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class MemberRecord:
    """One stored member. `kind` is the schema kind (tensor, text, image, json, bytes)."""

    kind: str
    dtype: str | None
    shape: tuple[int, ...] | None
    size: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
            "size": self.size,
            "sha256": self.sha256,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemberRecord:
        shape = d.get("shape")
        return cls(d["kind"], d.get("dtype"), None if shape is None else tuple(shape), d["size"], d["sha256"])


@dataclass(frozen=True)
class SampleRecord:
    """One sample: its key, global `index`, the shard holding it, that shard's split, and its members."""

    key: str
    index: int
    shard: str
    split: str
    members: dict[str, MemberRecord]

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "index": self.index,
            "shard": self.shard,
            "split": self.split,
            "members": {n: m.to_dict() for n, m in self.members.items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SampleRecord:
        members = {n: MemberRecord.from_dict(m) for n, m in d["members"].items()}
        return cls(d["key"], d["index"], d["shard"], d["split"], members)


@dataclass(frozen=True)
class FaultRecord:
    """One injected fault. `key` is None for a whole-shard fault, `member` None unless one member is hit."""

    kind: str
    shard: str
    key: str | None
    member: str | None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "shard": self.shard,
            "key": self.key,
            "member": self.member,
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FaultRecord:
        return cls(d["kind"], d["shard"], d.get("key"), d.get("member"), dict(d.get("detail") or {}))

    @property
    def damaged_keys(self) -> list[str]:
        """The samples this fault makes unreadable or wrong (for shard faults: all samples it cut off)."""
        keys = list(self.detail.get("damaged_keys", ()))
        if not keys and self.key is not None:
            keys = [self.key]
        return keys


@dataclass(frozen=True)
class ShardRecord:
    """One tar shard: its file name, split, how many samples were generated into it, and its final size."""

    name: str
    split: str
    num_samples: int
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "split": self.split, "num_samples": self.num_samples, "size": self.size}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardRecord:
        return cls(d["name"], d["split"], d["num_samples"], d["size"])


@dataclass
class Manifest:
    """The record of one generated dataset (written as ``<dataset>/manifest.json``)."""

    encoding: str
    seed: int
    num_samples: int
    shard_size: int
    schema: Schema
    subflavors: dict[str, Any]
    options: dict[str, Any]
    shards: list[ShardRecord]
    samples: list[SampleRecord]
    faults: list[FaultRecord]
    marker_path: str | None = None

    # -- queries -------------------------------------------------------------------------------------------------
    def keys(self, split: str | None = None) -> list[str]:
        """Sample keys in generation order, optionally of one split (``train``/``val``/``test``)."""
        return [s.key for s in self.samples if split is None or s.split == split]

    def sample(self, key: str) -> SampleRecord:
        """The record of sample `key` (KeyError if there is none)."""
        index = self._by_key()
        if key not in index:
            raise KeyError(f"no sample with key {key!r} in this manifest")
        return index[key]

    def faults_of(self, kind: str) -> list[FaultRecord]:
        """The faults of one kind, in manifest order."""
        return [f for f in self.faults if f.kind == kind]

    def damaged_keys(self) -> set[str]:
        """Every sample key any fault touched (including the samples a truncated or emptied shard lost)."""
        out: set[str] = set()
        for f in self.faults:
            out.update(f.damaged_keys)
        return out

    def clean_samples(self, split: str | None = None) -> list[SampleRecord]:
        """Samples no fault touched, optionally of one split."""
        damaged = self.damaged_keys()
        return [s for s in self.samples if s.key not in damaged and (split is None or s.split == split)]

    def __iter__(self) -> Iterator[SampleRecord]:
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    def _by_key(self) -> dict[str, SampleRecord]:
        cache = self.__dict__.get("_key_index")
        if cache is None or len(cache) != len(self.samples):
            cache = {s.key: s for s in self.samples}
            self.__dict__["_key_index"] = cache
        return cache

    # -- (de)serialisation ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "encoding": self.encoding,
            "seed": self.seed,
            "num_samples": self.num_samples,
            "shard_size": self.shard_size,
            "subflavors": self.subflavors,
            "schema": self.schema.to_dict(),
            "options": self.options,
            "marker_path": self.marker_path,
            "shards": [s.to_dict() for s in self.shards],
            "faults": [f.to_dict() for f in self.faults],
            "samples": [s.to_dict() for s in self.samples],
        }

    def to_json(self) -> str:
        """Deterministic JSON text (ASCII, 1-space indent, trailing newline)."""
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=True) + "\n"

    def save(self, path: str | PathLike[str]) -> Path:
        """Write `to_json()` to `path` (a file, or a dataset directory) atomically; returns the file path."""
        p = Path(path)
        if p.is_dir():
            p = p / MANIFEST_FILENAME
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(self.to_json(), encoding="ascii")
        tmp.replace(p)
        return p

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "manifest") -> Manifest:
        if d.get("format") != MANIFEST_FORMAT:
            raise SyntheticError(
                f"{source} is not a synthetic dataset manifest (no 'format: {MANIFEST_FORMAT}')"
            )
        if d.get("version") != MANIFEST_VERSION:
            raise SyntheticError(
                f"{source} has manifest version {d.get('version')!r}; this generator reads version {MANIFEST_VERSION}"
            )
        return cls(
            encoding=d["encoding"],
            seed=d["seed"],
            num_samples=d["num_samples"],
            shard_size=d["shard_size"],
            schema=Schema.from_dict(d["schema"], source=f"{source} schema"),
            subflavors=dict(d["subflavors"]),
            options=dict(d["options"]),
            shards=[ShardRecord.from_dict(s) for s in d["shards"]],
            samples=[SampleRecord.from_dict(s) for s in d["samples"]],
            faults=[FaultRecord.from_dict(f) for f in d["faults"]],
            marker_path=d.get("marker_path"),
        )

    @classmethod
    def load(cls, path: str | PathLike[str]) -> Manifest:
        """Read a manifest from its file or from the dataset directory holding ``manifest.json``."""
        p = Path(path)
        if p.is_dir():
            p = p / MANIFEST_FILENAME
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SyntheticError(f"no manifest at {str(p)!r}; is this a dataset made by synthetic?") from None
        except json.JSONDecodeError as exc:
            raise SyntheticError(f"{str(p)!r} is not valid JSON: {exc}") from None
        return cls.from_dict(data, source=repr(str(p)))
