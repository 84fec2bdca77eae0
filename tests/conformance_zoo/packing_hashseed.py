"""A packer whose packs depend on the interpreter's hash seed: it groups the samples by taking their keys
from a ``set``, whose iteration order for ``str`` depends on ``PYTHONHASHSEED``. Every pack it builds is
valid and every sample is packed exactly once; two processes with the same seed build different packs."""

from __future__ import annotations

from typing import Any

from megatron.energon import stateless

from tests.conformance_zoo.packing import FirstFitPackingTaskEncoder


class SetOrderPackingTaskEncoder(FirstFitPackingTaskEncoder):
    """First-fit packing over the samples in the order of a set of their keys."""

    @stateless
    def select_samples_to_pack(self, samples: list[Any]) -> list[list[Any]]:
        by_key = {sample.__key__: sample for sample in samples}
        return super().select_samples_to_pack([by_key[key] for key in set(by_key)])
