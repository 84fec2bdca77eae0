"""The conformance properties, one module each, in report order.

Every property module has ``check(ctx: CheckContext) -> dict`` that returns details for the report,
raises :class:`~conformance.results.PropertyFailure` when the target violates the property, and
:class:`~conformance.results.PropertySkipped` when it does not apply.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ..context import CheckContext

__all__ = ["Property", "PROPERTIES", "get_property"]


@dataclass(frozen=True)
class Property:
    id: str
    number: int
    title: str
    module: str
    #: "cooker", "task_encoder" or both
    applies_to: frozenset[str] = frozenset({"cooker", "task_encoder"})

    @property
    def check(self) -> Callable[[CheckContext], dict]:
        return importlib.import_module(f"{__name__}.{self.module}").check


_BOTH = frozenset({"cooker", "task_encoder"})
PROPERTIES: tuple[Property, ...] = (
    Property("accepted", 1, "Accepted by Energon", "accepted"),
    Property("keys", 2, "Key forwarding", "keys"),
    Property("fidelity", 3, "Fidelity", "fidelity"),
    Property("purity", 4, "Purity", "purity"),
    Property("determinism", 5, "Determinism across fresh processes", "determinism"),
    Property("resume", 6, "Resume", "resume"),
    Property("dispatch", 7, "Subflavor dispatch", "dispatch", frozenset({"task_encoder"})),
    Property("blend", 8, "Weight ratios", "blend"),
    Property("sharding", 9, "Distributed sharding", "sharding"),
    Property("bad_input", 10, "Bad input and security", "bad_input"),
    Property("batch", 11, "Batch contract", "batch", frozenset({"task_encoder"})),
    Property("throughput", 12, "Throughput", "throughput"),
)


def get_property(property_id: str) -> Property:
    for prop in PROPERTIES:
        if prop.id == property_id:
            return prop
    raise KeyError(f"unknown property {property_id!r}; known: {', '.join(p.id for p in PROPERTIES)}")
