"""Deliberately broken targets for property 9 (distributed sharding).

They live at module level so the ``torch.distributed`` ranks can rebuild them from ``MODULE:ATTR``.
"""

from __future__ import annotations

import zlib
from typing import Any

from megatron.energon import Cooker, SkipSample, WorkerConfig, stateless

from primus_energon import DiffusionSample, EncodedDiffusionTaskEncoder, cook_preencoded_diffusion

__all__ = [
    "DOUBLE_SHARDED_COOKER",
    "IgnoresRankTaskEncoder",
    "TORCH_DISTRIBUTED_SHARDED_COOKER",
    "KeylessBatchTaskEncoder",
    "KeylessDoubleShardedTaskEncoder",
]


@stateless
def cook_double_sharded(sample: dict) -> DiffusionSample:
    """Shards by key on top of Energon's own sharding ("keep only this rank's keys"): each rank drops the
    samples whose key hash belongs to another rank, although Energon already gave it only its own part.
    Single-process runs (world size 1) are unaffected."""
    config = WorkerConfig.active_worker_config
    if config is not None and config.world_size > 1:
        if zlib.crc32(sample["__key__"].encode()) % config.world_size != config.rank:
            raise SkipSample()
    return cook_preencoded_diffusion(sample)


DOUBLE_SHARDED_COOKER = Cooker(cook_double_sharded, has_subflavors={"encoding": "preencoded"})


class IgnoresRankTaskEncoder(EncodedDiffusionTaskEncoder):
    """Resets the worker config to a single rank while building the training pipeline, so every rank
    reads the whole dataset: each sample is trained on once per rank."""

    def build_train_datasets(self, *, worker_config: Any, **kwargs: Any) -> Any:
        worker_config.rank, worker_config.world_size = 0, 1
        return super().build_train_datasets(worker_config=worker_config, **kwargs)


@stateless
def cook_torch_distributed_sharded(sample: dict) -> DiffusionSample:
    """Shards by key with the ``torch.distributed`` rank: harmless in a single process, but under
    ``torchrun`` each rank drops the samples whose key hash belongs to another rank."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        if zlib.crc32(sample["__key__"].encode()) % dist.get_world_size() != dist.get_rank():
            raise SkipSample()
    return cook_preencoded_diffusion(sample)


TORCH_DISTRIBUTED_SHARDED_COOKER = Cooker(
    cook_torch_distributed_sharded, has_subflavors={"encoding": "preencoded"}
)


class KeylessBatchTaskEncoder(EncodedDiffusionTaskEncoder):
    """Not broken: batches hold only stacked tensors, no ``__key__``, so the determinism and sharding checks
    must take the keys from the cookers instead of the batches."""

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        full = super().batch(samples)
        return {
            name: value for name, value in full.items() if not name.startswith("__") and name != "caption"
        }


class KeylessDoubleShardedTaskEncoder(KeylessBatchTaskEncoder):
    """Keyless batches and the double sharding of :func:`cook_double_sharded`: the cooker records must
    still show the dropped samples as missing."""

    cookers = [DOUBLE_SHARDED_COOKER]
