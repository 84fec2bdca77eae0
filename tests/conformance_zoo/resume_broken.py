"""TaskEncoders for the resume property's tests: ones that cannot be resumed exactly (along every route
or along one), ones that resume but whose batches ``restore_sample`` cannot rebuild, and one that is
correct."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from megatron.energon import SavableDataset, stateless
from megatron.energon.state import FlexState
from megatron.energon.wrappers.base import BaseWrapperDataset

from primus_energon import DiffusionSample, EncodedDiffusionTaskEncoder

__all__ = [
    "UnseededNoiseTaskEncoder",
    "SeededNoiseTaskEncoder",
    "StepCounterTaskEncoder",
    "ListBatchTaskEncoder",
    "NotStatelessBatchTaskEncoder",
    "LazyRestoreTaskEncoder",
    "SaveDropsRestoreTaskEncoder",
]


def _noisy(sample: DiffusionSample) -> DiffusionSample:
    return dataclasses.replace(sample, latents=sample.latents + 0.1 * torch.rand(sample.latents.shape))


class UnseededNoiseTaskEncoder(EncodedDiffusionTaskEncoder):
    """Broken: random augmentation under plain ``@stateless``, drawn from the process's global RNG, so a
    restored loader draws different noise for the same samples."""

    @stateless
    def encode_sample(self, sample: DiffusionSample) -> DiffusionSample:
        return _noisy(sample)


class SeededNoiseTaskEncoder(EncodedDiffusionTaskEncoder):
    """Correct: the same augmentation under ``@stateless(restore_seeds=True)`` (seeded per sample)."""

    @stateless(restore_seeds=True)
    def encode_sample(self, sample: DiffusionSample) -> DiffusionSample:
        return _noisy(sample)


class StepCounterTaskEncoder(EncodedDiffusionTaskEncoder):
    """Broken: ``batch()`` adds a running step index kept in ``self``, which no saved state holds."""

    def __init__(self) -> None:
        super().__init__()
        self.step = 0

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        out = super().batch(samples)
        out["step"] = self.step
        self.step += 1
        return out


class ListBatchTaskEncoder(EncodedDiffusionTaskEncoder):
    """Resumes exactly, but its batches are plain lists: no ``__restore_key__``, so ``restore_sample``
    cannot rebuild them."""

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> list[DiffusionSample]:
        return list(samples)


class NotStatelessBatchTaskEncoder(EncodedDiffusionTaskEncoder):
    """Resumes exactly, but ``batch()`` is not marked ``@stateless``, so Energon refuses to rebuild its
    batches in ``restore_sample``."""

    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        return super().batch(samples)


class _NumberedBatches(BaseWrapperDataset):
    """Adds a running batch number (``batch_index``, counted per worker) to every dict batch, and keeps it
    in the loader's saved state. A restore is applied lazily: ``restore_state`` only remembers the number,
    the next pass starts counting from it. ``save_state`` is where the two targets below go wrong."""

    #: True: save_state() drops a pending restore; False: save_state() ignores it
    drops_pending_restore = False

    def __init__(self, dataset: SavableDataset, *, worker_config: Any) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self.index = 0
        self.pending: int | None = None

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)

    def __len__(self) -> int:  # what Energon 7.0-7.2 ask of a wrapper instead of len_worker
        return len(self.dataset)

    def __iter__(self) -> Iterator[Any]:
        if self.pending is not None:
            self.index, self.pending = self.pending, None
        for batch in self.dataset:
            batch["batch_index"] = self.index
            self.index += 1
            yield batch

    def save_state(self) -> FlexState:
        state = super().save_state()
        if self.drops_pending_restore:
            # Reports the restored number, but "the restore is done" once a checkpoint is taken: a
            # loader saved between its restore and its first batch numbers from 0 again.
            state["index"] = self.pending if self.pending is not None else self.index
            self.pending = None
        else:
            # Reports the live counter: before the first batch after a restore, that is still 0.
            state["index"] = self.index
        return state

    def restore_state(self, state: FlexState) -> None:
        super().restore_state(state)
        self.pending = state["index"]

    def config(self) -> dict[str, Any]:
        return {"type": type(self).__qualname__, "dataset": self.dataset.config()}


class _DropsPendingRestore(_NumberedBatches):
    drops_pending_restore = True


class LazyRestoreTaskEncoder(EncodedDiffusionTaskEncoder):
    """Broken along one route only: numbers its batches with a counter that is saved and restored, but a
    state saved right after a restore (before the first batch) holds the stale counter, so restoring that
    state continues at the wrong number. ``restore_state_rank`` and the wrapper resume correctly; only
    resume/resaved catches it (with 0 workers: with workers, Energon returns the restored state itself)."""

    def build_train_datasets(self, *, worker_config: Any, **kwargs: Any) -> Any:
        dataset = super().build_train_datasets(worker_config=worker_config, **kwargs)
        return _NumberedBatches(dataset, worker_config=worker_config)


class SaveDropsRestoreTaskEncoder(EncodedDiffusionTaskEncoder):
    """Broken by a save between a restore and the first batch: the same counter, but that save drops the
    pending restore (the state it returns is right). With 0 workers ``restore_state_rank`` alone resumes
    correctly and only the wrapper route, which saves right after restoring, catches it (resume/wrapper);
    with workers Energon itself saves in each worker right after restoring, so every route fails there."""

    def build_train_datasets(self, *, worker_config: Any, **kwargs: Any) -> Any:
        dataset = super().build_train_datasets(worker_config=worker_config, **kwargs)
        return _DropsPendingRestore(dataset, worker_config=worker_config)
