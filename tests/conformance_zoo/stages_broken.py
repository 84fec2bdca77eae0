"""TaskEncoders whose cooker and ``batch()`` are correct and whose defect sits in a stage that only the real
loader runs: ``encode_batch``, ``postencode_sample``. Each comes with a correct twin in another style."""

from __future__ import annotations

from typing import Any

import torch
from megatron.energon import stateless

from primus_energon import EncodedDiffusionTaskEncoder


class SortsTextInEncodeBatchTaskEncoder(EncodedDiffusionTaskEncoder):
    """``encode_batch`` sorts the text fields (captions and keys) by caption length, for a tokenizer that
    wants them sorted, and leaves the tensors where they are: rows of latents beside other samples' captions."""

    @stateless
    def encode_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        order = sorted(range(len(batch["caption"])), key=lambda i: len(batch["caption"][i]))
        return {
            **batch,
            "caption": [batch["caption"][i] for i in order],
            "__key__": [batch["__key__"][i] for i in order],
        }


class SortsWholeRowsInEncodeBatchTaskEncoder(EncodedDiffusionTaskEncoder):
    """Correct twin: ``encode_batch`` sorts by caption length and moves every field's row with its caption."""

    @stateless
    def encode_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        order = sorted(range(len(batch["caption"])), key=lambda i: len(batch["caption"][i]))
        index = torch.tensor(order)
        out = dict(batch)
        for name in ("latents", "prompt_embeds", "pooled_prompt_embeds"):
            out[name] = batch[name].index_select(0, index)
        out["caption"] = [batch["caption"][i] for i in order]
        out["__key__"] = [batch["__key__"][i] for i in order]
        return out


class HalfPrecisionPostencodeTaskEncoder(EncodedDiffusionTaskEncoder):
    """``postencode_sample`` casts the float32 latents and T5 embeddings to float16 to save memory: every
    value changes, and no stage the suite called on its own did it."""

    @stateless
    def postencode_sample(self, sample: Any) -> Any:
        sample.latents = sample.latents.to(torch.float16)
        sample.prompt_embeds = sample.prompt_embeds.to(torch.float16)
        return sample


class ClonesInPostencodeTaskEncoder(EncodedDiffusionTaskEncoder):
    """Correct twin: ``postencode_sample`` clones the tensors into memory of their own (so that later stages
    may write into them) and changes no value."""

    @stateless
    def postencode_sample(self, sample: Any) -> Any:
        sample.latents = sample.latents.clone()
        sample.prompt_embeds = sample.prompt_embeds.clone()
        return sample


class HalfPrecisionPreencodeTaskEncoder(EncodedDiffusionTaskEncoder):
    """``preencode_sample`` (the first encode stage when a TaskEncoder packs, or declares it) casts the latents
    to float16: the samples Energon hands on are no longer the data."""

    @stateless
    def preencode_sample(self, sample: Any) -> Any:
        sample.latents = sample.latents.to(torch.float16)
        return sample


class UpcastsInPreencodeTaskEncoder(EncodedDiffusionTaskEncoder):
    """Correct twin: ``preencode_sample`` casts the latents to float64, which changes no value."""

    @stateless
    def preencode_sample(self, sample: Any) -> Any:
        sample.latents = sample.latents.to(torch.float64)
        return sample
