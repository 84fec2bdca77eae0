"""Where each member of a sample flows: the per-sample pipeline run on the sample as the user stored it, then
with one member changed at a time (:mod:`~primus_energon.conformance.data.variants`); every output leaf that
changes depends on that member.

The per-sample pipeline is what Energon runs for one sample before batching or packing: the target's
decoder, its matching cooker and the first encode stage (``preencode_sample``, else ``encode_sample``), in
a worker context with the sample's index and the run's seed, on **one TaskEncoder instance held for the
whole check**, as a loader worker holds one for an epoch (state it keeps between samples meets every
sample). Each output is fingerprinted the moment it is returned, so a buffer reused by the next call cannot
change what was seen. A leaf that differs between two runs of the same sample is **unstable** (drawn from
state the sample does not fix: the determinism and purity properties judge that) and says nothing about
flow.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primus_energon.energon_compat import overrides

from ..data.variants import member_variants
from ..oracles.fields import leaves, top_field
from ..oracles.fingerprint import fingerprint
from ..oracles.plain import plain
from . import rngs
from .calls import TargetError, matching_cooker, target_call, worker_context
from .context import CheckContext, decode_like_target

__all__ = ["Run", "Flow", "first_stage", "run_first_stage"]

#: the planted global-generator states (:mod:`~primus_energon.conformance.engine.rngs`) of a sample's runs, plus
#: its index: one for the run as stored and its variants, another for the run again
_PLANT_BASE, _PLANT_AGAIN = 10_000, 20_000


@dataclass
class Run:
    """One sample through the per-sample pipeline: what the cooker returned and what the first encode stage
    made of it (the cooked sample where there is none, or where it yields several samples), as they were
    when returned."""

    cooked: Any
    output: Any
    #: leaf path -> fingerprint of ``output``'s leaves, taken when it was returned
    prints: dict[str, Any]
    #: the first encode stage's name, if it ran ("" when the output is the cooked sample)
    stage: str = ""


def _prints(value: Any) -> dict[str, Any]:
    return {path: fingerprint(leaf) for path, leaf in leaves(value)}


def first_stage(
    task_encoder: Any,
    crude: dict,
    *,
    sample_index: int,
    seed: int,
    what: str | None = None,
    as_plain: bool = True,
) -> tuple[Any, Any, str]:
    """``(cooked, output, stage)``: one crude sample cooked by the matching cooker of ``task_encoder`` and
    run through its first encode stage (``stage``: its name; ``output`` is ``cooked`` and ``stage`` "" where
    there is none, or where it yields several samples for one), in a worker context as Energon does; the
    outputs as plain data (:func:`~primus_energon.conformance.oracles.plain.plain`), read inside the timed
    call and copied there (a buffer the next call reuses cannot change them); with ``as_plain=False`` the
    objects themselves (for the purity checks of shared buffers). An exception is the target's (:class:`TargetError`)."""
    cookers = task_encoder.cookers
    cooker = cookers[matching_cooker(cookers, crude) or 0]
    stage_name = next(
        (name for name in ("preencode_sample", "encode_sample") if overrides(task_encoder, name)),
        "",
    )
    what = what or f"cooking and encoding the clean sample {crude.get('__key__')!r}"
    with target_call(what), worker_context(seed, sample_index):
        cooked = cooker.cook(crude)
        # Plain data, read inside the timed call: the judge never runs the target's methods (oracles.plain)
        cooked_plain = plain(cooked) if as_plain else cooked
        if not stage_name:
            return cooked_plain, cooked_plain, ""
        result = getattr(task_encoder, stage_name)(cooked)
        produced = list(result) if hasattr(result, "__next__") else [result]
        produced = [plain(item) for item in produced] if as_plain else produced
    if len(produced) != 1:
        return cooked_plain, cooked_plain, ""
    return cooked_plain, produced[0], stage_name


def run_first_stage(
    task_encoder: Any, crude: dict, *, sample_index: int, seed: int, what: str | None = None
) -> Run:
    """:func:`first_stage`, its output fingerprinted."""
    cooked, output, stage = first_stage(task_encoder, crude, sample_index=sample_index, seed=seed, what=what)
    return Run(cooked, output, _prints(output), stage)


