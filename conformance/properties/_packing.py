"""Whether a TaskEncoder packs, and how it is configured to: shared by the properties that build loaders
the way it runs (batch, determinism, packing)."""

from __future__ import annotations

from typing import Any

from megatron.energon import TaskEncoder

__all__ = ["DEFAULT_BUFFER", "packing_configured", "packs"]

#: the packing buffer the suite's loaders use where the target names none
DEFAULT_BUFFER = 8


def packs(task_encoder: TaskEncoder) -> bool:
    """Whether the TaskEncoder overrides both packing methods (Energon then packs with packing_buffer_size)."""
    return all(
        getattr(type(task_encoder), name) is not getattr(TaskEncoder, name)
        for name in ("select_samples_to_pack", "pack_selected_samples")
    )


def packing_configured(target: Any, task_encoder: TaskEncoder) -> bool | None:
    """How the TaskEncoder is configured to run, where it says so: True when it packs and is built with a
    positive ``packing_buffer_size`` attribute (or ``--conformance-packing-buffer-size`` gives one), False
    when it has the attribute and it is None or 0 (training scripts pass the same value to the loader:
    Energon then never packs), None when it does not say (no such attribute)."""
    if not packs(task_encoder):
        return False
    if getattr(target, "packing_buffer_size", None) is not None:
        return True
    if not hasattr(task_encoder, "packing_buffer_size"):
        return None
    own = task_encoder.packing_buffer_size
    return isinstance(own, int) and not isinstance(own, bool) and own > 0
