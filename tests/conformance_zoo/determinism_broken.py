"""Deliberately broken targets for property 5 (determinism across fresh processes).

They live at module level so the determinism children can rebuild them from ``MODULE:ATTR``.
"""

from __future__ import annotations

import dataclasses
import os
import random
from typing import Any

import torch
from megatron.energon import Cooker, stateless

from primus_energon import DiffusionSample, EncodedDiffusionTaskEncoder, cook_preencoded_diffusion

__all__ = [
    "HASH_NOISE_COOKER",
    "PID_NOISE_COOKER",
    "UNSEEDED_JITTER_COOKER",
    "PinnedSeedTaskEncoder",
]


def _with_noise(sample: DiffusionSample, seed: int, scale: float = 0.01) -> DiffusionSample:
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(sample.latents.shape, generator=generator, dtype=sample.latents.dtype) * scale
    return dataclasses.replace(sample, latents=sample.latents + noise)


@stateless
def cook_hash_noise(sample: dict) -> DiffusionSample:
    """Per-sample noise seeded by ``hash(key)``: str hashing is salted per process (PYTHONHASHSEED)."""
    cooked = cook_preencoded_diffusion(sample)
    return _with_noise(cooked, hash(sample["__key__"]) & 0xFFFFFFFF)


@stateless
def cook_pid_noise(sample: dict) -> DiffusionSample:
    """Noise seeded by the process id: differs between runs and between worker processes."""
    return _with_noise(cook_preencoded_diffusion(sample), os.getpid())


@stateless
def cook_unseeded_jitter(sample: dict) -> DiffusionSample:
    """Random brightness jitter from the global ``random`` module, without ``restore_seeds=True``."""
    cooked = cook_preencoded_diffusion(sample)
    return dataclasses.replace(cooked, latents=cooked.latents * (1.0 + 0.1 * random.random()))


HASH_NOISE_COOKER = Cooker(cook_hash_noise, has_subflavors={"encoding": "preencoded"})
PID_NOISE_COOKER = Cooker(cook_pid_noise, has_subflavors={"encoding": "preencoded"})
UNSEEDED_JITTER_COOKER = Cooker(cook_unseeded_jitter, has_subflavors={"encoding": "preencoded"})


class PinnedSeedTaskEncoder(EncodedDiffusionTaskEncoder):
    """Pins the loader seed "for reproducibility": every seed then gives the same order."""

    def build_train_datasets(self, *, worker_config: Any, **kwargs: Any) -> Any:
        worker_config.seed_offset = 1234
        return super().build_train_datasets(worker_config=worker_config, **kwargs)
