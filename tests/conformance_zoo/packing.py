"""TaskEncoders that pack samples (select_samples_to_pack / pack_selected_samples): a correct first-fit
decreasing packer, as NeMo's and DFM's sequence packing, and broken ones."""

from __future__ import annotations

from typing import Any

import torch
from megatron.energon import stateless

from primus_energon import DiffusionSample, EncodedDiffusionTaskEncoder


class FirstFitPackingTaskEncoder(EncodedDiffusionTaskEncoder):
    """First-fit decreasing by prompt length into packs of `capacity` tokens; a pack concatenates the
    prompts along the sequence and stacks the rest; a batch is a list of packs."""

    capacity = 16

    def select_samples_to_pack(self, samples: list[DiffusionSample]) -> list[list[DiffusionSample]]:
        order = sorted(range(len(samples)), key=lambda i: (-samples[i].prompt_embeds.shape[0], i))
        bins: list[list[DiffusionSample]] = []
        room: list[int] = []
        for index in order:
            length = samples[index].prompt_embeds.shape[0]
            for slot, left in enumerate(room):
                if length <= left:
                    bins[slot].append(samples[index])
                    room[slot] -= length
                    break
            else:
                bins.append([samples[index]])
                room.append(self.capacity - length)
        return bins

    @stateless
    def pack_selected_samples(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        return {
            "__key__": [s.__key__ for s in samples],
            "prompt_embeds": torch.cat([s.prompt_embeds for s in samples]),
            "seq_lens": torch.tensor([s.prompt_embeds.shape[0] for s in samples]),
            "latents": torch.stack([s.latents for s in samples]),
            "pooled_prompt_embeds": torch.stack([s.pooled_prompt_embeds for s in samples]),
            "caption": [s.caption for s in samples],
        }

    @stateless
    def batch(self, samples: list[Any]) -> dict[str, Any]:
        if not all(isinstance(s, dict) for s in samples):  # no packing_buffer_size: plain samples
            return super().batch(samples)
        return {"__key__": [key for pack in samples for key in pack["__key__"]], "packs": list(samples)}


class DropsLastPackTaskEncoder(FirstFitPackingTaskEncoder):
    """Leaves the last, partly filled pack of every buffer out: Energon drops those samples."""

    def select_samples_to_pack(self, samples: list[DiffusionSample]) -> list[list[DiffusionSample]]:
        bins = super().select_samples_to_pack(samples)
        return bins[:-1] if len(bins) > 1 else bins


class RepeatsASampleTaskEncoder(FirstFitPackingTaskEncoder):
    """Fills the room left in the first pack with a copy of its first sample: that sample trains twice."""

    def select_samples_to_pack(self, samples: list[DiffusionSample]) -> list[list[DiffusionSample]]:
        bins = super().select_samples_to_pack(samples)
        return [bins[0] + bins[0][:1], *bins[1:]]


class FirstPromptOnlyTaskEncoder(FirstFitPackingTaskEncoder):
    """Packs the keys of every sample but the prompt of the first one only."""

    @stateless
    def pack_selected_samples(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        pack = super().pack_selected_samples(samples)
        return {**pack, "prompt_embeds": samples[0].prompt_embeds.clone()}


class ShufflesPacksTaskEncoder(FirstFitPackingTaskEncoder):
    """Shuffles the packs with the operating system's randomness: two runs with one seed differ."""

    def select_samples_to_pack(self, samples: list[DiffusionSample]) -> list[list[DiffusionSample]]:
        import random

        bins = super().select_samples_to_pack(samples)
        random.SystemRandom().shuffle(bins)
        return bins


class GlobalShufflePacksTaskEncoder(FirstFitPackingTaskEncoder):
    """Shuffles the packs with the global ``random`` that nobody seeded (as Megatron-Bridge's WAN TaskEncoder
    did before its upstream fix): a run and its restore differ in whatever state the generator is in."""

    def select_samples_to_pack(self, samples: list[DiffusionSample]) -> list[list[DiffusionSample]]:
        import random

        bins = super().select_samples_to_pack(samples)
        random.shuffle(bins)
        return bins


class CountsBuffersTaskEncoder(FirstFitPackingTaskEncoder):
    """Reverses the packs of every other buffer, counted on the instance: a restored loader counts from 0
    again, so it continues with other packs than the saved run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buffers = 0

    def select_samples_to_pack(self, samples: list[DiffusionSample]) -> list[list[DiffusionSample]]:
        bins = super().select_samples_to_pack(samples)
        self.buffers += 1
        return bins[::-1] if self.buffers % 2 else bins


class PackWithoutItsBatchFieldsTaskEncoder(FirstFitPackingTaskEncoder):
    """Its packs lack the sequence lengths its batch() reads (as DFM's FLUX packs lack the metadata its
    batch() needs): every packed batch raises."""

    @stateless
    def pack_selected_samples(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        pack = super().pack_selected_samples(samples)
        del pack["seq_lens"]
        return pack

    @stateless
    def batch(self, samples: list[Any]) -> dict[str, Any]:
        if all(isinstance(s, dict) for s in samples):
            return {**super().batch(samples), "seq_lens": [pack["seq_lens"] for pack in samples]}
        return super().batch(samples)


class KeepsFirstPackTaskEncoder(FirstFitPackingTaskEncoder):
    """batch() treats the packs it is given as one sample: it keeps the first pack and the keys of all
    (the batch counts samples by keys, so a row count looks right while packs are lost)."""

    @stateless
    def batch(self, samples: list[Any]) -> dict[str, Any]:
        if all(isinstance(s, dict) for s in samples):
            return {"__key__": [key for pack in samples for key in pack["__key__"]], "packs": samples[:1]}
        return super().batch(samples)


class PadsPacksTaskEncoder(FirstFitPackingTaskEncoder):
    """A batch of packs padded to the longest pack along the sequence and the hidden dimension, with a
    mask, as NeMo and DFM batch packed sequences: every pack is kept."""

    @stateless
    def batch(self, samples: list[Any]) -> dict[str, Any]:
        if not all(isinstance(s, dict) for s in samples):
            return super().batch(samples)
        longest = max(pack["prompt_embeds"].shape[0] for pack in samples)
        width = max(pack["prompt_embeds"].shape[1] for pack in samples) + 2
        padded = torch.zeros(len(samples), longest, width, dtype=samples[0]["prompt_embeds"].dtype)
        mask = torch.zeros(len(samples), longest, dtype=torch.bool)
        for row, pack in enumerate(samples):
            length, dim = pack["prompt_embeds"].shape
            padded[row, :length, :dim] = pack["prompt_embeds"]
            mask[row, :length] = True
        return {
            "__key__": [key for pack in samples for key in pack["__key__"]],
            "prompt_embeds": padded,
            "mask": mask,
            "latents": [pack["latents"] for pack in samples],
            "pooled_prompt_embeds": [pack["pooled_prompt_embeds"] for pack in samples],
            "caption": [pack["caption"] for pack in samples],
        }


class PacksOnlyWithMaxLengthTaskEncoder(FirstFitPackingTaskEncoder):
    """As NeMo's diffusion TaskEncoder: it overrides both packing methods but packs only when built with a
    maximum pack length (its packing recipes pass one together with the loader's packing_buffer_size), and
    has no packing_buffer_size attribute. Built without one, as its non-packing training does, its packer
    raises TypeError: training built that way never packs, so nothing about packing can be judged."""

    def __init__(self, *args: Any, max_seq_length: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.capacity = max_seq_length  # None: `capacity - length` raises in select_samples_to_pack
