"""What a saved loader state records, and which changes a restore refuses.

Energon 7.4.1's ``SavableDataLoaderState`` holds slice positions, worker RNG states and the micro batch
size. Restored, those positions are applied to whatever the new loader reads: a state saved by 2 ranks
restored into 1, with another seed or over a dataset that gained a shard is accepted without a word and
repeats some samples and skips others (Energon itself checks only the worker count and the micro batch
size). So :class:`~primus_energon.MegatronDataloaderWrapper` saves, next to Energon's state, a *record* of
everything that decides the stream, taken from the loader itself, and compares it before restoring:

- data-parallel ``rank`` and ``world_size``, ``num_workers`` and ``seed`` (Energon's ``WorkerConfig``);
- ``micro_batch_size``;
- the datasets: for each, its path, blend weight, and its shard table (names and sample counts) for the
  split being read;
- every other setting of the loader's pipeline that decides the order (shuffle buffer, samples per
  sequence, packing sizes, ...), from Energon's own ``dataset.config()``; which functions (cookers, encoders)
  run is not compared: code changes between a save and a restore are the norm;
- the Energon release.

A restore that differs anywhere Energon cannot continue exactly raises :class:`ResumeMismatchError`, which
names each difference and what to do. Two changes have a defined continuation and are accepted when the
caller says so (``allow_changes``): a smaller micro batch size that divides the saved one, with worker
processes (Energon scales each worker's position; no sample is skipped), and another Energon release.
A dataset that moved (another path, the same shard names and counts) continues exactly, with a warning.
States saved without a record (by an older version, or by ``save_state_rank()`` directly) still restore,
with a :class:`ResumeUncheckedWarning`.

The module has no Energon import: the record is read off any loader that has a ``worker_config`` and a
``dataset.config()``, and is plain data (dicts, lists, strings, numbers) that ``torch.save`` keeps.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALLOWABLE_CHANGES",
    "STATE_MARKER",
    "ConfigChange",
    "ResumeMismatchError",
    "ResumeUncheckedWarning",
    "ResumeChangeWarning",
    "compare_records",
    "loader_record",
    "pack_state",
    "unpack_state",
]

#: The key that marks a state saved with a record; its value is the format version.
STATE_MARKER = "primus_energon_loader_state"
FORMAT = 1
#: Changes a restore accepts when named in ``allow_changes`` (where their continuation is defined).
ALLOWABLE_CHANGES = frozenset({"micro_batch_size", "energon"})
#: Datasets with more shards than this keep a digest of their shard table instead of every name.
MAX_LISTED_SHARDS = 4096

# Keys of Energon's dataset.config() that describe code or placement, not the stream's settings: the
# functions run (code changes between save and restore are the norm), paths (compared per dataset),
# the rank's share (derived from rank, world size and shards, which are compared on their own).
_IGNORED_KEYS = frozenset(
    {"worker_config", "slice_offsets", "len", "_path", "path", "shards", "dataset_weights"}
)
_CALLABLE_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[\w<>]+)+$")


class ResumeUncheckedWarning(UserWarning):
    """A state without a record was restored: nothing could check that it fits this loader."""


class ResumeChangeWarning(UserWarning):
    """A restore went ahead over a change with an exact (or allowed) continuation, e.g. a moved dataset."""


@dataclass(frozen=True)
class ConfigChange:
    """One difference between the configuration a state was saved with and the restoring loader's."""

    #: what changed: "rank", "world_size", "num_workers", "seed", "micro_batch_size", "datasets",
    #: "shards", "weight", "setting", "energon", "path"
    name: str
    saved: Any
    current: Any
    #: one sentence: what differs
    what: str
    #: what to do about it
    advice: str
    #: accepted when ``name`` is in ``allow_changes`` (its continuation is defined)
    allowable: bool = False
    #: accepted as it is (the continuation is exact), with a warning
    harmless: bool = False

    def describe(self) -> str:
        return f"{self.what}. {self.advice}"


