"""Deliberate transforms of one field, correct and broken: classifier-free-guidance caption dropout, a seeded
flip, truncated embeddings, a cast; each correct one passes once declared (``--conformance-transform``) and
fails undeclared with a message naming the declaration; each broken one fails the transforms claim meant for it.

The declarations they are checked with are in :data:`DECLARATIONS`.
"""

from __future__ import annotations

import dataclasses
import random
import zlib

import torch
from megatron.energon import Cooker, WorkerConfig, stateless

from primus_energon import EncodedDiffusionTaskEncoder, cook_preencoded_diffusion

#: the declaration each target here is checked with
DECLARATIONS = {
    "CfgDropoutTaskEncoder": 'caption: dropout rate=0.1 to=""',
    "cook_cfg_dropout": 'caption: dropout rate=0.1 to=""',
    "EmbeddingDropoutTaskEncoder": "prompt_embeds: dropout rate=0.1 to=zeros",
    "FlipTaskEncoder": "latents: flip axis=-1 rate=0.5",
    "TruncateTaskEncoder": "prompt_embeds: truncate axis=0 length=4",
    "CastTaskEncoder": "latents: cast dtype=bfloat16",
    "CfgInBatchTaskEncoder": 'caption: dropout rate=0.1 to=""',
    "DropsHalfTaskEncoder": 'caption: dropout rate=0.1 to=""',
    "ConstantSeedDropoutTaskEncoder": 'caption: dropout rate=0.1 to=""',
    "PerKeySeedDropoutTaskEncoder": 'caption: dropout rate=0.1 to=""',
    "UnseededDropoutTaskEncoder": 'caption: dropout rate=0.1 to=""',
    "DropsEmbeddingsTooTaskEncoder": 'caption: dropout rate=0.1 to=""',
    "TruncatesToFiveTaskEncoder": "prompt_embeds: truncate axis=0 length=4",
    "ZerosLatentsTaskEncoder": "latents: flip axis=-1 rate=0.5",
}


# -- correct ------------------------------------------------------------------------------------------------


class CfgDropoutTaskEncoder(EncodedDiffusionTaskEncoder):
    """CFG caption dropout, 10 %, drawn from Energon's per-sample seed."""

    @stateless(restore_seeds=True)
    def encode_sample(self, sample):
        if random.random() < 0.1:
            return dataclasses.replace(sample, caption="")
        return sample


@stateless
def cook_cfg_dropout(sample: dict):
    """The same in a cooker: a local generator seeded from Energon's worker seed and sample index."""
    cooked = cook_preencoded_diffusion(sample)
    config = WorkerConfig.active_worker_config
    rng = random.Random(f"{config.worker_seed()}/{config.active_worker_sample_index}")
    if rng.random() < 0.1:
        cooked = dataclasses.replace(cooked, caption="")
    return cooked


class EmbeddingDropoutTaskEncoder(EncodedDiffusionTaskEncoder):
    """CFG dropout of the text embeddings (zeros), 10 %."""

    @stateless(restore_seeds=True)
    def encode_sample(self, sample):
        if torch.rand(()) < 0.1:
            return dataclasses.replace(sample, prompt_embeds=torch.zeros_like(sample.prompt_embeds))
        return sample


class FlipTaskEncoder(EncodedDiffusionTaskEncoder):
    """A seeded horizontal flip of the latents, half of the samples."""

    @stateless(restore_seeds=True)
    def encode_sample(self, sample):
        if torch.rand(()) < 0.5:
            return dataclasses.replace(sample, latents=sample.latents.flip(-1))
        return sample


class TruncateTaskEncoder(EncodedDiffusionTaskEncoder):
    """T5 embeddings truncated to 4 tokens."""

    @stateless
    def encode_sample(self, sample):
        return dataclasses.replace(sample, prompt_embeds=sample.prompt_embeds[:4].clone())


class CastTaskEncoder(EncodedDiffusionTaskEncoder):
    """The latents cast to bfloat16 for training."""

    @stateless
    def encode_sample(self, sample):
        return dataclasses.replace(sample, latents=sample.latents.to(torch.bfloat16))


class CfgInBatchTaskEncoder(EncodedDiffusionTaskEncoder):
    """CFG caption dropout in batch(): each row's caption replaced by "" at 10 %, seeded per batch by Energon."""

    @stateless(restore_seeds=True)
    def batch(self, samples):
        batch = super().batch(samples)
        batch["caption"] = ["" if random.random() < 0.1 else caption for caption in batch["caption"]]
        return batch


# -- broken -------------------------------------------------------------------------------------------------


class DropsHalfTaskEncoder(EncodedDiffusionTaskEncoder):
    """Declared at 10 %, drops half the captions (a rate from another config)."""

    @stateless(restore_seeds=True)
    def encode_sample(self, sample):
        if random.random() < 0.5:
            return dataclasses.replace(sample, caption="")
        return sample


class ConstantSeedDropoutTaskEncoder(EncodedDiffusionTaskEncoder):
    """Seeds a constant before each draw: every sample gets the same decision."""

    @stateless
    def encode_sample(self, sample):
        rng = random.Random(1234)
        if rng.random() < 0.1:
            return dataclasses.replace(sample, caption="")
        return sample


class PerKeySeedDropoutTaskEncoder(EncodedDiffusionTaskEncoder):
    """Seeds from the sample's key: the same captions are dropped every epoch."""

    @stateless
    def encode_sample(self, sample):
        rng = random.Random(zlib.crc32(sample.__key__.encode()))
        if rng.random() < 0.1:
            return dataclasses.replace(sample, caption="")
        return sample


class UnseededDropoutTaskEncoder(EncodedDiffusionTaskEncoder):
    """Draws from the global generator without Energon's per-sample seed (@stateless, no restore_seeds)."""

    @stateless
    def encode_sample(self, sample):
        if random.random() < 0.1:
            return dataclasses.replace(sample, caption="")
        return sample


class DropsEmbeddingsTooTaskEncoder(EncodedDiffusionTaskEncoder):
    """Drops the caption as declared, and zeros the pooled embedding with it (undeclared)."""

    @stateless(restore_seeds=True)
    def encode_sample(self, sample):
        if random.random() < 0.1:
            return dataclasses.replace(
                sample, caption="", pooled_prompt_embeds=torch.zeros_like(sample.pooled_prompt_embeds)
            )
        return sample


class TruncatesToFiveTaskEncoder(EncodedDiffusionTaskEncoder):
    """Declared to keep 4 tokens, keeps 5 (the length of another configuration)."""

    @stateless
    def encode_sample(self, sample):
        return dataclasses.replace(sample, prompt_embeds=sample.prompt_embeds[:5].clone())


class ZerosLatentsTaskEncoder(EncodedDiffusionTaskEncoder):
    """Declared to flip the latents, replaces them by zeros (a default left in from a test)."""

    @stateless
    def encode_sample(self, sample):
        return dataclasses.replace(sample, latents=torch.zeros_like(sample.latents))


#: a cooker form of the correct dropout, as ``--cooker`` takes it
CFG_COOKER = Cooker(cook_cfg_dropout)
