"""Samples cooked and encoded as Energon does before batching, and what goes wrong when the target's formats
meet in one batch: shared by the batch property (its rows claim) and the blend property (a blend of the
formats stops or loses fields at its first mixed batch)."""

from __future__ import annotations

import copy
from typing import Any

from megatron.energon import TaskEncoder

from ..core.rendering import describe_error
from ..core.results import PropertySkipped
from ..engine.calls import TargetError, encode, matching_cooker, target_call, worker_context
from ..engine.context import CheckContext
from ..oracles.payloads import KEY, trace
from ._common import MISSING, get_field

__all__ = ["batch_of", "encoded", "keys_of", "mixed_format_problems"]


def encoded(task_encoder: TaskEncoder, crude: list[dict], seed: int) -> list[Any]:
    """Cook and encode samples as Energon does before batching (first matching cooker, the encode stages)."""
    out = []
    cookers = task_encoder.cookers
    for index, sample in enumerate(crude):
        cooker = cookers[matching_cooker(cookers, sample) or 0]
        with (
            target_call(f"cooking and encoding the clean sample {sample.get('__key__')!r}"),
            worker_context(seed, index),
        ):
            cooked = cooker.cook(copy.deepcopy(sample))
        with target_call(f"encoding the clean sample {sample.get('__key__')!r}"):
            encoded = encode(task_encoder, cooked, seed=seed, sample_index=index)
        if len(encoded) != 1:
            raise PropertySkipped(
                "encode_sample yields several samples (or none) per input; rows cannot be matched"
            )
        out.append(encoded[0])
    return out


def batch_of(task_encoder: TaskEncoder, samples: list[Any], seed: int, *, clean: bool = True) -> Any:
    """``task_encoder.batch(samples)``; on clean samples an exception is the target's (TargetError)."""
    if not clean:
        with worker_context(seed, 0):
            return task_encoder.batch(list(samples))
    with target_call(f"batch() of {len(samples)} clean samples"), worker_context(seed, 0):
        return task_encoder.batch(list(samples))


def keys_of(samples: list[Any]) -> list[str]:
    raw_keys = [get_field(s, "__key__") for s in samples]
    return [f"#{i}" if k is MISSING else str(k) for i, k in enumerate(raw_keys)]


def mixed_format_problems(ctx: CheckContext) -> dict[str, Any]:
    """What goes wrong when the target's formats meet in one batch (``{"raised", "lost", "problems",
    "examined", "batched", "how"}``: the errors batch() raised, the fields it lost, both),
    computed once per context (the blend property asks too). Raises PropertySkipped when a format alone
    cannot be batched (the rows claim reports that)."""
    return ctx.cached("mixed-formats", lambda: _mixed_formats(ctx))


def _mixed_formats(ctx: CheckContext) -> dict[str, Any]:
    task_encoder = ctx.target.make_task_encoder()
    formats: dict[str, list[Any]] = {}
    alone: dict[str, set[str]] = {}  # format -> the payload paths a batch of that format alone carries
    try:
        for encoding in ctx.encodings():
            name = encoding or "preencoded"
            formats[name] = encoded(task_encoder, ctx.crude(ctx.main_dataset(encoding), limit=3), ctx.seed)
            if len(formats[name]) < 2:
                raise PropertySkipped(f"fewer than 2 {name} samples could be read")
            alone_batch = batch_of(task_encoder, formats[name][:2], ctx.seed)
            alone[name] = {
                path
                for sample in trace(formats[name][:2], alone_batch).samples
                for path, places in sample.places.items()
                if places and path != KEY
            }
    except TargetError as error:
        raise PropertySkipped(f"blocked by batch/rows: {error.message.splitlines()[0][:200]}") from error
    names = list(formats)
    if type(task_encoder).batch_group_criterion is not TaskEncoder.batch_group_criterion:
        groups: dict[str, set[Any]] = {}
        for name, samples in formats.items():
            with (
                target_call(f"batch_group_criterion() of a clean {name} sample"),
                worker_context(ctx.seed, 0),
            ):
                groups[name] = {_group_key(task_encoder.batch_group_criterion(s)) for s in samples}
        shared = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if groups[a] & groups[b]]
        if not shared:
            count = sum(len(samples) for samples in formats.values())
            how = "batch_group_criterion keeps the formats apart"
            return {"raised": [], "lost": [], "problems": [], "examined": count, "batched": count, "how": how}
    raised: list[str] = []
    lost: list[str] = []
    examined = batched = 0
    for first in names:
        mixed = _interleave(first, formats)
        kinds = [name for name, _ in mixed]
        samples = [sample for _, sample in mixed]
        label = f"a batch mixing {' and '.join(names)} samples that begins with a {first} sample"
        examined += 1
        try:
            with worker_context(ctx.seed, 0):
                batch = task_encoder.batch(list(samples))
        except Exception as error:
            raised.append(
                f"batch() of {label} raised {describe_error(error, 240)}; a blend "
                "of these datasets stops training at its first mixed batch"
            )
            continue
        batched += 1
        lost += _kept(batch, samples, kinds, alone, label)
    raised, lost = list(dict.fromkeys(raised)), list(dict.fromkeys(lost))
    return {
        "raised": raised,
        "lost": lost,
        "problems": raised + lost,
        "examined": examined,
        "batched": batched,
        "how": "mixed batches",
    }


def _group_key(criterion: Any) -> Any:
    key = criterion[0] if isinstance(criterion, tuple) else criterion
    try:
        hash(key)
    except TypeError:
        return repr(key)
    return key


def _interleave(first: str, formats: dict[str, list[Any]]) -> list[tuple[str, Any]]:
    """One sample of each format in turn, ``first`` first, as a blend mixes them."""
    order = [first] + [name for name in formats if name != first]
    out = []
    for index in range(max(len(samples) for samples in formats.values())):
        out += [(name, formats[name][index]) for name in order if index < len(formats[name])]
    return out


def _kept(
    batch: Any, samples: list[Any], kinds: list[str], alone: dict[str, set[str]], label: str
) -> list[str]:
    """What a mixed batch loses: a payload of a sample that a batch of its format alone carries and this
    batch does not, and fields of different samples mixed up (the payload oracle: by value, any layout)."""
    keys = [f"{kind} {key}" for kind, key in zip(kinds, keys_of(samples), strict=True)]
    result = trace(samples, batch, keys)
    problems = []
    for sample, kind in zip(result.samples, kinds, strict=True):
        for path, places in sample.places.items():
            if not places and path in alone.get(kind, set()):
                problems.append(
                    f"in {label}, the {kind} sample {sample.key!r}'s {path!r} is nowhere in the batch, though a batch "
                    f"of {kind} samples alone carries it: the {kind} samples' {path} are lost"
                )
    return problems + [f"in {label}: {problem}" for problem in result.mixed()]