class ResumeMismatchError(ValueError):
    """The saved state cannot continue exactly in this loader; ``changes`` lists each difference."""

    def __init__(self, changes: list[ConfigChange], *, where: str = "") -> None:
        self.changes = changes
        lines = "\n".join(f"  - {change.describe()}" for change in changes)
        allowable = sorted({c.name for c in changes if c.allowable})
        tail = (
            f"\nTo accept {', '.join(allowable)} deliberately: restore_state(state, allow_changes={set(allowable)})."
            if allowable and all(c.allowable or c.harmless for c in changes)
            else ""
        )
        super().__init__(
            f"cannot resume{where}: the loader state was saved under another configuration, and Energon would "
            f"silently repeat or skip samples (or crash later) if it were restored here. "
            f"{len(changes)} difference{'s' if len(changes) != 1 else ''}:\n{lines}{tail}"
        )


# --- the record --------------------------------------------------------------------------------------


def _energon_release() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-energon")
    except PackageNotFoundError:
        return None


def _flat_shards(shards: list[Any]) -> list[Mapping[str, Any]]:
    """The shard entries of a dataset's configuration in order: a list of them on Energon 6.x/7.x, a list
    per worker of them on 5.x."""
    out: list[Mapping[str, Any]] = []
    for entry in shards:
        if isinstance(entry, Mapping):
            out.append(entry)
        elif isinstance(entry, (list, tuple)):
            out.extend(_flat_shards(list(entry)))
    return out


def _shard_table(shards: list[Any]) -> dict[str, Any]:
    pairs = [[str(s.get("name")), int(s.get("count", 0))] for s in _flat_shards(shards)]
    digest = hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16]
    table: dict[str, Any] = {
        "num_shards": len(pairs),
        "num_samples": sum(c for _, c in pairs),
        "digest": digest,
    }
    table["shards"] = pairs if len(pairs) <= MAX_LISTED_SHARDS else None
    return table


def _walk(config: Any, weight: Any, out: dict[str, Any], seen: dict[str, int]) -> None:
    """Collect datasets (with their blend weight), the micro batch size and the stream settings, each
    setting named ``Type.key`` after the pipeline stage holding it (``Type#2.key`` for its third
    occurrence), so that an inserted stage adds its own settings and shifts no other name."""
    if isinstance(config, Mapping):
        kind = str(config.get("type") or "")
        if kind:
            index = seen.get(kind, 0)
            seen[kind] = index + 1
            kind = f"{kind}#{index}" if index else kind
        if "batch_size" in config and out["micro_batch_size"] is None and "Batch" in kind:
            out["micro_batch_size"] = config["batch_size"]
        if isinstance(config.get("shards"), list):
            out["datasets"].append(
                {"path": str(config.get("_path") or config.get("path") or ""), "weight": weight}
                | _shard_table(config["shards"])
            )
        for entry in config.get("dataset_weights") or ():
            inner, inner_weight = (entry[0], entry[1]) if isinstance(entry, (list, tuple)) else (entry, None)
            _walk(inner, inner_weight, out, seen)
        for key, value in config.items():
            if key in _IGNORED_KEYS or key == "type" or key.endswith("_stateless"):
                continue
            if _has_mapping(value):
                _walk(value, weight, out, seen)
                continue
            if isinstance(value, str) and _CALLABLE_NAME.match(value):
                continue  # a function's qualified name: code, not a setting
            if key == "batch_size" and "Batch" in kind:
                continue  # recorded as micro_batch_size
            out["settings"][f"{kind or 'config'}.{key}"] = _plain(value)
    elif isinstance(config, (list, tuple)):
        for item in config:
            _walk(item, weight, out, seen)


def _has_mapping(value: Any) -> bool:
    if isinstance(value, Mapping):
        return True
    return isinstance(value, (list, tuple)) and any(_has_mapping(v) for v in value)


