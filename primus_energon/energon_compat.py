"""One home for what differs between the Energon 7 releases this project supports (7.0 through 7.4).

- **Error handlers.** Since Energon 7.3 a ``WorkerConfig(global_error_handler=...)`` decides what every
  stage of the pipeline does with an exception (log and skip, or raise). Energon 7.0-7.2 have no such field:
  each wrapper dataset (``MapDataset``, ``BatchDataset``, ``PackingDataset``, ...) holds its own
  ``error_handler``, logging and skipping by default. :func:`worker_config` takes the handler on every
  version, and :func:`get_train_dataset` / :func:`get_val_dataset` hand it, on 7.0-7.2, to every wrapper of
  the pipeline they build, so a caller asking for ``reraise_exception`` gets it there too.
- **Sample keys.** Energon 7.0-7.2 name a sample ``"<shard>/<key>"`` (e.g. ``shard-000000.tar/s_000001``);
  since 7.3 ``__key__`` is the key alone. :func:`energon_key` says what Energon calls a sample of a shard.
- **Choosing a cooker.** Since 7.3 a TaskEncoder picks the cooker for each dataset when the loader is
  built (no match: ``ValueError`` at build time); 7.0-7.2 look it up per sample (no match: the error comes
  with the first sample). :data:`COOKERS_CHOSEN_PER_SAMPLE` says which.
- **Skipping a sample.** Energon 7.3 defines ``SkipSample`` twice; the one it exports reaches the error
  handler as an error (see :data:`SKIP_SAMPLE_TYPES`). :func:`reraise_exception` lets it skip the sample.
- **The stock handlers.** ``log_exception`` and ``reraise_exception`` are exported at the top level since
  7.3; before, ``log_exception`` lives in ``megatron.energon.wrappers._log_exception``, and the
  ``reraise_exception`` of ``megatron.energon.flavors.webdataset.structs`` wraps the error in a bare
  ``Exception``: here it raises the error as it is, as on 7.3+.
- **The loader's watchdog.** Where Energon's loaders take ``watchdog_timeout_seconds``, each iteration of a
  loader starts a watchdog thread that ``Watchdog.watch_iter`` never finishes: in a loader without workers
  (``num_workers=0``) it stays for the life of the process, waking every second. :data:`SHORT_LOADER_SETTINGS`
  turns it (and the periodic ``gc.collect()``) off for short loaders in a long-lived process.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import megatron.energon as _energon
from megatron.energon import SavableDataset, WorkerConfig

__all__ = [
    "ENERGON_VERSION",
    "HAS_GLOBAL_ERROR_HANDLER",
    "ErrorHandler",
    "log_exception",
    "reraise_exception",
    "SKIP_SAMPLE_TYPES",
    "KEYS_NAME_THEIR_SHARD",
    "COOKERS_CHOSEN_PER_SAMPLE",
    "energon_key",
    "key_in_shard",
    "worker_config",
    "get_train_dataset",
    "get_val_dataset",
    "short_loader",
    "SHORT_LOADER_SETTINGS",
]

#: ``(exception, sample, sources)``: what Energon calls for a sample a stage raised on.
ErrorHandler = Callable[..., None]


def _version() -> tuple[int, ...]:
    try:
        text = version("megatron-energon")
    except PackageNotFoundError:  # an unpacked source tree: the newest behaviour
        return (7, 4, 0)
    return tuple(int(part) for part in text.split("+")[0].split(".")[:3] if part.isdigit())


#: The installed megatron-energon release, e.g. ``(7, 4, 1)``.
ENERGON_VERSION: tuple[int, ...] = _version()

#: True where ``WorkerConfig`` has ``global_error_handler`` (Energon 7.3 and later).
HAS_GLOBAL_ERROR_HANDLER: bool = "global_error_handler" in {f.name for f in dataclasses.fields(WorkerConfig)}

#: True where ``__key__`` is ``"<shard>/<key>"`` (Energon 7.0-7.2).
KEYS_NAME_THEIR_SHARD: bool = ENERGON_VERSION < (7, 3)
#: Energon 7.0-7.2 look the cooker up per sample, so "no cooker matches" surfaces at the first sample.
COOKERS_CHOSEN_PER_SAMPLE: bool = ENERGON_VERSION < (7, 3)


def energon_key(shard: str, key: str) -> str:
    """The ``__key__`` Energon gives the sample ``key`` of the tar shard ``shard`` (its path relative to the
    dataset, e.g. ``shard-000000.tar``)."""
    return f"{shard}/{key}" if KEYS_NAME_THEIR_SHARD else key


def key_in_shard(key: str, shard: str | None = None) -> str:
    """The inverse of :func:`energon_key`: the key a sample has inside its tar shard (what its member names
    start with), from the ``__key__`` Energon gave it. Without ``shard``, the prefix up to the first
    ``.tar/`` is taken for the shard's path."""
    if not KEYS_NAME_THEIR_SHARD:
        return key
    if shard and key.startswith(f"{shard}/"):
        return key[len(shard) + 1 :]
    head, found, tail = key.partition(".tar/")
    return tail if found and tail else key


if hasattr(_energon, "log_exception"):
    log_exception = _energon.log_exception
else:  # Energon 7.0-7.2
    from megatron.energon.wrappers._log_exception import log_exception  # noqa: F401


