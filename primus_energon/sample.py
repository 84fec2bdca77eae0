"""The typed sample that the preencoded cookers produce."""

from __future__ import annotations

import torch
from megatron.energon import Sample

from .energon_compat import sample_dataclass

__all__ = ["DiffusionSample"]


@sample_dataclass
class DiffusionSample(Sample):
    """One diffusion training sample with framework-standard field names.

    Inherits the installed release's base fields from :class:`megatron.energon.Sample` (``__key__``,
    ``__restore_key__``, ``__subflavors__``, and ``__sources__`` on 7.x or ``__subflavor__`` on 5.x/6.x),
    which Energon needs for deterministic resumption. Made as Energon's own samples are on the release
    (keyword-only and slotted on 7.x); build it with keywords.
    """

    #: VAE latents, ``[C, H/8, W/8]`` (``[64, H/8, W/8]`` for a 64-channel VAE).
    latents: torch.Tensor
    #: Text-encoder (T5) embeddings, ``[seq_len, hidden]``.
    prompt_embeds: torch.Tensor
    #: Pooled (CLIP) embedding, ``[hidden]``.
    pooled_prompt_embeds: torch.Tensor
    #: The original caption; empty when the dataset has none.
    caption: str = ""
