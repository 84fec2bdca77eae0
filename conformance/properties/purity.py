"""Property 4, purity: equal inputs give equal outputs whatever was cooked before and in whatever order;
two samples that share a ``__key__`` (two datasets of a blend) each get their own payload; the input dict
is not modified; the caller's torch, numpy and random RNG states are unchanged; outputs of different
samples share no memory."""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from ..context import CheckContext
from ..data import read_crude
from ..execution import cook
from ..fingerprint import fingerprint, first_difference
from ._common import fail


def _rng_states() -> tuple:
    return (torch.get_rng_state().numpy().tobytes(), repr(np.random.get_state()), random.getstate())


def _storages(value: Any, out: list[tuple[int, int, str]], path: str) -> None:
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        if storage.nbytes():
            out.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes(), path))
    elif isinstance(value, dict):
        for key, item in value.items():
            _storages(item, out, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _storages(item, out, f"{path}[{index}]")
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            _storages(getattr(value, name), out, f"{path}.{name}")


def _same_members(before: dict, after: dict) -> str | None:
    if before.keys() != after.keys():
        return f"keys changed: added {sorted(after.keys() - before.keys())}, removed {sorted(before.keys() - after.keys())}"
    for key in before:
        if fingerprint(before[key]) != fingerprint(after[key]):
            return f"member {key!r} changed"
    return None


def check(ctx: CheckContext) -> dict:
    decoded = ctx.target.wants_decoded
    encoding = ctx.encodings()[0]
    crude = read_crude(ctx.main_dataset(encoding), decoded=decoded)[:12]
    reference = [
        fingerprint(cook(ctx.target, copy.deepcopy(s), sample_index=i, seed=ctx.seed))
        for i, s in enumerate(crude)
    ]

    # The input dict is not modified, and the caller's RNG states are left alone.
    for index, sample in enumerate(crude):
        before = copy.deepcopy(sample)
        states = _rng_states()
        cook(ctx.target, sample, sample_index=index, seed=ctx.seed)
        changed = _same_members(before, sample)
        if changed:
            fail(
                f"cooking sample {sample['__key__']!r} modified its input dict: {changed}. Cookers must not "
                "mutate the crude sample (Energon may hand the same dict to a restore)",
                ctx.reproduce("purity"),
            )
        if _rng_states() != states:
            which = [
                name
                for name, a, b in zip(("torch", "numpy", "random"), states, _rng_states(), strict=True)
                if a != b
            ]
            fail(
                f"cooking sample {sample['__key__']!r} changed the caller's global RNG state ({', '.join(which)}). "
                "Use a local generator, or @stateless(restore_seeds=True) which restores the outer state",
                ctx.reproduce("purity"),
            )

    # Equal inputs, equal outputs, whatever was cooked before and in whatever order.
    @ctx.profile.hypothesis_settings()
    @given(order=st.permutations(range(len(crude))))
    def any_order(order: list[int]) -> None:
        for index in order:
            observed = fingerprint(
                cook(ctx.target, copy.deepcopy(crude[index]), sample_index=index, seed=ctx.seed)
            )
            if observed != reference[index]:
                where = first_difference(reference[index], observed)
                fail(
                    f"sample {crude[index]['__key__']!r} cooked differently after other samples (order {order}): "
                    f"{where}. A cooker must not depend on what it cooked before (caches, counters, state)",
                    ctx.reproduce("purity"),
                )

    any_order()

    # Two different samples that share a key (two datasets of a blend) each keep their own payload.
    first, second = copy.deepcopy(crude[0]), copy.deepcopy(crude[1])
    second["__key__"] = first["__key__"]
    out_first = fingerprint(cook(ctx.target, first, sample_index=0, seed=ctx.seed))
    out_second = fingerprint(cook(ctx.target, second, sample_index=1, seed=ctx.seed))
    expected_second = fingerprint(cook(ctx.target, copy.deepcopy(crude[1]), sample_index=1, seed=ctx.seed))
    if _drop_key(out_second) != _drop_key(expected_second) or out_first == out_second:
        fail(
            f"two samples sharing the key {first['__key__']!r} (as two datasets of a blend can) did not each get "
            f"their own payload: {first_difference(_drop_key(expected_second), _drop_key(out_second))}. "
            "Never cache by __key__ alone",
            ctx.reproduce("purity"),
        )

    # Outputs of different samples share no memory.
    spans: list[tuple[int, int, str]] = []
    outputs = [cook(ctx.target, copy.deepcopy(s), sample_index=i, seed=ctx.seed) for i, s in enumerate(crude)]
    for index, output in enumerate(outputs):
        _storages(output, spans, f"sample {crude[index]['__key__']!r}")
    spans.sort()
    for (_start_a, end_a, where_a), (start_b, _end_b, where_b) in zip(spans, spans[1:], strict=False):
        if start_b < end_a and where_a.split(".")[0] != where_b.split(".")[0]:
            fail(
                f"outputs of different samples share memory: {where_a} and {where_b} overlap. Writing into one "
                "changes the other; return tensors that own their storage (clone a shared buffer)",
                ctx.reproduce("purity"),
            )
    return {"samples": len(crude)}


def _drop_key(fp: Any) -> Any:
    """A fingerprint without the __key__ entry (compared payloads only)."""
    if isinstance(fp, tuple) and len(fp) == 2 and isinstance(fp[1], tuple):
        return (
            fp[0],
            tuple(item for item in fp[1] if not (isinstance(item, tuple) and item and item[0] == "__key__")),
        )
    return fp
