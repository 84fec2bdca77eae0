"""What every property check receives: the target, its data, the profile and the run's options."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .data import Workspace, read_crude
from .profiles import Profile
from .target import Target

__all__ = ["CheckContext"]

T = TypeVar("T")


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
    #: ``--conformance-strict``: advice claims fail the run too
    strict: bool = False
    #: a child process (fresh-process checks, torch.distributed ranks, the code-execution probe) is
    #: killed, with its whole process tree, after this many seconds
    timeout_s: float = 300.0
    #: an in-process call into the target (cooking one sample, the first batch) may take this long
    call_timeout_s: float = 60.0
    details: dict[str, Any] = field(default_factory=dict)
    #: why samples could not be read (decoder errors), for claims that examined nothing
    read_errors: list[str] = field(default_factory=list)
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

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

    def cached(self, key: Any, compute: Callable[[], T]) -> T:
        """``compute()`` once per context (e.g. the accepted preflight every property consults)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def crude(self, path: Path, *, limit: int | None = None) -> list[dict]:
        """The crude samples of ``path`` as the target's cookers receive them: decoded by the target's own
        decoder (a TaskEncoder's ``decoder``; for a cooker, none or the safe one of ``--input-form
        decoded``), so verdicts describe the pipeline as it runs. Fresh copies on every call."""
        samples = self.cached(("crude", str(path)), lambda: self._read(path, self.target.decoder()))
        return copy.deepcopy(samples[:limit] if limit is not None else samples)

    def raw(self, path: Path, *, limit: int | None = None) -> list[dict]:
        """The crude samples of ``path`` with every member as the bytes in the shard."""
        samples = self.cached(("raw", str(path)), lambda: self._read(path, None))
        return list(samples[:limit] if limit is not None else samples)

    def _read(self, path: Path, decoder: Any) -> list[dict]:
        errors: list[str] = []
        samples = read_crude(path, decoder=decoder, errors=errors)
        if errors:
            which = "the target's decoder" if decoder is not None else "Energon"
            self.read_errors.extend(f"{which} refused {line}" for line in errors)
        return samples

    def unreadable(self) -> str:
        """Why samples could not be read, if any were refused (else "")."""
        if not self.read_errors:
            return ""
        shown = "; ".join(dict.fromkeys(self.read_errors[:4]))
        return f"{len(self.read_errors)} sample(s) could not be read: {shown}"

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
        if self.min_samples_per_s is not None:
            extra += f" --conformance-min-samples-per-s {self.min_samples_per_s:g}"
        return (
            f"pytest {flag} {self.target.spec}{extra} --conformance-property {property_id.partition('/')[0]}"
        )
