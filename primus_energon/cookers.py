"""The reference cook functions: crude sample dict in, typed sample out.

Both are ``@stateless`` (Energon refuses to cook with anything else) and pure: they read the crude
dict, never modify it, and keep no state between calls. They accept members in every form Energon can
hand them: raw bytes (``TaskEncoder.decoder = None``, the reference setting), values an Energon
decoder already produced, or file paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from megatron.energon import basic_sample_keys, stateless

from .errors import MissingMemberError
from .payloads import decode_text, load_image, load_tensor
from .sample import DiffusionSample

__all__ = [
    "cook_preencoded_diffusion",
    "cook_preencoded_diffusion_zero_copy",
    "cook_raw_images",
    "PREENCODED_TENSOR_MEMBERS",
    "PREENCODED_CAPTION_MEMBER",
    "RAW_IMAGE_MEMBERS",
    "RAW_TEXT_MEMBER",
]

# The member layout of each format lives in primus_energon.formats; re-exported here for the cookers' users.
from .formats import PREENCODED_CAPTION_MEMBER, PREENCODED_TENSOR_MEMBERS, RAW_IMAGE_MEMBERS, RAW_TEXT_MEMBER


def _members_present(sample: Mapping[str, Any]) -> list[str]:
    return sorted(name for name in sample if not name.startswith("__"))


def _require(sample: Mapping[str, Any], member: str, what: str) -> Any:
    value = sample.get(member)
    if value is None:
        raise MissingMemberError(
            f"missing required member {member!r} ({what}); the sample has {_members_present(sample)}",
            sample,
            member=member,
        )
    return value


def _cook_preencoded(sample: dict, copy: bool) -> DiffusionSample:
    tensors = {
        field: load_tensor(_require(sample, member, "a torch.save tensor file"), sample, member, copy=copy)
        for field, member in PREENCODED_TENSOR_MEMBERS.items()
    }
    caption = sample.get(PREENCODED_CAPTION_MEMBER)
    caption = "" if caption is None else decode_text(caption, sample, PREENCODED_CAPTION_MEMBER)
    return DiffusionSample(**basic_sample_keys(sample), **tensors, caption=caption)


@stateless
def cook_preencoded_diffusion(sample: dict) -> DiffusionSample:
    """Cook a preencoded sample (VAE latents + text embeddings) into a :class:`DiffusionSample`.

    Reads ``latents.pth``, ``prompt_embeds.pth`` and ``pooled_prompt_embeds.pth`` (required) and
    ``caption.txt`` (optional, default ``""``). The tensors own their memory. Raises
    :class:`~primus_energon.errors.MissingMemberError`, :class:`~primus_energon.errors.PayloadDecodeError`
    or :class:`~primus_energon.errors.CaptionDecodeError` (all ``ValueError``) naming the member, the sample
    key and its shard. Never unpickles anything but tensors.
    """
    return _cook_preencoded(sample, copy=True)


@stateless
def cook_preencoded_diffusion_zero_copy(sample: dict) -> DiffusionSample:
    """:func:`cook_preencoded_diffusion` without copying: tensors read from member bytes are read-only
    views of those bytes (Energon's, one object per member and sample, so samples never share memory).

    For TaskEncoders whose ``batch()`` copies the tensors next, as stacking does: that copy is then the
    only one (:class:`~primus_energon.EncodedDiffusionTaskEncoder` uses it). Never write into the tensors
    (an in-place op before batching must ``clone()`` first), and do not keep them after batching unless a
    copy is fine: each keeps its member's bytes alive.
    """
    return _cook_preencoded(sample, copy=False)


@stateless
def cook_raw_images(sample: dict) -> dict[str, Any]:
    """Cook a raw sample into ``{**basic_sample_keys, "images": PIL RGB image, "txt": str}``.

    The image may be under ``images``, ``jpg``, ``jpeg``, ``png`` or ``webp`` (first found wins); the
    caption must be under ``txt``. A sample without an image or without a caption raises
    :class:`~primus_energon.errors.MissingMemberError`; undecodable bytes raise
    :class:`~primus_energon.errors.PayloadDecodeError`.
    """
    image_member = next((name for name in RAW_IMAGE_MEMBERS if sample.get(name) is not None), None)
    if image_member is None:
        raise MissingMemberError(
            f"no image member (looked for {list(RAW_IMAGE_MEMBERS)}); the sample has {_members_present(sample)}",
            sample,
            member=RAW_IMAGE_MEMBERS[0],
        )
    text = decode_text(_require(sample, RAW_TEXT_MEMBER, "the caption"), sample, RAW_TEXT_MEMBER)
    return {
        **basic_sample_keys(sample),
        "images": load_image(sample[image_member], sample, image_member),
        "txt": text,
    }
