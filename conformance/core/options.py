"""The options of one run, in one object: what the pytest options, the Python API and the supervised process
that runs a target all read. The pytest plugin builds it from its command line (``run_options``), the API
from its keyword arguments (:meth:`RunOptions.from_keywords`); the supervised process receives its two
halves as plain data: :meth:`RunOptions.target_request` (build the target, check its data format) and
:meth:`RunOptions.context_request` (the check context's settings)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RunOptions"]


def _strings(value: str | Sequence[Any] | None) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str) or not isinstance(value, Sequence):
        return (str(value),)
    return tuple(str(item) for item in value)


@dataclass(frozen=True)
class RunOptions:
    """Every setting of one run (the defaults are the plugin's)."""

    #: how hard each property searches: "quick", "ci" or "thorough"
    profile: str = "ci"
    seed: int = 0
    #: the data format to check (None: every format the target's cookers declare, or the data's)
    encoding: str | None = None
    #: schema files describing the user's formats
    schema: tuple[str, ...] = ()
    #: the user's prepared dataset or metadataset (read only; the suite derives its data from it)
    dataset: str | None = None
    min_samples_per_s: float | None = None
    #: advice and inconclusive claims fail too
    strict: bool = False
    #: resume hooks as given: ``"SAVE,LOAD"``, or the two ``MODULE:FUNC`` (None: none)
    resume_hooks: str | tuple[str, ...] | None = None
    #: declared transforms, one line each
    transforms: tuple[str, ...] = ()
    #: seconds one call into the target may take (None: the suite's default)
    call_timeout_s: float | None = None
    #: seconds a child process may take (None: the suite's default)
    timeout_s: float | None = None
    #: the folder watched for files the target writes (None: not watched)
    watch: str | None = "."
    watch_exclude: tuple[str, ...] = ()
    #: keep every dataset to the end of the run
    keep_data: bool = False
    #: how the target is built: its input form (cookers), the packing buffer and batch size of loaders that pack
    input_form: str = "bytes"
    packing_buffer_size: int | None = None
    batch_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("schema", "transforms", "watch_exclude"):
            object.__setattr__(self, name, _strings(getattr(self, name)))
        if self.resume_hooks is not None and not isinstance(self.resume_hooks, str):
            object.__setattr__(self, "resume_hooks", tuple(str(hook) for hook in self.resume_hooks))
        if self.watch is not None:
            object.__setattr__(self, "watch", str(self.watch))

    @classmethod
    def from_keywords(cls, options: Mapping[str, Any]) -> RunOptions:
        """From the Python API's keyword arguments; an unknown one is a ``TypeError`` naming it and the known
        ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**{k: v for k, v in options.items() if not (k == "transforms" and v is None)})

    def _hooks(self) -> str | list[str] | None:
        return list(self.resume_hooks) if isinstance(self.resume_hooks, tuple) else self.resume_hooks

    def target_options(self) -> dict[str, Any]:
        """``resolve_target``'s keyword arguments."""
        return {
            "input_form": self.input_form,
            "packing_buffer_size": self.packing_buffer_size,
            "batch_size": self.batch_size,
        }

    def target_request(self) -> dict[str, Any]:
        """What a supervised process needs to build a target and check its data format."""
        return {
            "options": self.target_options(),
            "resume_hooks": self._hooks(),
            "encoding": self.encoding,
            "schema": list(self.schema),
            "dataset": self.dataset,
            "profile": self.profile,
        }

    def context_request(self, workdir: str) -> dict[str, Any]:
        """``make_context``'s keyword arguments (plain data) for a context whose datasets go in ``workdir``."""
        out: dict[str, Any] = {
            "workdir": str(workdir),
            "profile": self.profile,
            "seed": self.seed,
            "encoding": self.encoding,
            "schema": list(self.schema),
            "dataset": self.dataset,
            "min_samples_per_s": self.min_samples_per_s,
            "strict": self.strict,
            "resume_hooks": self._hooks(),
            "transforms": list(self.transforms),
            "watch": self.watch,
            "watch_exclude": list(self.watch_exclude),
            "keep_data": self.keep_data,
        }
        if self.call_timeout_s is not None:
            out["call_timeout_s"] = float(self.call_timeout_s)
        if self.timeout_s is not None:
            out["timeout_s"] = float(self.timeout_s)
        return out
