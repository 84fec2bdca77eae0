"""The reference TaskEncoders: Energon cookers for dispatch, a safe decode path, and stacking ``batch()``.

Safety: Energon's default ``TaskEncoder.decoder`` (``SampleDecoder``) decodes ``.pth`` members with
``torch.load`` with ``weights_only`` off (and ``.pickle``/``.pyd`` members with ``pickle.loads``) before the
cooker runs, so a shard can execute code. These TaskEncoders therefore have no decoder: the cookers
receive the members' bytes and decode them themselves, tensors only through
:func:`~primus_energon.tensorfile.read_tensor`, which never unpickles. The decoder cannot be switched back on, by a subclass, by an instance
attribute or by any environment variable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from megatron.energon import Cooker, DefaultTaskEncoder, WorkerConfig, stateless

from .batching import sample_keys, stack_field
from .cookers import cook_preencoded_diffusion, cook_preencoded_diffusion_zero_copy, cook_raw_images
from .errors import BatchError
from .sample import DiffusionSample

__all__ = [
    "SafeDecodingTaskEncoder",
    "EncodedDiffusionTaskEncoder",
    "RawDiffusionTaskEncoder",
    "MultiFormatTaskEncoder",
    "PREENCODED_COOKER",
    "PREENCODED_ZERO_COPY_COOKER",
    "RAW_COOKER",
    "REFERENCE_COOKERS",
    "batch_preencoded",
    "batch_raw",
]

#: The reference cookers, dispatched by the dataset's ``subflavors.encoding``.
PREENCODED_COOKER = Cooker(cook_preencoded_diffusion, has_subflavors={"encoding": "preencoded"})
RAW_COOKER = Cooker(cook_raw_images, has_subflavors={"encoding": "raw"})
REFERENCE_COOKERS: tuple[Cooker, ...] = (PREENCODED_COOKER, RAW_COOKER)
#: The preencoded cooker the reference TaskEncoders use: tensors are views of the member bytes, and
#: ``batch()``'s stack is their only copy (see :func:`cook_preencoded_diffusion_zero_copy`).
PREENCODED_ZERO_COPY_COOKER = Cooker(
    cook_preencoded_diffusion_zero_copy, has_subflavors={"encoding": "preencoded"}
)

_UNSAFE_DECODER = (
    "{owner} must not set a decoder: Energon's SampleDecoder unpickles .pth members with "
    "weights_only off, so a shard could run code. The cookers decode members themselves; leave "
    "`decoder` as None (to add members, extend the cooker instead)"
)


def _check_batch_types(samples: Sequence[Any], expected: type, encoder: str) -> None:
    wrong = [s for s in samples if not isinstance(s, expected)]
    if wrong:
        keys = sample_keys(wrong) if all(hasattr(s, "__key__") or isinstance(s, dict) for s in wrong) else []
        raise BatchError(
            f"{encoder}.batch() expects {expected.__name__} samples, got {type(wrong[0]).__name__} "
            f"for {keys or len(wrong)}: a blend mixes encodings within one batch. Blend datasets of one "
            "encoding per loader, or group samples by encoding (TaskEncoder.batch_group_criterion)"
        )


def batch_preencoded(samples: Sequence[DiffusionSample]) -> dict[str, Any]:
    """Stack preencoded samples: ``latents [B, C, H, W]``, ``prompt_embeds [B, S, D]``,
    ``pooled_prompt_embeds [B, D]``, plus ``caption`` and ``__key__`` lists in batch order and the
    ``__restore_key__`` Energon fills in (needed for ``restore_sample``)."""
    return {
        "latents": stack_field(samples, "latents"),
        "prompt_embeds": stack_field(samples, "prompt_embeds"),
        "pooled_prompt_embeds": stack_field(samples, "pooled_prompt_embeds"),
        "caption": [s.caption for s in samples],
        "__key__": sample_keys(samples),
        "__restore_key__": (),
    }


def batch_raw(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """List raw samples: ``images`` (PIL RGB images), ``txt`` (captions), ``__key__``, in batch order."""
    return {
        "images": [s["images"] for s in samples],
        "txt": [s["txt"] for s in samples],
        "__key__": sample_keys(samples),
        "__restore_key__": (),
    }


class SafeDecodingTaskEncoder(DefaultTaskEncoder):
    """Base of the reference TaskEncoders: a ``DefaultTaskEncoder`` whose ``decoder`` is always None.

    Subclasses that define a ``decoder`` other than None, and assignments of one to an instance,
    raise ``TypeError`` (see the module docstring for why).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("decoder", None) is not None and not isinstance(
            cls.__dict__["decoder"], property
        ):
            raise TypeError(_UNSAFE_DECODER.format(owner=cls.__name__))

    @property
    def decoder(self) -> None:
        """Always None: members reach the cookers as bytes."""
        return None

    @decoder.setter
    def decoder(self, value: Any) -> None:
        if value is not None:
            raise TypeError(_UNSAFE_DECODER.format(owner=type(self).__name__))

    def __init__(self, worker_config: WorkerConfig | None = None) -> None:
        # `worker_config` is accepted because TaskEncoders are commonly built as `Encoder(worker_config)`; Energon takes the
        # worker configuration from the dataset, not from the TaskEncoder.
        super().__init__()
        self.worker_config = worker_config


