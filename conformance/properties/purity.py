"""Property 4, purity: equal inputs give equal outputs whatever was cooked before and in whatever order;
two samples that share a ``__key__`` (two datasets of a blend) each get their own payload; an output does
not change when later samples are cooked (no reused output buffer); the caller's torch, numpy and random
RNG states are unchanged (with ``num_workers=0`` the cooker runs in the training process). As advice: the
input dict is left as it was, and outputs of different samples share no memory."""

from __future__ import annotations

import copy
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..engine import rngs
from ..engine.context import CheckContext
from ..engine.flow import first_stage
from ..oracles.fingerprint import fingerprint, first_difference
from ._common import fail

CLAIMS = claims_of(
    "purity",
    (
        "order",
        "a sample cooks to the same output whatever was cooked before it and in whatever order",
        Harm.DETERMINISM,
        "keep no state between calls (caches, counters): a cooked sample depends on the sample and the seed only",
    ),
    (
        "shared_key",
        "two different samples that share a __key__ (two datasets of a blend) each keep their own payload",
        Harm.DATA,
        "never cache by __key__ alone",
    ),
    (
        "independent_outputs",
        "a cooked sample does not change when later samples are cooked",
        Harm.DATA,
        "return tensors that own their storage: do not decode into one reused buffer",
    ),
    (
        "global_rng",
        "cooking leaves the caller's torch, numpy and random RNG states as they were",
        Harm.DETERMINISM,
        "use a local generator, or @stateless(restore_seeds=True), which restores the outer state; with "
        "num_workers=0 a reseeded global RNG repeats the training loop's own noise and dropout draws",
    ),
    (
        "input_unchanged",
        "cooking leaves the crude sample dict it was given as it was",
        Harm.ADVICE,
        "read from the crude dict without popping or replacing members (it is what Energon's error "
        "handler shows when a later stage fails)",
    ),
    (
        "shared_memory",
        "outputs of different samples share no memory",
        Harm.ADVICE,
        "return tensors that own their storage (a write into one sample's tensor would change another's)",
    ),
)

SAMPLES = 12


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


def _drop_key(fp: Any) -> Any:
    """A fingerprint without its ``__`` entries (key, restore key, sources: Energon's bookkeeping, which
    differs between two samples anyway), so that payloads alone are compared."""
    if isinstance(fp, tuple) and len(fp) == 2 and isinstance(fp[1], tuple):
        return (
            fp[0],
            tuple(
                item
                for item in fp[1]
                if not (
                    isinstance(item, tuple) and item and isinstance(item[0], str) and item[0].startswith("__")
                )
            ),
        )
    return fp


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    crude = ctx.crude(ctx.main_dataset(ctx.encodings()[0]), limit=SAMPLES)

    def cooked(index: int, sample: dict | None = None) -> Any:
        source = copy.deepcopy(crude[index]) if sample is None else sample
        # as a loader worker runs it: the held TaskEncoder, cooker and first encode stage
        return first_stage(
            ctx.held_task_encoder(), source, sample_index=index, seed=ctx.seed, as_plain=False
        )[1]  # the objects themselves: purity judges whether outputs share buffers

    reference = [fingerprint(cooked(i)) for i in range(len(crude))]

    changed_rng: dict[str, list] = {}
    # the planted states are the suite's business: the process that runs the suite gets its own back
    with rngs.saved(), claims.claim("input_unchanged") as inputs, claims.claim("global_rng") as rng:
        for index in range(len(crude)):
            sample = copy.deepcopy(crude[index])
            before = copy.deepcopy(sample)
            states = rngs.plant(index)
            cooked(index, sample)
            inputs.examined()
            rng.examined()
            changed = _same_members(before, sample)
            if changed:
                inputs.problem(f"cooking sample {sample['__key__']!r} modified its input dict: {changed}")
            after = rngs.states()
            for name, planted, now in zip(("torch", "numpy", "random"), states, after, strict=True):
                if planted != now:
                    changed_rng.setdefault(name, []).append(now)
                    rng.problem(
                        f"cooking changes the caller's global {name} RNG state (it reseeds or draws from the "
                        "global generator)",
                        sample=sample["__key__"],
                    )
        for name, afters in changed_rng.items():
            if len(afters) > 1 and len(set(afters)) == 1:
                rng.problem(
                    f"every cook leaves the global {name} RNG in one and the same state: the cooker seeds it with "
                    "a constant, so with num_workers=0 the training loop draws the same noise and dropout masks "
                    "at every step"
                )

    with claims.claim("order") as claim:
        if not crude:
            claim.nothing_because(ctx.unreadable() or "the dataset has no samples")
        else:

            @ctx.hypothesis_settings()
            @given(order=st.permutations(range(len(crude))))
            def any_order(order: list[int]) -> None:
                for index in order:
                    claim.examined()
                    observed = fingerprint(cooked(index))
                    if observed != reference[index]:
                        fail(
                            f"sample {crude[index]['__key__']!r} cooked differently after other samples (order "
                            f"{order}): {first_difference(reference[index], observed)}"
                        )

            any_order()

    with claims.claim("shared_key") as claim:
        if len(crude) >= 2:
            first, second = copy.deepcopy(crude[0]), copy.deepcopy(crude[1])
            second["__key__"] = first["__key__"]
            out_first = fingerprint(cooked(0, first))
            out_second = fingerprint(cooked(1, second))
            claim.examined()
            if _drop_key(out_second) != _drop_key(reference[1]) or out_first == out_second:
                fail(
                    f"two samples sharing the key {first['__key__']!r} (as two datasets of a blend can) did not "
                    f"each get their own payload: {first_difference(_drop_key(reference[1]), _drop_key(out_second))}"
                )
        else:
            claim.nothing_because(ctx.unreadable() or "fewer than 2 samples could be read")

    outputs = [cooked(i) for i in range(len(crude))]
    with claims.claim("independent_outputs") as claim:
        for index, output in enumerate(outputs):
            claim.examined()
            now = fingerprint(output)
            if now != reference[index]:
                claim.problem(
                    f"sample {crude[index]['__key__']!r}'s output changed after the {len(crude) - index - 1} samples "
                    f"after it were cooked: {first_difference(reference[index], now)}"
                )
    with claims.claim("shared_memory") as claim:
        spans: list[tuple[int, int, str]] = []
        for index, output in enumerate(outputs):
            claim.examined()
            _storages(output, spans, f"sample {crude[index]['__key__']!r}")
        spans.sort()
        for (_start_a, end_a, where_a), (start_b, _end_b, where_b) in zip(spans, spans[1:], strict=False):
            if start_b < end_a and where_a.split(".")[0] != where_b.split(".")[0]:
                fail(f"outputs of different samples share memory: {where_a} and {where_b} overlap")
    return {"samples": len(crude)}
