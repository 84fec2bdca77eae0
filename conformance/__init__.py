"""Conformance suite for Megatron-Energon cookers and TaskEncoders.

From pytest (the plugin is installed with the package)::

    pytest --cooker mypkg.cookers:cook_x
    pytest --task-encoder mypkg.encoders:MyTaskEncoder --conformance-profile thorough
    pytest --wrapper mypkg.dataloader:MegatronDataloaderWrapper

From Python::

    from primus_energon.conformance import check_cooker
    results = check_cooker("mypkg.cookers:cook_x", profile="quick")
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    advice = [c for r in results for c in r.advice]   # reported, never a failure

Each property is a list of claims (``results[i].claims``); a claim is a defect claim (its failure fails
the property) or advice (see :mod:`primus_energon.conformance.core.claims`). Importing the package loads
nothing heavy; each name loads its module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__all__ = [
    "Claim",
    "ClaimResult",
    "Harm",
    "check_cooker",
    "check_task_encoder",
    "check_wrapper",
    "PROPERTIES",
    "Property",
    "PROFILES",
    "Profile",
    "PropertyResult",
    "PropertyFailure",
    "PropertySkipped",
    "Target",
    "resolve_target",
]

#: The public names of each submodule; a name loads its module on first use.
_EXPORTS = {
    "api": ("check_cooker", "check_task_encoder", "check_wrapper"),
    "core.claims": ("Claim", "ClaimResult", "Harm"),
    "core.profiles": ("PROFILES", "Profile"),
    "properties": ("PROPERTIES", "Property"),
    "core.results": ("PropertyResult", "PropertyFailure", "PropertySkipped"),
    "engine.target": ("Target", "resolve_target"),
}

if TYPE_CHECKING:
    from .api import check_cooker, check_task_encoder, check_wrapper
    from .core.claims import Claim, ClaimResult, Harm
    from .core.profiles import PROFILES, Profile
    from .core.results import PropertyFailure, PropertyResult, PropertySkipped
    from .engine.target import Target, resolve_target
    from .properties import PROPERTIES, Property

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
