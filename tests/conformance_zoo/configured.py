"""Targets built as projects build theirs: with constructor arguments and no defaults
(``WanTaskEncoder(seq_length=1024, packing_buffer_size=8)``), given on the command line as
``MODULE:Class(NAME=VALUE, ...)``."""

from __future__ import annotations

from typing import Any

from megatron.energon import Cooker, stateless

from primus_energon import PREENCODED_COOKER, MegatronDataloaderWrapper

from .packing import FirstFitPackingTaskEncoder


class ConfiguredPackingTaskEncoder(FirstFitPackingTaskEncoder):
    """A correct first-fit packer that needs its arguments: packs of at most ``seq_length`` prompt tokens,
    a buffer of ``packing_buffer_size`` samples (the loader must be built with the same value, as training
    scripts do), and one pack per batch (THD-style packed training runs at batch size 1)."""

    def __init__(self, *, seq_length: int, packing_buffer_size: int) -> None:
        super().__init__()
        self.capacity = seq_length
        self.packing_buffer_size = packing_buffer_size

    def select_samples_to_pack(self, samples: list[Any]) -> list[list[Any]]:
        if len(samples) > self.packing_buffer_size:
            raise ValueError(
                f"a packing buffer of {len(samples)} samples; this TaskEncoder was built for "
                f"packing_buffer_size={self.packing_buffer_size}"
            )
        return super().select_samples_to_pack(samples)

    @stateless
    def batch(self, samples: list[Any]) -> dict[str, Any]:
        if all(isinstance(s, dict) for s in samples) and len(samples) != 1:
            raise ValueError(f"{len(samples)} packs in one batch; packed training takes one pack per batch")
        return super().batch(samples)


def make_cooker(*, encoding: str) -> Cooker:
    """A cooker factory: the reference preencoded cooker, declared for ``encoding``."""
    return Cooker(PREENCODED_COOKER.cook, has_subflavors={"encoding": encoding})


class StepsWrapper(MegatronDataloaderWrapper):
    """The reference wrapper with a required keyword argument (built as ``StepsWrapper(loader, name=...)``)."""

    def __init__(self, loader: Any, *, name: str) -> None:
        super().__init__(loader)
        self.name = name
