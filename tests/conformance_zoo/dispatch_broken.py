"""TaskEncoders for the dispatch property's tests: cooker lists and dispatch overrides, broken and correct."""

from __future__ import annotations

from typing import Any

from megatron.energon import Cooker, stateless

from primus_energon import DiffusionSample, MultiFormatTaskEncoder, cook_preencoded_diffusion

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


class LastMatchTaskEncoder(MultiFormatTaskEncoder):
    """Broken: dispatches to the LAST matching cooker instead of the first."""

    cookers = list(_OVERLAPPING)

    def build_cook_crude_sample(self, dataset: Any, **kwargs: Any) -> Any:
        ordered = self.cookers
        self.cookers = list(reversed(ordered))
        try:
            return super().build_cook_crude_sample(dataset, **kwargs)
        finally:
            self.cookers = ordered


class FallbackTaskEncoder(MultiFormatTaskEncoder):
    """Broken: when no cooker matches, silently falls back to the first one instead of failing."""

    def build_cook_crude_sample(self, dataset: Any, **kwargs: Any) -> Any:
        ordered = self.cookers
        self.cookers = [*ordered, Cooker(ordered[0].cook)]
        try:
            return super().build_cook_crude_sample(dataset, **kwargs)
        finally:
            self.cookers = ordered


class UnclearErrorTaskEncoder(MultiFormatTaskEncoder):
    """Broken: when no cooker matches, fails with an error that does not say why."""

    def build_cook_crude_sample(self, dataset: Any, *, subflavors: dict[str, Any], **kwargs: Any) -> Any:
        if not any(c.is_match(subflavors) for c in self.cookers):
            raise RuntimeError("bad dataset")
        return super().build_cook_crude_sample(dataset, subflavors=subflavors, **kwargs)
