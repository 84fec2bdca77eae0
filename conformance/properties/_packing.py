"""Whether a TaskEncoder packs, and how it is configured to: shared by the properties that build loaders
the way it runs (batch, determinism, packing)."""

from __future__ import annotations

from typing import Any

from megatron.energon import TaskEncoder

__all__ = ["DEFAULT_BUFFER", "packing_configured", "packs", "cannot_pack_as_built"]

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


def cannot_pack_as_built(ctx: Any, task_encoder: TaskEncoder) -> str | None:
    """Where the TaskEncoder does not say whether it packs (:func:`packing_configured` None): why, as built, it
    does not pack clean samples (its own ``select_samples_to_pack`` or ``pack_selected_samples`` raised on a
    buffer of them, in a worker context as Energon calls them: a TaskEncoder built for training that does
    not pack, e.g. without the maximum pack length its packer needs); else None. None too when clean
    samples do not cook and encode (other claims report that)."""
    if packing_configured(ctx.target, task_encoder) is not None:
        return None
    return ctx.cached(("cannot_pack_as_built", id(type(task_encoder))), lambda: _probe(ctx, task_encoder))


def _probe(ctx: Any, task_encoder: TaskEncoder) -> str | None:
    from ..core.rendering import describe_error
    from ..engine.calls import cook, encode, worker_context

    encoding = ctx.encodings()[0]
    samples: list[Any] = []
    try:
        for index, crude in enumerate(
            ctx.crude(ctx.main_dataset(encoding), limit=DEFAULT_BUFFER, keep=False)
        ):
            cooked = cook(ctx.target, crude, sample_index=index, seed=ctx.seed)
            samples.extend(encode(task_encoder, cooked, seed=ctx.seed, sample_index=index))
    except Exception:  # clean data that does not cook or encode: reported by the claims that judge that
        return None
    if not samples:
        return None
    stage = "select_samples_to_pack"
    try:
        with worker_context(ctx.seed, 0):
            groups = task_encoder.select_samples_to_pack(list(samples))
            stage = "pack_selected_samples"
            for group in groups:
                task_encoder.pack_selected_samples(group)
    except Exception as error:
        return f"as built, its {stage} raised {describe_error(error, 200)} on a buffer of {len(samples)} clean samples"
    return None
