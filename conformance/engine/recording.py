"""Recording what a target's cookers and ``batch()`` see, in whichever process they run, and reading it back.

:func:`instrument` wraps the cookers (and optionally ``batch()``) of a TaskEncoder so that each appends JSON
lines to a sink file. Every record is written with one ``write(2)`` under ``O_APPEND``, so the lines of
several worker processes never interleave; :func:`read_records` leaves out a last line still being written.

A cook record is ``{"stage": "cook", "cooker": INDEX, "key", "subflavors", "dataset", "rank", "pid"}`` plus
what ``describe_cooked(sample, output)`` adds. By default it is written *before* the cooker runs (so a
sample the cooker then skips or fails on is recorded: which cooker was chosen); with ``cooked_only`` it is
written after the cooker returned (so it says what was cooked). With ``batches``, ``batch()`` writes
``{"stage": "batch", "keys", "rank", "pid"}`` plus what ``describe_batch(samples)`` adds, and the cook
records of that process are held back and written with it (one write per batch instead of per sample).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from megatron.energon import Cooker, TaskEncoder, WorkerConfig, stateless
from megatron.energon.task_encoder.base import get_stateless

__all__ = ["instrument", "read_records", "cook_order"]

DescribeCooked = Callable[[dict, Any], Mapping[str, Any]]
DescribeBatch = Callable[[Sequence[Any]], Mapping[str, Any]]


def _where() -> dict[str, Any]:
    config = WorkerConfig.active_worker_config
    return {"rank": config.rank if config is not None else None, "pid": os.getpid()}


def _key(sample: Any) -> Any:
    key = sample.get("__key__") if isinstance(sample, Mapping) else getattr(sample, "__key__", None)
    return key if isinstance(key, str) else None


def _append(sink: str, lines: Sequence[Mapping[str, Any]]) -> None:
    # One write(2) with O_APPEND: a buffered file object may split a long write into several, and then
    # the lines of two worker processes can interleave.
    data = "".join(json.dumps(line, default=str) + "\n" for line in lines).encode("utf-8")
    fd = os.open(sink, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _cook_record(index: int, sample: dict) -> dict[str, Any]:
    sources = sample.get("__sources__") or ()
    return {
        "stage": "cook",
        "cooker": index,
        "key": sample.get("__key__"),
        "subflavors": sample.get("__subflavors__"),
        "dataset": str(sources[0].dataset_path) if sources else None,
        **_where(),
    }


def _keeping_stateless(original: Any, wrapper: Any) -> Any:
    # functools.wraps copies the __stateless__ marker; set it from the original to be exact.
    return stateless(wrapper) if get_stateless(original) else wrapper


def _recording_cooker(
    cook_fn: Any,
    index: int,
    emit: Callable[[dict[str, Any]], None],
    cooked_only: bool,
    describe_cooked: DescribeCooked | None,
) -> Any:
    @functools.wraps(cook_fn)
    def recorded(sample: dict, **aux: Any) -> Any:
        line = _cook_record(index, sample)
        if not cooked_only:
            emit(line)
            return cook_fn(sample, **aux)
        output = cook_fn(sample, **aux)  # a skipped or failed sample is not recorded
        emit({**line, **(describe_cooked(sample, output) if describe_cooked else {})})
        return output

    return _keeping_stateless(cook_fn, recorded)


def instrument(
    task_encoder: TaskEncoder,
    sink: str | os.PathLike,
    *,
    cooked_only: bool = False,
    describe_cooked: DescribeCooked | None = None,
    batches: bool = False,
    describe_batch: DescribeBatch | None = None,
    ship_batches: bool = True,
) -> TaskEncoder:
    """Make ``task_encoder``'s cookers (and with ``batches`` its ``batch()``) append records to ``sink``
    (see the module docstring). ``ship_batches=False`` makes ``batch()`` still run but hand the loader only
    the sample count, so batches are not shipped from the workers when only the records are wanted.
    Sets attributes on the given TaskEncoder (copy an instance you do not own) and returns it."""
    path = str(sink)
    pending: list[dict[str, Any]] = []

    def emit(line: dict[str, Any]) -> None:
        if batches:
            pending.append(line)
        else:
            _append(path, [line])

    cookers = list(getattr(task_encoder, "cookers", None) or [])
    task_encoder.cookers = [
        Cooker(
            _recording_cooker(c.cook, index, emit, cooked_only, describe_cooked),
            has_subflavors=c.has_subflavors,
        )
        for index, c in enumerate(cookers)
    ]
    if batches:
        batch_fn = task_encoder.batch

        @functools.wraps(batch_fn)
        def recorded_batch(samples: list[Any]) -> Any:
            result = batch_fn(samples)  # a skipped batch is not recorded
            line = {"stage": "batch", "keys": [_key(s) for s in samples], **_where()}
            if describe_batch is not None:
                line.update(describe_batch(samples))
            _append(path, [*pending, line])
            pending.clear()
            return result if ship_batches else len(samples)

        task_encoder.batch = _keeping_stateless(batch_fn, recorded_batch)  # type: ignore[method-assign]
    return task_encoder


def read_records(sink: str | os.PathLike) -> list[dict[str, Any]]:
    """The complete records in ``sink``, in file order: workers may still be appending (they prefetch),
    so a last line without its newline is left for the next read. No file: no records."""
    path = Path(sink)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    return [json.loads(line) for line in lines[:-1] if line]


def cook_order(records: Sequence[Mapping[str, Any]], per_process: int | None = None) -> list[list[str]]:
    """Key order seen by the cookers, one list per process (main or worker), in a canonical order of
    processes; each list cut to ``per_process`` keys (what was delivered, not what was prefetched)."""
    by_pid: dict[Any, list[str]] = {}
    for line in records:
        if line.get("stage", "cook") == "cook":
            by_pid.setdefault(line.get("pid"), []).append(str(line.get("key")))
    return sorted(keys[:per_process] if per_process is not None else keys for keys in by_pid.values())
