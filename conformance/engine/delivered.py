"""What the training loop receives: the target's whole pipeline run by a real Energon loader, and each
delivered batch traced back, by value, to the samples it came from.

Checks that call one stage of a TaskEncoder on its own (the cook, ``encode_sample``, ``batch()``) cannot see a
defect in a stage they do not call: an ``encode_batch`` that reorders one field, a ``postencode_sample`` that
casts the latents to float16. Here Energon builds the loader and runs every stage the TaskEncoder overrides
(decoder, cookers, ``encode_sample``/``preencode_sample``, ``postencode_sample``, ``batch``,
``encode_batch``), with and without worker processes, and what comes out is compared with the samples as
they left the first encode stage (:func:`first_stage_samples`): every payload must be in the delivered batch,
each with its own sample, unchanged. Calling ``batch()`` on its own then only says which stage is at fault.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from megatron.energon import TaskEncoder

from primus_energon.energon_compat import overrides

from ..core import breadcrumbs
from ..core.declarations import Transform, field_transform
from ..oracles.declared import is_applied_value, variants
from ..oracles.fields import field_at
from ..oracles.payloads import KEY, Payload, Trace, identity, payloads, trace
from .calls import build_loader, closing, matching_cooker, target_call, worker_context
from .context import CheckContext

__all__ = [
    "Delivered",
    "delivered_batches",
    "first_stage_samples",
    "seeded_payloads",
    "assign",
    "cast_payloads",
    "FLOAT_DTYPES",
    "declared_alternatives",
    "explained",
    "row_value",
    "own_alternatives",
]

#: the floating dtypes a stage may cast a payload to (a cast is found by casting the given payload)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass
class Delivered:
    """The batches one loader delivered, with how it was configured."""

    num_workers: int
    batch_size: int
    batches: list[Any]

    @property
    def where(self) -> str:
        return f"the real loader (num_workers={self.num_workers}, batch size {self.batch_size})"


#: the end of a loader's iteration (next()'s default)
_END = object()


def delivered_batches(
    ctx: CheckContext, path: Path, *, num_workers: int, batch_size: int, max_batches: int
) -> Delivered:
    """The first ``max_batches`` batches of the target's own training loader over ``path`` (a dataset or a
    metadataset; Energon blends weighted datasets only when they repeat), as the training loop receives
    them (torch's ``default_convert`` included)."""
    loader = build_loader(ctx.target, path, batch_size=batch_size, num_workers=num_workers, seed=ctx.seed)
    batches: list[Any] = []
    with closing(loader):
        what = f"iterating the target's loader (num_workers={num_workers})"
        with target_call(what):
            iterator = iter(loader)
            while len(batches) < max_batches:
                with breadcrumbs.mark(call=f"{what}, batch {len(batches) + 1}"):  # a budget per batch
                    batch = next(iterator, _END)
                if batch is _END:
                    break
                batches.append(batch)
    return Delivered(num_workers, batch_size, batches)


def first_stage_samples(
    task_encoder: TaskEncoder,
    crude: Sequence[dict],
    seed: int,
    *,
    index_offset: int = 0,
) -> list[Any] | None:
    """Each crude sample cooked and run through the first encode stage Energon applies to it
    (``preencode_sample``, else ``encode_sample``), in a worker context as Energon does; None when a stage
    yields several samples (or none) for one input, so that samples cannot be told apart by their input.
    ``postencode_sample`` is left out on purpose: it is one of the stages the delivered batches are judged on.
    """
    if overrides(task_encoder, "preencode_sample"):
        stage = task_encoder.preencode_sample
    elif overrides(task_encoder, "encode_sample"):
        stage = task_encoder.encode_sample
    else:
        stage = None
    out = []
    cookers = task_encoder.cookers
    for index, sample in enumerate(crude):
        cooker = cookers[matching_cooker(cookers, sample) or 0]
        key = sample.get("__key__")
        with (
            target_call(f"cooking and encoding the clean sample {key!r}"),
            worker_context(seed, index + index_offset),
        ):
            cooked = cooker.cook(copy.deepcopy(sample))
            result = stage(cooked) if stage is not None else cooked
            produced = list(result) if hasattr(result, "__next__") else [result]
        if len(produced) != 1:
            return None
        out.append(produced[0])
    return out


def seeded_payloads(first: Sequence[Any], second: Sequence[Any], keys: Sequence[str]) -> set[tuple[str, str]]:
    """``(key, payload path)`` of the payloads that differ between two encodings of the same samples under
    other per-sample seeds (``index_offset``): random augmentation drawn from Energon's per-sample seed,
    which depends on where the loader took the sample, so it cannot be traced by value (determinism and
    resume judge it)."""
    out = set()
    for key, a, b in zip(keys, first, second, strict=True):
        theirs = {p.path: identity(p) for p in payloads(b)}
        for payload in payloads(a):
            if theirs.get(payload.path) != identity(payload):
                out.add((key, payload.path or "(the sample itself)"))
    return out


def assign(batch: Any, keys: list[str] | None, candidates: dict[str, Any]) -> list[str]:
    """The keys of the candidate samples ``batch`` holds: its own ``__key__`` list where it has one, else
    every candidate with a *distinctive* payload found in the batch: one no other candidate shares (a
    caption or a metadata field copied across samples says nothing about which sample it is)."""
    if keys:
        return [k for k in dict.fromkeys(keys) if k in candidates]
    found = trace(list(candidates.values()), batch, list(candidates))
    shared: dict[Any, int] = {}
    for sample in found.samples:
        for path, payload in sample.payloads.items():
            if path != KEY:
                shared[identity(payload)] = shared.get(identity(payload), 0) + 1
    held = []
    for sample in found.samples:
        if any(
            places and path != KEY and shared[identity(sample.payloads[path])] == 1
            for path, places in sample.places.items()
        ):
            held.append(sample.key)
    return held


def cast_payloads(result: Trace, lost: list[tuple[str, str, str]]) -> dict[tuple[str, str], str]:
    """For each lost tensor payload found in the output once cast to another floating dtype:
    ``{(key, path): "float32 -> float16 (at LEAF)"}``."""
    out: dict[tuple[str, str], str] = {}
    by_key = {s.key: s for s in result.samples}
    for key, path, _why in lost:
        payload = by_key[key].payloads.get(path)
        if (
            payload is None
            or not isinstance(payload.value, torch.Tensor)
            or not payload.value.is_floating_point()
        ):
            continue
        for dtype in FLOAT_DTYPES:
            if dtype == payload.value.dtype:
                continue
            cast = payload.value.to(dtype)
            if torch.equal(cast.to(payload.value.dtype), payload.value):
                continue  # a lossless cast (float32 -> float64) changes no value
            places = result.haystack.find(Payload(path, cast))
            if places:
                out[(key, path)] = f"{_name(payload.value.dtype)} -> {_name(dtype)} (at {places[0].path})"
                break
    return out


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


#: further per-sample seeds tried for a sample whose declared field was transformed under every one tried
#: so far (its clean value is needed to compute what the transform may make of it)
_MORE_OFFSETS = (104729, 1299709, 15485863, 32452843, 49979687, 67867967, 86028121, 104395301)


def declared_alternatives(
    task_encoder: TaskEncoder,
    crude: Sequence[dict],
    seed: int,
    transforms: Sequence[Transform],
    runs: Sequence[Sequence[Any]],
    keys: Sequence[str],
) -> dict[tuple[str, str], list[Any] | None]:
    """For each sample's payload in a declared field: every value the loader may deliver there (its clean
    value and what the declared transform makes of it), from the first-stage samples of ``runs`` (the same
    samples under other per-sample seeds; more are tried for a sample whose field was dropped in each).
    ``None`` for a field whose transformed value cannot be computed (dropout to None or to a constant)."""
    out: dict[tuple[str, str], list[Any] | None] = {}
    if not transforms:
        return out
    for index, key in enumerate(keys):
        values: dict[str, list[Any]] = {}
        for run in runs:
            for payload in payloads(run[index]):
                if field_transform(transforms, payload.path) is not None:
                    values.setdefault(payload.path, []).append(payload.value)
        for path, seen in values.items():
            transform = field_transform(transforms, path)
            if not transform.traceable:
                out[(key, path)] = None
                continue
            clean = [v for v in seen if not is_applied_value(transform, v)]
            for offset in _MORE_OFFSETS if not clean else ():
                again = first_stage_samples(task_encoder, [crude[index]], seed, index_offset=index + offset)
                value = {p.path: p.value for p in payloads(again[0])}.get(path) if again else None
                if value is not None and not is_applied_value(transform, value):
                    clean = [value]
                    break
            alternatives = list(seen)
            for value in clean:
                alternatives += variants(transform, value)
            out[(key, path)] = alternatives
    return out


def explained(
    result: Trace, key: str, path: str, alternatives: dict[tuple[str, str], list[Any] | None]
) -> bool:
    """Whether a payload not found as it was is found as one of the values its declaration allows (or its
    declaration allows a value that cannot be computed)."""
    if (key, path) not in alternatives:
        return False
    allowed = alternatives[(key, path)]
    if allowed is None:
        return True
    return any(result.haystack.find(Payload(path, value)) for value in allowed)


def row_value(batch: Any, path: str, row: int) -> Any:
    """The value a batch holds for one sample at a payload path: row ``row`` of a stacked tensor or a list
    field (None where the batch does not lay it out by rows)."""
    value = field_at(batch, path)
    if isinstance(value, torch.Tensor) and value.dim() > 0 and row < value.shape[0]:
        return value[row]
    if isinstance(value, (list, tuple)) and row < len(value):
        return value[row]
    return None


def own_alternatives(
    samples: Sequence[Any], keys: Sequence[str], transforms: Sequence[Transform]
) -> dict[tuple[str, str], list[Any] | None]:
    """:func:`declared_alternatives` for samples whose declared fields are clean (the input of a stage that
    may apply the transform itself, such as ``batch()``): each payload in a declared field, and what the
    declaration makes of it."""
    out: dict[tuple[str, str], list[Any] | None] = {}
    for key, sample in zip(keys, samples, strict=True):
        for payload in payloads(sample):
            transform = field_transform(transforms, payload.path)
            if transform is not None:
                out[(key, payload.path)] = (
                    [payload.value, *variants(transform, payload.value)] if transform.traceable else None
                )
    return out
