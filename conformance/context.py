"""What every property check receives: the target, its data, the profile and the run's options."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .data import Workspace
from .profiles import Profile
from .target import Target

__all__ = ["CheckContext"]


@dataclass
class CheckContext:
    target: Target
    workspace: Workspace
    profile: Profile
    seed: int = 0
    #: ``--encoding``: the encoding to generate instead of the one the target's cookers ask for
    encoding: str | None = None
    #: ``--min-samples-per-s``: makes the throughput property pass/fail
    min_samples_per_s: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def encodings(self) -> list[str | None]:
        """One encoding per distinct data format the target cooks (a TaskEncoder may have several)."""
        if self.encoding:
            return [self.encoding]
        if self.workspace.dataset or self.workspace.schema_file:
            return [self.workspace.schema(None).encoding]
        seen: list[str | None] = []
        for cooker in self.target.cookers:
            value = (cooker.has_subflavors or {}).get("encoding")
            value = None if value is None else str(value)
            if value not in seen:
                seen.append(value)
        supported = [e for e in seen if e in (None, "preencoded", "raw")]
        return supported or seen[:1] or [None]

    def main_dataset(self, encoding: str | None = None) -> Path:
        return self.workspace.main(encoding if encoding is not None else self.encodings()[0])

    def reproduce(self, property_id: str) -> str:
        """A command that re-runs one property on this target."""
        flag = "--cooker" if self.target.kind == "cooker" else "--task-encoder"
        extra = f" --conformance-profile {self.profile.name}"
        # The --conformance-* spellings work everywhere (the short ones may belong to another plugin).
        if self.workspace.dataset:
            extra += f" --conformance-dataset {self.workspace.dataset}"
        if self.workspace.schema_file:
            extra += f" --conformance-schema {self.workspace.schema_file}"
        if self.encoding:
            extra += f" --conformance-encoding {self.encoding}"
        if getattr(self.target, "input_form", "bytes") != "bytes":
            extra += f" --conformance-input-form {self.target.input_form}"
        return f"pytest {flag} {self.target.spec}{extra} -k {property_id}"
