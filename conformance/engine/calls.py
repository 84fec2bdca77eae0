"""Running a target the way Energon does: cooking and encoding inside an active worker context, and
building real loaders (recording what the target saw is :mod:`primus_energon.conformance.engine.recording`)."""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from megatron.energon import (
    Cooker,
    SavableDataLoader,
    TaskEncoder,
    WorkerConfig,
    get_savable_loader,
)

from primus_energon.energon_compat import (
    SHORT_LOADER_SETTINGS,
    cooker_filters,
    get_train_dataset,
    get_val_dataset,
    log_exception,
    missing_decoding_dependency,
    overrides,
    reraise_exception,
    worker_config,
)
from primus_energon.storage import dataset_path

from ..core import breadcrumbs
from ..core.results import Inconclusive, PropertyFailure, PropertySkipped, TargetError
from ..oracles.plain import plain
from .target import Target

__all__ = [
    "TargetError",
    "target_call",
    "take",
    "worker_context",
    "cook",
    "encode",
    "build_loader",
    "closing",
    "matching_cooker",
]


@contextlib.contextmanager
def target_call(what: str) -> Iterator[None]:
    """Turn any exception raised inside into a :class:`TargetError` saying ``what`` was being done. A
    real-time alarm (``signal.alarm``, ``setitimer``) the call armed and left armed is disarmed, its
    handler put back, and reported as the target's: it would fire later in the training loop."""
    armed_before = _alarm_armed()
    handler = signal.getsignal(signal.SIGALRM) if _main_thread() else None
    try:
        with breadcrumbs.mark(call=what):
            yield
    except (TargetError, StopIteration, PropertyFailure, PropertySkipped, Inconclusive):
        raise
    except Exception as error:
        environment = missing_decoding_dependency(error)
        if environment is not None:  # the release's own decoder cannot run here: not the target's fault
            raise Inconclusive(f"{what}: {environment}") from error
        raise TargetError(what, error) from error
    finally:
        left = 0.0 if armed_before else _alarm_armed()
    if left:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if handler is not None:
            signal.signal(signal.SIGALRM, handler)
        raise TargetError(
            what,
            RuntimeError(
                f"it left a real-time alarm armed (signal.alarm / setitimer, {left:.1f} s to go): in training it "
                "fires later, in whatever runs then (a TimeoutError from its handler, or the process killed by "
                "SIGALRM); cancel it (signal.alarm(0)) before returning, also when the work ends early"
            ),
        )


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _alarm_armed() -> float:
    """Seconds until the process's real-time alarm fires (0: none armed)."""
    return signal.getitimer(signal.ITIMER_REAL)[0] if hasattr(signal, "getitimer") else 0.0


def take(loader: Any, count: int, *, what: str) -> list[Any]:
    """The next ``count`` batches of ``loader`` (an iterator or iterable); an exception is the target's."""
    iterator = loader if hasattr(loader, "__next__") else None
    with target_call(what):
        if iterator is None:
            iterator = iter(loader)
        out = []
        for index in range(count):
            # each batch its own call for the supervisor's per-call budget (a slow target's 16 batches may
            # take minutes together; one batch that never comes is the hang)
            with breadcrumbs.mark(call=f"{what} (batch {index + 1} of {count})"):
                out.append(next(iterator))
        return out


@contextlib.contextmanager
def worker_context(seed: int = 0, sample_index: int = 0) -> Iterator[WorkerConfig]:
    """Activate a single-process worker config, as Energon does around every cook call."""
    config = WorkerConfig(rank=0, world_size=1, num_workers=0, seed_offset=seed)
    config.worker_activate(sample_index)
    try:
        yield config
    finally:
        config.worker_deactivate()


def matching_cooker(cookers: Sequence[Cooker], crude: Mapping[str, Any] | None) -> int | None:
    """Index of the first cooker that takes the crude sample ``crude`` (the dispatch oracle, written
    independently of Energon's ``Cooker.is_match``), or None: its ``has_subflavors`` contained in the
    sample's ``__subflavors__`` and, where the release has them (5.x/6.x), ``is_subflavor`` equal to its
    ``__subflavor__`` and ``condition(crude)`` true. ``crude`` may hold the subflavors alone (a dataset's,
    before any sample is read): a ``condition`` is then taken to hold."""
    crude = crude or {}
    subflavors = crude.get("__subflavors__") or {}
    for index, cooker in enumerate(cookers):
        is_subflavor, has_subflavors, condition = cooker_filters(cooker)
        if is_subflavor is not None and crude.get("__subflavor__") != is_subflavor:
            continue
        if not all(
            key in subflavors and subflavors[key] == value for key, value in (has_subflavors or {}).items()
        ):
            continue
        if condition is not None and "__key__" in crude and not condition(crude):
            continue
        return index
    return None


def dataset_sample(subflavors: Mapping[str, Any] | None, subflavor: str | None = None) -> dict[str, Any]:
    """What :func:`matching_cooker` knows of a dataset's samples before one is read: its subflavors."""
    return {"__subflavors__": dict(subflavors or {}), "__subflavor__": subflavor}


