"""Running a target the way Energon does: cooking inside an active worker context, building real
loaders, and recording which cooker saw which sample (in any process) through a file sink."""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from megatron.energon import (
    Cooker,
    SavableDataLoader,
    TaskEncoder,
    WorkerConfig,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
    log_exception,
    reraise_exception,
    stateless,
)
from megatron.energon.task_encoder.base import get_stateless

from .target import Target

__all__ = [
    "worker_context",
    "cook",
    "build_loader",
    "closing",
    "instrument",
    "read_records",
    "matching_cooker",
]


@contextlib.contextmanager
def worker_context(seed: int = 0, sample_index: int = 0) -> Iterator[WorkerConfig]:
    """Activate a single-process worker config, as Energon does around every cook call."""
    config = WorkerConfig(rank=0, world_size=1, num_workers=0, seed_offset=seed)
    config.worker_activate(sample_index)
    try:
        yield config
    finally:
        config.worker_deactivate()


def matching_cooker(cookers: Sequence[Cooker], subflavors: dict[str, Any] | None) -> int | None:
    """Index of the first cooker whose ``has_subflavors`` is contained in ``subflavors`` (the dispatch
    oracle, written independently of Energon's ``Cooker.is_match``), or None."""
    subflavors = subflavors or {}
    for index, cooker in enumerate(cookers):
        wanted = cooker.has_subflavors or {}
        if all(key in subflavors and subflavors[key] == value for key, value in wanted.items()):
            return index
    return None


def cook(target: Target, crude: dict[str, Any], *, sample_index: int = 0, seed: int = 0) -> Any:
    """Cook one crude sample with the target's matching cooker (first match, as Energon dispatches)."""
    cookers = target.cookers
    index = matching_cooker(cookers, crude.get("__subflavors__"))
    if index is None:
        index = 0
    cooker = cookers[index]
    with worker_context(seed, sample_index):
        return cooker.cook(crude)


def build_loader(
    target: Target,
    path: str | os.PathLike,
    *,
    batch_size: int,
    num_workers: int,
    seed: int = 0,
    mode: str = "train",
    rank: int = 0,
    world_size: int = 1,
    repeat: bool = True,
    split_part: str = "train",
    on_error: str = "raise",
    task_encoder: TaskEncoder | None = None,
    **loader_kwargs: Any,
) -> SavableDataLoader:
    """Energon's own savable loader for ``path`` with a fresh TaskEncoder of the target."""
    config = WorkerConfig(
        rank=rank,
        world_size=world_size,
        num_workers=num_workers,
        seed_offset=seed,
        global_error_handler=reraise_exception if on_error == "raise" else log_exception,
    )
    task_encoder = task_encoder or target.make_task_encoder()
    if mode == "train":
        dataset = get_train_dataset(
            str(path),
            split_part=split_part,
            worker_config=config,
            batch_size=batch_size,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            repeat=repeat,
            task_encoder=task_encoder,
        )
    else:
        dataset = get_val_dataset(
            str(path),
            split_part=split_part,
            worker_config=config,
            batch_size=batch_size,
            task_encoder=task_encoder,
        )
    return get_savable_loader(dataset, **loader_kwargs)


@contextlib.contextmanager
def closing(loader: SavableDataLoader) -> Iterator[SavableDataLoader]:
    """Shut a loader's worker processes down on exit (left to the garbage collector, an Energon loader
    with workers takes torch's 5 s join timeout per worker)."""
    try:
        yield loader
    finally:
        iterator = getattr(loader, "_epoch_iterator", None)
        if iterator is not None:
            iterator.close()
        shutdown = getattr(getattr(loader, "_iterator", None), "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def _recording(cook_fn: Any, index: int, sink: str) -> Any:
    @functools.wraps(cook_fn)
    def record(sample: dict, **aux: Any) -> Any:
        sources = sample.get("__sources__") or ()
        config = WorkerConfig.active_worker_config
        line = {
            "cooker": index,
            "key": sample.get("__key__"),
            "subflavors": sample.get("__subflavors__"),
            "dataset": str(sources[0].dataset_path) if sources else None,
            "rank": config.rank if config is not None else None,
            "pid": os.getpid(),
        }
        with open(sink, "a", encoding="utf-8") as out:
            out.write(json.dumps(line, default=str) + "\n")
        return cook_fn(sample, **aux)

    # functools.wraps copies the __stateless__ marker; set it from the original to be exact.
    return stateless(record) if get_stateless(cook_fn) else record


def instrument(task_encoder: TaskEncoder, sink: str | os.PathLike) -> TaskEncoder:
    """Make every cooker of ``task_encoder`` append ``{cooker, key, subflavors, dataset, rank}`` to ``sink``
    (one JSON line per cooked sample, from any worker process). Returns the same TaskEncoder."""
    cookers = list(getattr(task_encoder, "cookers", None) or [])
    task_encoder.cookers = [
        Cooker(_recording(c.cook, i, str(sink)), has_subflavors=c.has_subflavors)
        for i, c in enumerate(cookers)
    ]
    return task_encoder


def read_records(sink: str | os.PathLike) -> list[dict[str, Any]]:
    """The records an instrumented TaskEncoder wrote, in file order."""
    path = Path(sink)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
