"""TaskEncoders for the dispatch property's tests: cooker lists and dispatch overrides, broken and correct."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from megatron.energon import Cooker, stateless

from primus_energon import DiffusionSample, MultiFormatTaskEncoder, cook_preencoded_diffusion
from primus_energon.energon_compat import COOKERS_CHOSEN_PER_SAMPLE

__all__ = [
    "ShadowedCookerTaskEncoder",
    "LastMatchTaskEncoder",
    "SpecificFirstTaskEncoder",
    "FallbackTaskEncoder",
    "UnclearErrorTaskEncoder",
]


@stateless
def cook_high_quality(sample: dict) -> DiffusionSample:
    """A second preencoded cooker, for datasets marked ``quality: high``."""
    return cook_preencoded_diffusion(sample)


#: The more specific cooker first: both match ``{encoding: preencoded, quality: high}``, the first wins.
_OVERLAPPING = [
    Cooker(cook_high_quality, has_subflavors={"encoding": "preencoded", "quality": "high"}),
    Cooker(cook_preencoded_diffusion, has_subflavors={"encoding": "preencoded"}),
]


class ShadowedCookerTaskEncoder(MultiFormatTaskEncoder):
    """Broken: a catch-all cooker first, so the preencoded cooker after it can never be chosen."""

    cookers = [
        Cooker(cook_preencoded_diffusion),
        Cooker(cook_preencoded_diffusion, has_subflavors={"encoding": "preencoded"}),
    ]


class SpecificFirstTaskEncoder(MultiFormatTaskEncoder):
    """Correct: overlapping cookers, the more specific one first (Energon's first match picks it)."""

    cookers = list(_OVERLAPPING)


@contextlib.contextmanager
def _cookers(task_encoder: Any, cookers: list[Cooker]) -> Iterator[None]:
    ordered = task_encoder.cookers
    task_encoder.cookers = cookers
    try:
        yield
    finally:
        task_encoder.cookers = ordered


class LastMatchTaskEncoder(MultiFormatTaskEncoder):
    """Broken: dispatches to the LAST matching cooker instead of the first (when the loader is built on
    Energon 7.3+, per sample on 7.0-7.2, which choose the cooker there)."""

    cookers = list(_OVERLAPPING)

    def build_cook_crude_sample(self, dataset: Any, **kwargs: Any) -> Any:
        with _cookers(self, list(reversed(self.cookers))):
            return super().build_cook_crude_sample(dataset, **kwargs)

    @stateless
    def cook_crude_sample(self, sample: Any, *args: Any, **kwargs: Any) -> Any:
        if not COOKERS_CHOSEN_PER_SAMPLE:
            return super().cook_crude_sample(sample, *args, **kwargs)
        with _cookers(self, list(reversed(self.cookers))):
            return super().cook_crude_sample(sample, *args, **kwargs)


class FallbackTaskEncoder(MultiFormatTaskEncoder):
    """Broken: when no cooker matches, silently falls back to the first one instead of failing."""

    def build_cook_crude_sample(self, dataset: Any, **kwargs: Any) -> Any:
        with _cookers(self, [*self.cookers, Cooker(self.cookers[0].cook)]):
            return super().build_cook_crude_sample(dataset, **kwargs)

    @stateless
    def cook_crude_sample(self, sample: Any, *args: Any, **kwargs: Any) -> Any:
        if not COOKERS_CHOSEN_PER_SAMPLE:
            return super().cook_crude_sample(sample, *args, **kwargs)
        with _cookers(self, [*self.cookers, Cooker(self.cookers[0].cook)]):
            return super().cook_crude_sample(sample, *args, **kwargs)


class UnclearErrorTaskEncoder(MultiFormatTaskEncoder):
    """Broken: when no cooker matches, fails with an error that does not say why."""

    def build_cook_crude_sample(self, dataset: Any, *, subflavors: dict[str, Any], **kwargs: Any) -> Any:
        if not COOKERS_CHOSEN_PER_SAMPLE and not any(c.is_match(subflavors) for c in self.cookers):
            raise RuntimeError("bad dataset")
        return super().build_cook_crude_sample(dataset, subflavors=subflavors, **kwargs)

    @stateless
    def cook_crude_sample(self, sample: Any, *args: Any, **kwargs: Any) -> Any:
        if COOKERS_CHOSEN_PER_SAMPLE and not any(c.is_match(sample) for c in self.cookers):
            raise RuntimeError("bad dataset")
        return super().cook_crude_sample(sample, *args, **kwargs)