def _plain(value: Any) -> Any:
    """``value`` as JSON-able plain data (anything else by its ``str``)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def loader_record(loader: Any) -> dict[str, Any] | None:
    """The record of what decides ``loader``'s stream, or None when it is not an Energon-style loader
    (no ``worker_config``, or no ``dataset.config()``)."""
    worker_config = getattr(loader, "worker_config", None)
    config = getattr(getattr(loader, "dataset", None), "config", None)
    if worker_config is None or not callable(config):
        return None
    out: dict[str, Any] = {"micro_batch_size": None, "datasets": [], "settings": {}}
    _walk(config(), None, out, {})
    return {
        "format": FORMAT,
        "rank": int(getattr(worker_config, "rank", 0)),
        "world_size": int(getattr(worker_config, "world_size", 1)),
        "num_workers": int(getattr(worker_config, "num_workers", 0)),
        "seed": _plain(getattr(worker_config, "seed_offset", None)),
        "micro_batch_size": out["micro_batch_size"],
        "datasets": out["datasets"],
        "settings": out["settings"],
        "energon": _energon_release(),
    }


def pack_state(record: Mapping[str, Any] | None, state: Any) -> Any:
    """What ``save_state()`` returns: Energon's ``state`` with ``record`` beside it (``state`` as it is
    when there is no record; None stays None: a loader that cannot save)."""
    if record is None or state is None:
        return state
    return {STATE_MARKER: FORMAT, "record": dict(record), "state": state}


def unpack_state(saved: Any) -> tuple[dict[str, Any] | None, Any]:
    """``(record, state)`` of a saved state; ``(None, saved)`` for one saved without a record."""
    if isinstance(saved, Mapping) and STATE_MARKER in saved:
        return saved.get("record"), saved.get("state")
    return None, saved


# --- comparing ---------------------------------------------------------------------------------------


def _names(pairs: list[list[Any]], limit: int = 6) -> str:
    shown = ", ".join(f"{name} ({count})" for name, count in pairs[:limit])
    return shown + (f" and {len(pairs) - limit} more" if len(pairs) > limit else "")


def _dataset_changes(saved: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[ConfigChange]:
    changes: list[ConfigChange] = []
    fresh = "start this run's data from scratch (restore_state(None)), or restore with the data as saved"
    if len(saved) != len(current):
        return [
            ConfigChange(
                "datasets",
                [d["path"] for d in saved],
                [d["path"] for d in current],
                f"the loader reads {len(current)} dataset(s), the state was saved over {len(saved)} "
                f"({', '.join(d['path'] for d in saved)})",
                f"Restore with the metadataset the state was saved with, or {fresh}",
            )
        ]
    for old, new in zip(saved, current, strict=True):
        label = new["path"] or old["path"]
        if old["digest"] != new["digest"]:
            detail = ""
            if old.get("shards") is not None and new.get("shards") is not None:
                before = {name: count for name, count in old["shards"]}
                after = {name: count for name, count in new["shards"]}
                added = [[n, c] for n, c in new["shards"] if n not in before]
                removed = [[n, c] for n, c in old["shards"] if n not in after]
                resized = [
                    [n, f"{before[n]} -> {c}"] for n, c in new["shards"] if n in before and before[n] != c
                ]
                parts = [
                    f"added {_names(added)}" if added else "",
                    f"removed {_names(removed)}" if removed else "",
                    f"changed sample counts of {_names(resized)}" if resized else "",
                ]
                detail = "; ".join(p for p in parts if p) or "the shards are in another order"
            else:
                detail = "the shard names are not recorded (too many shards), only their digest"
            changes.append(
                ConfigChange(
                    "shards",
                    f"{old['num_shards']} shards, {old['num_samples']} samples",
                    f"{new['num_shards']} shards, {new['num_samples']} samples",
                    f"dataset {label!r} changed since the save: {old['num_shards']} shards / "
                    f"{old['num_samples']} samples then, {new['num_shards']} / {new['num_samples']} now ({detail})",
                    "Energon's saved positions index the shard table, so they would land on other samples. "
                    f"Restore over the shards as saved (add new data at the next fresh start), or {fresh}",
                )
            )
        elif old["path"] != new["path"]:
            changes.append(
                ConfigChange(
                    "path",
                    old["path"],
                    new["path"],
                    f"dataset {old['path']!r} is now read from {new['path']!r} (the same shard names and counts)",
                    "The continuation is exact; nothing to do if the data moved on purpose",
                    harmless=True,
                )
            )
        if old.get("weight") != new.get("weight"):
            changes.append(
                ConfigChange(
                    "weight",
                    old.get("weight"),
                    new.get("weight"),
                    f"the blend weight of {label!r} changed from {old.get('weight')} to {new.get('weight')}",
                    f"Energon's saved blend position does not carry over to other weights; restore with the saved "
                    f"weights, or {fresh}",
                )
            )
    return changes


def compare_records(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[ConfigChange]:
    """Every difference between the record a state was saved with and the restoring loader's, most
    consequential first."""
    changes: list[ConfigChange] = []
    s_rank, s_world = saved.get("rank"), saved.get("world_size")
    c_rank, c_world = current.get("rank"), current.get("world_size")
    if s_world != c_world:
        changes.append(
            ConfigChange(
                "world_size",
                s_world,
                c_world,
                f"the data-parallel world size is {c_world}; the state was saved by rank {s_rank} of {s_world}",
                f"Energon splits the data by world size, so a state of {s_world} ranks restored into {c_world} "
                f"repeats some samples and never delivers others. Resume with {s_world} data-parallel ranks "
                "(tensor/pipeline parallel sizes may change), or start the data from scratch (restore_state(None))",
            )
        )
    elif s_rank != c_rank:
        changes.append(
            ConfigChange(
                "rank",
                s_rank,
                c_rank,
                f"this is data-parallel rank {c_rank}; the state is rank {s_rank}'s",
                f"Restore each rank's own state: load the file rank {c_rank} saved (check how the checkpoint "
                "names its per-rank loader states)",
            )
        )
    if saved.get("num_workers") != current.get("num_workers"):
        changes.append(
            ConfigChange(
                "num_workers",
                saved.get("num_workers"),
                current.get("num_workers"),
                f"num_workers is {current.get('num_workers')}; the state was saved with {saved.get('num_workers')}",
                "Each worker reads its own part of the data and the state holds one position per worker. "
                f"Resume with num_workers={saved.get('num_workers')}",
            )
        )
    if saved.get("seed") != current.get("seed"):
        changes.append(
            ConfigChange(
                "seed",
                saved.get("seed"),
                current.get("seed"),
                f"the seed is {current.get('seed')}; the state was saved with seed {saved.get('seed')}",
                "Energon restores the saved random state and would ignore the new seed. Resume with "
                f"seed={saved.get('seed')}; a new seed takes effect only in a fresh start (restore_state(None))",
            )
        )
    s_batch, c_batch = saved.get("micro_batch_size"), current.get("micro_batch_size")
    if s_batch != c_batch:
        defined = (
            isinstance(s_batch, int)
            and isinstance(c_batch, int)
            and 0 < c_batch < s_batch
            and s_batch % c_batch == 0
            and (current.get("num_workers") or 0) > 0
        )
        changes.append(
            ConfigChange(
                "micro_batch_size",
                s_batch,
                c_batch,
                f"the micro batch size is {c_batch}; the state was saved with {s_batch}",
                (
                    "Energon can continue with a divisor of the saved size (it scales each worker's position; "
                    "no sample is skipped, but the order of the next few batches differs from an "
                    f"uninterrupted run). Resume with micro batch size {s_batch} to continue exactly"
                )
                if defined
                else (
                    f"Energon cannot continue from it (only a divisor of {s_batch}, with workers, is defined). "
                    f"Resume with micro batch size {s_batch}"
                ),
                allowable=defined,
            )
        )
    changes += _dataset_changes(list(saved.get("datasets") or []), list(current.get("datasets") or []))
    s_settings, c_settings = dict(saved.get("settings") or {}), dict(current.get("settings") or {})
    differing = sorted(
        k for k in s_settings.keys() | c_settings.keys() if s_settings.get(k) != c_settings.get(k)
    )
    if differing:
        shown = "; ".join(
            f"{key}: {s_settings.get(key, '(absent)')!r} -> {c_settings.get(key, '(absent)')!r}"
            for key in differing[:5]
        )
        more = f" and {len(differing) - 5} more" if len(differing) > 5 else ""
        changes.append(
            ConfigChange(
                "setting",
                {k: s_settings.get(k) for k in differing},
                {k: c_settings.get(k) for k in differing},
                f"{len(differing)} setting(s) of the loader's pipeline differ ({shown}{more})",
                "They decide the order of the samples (shuffle buffer, samples per sequence, packing, split, "
                "training mode), so the saved positions mean other samples here. Restore with the saved settings",
            )
        )
    if saved.get("energon") != current.get("energon"):
        changes.append(
            ConfigChange(
                "energon",
                saved.get("energon"),
                current.get("energon"),
                f"the state was saved by Energon {saved.get('energon')}; this is {current.get('energon')}",
                "A release may change what a state means (7.3.2 -> 7.4.1 was measured exact). Check the "
                "release notes, or resume with the same release",
                allowable=True,
            )
        )
    return changes


def blocking(changes: Iterable[ConfigChange], allow_changes: Iterable[str] = ()) -> list[ConfigChange]:
    """The changes that stop a restore: neither harmless nor allowed (and allowable)."""
    allowed = set(allow_changes)
    return [c for c in changes if not c.harmless and not (c.allowable and c.name in allowed)]
