"""Property 3, fidelity: every clean sample cooks, and every output field that corresponds to an input
member equals it exactly: dtype, shape and values for tensors (float32, bfloat16 and float16 data); the
exact text for captions (non-ASCII and long ones included); the pixels for images; on every sample of
generated datasets, then on hypothesis-drawn payloads. Members are decoded by the target's own decoder
first, as in production; the expected values are read from the member bytes by the suite."""

from __future__ import annotations

import io
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from synthetic import ImageSpec, TensorSpec, TextSpec
from synthetic.schema import FLOAT_DTYPES, MemberSpec

from ..claims import ClaimRecorder, Harm, claims_of
from ..context import CheckContext
from ..execution import TargetError, cook
from ..results import PropertyFailure
from ._common import compare, decode_like_target, expected_value, field_names, find_field

CLAIMS = claims_of(
    "fidelity",
    (
        "cooks",
        "every clean sample is decoded and cooked without an error",
        Harm.DATA,
        "a clean sample the target cannot cook is a sample Energon skips: fix the error shown",
    ),
    (
        "tensors",
        "every tensor member reaches its output field with the same dtype, shape and values",
        Harm.DATA,
        "return the tensor as read (no cast, reshape, normalisation or copy into a shared buffer)",
    ),
    (
        "dtypes",
        "the same holds for bfloat16 and float16 data",
        Harm.DATA,
        "do not cast tensors (e.g. .float()); keep the dtype the data was written in",
    ),
    (
        "text",
        "every text member reaches its output field as the exact UTF-8 text (non-ASCII, long, surrounding "
        "white space and control characters included)",
        Harm.DATA,
        "decode with bytes.decode('utf-8') and keep the text as it is (no strip, truncation or ASCII filter)",
    ),
    (
        "images",
        "every image member reaches its output field with the same pixels",
        Harm.DATA,
        "decode to RGB without resizing or changing the mode",
    ),
    (
        "other",
        "every other member (JSON, bytes) reaches its output field unchanged",
        Harm.DATA,
        "pass the member on as decoded",
    ),
    (
        "payloads",
        "the same holds for hypothesis-drawn tensor values, dtypes and caption texts",
        Harm.DATA,
        "return every drawn value exactly as read: no cast, strip, truncation or normalisation",
    ),
)


_NOUN = {"tensors": "tensor", "text": "text", "images": "image", "other": "JSON or bytes"}


def _claim_of(spec: MemberSpec) -> str:
    if isinstance(spec, TensorSpec):
        return "tensors"
    if isinstance(spec, TextSpec):
        return "text"
    if isinstance(spec, ImageSpec):
        return "images"
    return "other"


def _member_problem(spec: MemberSpec, member: str, raw: Any, output: Any) -> str | None:
    name, observed = find_field(output, member, spec)
    if name is None:
        return (
            f"the output has no field for member {member!r} (fields: {field_names(output)}), so the member is "
            f"lost; name the field in the schema (`field:`) if it is not {member.split('.', 1)[0]!r}"
        )
    if observed is None:
        return f"field {name!r} is None: member {member!r} is lost"
    problem = compare(spec, expected_value(spec, raw), observed)
    return f"field {name!r} does not equal member {member!r}: {problem}" if problem else None


def _check_dataset(
    ctx: CheckContext, claims: ClaimRecorder, members: dict, path: Any, label: str, dtype_claim: bool
) -> dict | None:
    """Cook every sample of ``path`` and compare each member; returns the first raw sample (a template)."""
    raw = ctx.raw(path)
    decoded = {s["__key__"]: s for s in ctx.crude(path)}
    where = f"dataset {label} ({path.name})"
    cooked: list[tuple[dict, Any]] = []
    with claims.claim("cooks") as claim:
        for index, sample in enumerate(raw):
            claim.examined()
            if sample["__key__"] not in decoded:
                claim.problem(f"{where}: the target's decoder refused the clean sample {sample['__key__']!r}")
                continue
            try:
                output = cook(ctx.target, decoded[sample["__key__"]], sample_index=index, seed=ctx.seed)
            except TargetError as error:
                claim.problem(f"{where}: {error.message}")
                continue
            cooked.append((sample, output))
    for member, spec in members.items():
        name = "dtypes" if dtype_claim and isinstance(spec, TensorSpec) else _claim_of(spec)
        if dtype_claim and name != "dtypes":
            continue
        with claims.claim(name) as claim:
            for sample, output in cooked:
                if member not in sample:
                    continue
                claim.examined()
                problem = _member_problem(spec, member, sample[member], output)
                if problem:
                    claim.problem(f"{where}: {problem}", sample=sample["__key__"])
    return raw[0] if raw else None


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    kinds_seen: set[str] = set()
    float_seen = False
    checked = 0
    for encoding in ctx.encodings():
        schema = ctx.workspace.schema(encoding)
        members = dict(schema.members)
        kinds_seen |= {_claim_of(spec) for spec in members.values()}
        has_float = any(isinstance(s, TensorSpec) and s.dtype in FLOAT_DTYPES for s in members.values())
        float_seen |= has_float
        main = ctx.main_dataset(encoding)
        template = _check_dataset(ctx, claims, members, main, "main", dtype_claim=False)
        checked += len(ctx.raw(main))
        if has_float:
            for dtype in ("bfloat16", "float16"):
                path = ctx.workspace.generated(encoding, f"dtype-{dtype}", dtype=dtype, num_samples=16)
                _check_dataset(ctx, claims, members, path, dtype, dtype_claim=True)
                checked += len(ctx.raw(path))
        if template is not None:
            if any(isinstance(spec, TextSpec) and m in template for m, spec in members.items()):
                with claims.claim("text") as claim:
                    claim.examined(_edge_cases(ctx, members, template))
            with claims.claim("payloads") as claim:
                claim.examined(_hypothesis_payloads(ctx, members, template))
    for name in ("tensors", "text", "images", "other"):
        if name not in kinds_seen:
            claims.not_applicable(name, f"the data format has no {_NOUN[name]} members")
    if not float_seen:
        claims.not_applicable("dtypes", "the data format has no floating-point tensor members")
    if not any(k in kinds_seen for k in ("tensors", "text")):
        claims.not_applicable("payloads", "hypothesis draws tensors and texts; the format has neither")
    return {"samples": checked}


