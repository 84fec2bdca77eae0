"""Correct targets in styles the rest of the zoo lacks, written as their authors would (not to please the
suite), and the broken variants of the same styles:

- a pass-through cooker that trusts ``torch.load(weights_only=True)`` for whatever a ``.pth`` holds;
- a packer whose packs carry the embeddings only (the captions are provenance, left out);
- a THD packed TaskEncoder: a pack concatenates its samples along the sequence with ``cu_seqlens``, and a
  batch of packs concatenates the packs again (one long sequence, with the lengths of every sample);
- a TaskEncoder whose batch carries the per-sample conditioning as a list of dicts;
- broken: a packed ``batch()`` that keeps only ``metadata[0]`` of each pack, and a cooker that turns a
  ``.pth`` holding a dict into ``torch.zeros``.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import torch
from megatron.energon import Cooker, DefaultTaskEncoder, basic_sample_keys, stateless

from primus_energon import DiffusionSample, EncodedDiffusionTaskEncoder


def _as_tensor(raw: bytes) -> Any:
    # the common helper: what a .pth holds, read without unpickling arbitrary objects
    return torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")


@stateless
def cook_trusting_weights_only(sample: dict) -> DiffusionSample:
    """Reads each tensor member with weights_only=True and passes it on: a .pth that holds a dict ends up
    in the field, and the first torch.stack fails loudly on it."""
    caption = sample.get("caption.txt")
    return DiffusionSample(
        **basic_sample_keys(sample),
        latents=_as_tensor(sample["latents.pth"]),
        prompt_embeds=_as_tensor(sample["prompt_embeds.pth"]),
        pooled_prompt_embeds=_as_tensor(sample["pooled_prompt_embeds.pth"]),
        caption=caption.decode("utf-8") if caption is not None else None,
    )


@stateless
def cook_zeros_for_dicts(sample: dict) -> DiffusionSample:
    """Broken: "be robust to odd files": a member that is not a tensor becomes zeros of the expected shape,
    so a bad sample trains as a plausible one."""

    def tensor(member: str, shape: tuple[int, ...]) -> torch.Tensor:
        value = _as_tensor(sample[member])
        return value if isinstance(value, torch.Tensor) else torch.zeros(shape)

    latents = _as_tensor(sample["latents.pth"])
    embeds = _as_tensor(sample["prompt_embeds.pth"])
    pooled = _as_tensor(sample["pooled_prompt_embeds.pth"])
    shapes = [v.shape if isinstance(v, torch.Tensor) else None for v in (latents, embeds, pooled)]
    return DiffusionSample(
        **basic_sample_keys(sample),
        latents=tensor("latents.pth", shapes[0] or (4, 8, 8)),
        prompt_embeds=tensor("prompt_embeds.pth", shapes[1] or (7, 16)),
        pooled_prompt_embeds=tensor("pooled_prompt_embeds.pth", shapes[2] or (16,)),
        caption=sample["caption.txt"].decode("utf-8") if "caption.txt" in sample else None,
    )


class _Packer(EncodedDiffusionTaskEncoder):
    """Greedy packing by prompt length into packs of at most ``max_tokens`` tokens."""

    max_tokens = 24

    def select_samples_to_pack(self, samples: list[DiffusionSample]) -> list[list[DiffusionSample]]:
        packs: list[list[DiffusionSample]] = []
        used = 0
        for sample in samples:
            length = sample.prompt_embeds.shape[0]
            if packs and used + length <= self.max_tokens:
                packs[-1].append(sample)
                used += length
            else:
                packs.append([sample])
                used = length
        return packs


class EmbeddingsOnlyPackingTaskEncoder(_Packer):
    """Packs carry what the model trains on: latents, the concatenated prompt with its lengths, the pooled
    embeddings. Captions are not needed after encoding, so no pack carries them."""

    @stateless
    def pack_selected_samples(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        return {
            "__key__": ",".join(s.__key__ for s in samples),
            "latents": torch.stack([s.latents for s in samples]),
            "prompt_embeds": torch.cat([s.prompt_embeds for s in samples]),
            "prompt_lens": [s.prompt_embeds.shape[0] for s in samples],
            "pooled_prompt_embeds": torch.stack([s.pooled_prompt_embeds for s in samples]),
        }

    @stateless
    def batch(self, samples: list[Any]) -> Any:
        if isinstance(samples[0], DiffusionSample):
            return super().batch(samples)
        return {
            "__key__": [pack["__key__"] for pack in samples],
            "latents": torch.cat([pack["latents"] for pack in samples]),
            "prompt_embeds": [pack["prompt_embeds"] for pack in samples],
            "prompt_lens": [pack["prompt_lens"] for pack in samples],
            "pooled_prompt_embeds": torch.cat([pack["pooled_prompt_embeds"] for pack in samples]),
        }


class ThdPackingTaskEncoder(_Packer):
    """THD layout, as Megatron's packed sequences: a pack is one sequence of its samples' prompt tokens
    with ``cu_seqlens``; a batch of packs concatenates the packs into one sequence again (the model's
    attention reads the boundaries from ``cu_seqlens``), B=1 for a batch of one pack."""

    @stateless
    def encode_sample(self, sample: DiffusionSample) -> DiffusionSample:
        # patchify (1x1 patches): [C, H, W] latents become [H*W, C] tokens
        return dataclasses.replace(sample, latents=sample.latents.flatten(1).T.contiguous())

    @stateless
    def pack_selected_samples(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        lengths = torch.tensor([s.prompt_embeds.shape[0] for s in samples], dtype=torch.int32)
        return {
            "__key__": [s.__key__ for s in samples],
            "tokens": torch.cat([s.prompt_embeds for s in samples]),
            "cu_seqlens": torch.cat(
                [torch.zeros(1, dtype=torch.int32), lengths.cumsum(0, dtype=torch.int32)]
            ),
            "latents": torch.cat([s.latents for s in samples]),  # [sum(H*W), C]
            "latent_lens": [s.latents.shape[0] for s in samples],
            "pooled": torch.stack([s.pooled_prompt_embeds for s in samples]),
            "captions": [s.caption for s in samples],
        }

    @stateless
    def batch(self, samples: list[Any]) -> Any:
        if isinstance(samples[0], DiffusionSample):
            return super().batch(samples)
        offsets, cu = 0, [0]
        for pack in samples:
            cu += [offsets + int(n) for n in pack["cu_seqlens"][1:]]
            offsets = cu[-1]
        return {
            "__key__": [key for pack in samples for key in pack["__key__"]],
            "tokens": torch.cat([pack["tokens"] for pack in samples]).unsqueeze(0),  # [1, T, D]
            "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
            "latents": torch.cat([pack["latents"] for pack in samples]),
            "latent_lens": [n for pack in samples for n in pack["latent_lens"]],
            "pooled": torch.cat([pack["pooled"] for pack in samples]),
            "captions": [c for pack in samples for c in pack["captions"]],
        }


class MetadataListPackingTaskEncoder(_Packer):
    """A pack keeps each sample's conditioning in a list of per-sample dicts; a batch of packs keeps the
    lists (correct)."""

    @stateless
    def pack_selected_samples(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        return {
            "__key__": [s.__key__ for s in samples],
            "latents": torch.stack([s.latents for s in samples]),
            "metadata": [
                {"prompt_embeds": s.prompt_embeds, "pooled": s.pooled_prompt_embeds, "caption": s.caption}
                for s in samples
            ],
        }

    @stateless
    def batch(self, samples: list[Any]) -> Any:
        if isinstance(samples[0], DiffusionSample):
            return super().batch(samples)
        return {
            "__key__": [pack["__key__"] for pack in samples],
            "latents": [pack["latents"] for pack in samples],
            "metadata": [pack["metadata"] for pack in samples],
        }


class KeepsFirstMetadataTaskEncoder(MetadataListPackingTaskEncoder):
    """Broken: batch() keeps ``metadata[0]`` of each pack ("the conditioning of the pack"), so the pooled
    embedding of every other sample of the pack never reaches the model."""

    @stateless
    def batch(self, samples: list[Any]) -> Any:
        if isinstance(samples[0], DiffusionSample):
            return super().batch(samples)
        return {
            "__key__": [pack["__key__"] for pack in samples],
            "latents": [pack["latents"] for pack in samples],
            "metadata": [pack["metadata"][0] for pack in samples],
        }


class PerSampleDictsTaskEncoder(DefaultTaskEncoder):
    """No packing: batch() stacks the latents and keeps each sample's text conditioning as a list of
    per-sample dicts (prompt embeddings of different lengths need no padding that way)."""

    decoder = None
    cookers = [Cooker(cook_trusting_weights_only, has_subflavors={"encoding": "preencoded"})]

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        return {
            "__key__": [s.__key__ for s in samples],
            "latents": torch.stack([s.latents for s in samples]),
            "conditioning": [
                {"prompt_embeds": s.prompt_embeds, "pooled": s.pooled_prompt_embeds, "caption": s.caption}
                for s in samples
            ],
        }


class DropsOddSamplesInBatchTaskEncoder(PerSampleDictsTaskEncoder):
    """Broken: batch() quietly leaves out samples whose fields are not tensors ("defensive collate"), so a
    bad sample vanishes with nothing logged or counted."""

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        kept = [
            s
            for s in samples
            if all(isinstance(v, torch.Tensor) for v in (s.latents, s.prompt_embeds, s.pooled_prompt_embeds))
        ]
        return super().batch(kept)