class EncodedDiffusionTaskEncoder(SafeDecodingTaskEncoder):
    """TaskEncoder for preencoded datasets (``subflavors.encoding: preencoded``); batches are dicts of
    stacked tensors (see :func:`batch_preencoded`) that own their memory.

    Its cooker does not copy: the cooked samples' tensors are read-only views of the member bytes, and the
    stack in ``batch()`` is their only copy. A subclass that modifies samples in place before batching
    (in ``encode_sample``, say) must ``clone()`` first, or set ``cookers = [PREENCODED_COOKER]``, whose
    tensors own their memory.
    """

    cookers = [PREENCODED_ZERO_COPY_COOKER]

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        _check_batch_types(samples, DiffusionSample, type(self).__name__)
        return batch_preencoded(samples)


class RawDiffusionTaskEncoder(SafeDecodingTaskEncoder):
    """TaskEncoder for raw datasets (``subflavors.encoding: raw``); batches are lists of PIL images and
    captions (see :func:`batch_raw`); encoding happens in the model's forward step."""

    cookers = [RAW_COOKER]

    @stateless
    def batch(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        _check_batch_types(samples, dict, type(self).__name__)
        return batch_raw(samples)


class MultiFormatTaskEncoder(SafeDecodingTaskEncoder):
    """One TaskEncoder for every reference encoding, dispatched per dataset by ``subflavors.encoding``.

    A blend may mix encodings: ``batch_group_criterion`` puts the samples of each encoding into batches
    of their own (Energon's grouped batching, with the loader's batch size), which then batch as in
    :class:`EncodedDiffusionTaskEncoder` (zero-copy cooking included) or :class:`RawDiffusionTaskEncoder`.
    """

    cookers = [PREENCODED_ZERO_COPY_COOKER, RAW_COOKER]

    def batch_group_criterion(self, sample: Any) -> tuple[str, None]:
        """The sample's encoding as its batch group (None: the loader's batch size)."""
        return ("preencoded" if isinstance(sample, DiffusionSample) else "raw"), None

    def build_batch(self, dataset: Any, **kwargs: Any) -> Any:
        # Energon 7.4.1 builds the GroupBatchDataset of grouped batching without `batcher_stateless`, so
        # restore_sample refuses every batch although batch() is @stateless: pass it on here.
        from megatron.energon.task_encoder.base import get_stateless
        from megatron.energon.wrappers.group_batch_dataset import GroupBatchDataset

        batched = super().build_batch(dataset, **kwargs)
        inner = batched
        while inner is not None and not isinstance(inner, GroupBatchDataset):
            inner = getattr(inner, "dataset", None)  # under encode_batch's MapDataset
        if inner is not None:
            inner.batcher_stateless = get_stateless(self.batch)
        return batched

    @stateless
    def batch(self, samples: list[Any]) -> dict[str, Any]:
        if isinstance(samples[0], DiffusionSample):
            _check_batch_types(samples, DiffusionSample, type(self).__name__)
            return batch_preencoded(samples)
        _check_batch_types(samples, dict, type(self).__name__)
        return batch_raw(samples)