#: texts every text member is also tried with (hypothesis draws the rest): edge cases a cooker may alter
EDGE_TEXTS = (
    "",
    " leading space",
    "trailing space ",
    "\ttabs and\nnew lines\n",
    "non-ASCII: Ünïcödé 漢字 emoji 🙂 and a combining e\u0301",
    "NUL \x00 and bell \x07 characters",
    "a long caption " * 300,
)


def _edge_cases(ctx: CheckContext, members: dict, template: dict) -> int:
    """Cook the template with each of EDGE_TEXTS in every text member (the ``text`` claim)."""
    text_members = [m for m, spec in members.items() if isinstance(spec, TextSpec) and m in template]
    for index, text in enumerate(EDGE_TEXTS if text_members else ()):
        # A key of its own for each drawn payload, as in a real shard (caching by key is purity/shared_key).
        sample = {**template, "__key__": f"{template['__key__']}_edge{index}"}
        sample.update({m: text.encode("utf-8") for m in text_members})
        output = cook(ctx.target, decode_like_target(ctx, sample), sample_index=index, seed=ctx.seed)
        for member in text_members:
            problem = _member_problem(members[member], member, sample[member], output)
            if problem:
                raise PropertyFailure(
                    f"caption edge case {text[:40]!r}: sample {sample['__key__']!r}: {problem}"
                )
    return len(EDGE_TEXTS) if text_members else 0


def _hypothesis_payloads(ctx: CheckContext, members: dict, template: dict) -> int:
    """Cook the template sample with hypothesis-drawn tensor values/dtypes and caption texts (as member
    bytes, decoded by the target's decoder as in production)."""
    texts = st.one_of(
        st.text(st.characters(exclude_categories=("Cs",)), max_size=200),
        st.text(st.characters(exclude_categories=("Cs",)), min_size=1000, max_size=4000),
    )
    counter = {"n": 0}

    @ctx.profile.hypothesis_settings()
    @given(data=st.data())
    def run(data: Any) -> None:
        sample = {**template, "__key__": f"{template['__key__']}_drawn{counter['n']}"}
        for member, spec in members.items():
            if member not in sample:
                continue
            if isinstance(spec, TensorSpec) and spec.dtype in FLOAT_DTYPES:
                dtype = getattr(
                    torch, data.draw(st.sampled_from(["float32", "bfloat16", "float16"]), label=member)
                )
                seed = data.draw(st.integers(0, 2**31 - 1), label=f"{member} seed")
                scale = data.draw(st.sampled_from([1.0, 1e-30, 1e4, 1e38]), label=f"{member} scale")
                shape = expected_value(spec, sample[member]).shape
                generator = torch.Generator().manual_seed(seed)
                tensor = (torch.randn(shape, generator=generator) * scale).to(dtype)
                sample[member] = _tensor_bytes(tensor)
            elif isinstance(spec, TextSpec):
                sample[member] = data.draw(texts, label=member).encode("utf-8")
        counter["n"] += 1
        output = cook(ctx.target, decode_like_target(ctx, sample), sample_index=counter["n"], seed=ctx.seed)
        for member, spec in members.items():
            if member in sample and isinstance(spec, (TensorSpec, TextSpec)):
                problem = _member_problem(spec, member, sample[member], output)
                if problem:
                    raise PropertyFailure(f"hypothesis payload for sample {sample['__key__']!r}: {problem}")

    run()
    return counter["n"]
