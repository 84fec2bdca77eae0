"""TaskEncoders for the resume property's tests: two that cannot be resumed exactly, one that can."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from megatron.energon import stateless

from primus_energon import DiffusionSample, EncodedDiffusionTaskEncoder

__all__ = [
    "UnseededNoiseTaskEncoder",
    "SeededNoiseTaskEncoder",
    "StepCounterTaskEncoder",
    "ListBatchTaskEncoder",
    "NotStatelessBatchTaskEncoder",
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
