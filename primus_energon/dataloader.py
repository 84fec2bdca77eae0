"""``MegatronDataloaderWrapper``: endless iteration and duck-typed checkpointing over any loader.

It has no Energon dependency: it wraps a PyTorch ``DataLoader``, an Energon loader, a list or any
other iterable. With an Energon ``SavableDataLoader`` it saves and restores through
``save_state_rank()`` / ``restore_state_rank()``.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

from .errors import EmptyDataloaderError
from .resume import (
    ALLOWABLE_CHANGES,
    ResumeChangeWarning,
    ResumeMismatchError,
    ResumeUncheckedWarning,
    blocking,
    compare_records,
    loader_record,
    pack_state,
    unpack_state,
)

__all__ = ["MegatronDataloaderWrapper", "EnergonDataloader", "cyclic_iter"]

T = TypeVar("T")
log = logging.getLogger(__name__)


def cyclic_iter(iterable: Iterable[T]) -> Iterator[T]:
    """Yield the items of ``iterable`` pass after pass, forever.

    Raises :class:`EmptyDataloaderError` when a pass yields nothing (an empty iterable, or a one-shot
    iterator such as a generator that is already exhausted) instead of spinning forever. Closing this
    generator closes the running pass's iterator too, so a loader's worker processes stop at once.
    """
    passes = 0
    while True:
        produced = False
        iterator = iter(iterable)
        try:
            for item in iterator:
                produced = True
                yield item
        except BaseException:  # closed (GeneratorExit), or the pass raised (a bad sample)
            # Left to the garbage collector, an Energon loader's pass shuts its workers down inside
            # gc.collect(), where each worker takes torch's 5 s join timeout; closing it here is instant.
            close = getattr(iterator, "close", None)
            if close is not None:
                close()
            raise
        if not produced:
            raise EmptyDataloaderError(_empty_message(iterable, passes))
        passes += 1


def _empty_message(iterable: Any, passes: int) -> str:
    what = type(iterable).__name__
    if passes == 0:
        return (
            f"the wrapped {what} yielded no items: the dataset (or this rank's part of it) is empty. "
            "Check the dataset path, its split and the number of ranks and workers"
        )
    return (
        f"the wrapped {what} yielded no items on pass {passes + 1}: it cannot be iterated again "
        "(a one-shot iterator or generator is exhausted). Wrap a re-iterable object such as a "
        "DataLoader or a list instead"
    )


class MegatronDataloaderWrapper(Generic[T]):
    """Makes any iterable fit Megatron's training loop: ``next()`` never raises ``StopIteration``.

    - Cyclic: when a pass over the wrapped loader ends, the next one starts (see :func:`cyclic_iter`).
    - ``save_state()`` returns ``loader.save_state_rank()`` if the loader has it, else None; for an
      Energon loader, together with a record of what decides its stream (rank, world size, workers,
      seed, micro batch size, shard tables, pipeline settings, Energon release; see
      :mod:`primus_energon.resume`).
    - ``restore_state(state)`` first compares that record with this loader's and raises
      :class:`~primus_energon.resume.ResumeMismatchError`, naming each difference, where Energon could
      not continue exactly; then calls ``loader.restore_state_rank(state)``, which takes effect from the
      next batch (a fresh iterator), so the run continues exactly where the saved one would have.
    """

    def __init__(self, dataloader: Iterable[T]) -> None:
        self._dataloader = dataloader
        self._iterator: Iterator[T] | None = None
        self._closed = False

    @property
    def dataloader(self) -> Iterable[T]:
        """The wrapped loader (iterate it directly for exactly one pass)."""
        return self._dataloader

    def __iter__(self) -> MegatronDataloaderWrapper[T]:
        return self

    def __next__(self) -> T:
        if self._iterator is None:
            if self._closed:
                raise RuntimeError("this MegatronDataloaderWrapper was closed; build a new loader")
            self._iterator = cyclic_iter(self._dataloader)
        return next(self._iterator)

    def close(self) -> None:
        """Stop the running pass and the loader's worker processes now; ``next()`` then raises."""
        self._closed = True
        self._close_iterator()
        # torch keeps persistent workers (Energon always asks for them) in DataLoader._iterator until the
        # DataLoader itself is freed; shut them down explicitly so that close() means it.
        shutdown = getattr(getattr(self._dataloader, "_iterator", None), "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def __enter__(self) -> MegatronDataloaderWrapper[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Dropped by reference counting, the wrapper closes its pass outside the garbage collector (fast).
        try:
            self._close_iterator()
        except Exception:  # never raise from a finalizer (e.g. at interpreter shutdown)
            pass

    def __len__(self) -> int:
        """Batches in one pass of the wrapped loader (``TypeError`` if it has no length)."""
        return len(self._dataloader)  # type: ignore[arg-type]

    def save_state(self) -> Any:
        """This rank's loader state (``save_state_rank()``) with the record of its configuration, or None
        if the wrapped loader cannot save. Plain data around Energon's state: ``torch.save`` it per rank."""
        save = getattr(self._dataloader, "save_state_rank", None)
        if save is None:
            log.debug("%s has no save_state_rank(); nothing to save", type(self._dataloader).__name__)
            return None
        return pack_state(loader_record(self._dataloader), save())

    def restore_state(self, state: Any, *, allow_changes: Iterable[str] = ()) -> None:
        """Restore a state from :meth:`save_state`; the next batch is the one that followed the save.

        ``None`` means the initial state. Raises :class:`~primus_energon.resume.ResumeMismatchError`
        when the state was saved under a configuration this loader cannot continue exactly (another
        world size, rank, worker count, seed, micro batch size, shard table or pipeline setting), naming
        each difference; ``allow_changes`` accepts the changes whose continuation is defined
        (``"micro_batch_size"``: a divisor of the saved one, with workers; ``"energon"``: another release).
        A state saved without a record restores with a :class:`~primus_energon.resume.ResumeUncheckedWarning`.
        Raises ``TypeError`` for a non-None state when the wrapped loader cannot restore, and
        ``RuntimeError`` when it refuses (Energon loaders with worker processes accept a restore only
        before their first batch: build a new loader and restore that).
        """
        allow = set(allow_changes)
        if allow - ALLOWABLE_CHANGES:
            raise ValueError(
                f"allow_changes={sorted(allow)}: only {sorted(ALLOWABLE_CHANGES)} can be allowed; the other "
                "changes have no defined continuation in Energon"
            )
        restore = getattr(self._dataloader, "restore_state_rank", None)
        if restore is not None and getattr(self._dataloader, "_has_workers", False):
            # Energon asserts here; check first so that the running pass stays usable after the error.
            raise RuntimeError(
                f"{type(self._dataloader).__name__} has running worker processes and cannot be restored: "
                "a loader with workers can be restored only before its first batch. Build a fresh loader, "
                "restore it, then iterate"
            )
        record, inner = unpack_state(state)
        if restore is not None and state is not None:
            self._check_record(record, allow)
        # Close the running pass first: its generators' cleanup must not run after (and undo) the restore.
        # Energon applies a restored state to the next iterator it creates, not to a running one.
        self._close_iterator()
        if restore is None:
            if inner is not None:
                raise TypeError(
                    f"cannot restore a saved state: the wrapped {type(self._dataloader).__name__} has no "
                    "restore_state_rank(); wrap an Energon savable loader (get_savable_loader)"
                )
            log.debug(
                "%s has no restore_state_rank(); restoring None is a no-op", type(self._dataloader).__name__
            )
        else:
            try:
                # Energon consumes parts of the state object while restoring; restore a copy so that
                # the caller's state stays valid (e.g. to restore the same checkpoint twice).
                restore(copy.deepcopy(inner))
            except AssertionError as error:
                raise RuntimeError(
                    f"{type(self._dataloader).__name__} refused the restore ({error}). A loader with worker "
                    "processes can be restored only before its first batch: build a fresh loader, restore "
                    "it, then iterate"
                ) from error

    def _check_record(self, record: Any, allow: set[str]) -> None:
        """Raise :class:`ResumeMismatchError` for the differences that stop a restore; warn about the rest."""
        current = loader_record(self._dataloader)
        if record is None:
            warnings.warn(
                "restoring a loader state saved without a record of its configuration (by an older "
                "primus-energon, or by save_state_rank() directly): nothing can check that it was saved by "
                "this rank with this world size, seed, worker count and data. Save with "
                "MegatronDataloaderWrapper.save_state() to have it checked",
                ResumeUncheckedWarning,
                stacklevel=3,
            )
            return
        if current is None:
            return  # a loader that cannot describe itself: nothing to compare with
        changes = compare_records(record, current)
        stopping = blocking(changes, allow)
        if stopping:
            where = f" (rank {current.get('rank')} of {current.get('world_size')})"
            raise ResumeMismatchError(changes if len(stopping) == len(changes) else stopping, where=where)
        for change in changes:
            warnings.warn(f"resuming across a change: {change.describe()}", ResumeChangeWarning, stacklevel=3)

    def _close_iterator(self) -> None:
        iterator, self._iterator = self._iterator, None
        if iterator is not None:
            iterator.close()  # a generator (cyclic_iter): closes the wrapped loader's pass as well


class EnergonDataloader(MegatronDataloaderWrapper[T]):
    """Deprecated name of :class:`MegatronDataloaderWrapper` (it has no Energon dependency)."""

    def __init__(self, dataloader: Iterable[T]) -> None:
        warnings.warn(
            "EnergonDataloader is deprecated; use primus_energon.MegatronDataloaderWrapper (same behaviour)",
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(dataloader)
