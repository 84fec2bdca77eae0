"""A correct TaskEncoder of the size real projects write: two formats, a decoder of its own, and sequence
packing, together (Primus' two encodings, DFM's packed FLUX path and NeMo's own decoding in one). The
conformance speed benchmark measures the suite on it (``benchmarks/bench_conformance.py``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from megatron.energon import Cooker, DefaultTaskEncoder, Sample, basic_sample_keys, stateless

from primus_energon import SafeSampleDecoder

from .correct import cook_decoded_input
from .formats import cook_two_format_numpy

__all__ = ["PackedTwoFormatTaskEncoder"]


@dataclasses.dataclass
class Conditioned(Sample):
    """One sample of either format: the preencoded one has latents and a caption, MLPerf's mean/logvar."""

    prompt_embeds: torch.Tensor
    pooled_prompt_embeds: torch.Tensor
    latents: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    logvar: torch.Tensor | None = None
    caption: str | None = None

    @property
    def layout(self) -> str:
        return "latents" if self.latents is not None else "mean/logvar"


@stateless
def cook_decoded_preencoded(sample: dict) -> Conditioned:
    """The preencoded layout after the TaskEncoder's own decoder: members arrive as tensors and text."""
    return Conditioned(**cook_decoded_input(sample))


@stateless
def cook_mlperf(sample: dict) -> Conditioned:
    """MLPerf's headerless bf16 bytes (the decoder leaves ``.bytes`` members alone)."""
    cooked = cook_two_format_numpy(sample)
    return Conditioned(
        **basic_sample_keys(sample),
        prompt_embeds=cooked.prompt_embeds,
        pooled_prompt_embeds=cooked.pooled_prompt_embeds,
        mean=cooked.mean,
        logvar=cooked.logvar,
    )


class PackedTwoFormatTaskEncoder(DefaultTaskEncoder):
    """Decodes with its own safe decoder, cooks two formats, packs each format's samples first-fit by prompt
    length into THD packs (prompts concatenated, ``cu_seqlens``), and batches packs by concatenating them
    again; without a packing buffer a batch keeps every field of every sample (lists where formats mix)."""

    decoder = SafeSampleDecoder()
    cookers = [
        Cooker(cook_decoded_preencoded, has_subflavors={"encoding": "preencoded"}),
        Cooker(cook_mlperf, has_subflavors={"encoding": "preencoded_numpy"}),
    ]
    capacity = 32  # prompt tokens per pack

    def select_samples_to_pack(self, samples: list[Conditioned]) -> list[list[Conditioned]]:
        packs: list[list[Conditioned]] = []
        room: list[int] = []
        order = sorted(
            range(len(samples)), key=lambda i: (samples[i].layout, -len(samples[i].prompt_embeds), i)
        )
        for index in order:
            sample, length = samples[index], len(samples[index].prompt_embeds)
            for slot, left in enumerate(room):
                if length <= left and packs[slot][0].layout == sample.layout:
                    packs[slot].append(sample)
                    room[slot] -= length
                    break
            else:
                packs.append([sample])
                room.append(self.capacity - length)
        return packs

    @stateless
    def pack_selected_samples(self, samples: list[Conditioned]) -> dict[str, Any]:
        lengths = torch.tensor([len(s.prompt_embeds) for s in samples], dtype=torch.int32)
        pack: dict[str, Any] = {
            "__key__": [s.__key__ for s in samples],
            "tokens": torch.cat([s.prompt_embeds for s in samples]),
            "cu_seqlens": torch.cat(
                [torch.zeros(1, dtype=torch.int32), lengths.cumsum(0, dtype=torch.int32)]
            ),
            "pooled": torch.stack([s.pooled_prompt_embeds for s in samples]),
        }
        if samples[0].layout == "latents":  # one format per pack (select_samples_to_pack keeps them apart)
            pack["latents"] = torch.stack([s.latents for s in samples])
            pack["captions"] = [s.caption for s in samples]
        else:
            pack["mean"] = torch.stack([s.mean for s in samples])
            pack["logvar"] = torch.stack([s.logvar for s in samples])
        return pack

    @stateless
    def batch(self, samples: list[Any]) -> dict[str, Any]:
        if samples and isinstance(samples[0], Conditioned):  # no packing buffer: plain samples
            return _plain_batch(samples)
        return {
            "__key__": [key for pack in samples for key in pack["__key__"]],
            "__restore_key__": (),  # Energon fills it in: loader.restore_sample() can rebuild the batch
            "packs": [{name: value for name, value in pack.items() if name != "__key__"} for pack in samples],
        }


def _plain_batch(samples: list[Conditioned]) -> dict[str, Any]:
    """Every field of every sample: shared fields stacked by format, the rest in per-sample lists."""
    out: dict[str, Any] = {"__key__": [s.__key__ for s in samples], "__restore_key__": ()}
    for name in ("prompt_embeds", "pooled_prompt_embeds", "latents", "mean", "logvar", "caption"):
        values = [getattr(s, name) for s in samples]
        if all(isinstance(v, torch.Tensor) for v in values) and len({v.shape for v in values}) == 1:
            out[name] = torch.stack(values)
        elif any(v is not None for v in values):
            out[name] = values
    return out
