"""Targets that read a user's data exactly as the user's own pipeline stores it, for the checks on a user's
dataset (``--conformance-dataset``), whose other datasets are derived from the user's samples.

A cooker that reads something from the key (an index into a side table, as some pipelines do) cooks every
sample of its own dataset, but not the suite's derived copies, whose keys the suite chooses: no verdict on
those copies would be about the target, so the claims that need them are inconclusive, never failures.
"""

from __future__ import annotations

from megatron.energon import Cooker, stateless

from primus_energon import EncodedDiffusionTaskEncoder, cook_preencoded_diffusion

#: the key form of the user's datasets these targets are written for
KEY_PREFIX = "img_"


@stateless
def cook_numbered(sample: dict):  # noqa: ANN201 - the reference's DiffusionSample
    """The reference cooker, behind a check of the key's form (the number after ``img_`` indexes a side
    table in the pipeline this imitates)."""
    key = str(sample["__key__"])
    if not key.startswith(KEY_PREFIX) or not key[len(KEY_PREFIX) :].isdigit():
        raise ValueError(f"sample {key!r}: keys in our datasets are {KEY_PREFIX}<number>")
    return cook_preencoded_diffusion(sample)


class KeyNumberTaskEncoder(EncodedDiffusionTaskEncoder):
    """Correct on the user's own data (keys ``img_<number>``); cannot cook re-keyed copies."""

    cookers = [Cooker(cook_numbered, has_subflavors={"encoding": "preencoded"})]
