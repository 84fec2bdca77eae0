"""Property 3, fidelity: every output field that corresponds to an input member equals it exactly:
dtype, shape and values for tensors; the exact text for captions (non-ASCII and long ones included);
the pixels for images. Checked on every sample of generated datasets in each floating dtype, then on
hypothesis-generated payloads."""

from __future__ import annotations

import io
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from synthetic import TensorSpec, TextSpec
from synthetic.schema import FLOAT_DTYPES

from ..context import CheckContext
from ..data import read_crude
from ..execution import cook
from ..results import PropertyFailure
from ._common import compare, expected_value, fail, field_names, find_field


def _check_sample(ctx: CheckContext, members: dict, sample: dict, index: int, where: str) -> None:
    output = cook(ctx.target, sample, sample_index=index, seed=ctx.seed)
    for member, spec in members.items():
        if member not in sample:
            continue
        name, observed = find_field(output, member, spec)
        if name is None:
            fail(
                f"{where}: sample {sample['__key__']!r}: the output has no field for member {member!r} "
                f"(fields: {field_names(output)}); name the field in the schema (`field:`) if it is not "
                f"{member.split('.', 1)[0]!r}",
                ctx.reproduce("fidelity"),
            )
        problem = compare(spec, expected_value(spec, sample[member]), observed)
        if problem:
            fail(
                f"{where}: sample {sample['__key__']!r}: field {name!r} does not equal member {member!r}: {problem}",
                ctx.reproduce("fidelity"),
            )


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()


def check(ctx: CheckContext) -> dict:
    decoded = ctx.target.wants_decoded
    checked = 0
    for encoding in ctx.encodings():
        schema = ctx.workspace.schema(encoding)
        members = dict(schema.members)
        has_float = any(isinstance(s, TensorSpec) and s.dtype in FLOAT_DTYPES for s in members.values())
        datasets = [("main", ctx.main_dataset(encoding))]
        if has_float:
            for dtype in ("bfloat16", "float16"):
                datasets.append(
                    (dtype, ctx.workspace.generated(encoding, f"dtype-{dtype}", dtype=dtype, num_samples=16))
                )
        template = None
        for label, path in datasets:
            crude = read_crude(path, decoded=decoded)
            template = template or crude[0]
            for index, sample in enumerate(crude):
                _check_sample(ctx, members, sample, index, f"dataset {label} ({path.name})")
                checked += 1
        checked += _hypothesis_payloads(ctx, members, template, decoded)
    return {"samples": checked}


def _hypothesis_payloads(ctx: CheckContext, members: dict, template: dict, decoded: bool) -> int:
    """Cook the template sample with hypothesis-drawn tensor values/dtypes and caption texts."""
    texts = st.one_of(
        st.text(st.characters(exclude_categories=("Cs",)), max_size=200),
        st.text(st.characters(exclude_categories=("Cs",)), min_size=1000, max_size=4000),
    )
    counter = {"n": 0}

    @ctx.profile.hypothesis_settings()
    @given(data=st.data())
    def run(data: Any) -> None:
        sample = dict(template)
        for member, spec in members.items():
            if member not in sample:
                continue
            if isinstance(spec, TensorSpec) and spec.dtype in FLOAT_DTYPES:
                dtype = getattr(
                    torch, data.draw(st.sampled_from(["float32", "bfloat16", "float16"]), label=member)
                )
                seed = data.draw(st.integers(0, 2**31 - 1), label=f"{member} seed")
                scale = data.draw(st.sampled_from([1.0, 1e-30, 1e4, 1e38]), label=f"{member} scale")
                reference = (
                    sample[member]
                    if not isinstance(sample[member], bytes)
                    else expected_value(spec, sample[member])
                )
                generator = torch.Generator().manual_seed(seed)
                tensor = (torch.randn(reference.shape, generator=generator) * scale).to(dtype)
                sample[member] = tensor if decoded else _tensor_bytes(tensor)
            elif isinstance(spec, TextSpec):
                text = data.draw(texts, label=member)
                sample[member] = text if decoded else text.encode("utf-8")
        counter["n"] += 1
        _check_sample(ctx, members, sample, counter["n"], "hypothesis payload")

    try:
        run()
    except PropertyFailure:
        raise
    return counter["n"]
