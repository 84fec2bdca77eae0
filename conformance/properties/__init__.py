"""The conformance properties, one module each, in report order.

Every property module declares ``CLAIMS`` (its named claims, see :mod:`primus_energon.conformance.core.claims`) and has
``check(ctx: CheckContext, claims: ClaimRecorder) -> dict`` that runs each claim inside
``with claims.claim(name):`` and returns details for the report. Raising
:class:`~primus_energon.conformance.core.results.PropertySkipped` outside a claim skips what has not run.

A property whose check waits for child processes may also have ``prestart(ctx)``: it starts them (through
``ctx.started(property_id, ...)``) when the context is made, so they run while the properties before it are
checked; its ``check`` asks ``ctx.started`` for the same object and judges what the children wrote.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the property modules import torch and Energon; the verdict process needs only this table
    from ..core.claims import Claim, ClaimRecorder
    from ..engine.context import CheckContext

__all__ = ["Property", "PROPERTIES", "get_property", "all_claims", "properties_for"]


@dataclass(frozen=True)
class Property:
    id: str
    number: int
    title: str
    module: str
    #: the target kinds it checks: "cooker", "task_encoder", "wrapper"
    applies_to: frozenset[str] = frozenset({"cooker", "task_encoder"})
    #: needs a target that cooks clean data: blocked (skipped, once) when ``accepted`` fails
    needs_loader: bool = True
    #: how many hash seeds its fresh processes run under (fork servers it needs: the first n of
    #: :data:`~primus_energon.conformance.processes.children.HASHSEEDS`)
    hash_seeds: int = 0

    @property
    def _module(self) -> ModuleType:
        return importlib.import_module(f"{__name__}.{self.module}")

    @property
    def check(self) -> Callable[[CheckContext, ClaimRecorder], dict]:
        return self._module.check

    @property
    def claims(self) -> tuple[Claim, ...]:
        return self._module.CLAIMS

    @property
    def prestart(self) -> Callable[[CheckContext], Any] | None:
        """The module's ``prestart(ctx)`` (starts its child processes ahead of its check), if it has one."""
        return getattr(self._module, "prestart", None)


_TE = frozenset({"task_encoder"})
PROPERTIES: tuple[Property, ...] = (
    Property("accepted", 1, "Accepted by Energon", "accepted", needs_loader=False),
    Property("keys", 2, "Key forwarding", "keys"),
    Property("fidelity", 3, "Fidelity", "fidelity"),
    Property("purity", 4, "Purity", "purity"),
    Property("determinism", 5, "Determinism across fresh processes", "determinism", hash_seeds=2),
    Property("resume", 6, "Resume", "resume"),
    Property("dispatch", 7, "Subflavor dispatch", "dispatch", _TE),
    Property("blend", 8, "Weight ratios", "blend"),
    Property("sharding", 9, "Distributed sharding", "sharding", hash_seeds=2),
    Property("bad_input", 10, "Bad input and security", "bad_input", hash_seeds=1),
    Property("batch", 11, "Batch contract", "batch", _TE),
    Property("throughput", 12, "Throughput", "throughput"),
    Property(
        "wrapper", 13, "Dataloader wrapper contract", "wrapper", frozenset({"wrapper"}), needs_loader=False
    ),
    Property("packing", 14, "Sequence packing", "packing", _TE),
    Property(
        "restart",
        15,
        "Resume in fresh processes, under changed configurations",
        "restart",
        frozenset({"cooker", "task_encoder", "wrapper"}),
        hash_seeds=2,
    ),
    Property("transforms", 16, "Declared transforms", "transforms"),
    Property(
        "conduct",
        17,
        "Leaves nothing behind",
        "conduct",
        frozenset({"cooker", "task_encoder", "wrapper"}),
        needs_loader=False,
    ),
)


def get_property(property_id: str) -> Property:
    for prop in PROPERTIES:
        if prop.id == property_id:
            return prop
    raise KeyError(f"unknown property {property_id!r}; known: {', '.join(p.id for p in PROPERTIES)}")


def all_claims() -> list[Claim]:
    """Every claim of every property, in report order."""
    return [claim for prop in PROPERTIES for claim in prop.claims]


def properties_for(kind: str) -> list[Property]:
    """The properties that check a target of ``kind``, in report order."""
    return [prop for prop in PROPERTIES if kind in prop.applies_to]