def cook(
    target: Target,
    crude: dict[str, Any],
    *,
    sample_index: int = 0,
    seed: int = 0,
    clean: bool = True,
    as_plain: bool = False,
) -> Any:
    """Cook one crude sample with the target's matching cooker (first match, as Energon dispatches).

    ``clean``: the sample is benign data, so an exception is the target's failure (:class:`TargetError`);
    with ``clean=False`` (bad input on purpose) the exception is raised as it is. ``as_plain``: what the
    cooker returned as plain data, read inside the call (:func:`~.oracles.plain.plain`: to be judged,
    never to be handed on to the target)."""
    cookers = target.cookers
    index = matching_cooker(cookers, crude)
    if index is None:
        index = 0
    cooker = cookers[index]
    if not clean:
        with worker_context(seed, sample_index):
            cooked = cooker.cook(crude)
            return plain(cooked) if as_plain else cooked
    with (
        target_call(f"cooking the clean sample {crude.get('__key__')!r}"),
        worker_context(seed, sample_index),
    ):
        cooked = cooker.cook(crude)
        return plain(cooked) if as_plain else cooked


def encode(task_encoder: TaskEncoder, cooked: Any, *, seed: int = 0, sample_index: int = 0) -> list[Any]:
    """The encoded samples of one cooked sample, as Energon's pipeline makes them without packing:
    ``preencode_sample`` then ``postencode_sample`` where the TaskEncoder defines them, else
    ``encode_sample``; every output of a generator. Exceptions (``SkipSample`` included) are raised as
    they are."""
    if overrides(task_encoder, "preencode_sample"):
        stages = [task_encoder.preencode_sample]
    elif overrides(task_encoder, "encode_sample"):
        stages = [task_encoder.encode_sample]
    else:
        stages = []
    if overrides(task_encoder, "postencode_sample"):
        stages.append(task_encoder.postencode_sample)
    outputs = [cooked]
    with worker_context(seed, sample_index):
        for stage in stages:
            produced = []
            for sample in outputs:
                result = stage(sample)
                produced.extend(result if inspect.isgenerator(result) else [result])
            outputs = produced
    return outputs


def packing_settings(
    target: Target, task_encoder: Any, packing_buffer_size: int, batch_size: int
) -> tuple[int, int]:
    """The packing buffer size and batch size (packs per batch) of a loader that packs: the target's
    ``--conformance-packing-buffer-size`` / ``--conformance-batch-size``; else the buffer size the
    TaskEncoder was built with (an int attribute ``packing_buffer_size``, as training scripts pass the same
    value to the TaskEncoder and the loader); else the property's own choice."""
    own = getattr(task_encoder, "packing_buffer_size", None)
    if getattr(target, "packing_buffer_size", None) is not None:
        packing_buffer_size = target.packing_buffer_size
    elif isinstance(own, int) and not isinstance(own, bool) and own > 0:
        packing_buffer_size = own
    if getattr(target, "batch_size", None) is not None:
        batch_size = target.batch_size
    return packing_buffer_size, batch_size


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
    packing_buffer_size: int | None = None,
    **loader_kwargs: Any,
) -> SavableDataLoader:
    """Energon's own savable loader for ``path`` with a fresh TaskEncoder of the target."""
    config = worker_config(
        rank=rank,
        world_size=world_size,
        num_workers=num_workers,
        seed_offset=seed,
        error_handler=reraise_exception if on_error == "raise" else log_exception,
    )
    task_encoder = task_encoder or target.make_task_encoder()
    if packing_buffer_size is not None:  # a loader that packs: the settings the target needs, where given
        packing_buffer_size, batch_size = packing_settings(
            target, task_encoder, packing_buffer_size, batch_size
        )
    with target_call(f"building {target.describe()}'s loader over {dataset_path(path).name}"):
        return _build(
            path,
            config,
            task_encoder,
            mode,
            split_part,
            batch_size,
            repeat,
            loader_kwargs,
            packing_buffer_size,
        )


def _build(
    path: str | os.PathLike,
    config: WorkerConfig,
    task_encoder: TaskEncoder,
    mode: str,
    split_part: str,
    batch_size: int,
    repeat: bool,
    loader_kwargs: dict[str, Any],
    packing_buffer_size: int | None = None,
) -> SavableDataLoader:
    packing = {} if packing_buffer_size is None else {"packing_buffer_size": packing_buffer_size}
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
            **packing,
        )
    else:
        dataset = get_val_dataset(
            str(path),
            split_part=split_part,
            worker_config=config,
            batch_size=batch_size,
            task_encoder=task_encoder,
            **packing,
        )
    # The suite builds dozens of short loaders per target in one process: no periodic gc.collect() and no
    # watchdog thread left behind per iteration (SHORT_LOADER_SETTINGS says why); neither touches a sample.
    return get_savable_loader(dataset, **{**SHORT_LOADER_SETTINGS, **loader_kwargs})


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
