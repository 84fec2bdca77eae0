"""Targets that cannot cook clean data at all, in every way a target can fail: the suite must report them
(accepted fails, the rest is blocked once, the code-execution probe still runs) and never crash itself."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from megatron.energon import Cooker, DefaultTaskEncoder, SampleDecoder, stateless

from primus_energon import cook_preencoded_diffusion


@stateless
def cook_raises_always(sample: dict) -> Any:
    raise ValueError("this cooker refuses every sample")


@stateless
def cook_returns_none(sample: dict) -> Any:
    return None


@stateless
def cook_returns_text(sample: dict) -> Any:
    return f"sample {sample['__key__']}"


@stateless
def cook_hangs(sample: dict) -> Any:
    time.sleep(3600)


class RefusingDecoder(SampleDecoder):
    """A decoder that refuses every sample (as a decoder for another format would)."""

    def __call__(self, sample: dict) -> dict:
        raise ValueError("this decoder refuses every sample")


class RefusingDecoderTaskEncoder(DefaultTaskEncoder):
    decoder = RefusingDecoder()
    cookers = [Cooker(cook_preencoded_diffusion, has_subflavors={"encoding": "preencoded"})]


class NoCookersTaskEncoder(DefaultTaskEncoder):
    decoder = None


@stateless
def cook_hangs_in_the_determinism_runs(sample: dict) -> Any:
    """Correct in one process; hangs in determinism's fresh processes (the runner's ``determinism``)."""
    if sys.argv[1:2] == ["determinism"]:
        time.sleep(3600)
    return cook_preencoded_diffusion(sample)


@stateless
def _cook_hangs_in_a_rank(sample: dict) -> Any:
    if "TORCHELASTIC_RUN_ID" in os.environ:  # only inside a torch.distributed.run rank
        time.sleep(3600)
    return cook_preencoded_diffusion(sample)


class HangsInARankTaskEncoder(DefaultTaskEncoder):
    """Correct in one process; hangs inside a torch.distributed rank (a deadlock in the user's code)."""

    decoder = None
    cookers = [Cooker(_cook_hangs_in_a_rank, has_subflavors={"encoding": "preencoded"})]

    @stateless
    def batch(self, samples: list) -> list:
        return list(samples)


#: name -> (kind, spec, options)
PATHOLOGICAL_TARGETS: dict[str, tuple[str, str, dict]] = {
    "refuses every sample": ("cooker", "cook_raises_always", {"encoding": "preencoded"}),
    "returns nothing": ("cooker", "cook_returns_none", {"encoding": "preencoded"}),
    "returns text, not a sample": ("cooker", "cook_returns_text", {"encoding": "preencoded"}),
    # its probe child hangs too, whatever the limit: a short one only makes the test wait less
    "hangs": ("cooker", "cook_hangs", {"encoding": "preencoded", "timeout_s": 12}),
    "decoder refuses every sample": ("task_encoder", "RefusingDecoderTaskEncoder", {}),
    "registers no cookers": ("task_encoder", "NoCookersTaskEncoder", {}),
}


class FailsOnFourthBatchTaskEncoder(DefaultTaskEncoder):
    """Cooks and batches correctly at first, then every batch() raises (an out-of-memory in a real run):
    accepted passes, the properties that read further must report it, never crash."""

    decoder = None
    cookers = [Cooker(cook_preencoded_diffusion, has_subflavors={"encoding": "preencoded"})]

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    @stateless
    def batch(self, samples: list) -> list:
        self.calls += 1
        if self.calls >= 4:
            raise RuntimeError("out of memory (simulated)")
        return list(samples)