@dataclass
class _SampleFlow:
    base: Run
    unstable: set[str] | None = None
    #: member -> variant label -> the leaf paths that changed
    changed: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    #: member -> variant label -> why the target refused the variant
    refused: dict[str, dict[str, str]] = field(default_factory=dict)


class Flow:
    """The flow of every member of one dataset's samples, computed on demand and kept."""

    def __init__(self, ctx: CheckContext, path: Path, members: Mapping[str, Any]) -> None:
        self.ctx = ctx
        self.path = path
        self.members = dict(members)
        self.raw = ctx.raw(path)
        self.crude = {sample.get("__key__"): sample for sample in ctx.crude(path)}
        self.task_encoder = ctx.held_task_encoder()
        self._samples: dict[int, _SampleFlow] = {}

    def _run(
        self, index: int, sample: dict, what: str | None = None, *, decoded: bool = False, again: bool = False
    ) -> Run:
        """Sample ``index`` through the per-sample pipeline with the global generators planted: the run as
        stored and every variant in one state (a draw from them is the same, so what changes is the member's
        doing), the run again in another (so such a draw shows as unstable, in every run of the suite)."""
        if not decoded:
            sample = decode_like_target(self.ctx, sample)
        with rngs.planted(_PLANT_AGAIN + index if again else _PLANT_BASE + index):
            return run_first_stage(
                self.task_encoder, sample, sample_index=index, seed=self.ctx.seed, what=what
            )

    def decoded(self, index: int) -> dict | None:
        """Sample ``index`` as the target's decoder gave it (None: the decoder refused it)."""
        sample = self.crude.get(self.raw[index].get("__key__"))
        return None if sample is None else copy.deepcopy(sample)

    def base(self, index: int) -> Run:
        """Sample ``index`` through the per-sample pipeline, as the user stored it (run once, kept); an
        exception is the target's (:class:`TargetError`)."""
        if index not in self._samples:
            sample = self.decoded(index)
            if sample is None:
                raise KeyError(self.raw[index].get("__key__"))
            self._samples[index] = _SampleFlow(self._run(index, sample, decoded=True))
        return self._samples[index].base

    def unstable(self, index: int) -> set[str]:
        """The output leaves of sample ``index`` that differ when it is run again as it is."""
        flow = self._samples[index] if index in self._samples else None
        if flow is None:
            self.base(index)
            flow = self._samples[index]
        if flow.unstable is None:
            again = self._run(index, self.decoded(index) or {}, decoded=True, again=True)
            first = flow.base.prints
            flow.unstable = {
                p for p in first.keys() | again.prints.keys() if first.get(p) != again.prints.get(p)
            }
        return flow.unstable

    def changed(self, index: int, member: str) -> dict[str, set[str]]:
        """variant label -> the output leaf paths that change when ``member`` of sample ``index`` is
        replaced by that variant (unstable leaves left out)."""
        self.base(index)
        flow = self._samples[index]
        if member not in flow.changed:
            unstable = self.unstable(index)
            raw = dict(self.raw[index])
            others = [dict(s).get(member) for i, s in enumerate(self.raw) if i != index]
            spec = self.members.get(member)
            changed: dict[str, set[str]] = {}
            refused: dict[str, str] = {}
            data = raw.get(member)
            if isinstance(data, (bytes, bytearray)) and spec is not None:
                variants = member_variants(member, spec, bytes(data), [o for o in others if o is not None])
                for label, variant in variants:
                    what = (
                        f"cooking sample {raw.get('__key__')!r} with its member {member!r} changed ({label})"
                    )
                    try:
                        run = self._run(index, {**raw, member: variant}, what=what)
                    except TargetError as error:
                        refused[label] = error.message
                        continue
                    base = flow.base.prints
                    changed[label] = {
                        p
                        for p in run.prints.keys() | base.keys()
                        if p not in unstable and run.prints.get(p) != base.get(p)
                    }
            flow.changed[member] = changed
            flow.refused[member] = refused
        return flow.changed[member]

    def dependents(self, index: int, member: str) -> set[str]:
        """The output fields (top-level) that depend on ``member`` of sample ``index``."""
        return {top_field(p) for paths in self.changed(index, member).values() for p in paths}

    def refused(self, index: int, member: str) -> dict[str, str]:
        self.changed(index, member)
        return self._samples[index].refused.get(member, {})

    def unstable_fields(self, index: int) -> set[str]:
        return {top_field(p) for p in self.unstable(index)}
