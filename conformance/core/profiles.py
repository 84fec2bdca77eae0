"""Conformance profiles: how hard each property searches. ``ci`` is the default; all are derandomized
except ``thorough``'s extra examples, so a verdict on a given target is reproducible."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Profile", "PROFILES", "get_profile"]


@dataclass(frozen=True)
class Profile:
    name: str
    #: hypothesis examples per property-based check
    max_examples: int
    #: weighted blends drawn for the weight-ratio property
    blends: int
    #: extra hypothesis-chosen resume steps beyond the explicit ones (0, mid-epoch, epoch boundary)
    resume_draws: int
    #: world sizes checked in-process by the sharding property
    world_sizes: tuple[int, ...] = (2, 4)
    #: num_workers values the determinism property compares fresh processes at
    determinism_workers: tuple[int, ...] = (0, 1, 2)
    #: the effect (Cohen's w) the blend property's chi-square test has 99% power against; the draws it
    #: needs grow as 1/w**2, so this is where a profile trades the test's sensitivity for time
    blend_effect: float = 0.05
    #: samples cooked (each under its own per-sample seed) to measure a declared transform's rate
    transform_draws: int = 192
    derandomize: bool = True
    #: shrink a failing example to a minimal one (slow: every shrink step cooks again)
    shrink: bool = False


PROFILES = {
    "quick": Profile(
        "quick",
        max_examples=10,
        blends=1,
        resume_draws=0,
        world_sizes=(2,),
        determinism_workers=(0, 2),
        blend_effect=0.15,
        transform_draws=128,
    ),
    "ci": Profile("ci", max_examples=30, blends=1, resume_draws=1, blend_effect=0.1),
    "thorough": Profile(
        "thorough",
        max_examples=200,
        blends=4,
        resume_draws=6,
        shrink=True,
        blend_effect=0.05,
        transform_draws=768,
    ),
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown conformance profile {name!r}; use one of {', '.join(PROFILES)}") from None
