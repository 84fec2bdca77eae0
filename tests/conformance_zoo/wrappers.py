"""Dataloader wrappers for the wrapper property (``--wrapper``): each broken one has the defect its
docstring names (seen in real wrappers of Energon loaders); the plain one is correct in another style."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


class PlainWrapper:
    """Correct, written plainly: cycles, refuses empty passes, closes the pass before a restore."""

    def __init__(self, dataloader: Iterable[Any]) -> None:
        self.dataloader = dataloader
        self._iterator: Iterator[Any] | None = None

    def _passes(self) -> Iterator[Any]:
        while True:
            empty = True
            for item in self.dataloader:
                empty = False
                yield item
            if empty:
                raise RuntimeError(f"the wrapped {type(self.dataloader).__name__} yielded nothing")

    def __iter__(self) -> PlainWrapper:
        return self

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._passes()
        return next(self._iterator)

    def save_state(self) -> Any:
        return self.dataloader.save_state_rank()

    def restore_state(self, state: Any) -> None:
        import copy

        if getattr(self.dataloader, "_has_workers", False):
            raise RuntimeError("cannot restore a loader whose workers are running; build a new one")
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None
        self.dataloader.restore_state_rank(copy.deepcopy(state))


class NoCycleWrapper(PlainWrapper):
    """Iterates the loader once: StopIteration at the end of the first epoch."""

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self.dataloader)
        return next(self._iterator)


class SpinningWrapper(PlainWrapper):
    """Cycles with ``while True: for item in loader: yield item``: spins forever on an empty loader or an
    exhausted iterator."""

    def _passes(self) -> Iterator[Any]:
        while True:
            yield from self.dataloader


class RestoresTheStateItselfWrapper(PlainWrapper):
    """Hands the caller's state object to Energon, which consumes parts of it: a second restore of the
    same object continues elsewhere."""

    def restore_state(self, state: Any) -> None:
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None
        self.dataloader.restore_state_rank(state)


class KeepsThePassWrapper(PlainWrapper):
    """Restores the loader but keeps iterating the running pass, which the restore does not touch: after
    a restore into a wrapper that has read batches it silently continues where it was."""

    def restore_state(self, state: Any) -> None:
        import copy

        if getattr(self.dataloader, "_has_workers", False):
            raise RuntimeError("cannot restore a loader whose workers are running; build a new one")
        self.dataloader.restore_state_rank(copy.deepcopy(state))


class StatelessWrapper(PlainWrapper):
    """Treats checkpointing as optional and saves nothing (``None``), restoring ``None`` as a no-op: a
    resumed run starts the data over."""

    def save_state(self) -> Any:
        return None

    def restore_state(self, state: Any) -> None:
        if state is not None:
            super().restore_state(state)


class RenamedWrapper(PlainWrapper):
    """Correct, but its module keeps the old name as a bare alias that never warns."""


OldWrapperName = RenamedWrapper  # the name users had before; no DeprecationWarning


class RecordingWrapper(PlainWrapper):
    """Correct in another style: saves Energon's own description of the loader (``worker_config`` and
    ``dataset.config()``) beside its state and refuses, with one message, a restore into a loader that
    describes itself otherwise (another rank, world size, worker count, seed, batch size or shard list)."""

    @staticmethod
    def _describe(loader: Any) -> str:
        import json

        worker = loader.worker_config
        described = {
            "rank": worker.rank,
            "world_size": worker.world_size,
            "num_workers": worker.num_workers,
            "seed": worker.seed_offset,
            "dataset": loader.dataset.config(),
        }
        return json.dumps(described, sort_keys=True, default=str)

    def save_state(self) -> Any:
        return {"loader": self.dataloader.save_state_rank(), "described": self._describe(self.dataloader)}

    def restore_state(self, state: Any) -> None:
        if state["described"] != self._describe(self.dataloader):
            raise ValueError(
                "this loader state belongs to a loader configured otherwise (rank, world size, workers, seed, "
                "batch size or shards differ); resume with the configuration it was saved with"
            )
        super().restore_state(state["loader"])


class StartsFreshOnErrorWrapper(PlainWrapper):
    """Swallows a refused restore and starts the data from scratch with a log line: Energon's refusal of
    another worker count or a larger micro batch size becomes a silent repeat of the epoch so far."""

    def restore_state(self, state: Any) -> None:
        import logging

        try:
            super().restore_state(state)
        except Exception as error:  # "keep training going"
            logging.getLogger(__name__).warning("could not restore the loader (%s); starting fresh", error)


class NewSeedStartsFreshWrapper(PlainWrapper):
    """Saves the seed and, when a restart brings another one, applies it by starting a new pass: the
    samples of the epoch so far come again, the new seed's order mixed into the rest."""

    def save_state(self) -> Any:
        return {
            "loader": self.dataloader.save_state_rank(),
            "seed": self.dataloader.worker_config.seed_offset,
        }

    def restore_state(self, state: Any) -> None:
        if state["seed"] != self.dataloader.worker_config.seed_offset:
            return  # the new seed wins: a fresh pass in the new order
        super().restore_state(state["loader"])
