"""Deliberately broken targets for the weight-ratio property (8). Each violates the blend contract the
way a real one might, and passes the properties that look at one dataset at a time.

A cooker cannot change a blend's ratios in Energon 7.4.1: cooking runs per dataset, before the blend,
so a cooker that skips a sample only makes Energon read the next sample of the same dataset. Filtering
after the blend (``encode_sample``, ``batch``) does change them, hence the TaskEncoder below.
"""

from __future__ import annotations

from typing import Any

from megatron.energon import Cooker, SkipSample, stateless

from primus_energon import EncodedDiffusionTaskEncoder, cook_preencoded_diffusion
from primus_energon.energon_compat import key_in_shard
from primus_energon.sample import DiffusionSample


class FiltersOneSourceTaskEncoder(EncodedDiffusionTaskEncoder):
    """Filters samples in ``encode_sample`` by a criterion that hits one source far harder than the
    others (standing in for a minimum resolution or caption length): three of every four samples of
    the second generated blend dataset are skipped, so that dataset is under-represented."""

    @stateless
    def encode_sample(self, sample: DiffusionSample) -> DiffusionSample:
        key = key_in_shard(sample.__key__)
        if key.startswith("blend1_") and int(key.rsplit("_", 1)[1]) % 4 != 0:
            raise SkipSample()
        return sample


@stateless
def cook_keeps_known_subflavors(sample: dict) -> DiffusionSample:
    """Passes on only the subflavors it knows (``encoding``), so the per-entry subflavors a metadataset
    sets (source tags, loss weights) never reach training. On a single dataset, whose only subflavor is
    ``encoding``, its output is indistinguishable from the reference's."""
    out = cook_preencoded_diffusion(sample)
    known: dict[str, Any] = {"encoding": (sample.get("__subflavors__") or {}).get("encoding")}
    out.__subflavors__ = known
    return out


KEEPS_KNOWN_SUBFLAVORS = Cooker(cook_keeps_known_subflavors, has_subflavors={"encoding": "preencoded"})
