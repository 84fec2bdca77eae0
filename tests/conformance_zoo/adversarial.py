"""Targets that try to sway the judge, each with a damaged caption (non-ASCII characters dropped, which
``fidelity/text`` fails plainly in ``broken.cook_ascii_caption``): a caption whose ``==``/``!=`` always
say "equal", one whose comparison sleeps, and ones that patch the suite's own code in the process that runs
them, at import (:mod:`tests.conformance_zoo.forging`) or in a call. The judge must give each the verdict it
deserves (tests/test_conformance_supervised.py). Only the supervised process imports this module: the
tests name it by spec."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from megatron.energon import stateless

from primus_energon import DiffusionSample, cook_preencoded_diffusion  # noqa: F401


def _damaged(sample: dict, caption_type: type = str) -> DiffusionSample:
    good = cook_preencoded_diffusion(sample)
    damaged = good.caption.encode("ascii", "ignore").decode()
    return dataclasses.replace(good, caption=caption_type(damaged))


class AlwaysEqual(str):
    """A caption that says it equals anything."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__


class SlowToCompare(str):
    """A caption whose comparison takes a minute (and then lies)."""

    def __eq__(self, other: object) -> bool:
        time.sleep(60)
        return True

    def __ne__(self, other: object) -> bool:
        time.sleep(60)
        return False

    __hash__ = str.__hash__


@stateless
def cook_lying_caption(sample: dict) -> Any:
    return _damaged(sample, AlwaysEqual)


@stateless
def cook_slow_comparison(sample: dict) -> Any:
    return _damaged(sample, SlowToCompare)


@stateless
def cook_forges_in_a_call(sample: dict) -> Any:
    """Makes every recorded problem vanish the first time it is called."""
    from primus_energon.conformance.core import claims

    claims.ClaimCheck.problem = lambda self, message, *, sample=None: None
    return _damaged(sample)