def _skip_sample_types() -> tuple[type[BaseException], ...]:
    found = {_energon.SkipSample}
    for module in ("megatron.energon.errors", "megatron.energon.wrappers.skip"):
        try:
            found.add(importlib.import_module(module).SkipSample)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


#: Every class Energon calls ``SkipSample``. Energon 7.3 has two: ``megatron.energon.SkipSample`` (from
#: ``wrappers.skip``), the one user code raises, and ``errors.SkipSample``, the one its pipeline catches;
#: the first reaches the error handler like any error (the default handler logs it and skips the sample).
SKIP_SAMPLE_TYPES: tuple[type[BaseException], ...] = _skip_sample_types()


def reraise_exception(error: Exception, sample: Any, sources: Any = None) -> None:
    """Raise the exception as it is, on every release (7.0-7.2's own wraps it in a bare ``Exception`` holding
    the whole sample's text). A ``SkipSample`` is not an error: it returns, and Energon skips the sample,
    as 7.4 does before any handler is asked (7.3 hands the class user code raises to the handler)."""
    if isinstance(error, SKIP_SAMPLE_TYPES):
        return
    raise error


#: On 7.0-7.2, by ``id(config)``: each config made by :func:`worker_config` (kept alive, so that its id is
#: not reused) and its handler, for the datasets built with it. The config is a slotted, unhashable
#: dataclass there: it takes no extra attribute and cannot be a key.
_HANDLERS: dict[int, tuple[WorkerConfig, ErrorHandler]] = {}


def worker_config(*, error_handler: ErrorHandler | None = None, **fields: Any) -> WorkerConfig:
    """``WorkerConfig(**fields)`` whose pipeline hands every exception to ``error_handler`` (Energon's
    default when None), on every Energon 7 release; build datasets with it through this module's
    :func:`get_train_dataset` / :func:`get_val_dataset`."""
    if error_handler is not None and HAS_GLOBAL_ERROR_HANDLER:
        fields["global_error_handler"] = error_handler
    config = WorkerConfig(**fields)
    if error_handler is not None and not HAS_GLOBAL_ERROR_HANDLER:
        _HANDLERS[id(config)] = (config, error_handler)
    return config


def get_train_dataset(
    path: str | os.PathLike, *, worker_config: WorkerConfig, **kwargs: Any
) -> SavableDataset:
    """Energon's ``get_train_dataset``, with the config's error handler in force on every release."""
    dataset = _energon.get_train_dataset(path, worker_config=worker_config, **kwargs)
    return _route_errors(dataset, worker_config)


def get_val_dataset(path: str | os.PathLike, *, worker_config: WorkerConfig, **kwargs: Any) -> SavableDataset:
    """Energon's ``get_val_dataset``, with the config's error handler in force on every release."""
    dataset = _energon.get_val_dataset(path, worker_config=worker_config, **kwargs)
    return _route_errors(dataset, worker_config)


def _route_errors(dataset: SavableDataset, config: WorkerConfig) -> SavableDataset:
    entry = None if HAS_GLOBAL_ERROR_HANDLER else _HANDLERS.get(id(config))
    if entry is None or entry[0] is not config:
        return dataset
    handler = entry[1]
    seen: set[int] = set()
    stack: list[Any] = [dataset]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, (list, tuple)):
            stack.extend(node)
            continue
        if not isinstance(node, SavableDataset):
            continue
        if "error_handler" in vars(node):
            node.error_handler = _Handler(handler)
        stack.extend(vars(node).values())
    return dataset


class _Handler:
    """Energon 7.0-7.2 call a wrapper's handler as ``(exception, sample)`` or with ``sources`` too."""

    def __init__(self, handler: ErrorHandler) -> None:
        self.handler = handler

    def __call__(self, error: Exception, sample: Any, sources: Any = None) -> None:
        self.handler(error, sample, sources)


def _short_loader_settings() -> dict[str, Any]:
    from megatron.energon.savable_loader import SavableDataLoader

    settings: dict[str, Any] = {"gc_collect_every_n_steps": 0}
    if "watchdog_timeout_seconds" in inspect.signature(SavableDataLoader.__init__).parameters:
        settings["watchdog_timeout_seconds"] = None
    return settings


#: Loader settings (``get_savable_loader``, ``BasicDataLoader``) for the many short loaders of one long-lived
#: process (the conformance suite builds dozens per target). Neither setting changes a sample or a state:
#: - ``gc_collect_every_n_steps=0``: Energon's GcDataset runs ``gc.collect()`` as each iteration starts and
#:   every few batches, a safeguard for days-long runs that costs ~0.15 s a loader in a process holding
#:   torch, pytest and hypothesis.
#: - ``watchdog_timeout_seconds=None`` (where the loaders have a watchdog): each iteration starts a watchdog
#:   thread that is never finished; without workers it stays, waking every second. Hundreds pile up, and a
#:   loader that forks its workers from such a process can wait out torch's 5-second join per worker when it
#:   shuts down. The suite's own time limits (:func:`call_with_timeout`, child timeouts) stand in for it.
SHORT_LOADER_SETTINGS: dict[str, Any] = _short_loader_settings()


def short_loader(dataset: SavableDataset) -> Any:
    """Energon's plain (not savable) loader for a short read of ``dataset``, with
    :data:`SHORT_LOADER_SETTINGS`. Same samples, same order as ``megatron.energon.get_loader(dataset)``."""
    from megatron.energon.savable_loader import BasicDataLoader

    return BasicDataLoader(dataset, **SHORT_LOADER_SETTINGS)
