"""A target module that, when imported, makes every problem the suite records vanish (the patch a target
could slip into the process that runs it), with a cook that damages captions (see
:mod:`tests.conformance_zoo.adversarial`). Only the supervised process imports it: the tests name it by
spec, never import it (the patch would reach the test process)."""

from __future__ import annotations

from typing import Any

from megatron.energon import stateless

from primus_energon.conformance.core import claims
from tests.conformance_zoo.adversarial import _damaged

claims.ClaimCheck.problem = lambda self, message, *, sample=None: None


@stateless
def cook_forged(sample: dict) -> Any:
    return _damaged(sample)
