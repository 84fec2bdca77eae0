"""The typed sample that the preencoded cookers produce."""

from __future__ import annotations

import torch
from megatron.energon import Sample

# Energon 7.0-7.2 export a module of this name from megatron.energon; the function lives in it on every 7.x.
from megatron.energon.edataclass import edataclass

__all__ = ["DiffusionSample"]


@edataclass
class DiffusionSample(Sample):
    """One diffusion training sample with framework-standard field names.

    Inherits ``__key__``, ``__restore_key__``, ``__subflavors__`` and ``__sources__`` from
    :class:`megatron.energon.Sample`, which Energon needs for deterministic resumption.
    Keyword-only and slotted, like Energon's own samples.
    """

    #: VAE latents, ``[C, H/8, W/8]`` (``[64, H/8, W/8]`` for a 64-channel VAE).
    latents: torch.Tensor
    #: Text-encoder (T5) embeddings, ``[seq_len, hidden]``.
    prompt_embeds: torch.Tensor
    #: Pooled (CLIP) embedding, ``[hidden]``.
    pooled_prompt_embeds: torch.Tensor
    #: The original caption; empty when the dataset has none.
    caption: str = ""
