"""Property 3, fidelity: every clean sample cooks, and every output field that corresponds to an input
member equals it exactly: dtype, shape and values for tensors (float32, bfloat16 and float16 data); the
exact text for captions (non-ASCII and long ones included); the pixels for images; on every sample of
generated datasets, then on hypothesis-drawn payloads. Members are decoded by the target's own decoder
first, as in production; the expected values are read from the member bytes by the suite."""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from primus_energon.synthetic.schema import FLOAT_DTYPES, JsonSpec, NpySpec, PickleSpec, TensorSpec, TextSpec

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..core.declarations import Transform, declaration_hint, field_transform
from ..core.results import Inconclusive, PropertyFailure
from ..engine.calls import TargetError, cook
from ..engine.context import CheckContext, decode_like_target
from ..engine.flow import Flow
from ..engine.judge import MemberJudge
from ..oracles.declared import outcome, recognise
from ..oracles.expectations import (
    MISSING,
    NESTED,
    STACKED,
    Expectation,
    claim_of,
    decode_member,
    difference,
    expectations,
    fields,
    holds,
    is_required,
    locate,
    raw_holder,
)
from ..oracles.fields import field_at
from ..oracles.members import member_form

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
        "every tensor member reaches the sample its pipeline returns: as it is, laid out anew, cast without "
        "loss, padded or scaled; never cut, filled, cast with loss or flipped unless declared",
        Harm.DATA,
        "return the tensor's values as read (a reshape or a lossless cast is fine; a cut, a fill or a lossy "
        "cast loses data)",
    ),
    (
        "dtypes",
        "the same holds for bfloat16 and float16 data",
        Harm.DATA,
        "do not cast tensors to a narrower dtype (e.g. .half() on float32 data); keep the dtype the data was "
        "written in or a wider one",
    ),
    (
        "text",
        "every text member reaches the sample as the exact UTF-8 text (non-ASCII, long, surrounding white "
        "space and control characters included), or as token ids that tell distinct captions apart",
        Harm.DATA,
        "decode with bytes.decode('utf-8') and keep the text as it is (no strip, truncation or ASCII filter); "
        "tokenise each sample's own caption, to a length that keeps what tells captions apart",
    ),
    (
        "images",
        "every image member reaches the sample with its content: as it is, or resized, cropped, laid out and "
        "normalised as image pipelines do; never normalised twice, wrapped around, turned grey or transposed",
        Harm.DATA,
        "decode to RGB, resize and crop along height and width only, and normalise once (e.g. x / 127.5 - 1 "
        "on float values, never on uint8)",
    ),
    (
        "other",
        "every other member (JSON, bytes) reaches the sample unchanged",
        Harm.DATA,
        "pass the member on as decoded",
    ),
    (
        "unmatched",
        "every member reaches some output field (a member the format does not require may be dropped)",
        Harm.ADVICE,
        "name the member's output field in the schema (`field:`) if the cooker renames it; a provenance "
        "sidecar the cooker drops on purpose needs nothing",
    ),
    (
        "transformed",
        "a member that reaches its field through a transform the suite does not recognise, or a caption cut "
        "to the tokeniser's length, is reported with what was seen",
        Harm.ADVICE,
        "if the transform is deliberate, declare it (--conformance-transform 'FIELD: KIND ...') so that every "
        "claim checks it; a caption cut to the tokeniser's length needs nothing if that length is intended",
    ),
    (
        "masks",
        "every mask beside token ids or padded embeddings marks exactly their padding, sample by sample",
        Harm.DATA,
        "build each sample's mask from its own length (ones for tokens, zeros for padding), in the same "
        "order as the values it describes",
    ),
    (
        "payloads",
        "the same holds for hypothesis-drawn tensor values, dtypes and caption texts",
        Harm.DATA,
        "return every drawn value exactly as read: no cast, strip, truncation or normalisation",
    ),
)


_NOUN = {"tensors": "tensor", "text": "text", "images": "image", "other": "JSON, number or bytes"}


def _leaf_kinds(spec: Any) -> set[str]:
    """The claims a member's leaves belong to (a pickle of tensors: tensors)."""
    if isinstance(spec, PickleSpec):
        return {claim_of(leaf) for leaf in spec.leaves.values()}
    if isinstance(spec, JsonSpec) and spec.fields:
        return {claim_of(leaf) for leaf in spec.fields.values()}
    return {claim_of(spec)}


def _siblings(members: Mapping[str, Any]) -> dict[str, list[str]]:
    """member -> the other members of its kind whose names differ from it in digits only (a video's
    ``frame_000.png`` ... ``frame_015.png``, per-view ``latents_0.pth``, ``latents_1.pth``): one group of
    per-item members, which a target keeps all of or loses data."""
    groups: dict[tuple[str, str], list[str]] = {}
    for member, spec in members.items():
        groups.setdefault((re.sub(r"\d+", "#", member), getattr(spec, "kind", "")), []).append(member)
    return {m: [o for o in group if o != m] for group in groups.values() if len(group) > 1 for m in group}


def _as_declared(expected: Expectation, output: Any, transforms: Sequence[Transform]) -> bool:
    """Whether a declared field holds the expectation as its declaration allows (kept or transformed)."""
    for transform in transforms:
        value = field_at(output, transform.field)
        if value is not MISSING and outcome(transform, expected.value, value) is not None:
            return True
    return False


def _undeclared(expected: Expectation, observed: Any, field_name: str) -> str:
    """The declaration that would express ``observed`` as a deliberate change of the expectation, as the
    end of a message ("" where the change is none the suite knows)."""
    if expected.value is MISSING:
        return ""
    recognised = recognise(expected.value, observed)
    return f"; {declaration_hint(field_name, recognised)}" if recognised else ""


def _judge(
    claims: ClaimRecorder,
    expected: Expectation,
    output: Any,
    where: str,
    key: str,
    only: str | None,
    lost_because: str = "",
    transforms: Sequence[Transform] = (),
) -> None:
    """Judge one expectation in one output by identity and form alone (no flow: nothing is run again),
    and record the verdict: the building block the dataset check runs with a flow."""
    judge = MemberJudge(claims, None, where, transforms, "ci")
    judge.expectation(0, key, expected, output, only, lost_because)
    judge.finish(across=False)


def _mismatch(
    spec: Any, member: str, data: bytes, output: Any, transforms: Sequence[Transform] = ()
) -> str | None:
    """What differs between a member (each of its leaves) and the output field that holds it (as declared,
    where a transform of that field is declared); a member no field holds is left to the main datasets'
    verdicts (lost or unmatched)."""
    for expected in expectations(member, spec, data, required=False):
        field_name, how = locate(expected, output)
        if field_name is None or how in ("by raw bytes", NESTED, STACKED):
            continue
        if transforms and _as_declared(expected, output, transforms):
            continue
        observed = fields(output)[field_name]
        problem = difference(expected, observed)
        if problem and not isinstance(observed, str):
            form = member_form(
                expected.spec, expected.value, observed, field_transform(transforms, field_name)
            )
            if form is not None and form.verdict in ("kept", "declared"):
                continue  # a recognised transform (a lossless cast, a layout): the value is there
        if problem:
            return f"field {field_name!r} ({how}) does not equal {expected.what}: {problem}" + _undeclared(
                expected, observed, field_name
            )
    return None


def _holds_floats(spec: Any) -> bool:
    """Whether a member holds floating-point values a derived dtype variant can cast: a float ``.npy``
    array (numpy has no bfloat16, so not as bfloat16), or float tensors in a pickled structure."""
    if isinstance(spec, NpySpec):
        return spec.view is None and spec.dtype in FLOAT_DTYPES
    if isinstance(spec, PickleSpec):
        return any(
            _holds_floats(leaf) or (isinstance(leaf, TensorSpec) and leaf.dtype in FLOAT_DTYPES)
            for leaf in spec.leaves.values()
            if not isinstance(leaf, str)
        )
    return False


def _castable(spec: Any, dtype: str) -> bool:
    """Whether a derived dtype variant casts something of this member to ``dtype`` (a float tensor or
    array of another dtype; numpy arrays not to bfloat16)."""
    if isinstance(spec, TensorSpec):
        return spec.dtype in FLOAT_DTYPES and spec.dtype != dtype
    if isinstance(spec, NpySpec):
        return (
            spec.view is None and spec.dtype in FLOAT_DTYPES and spec.dtype != dtype and dtype != "bfloat16"
        )
    if isinstance(spec, PickleSpec):
        return any(_castable(leaf, dtype) for leaf in spec.leaves.values() if not isinstance(leaf, str))
    return False


def _float_dtypes(ctx: CheckContext, members: Mapping[str, Any]) -> set[str]:
    """The floating-point dtypes the user's samples hold, over every tensor, array and pickled tensor of
    every member and sample the suite derives from."""
    seen: set[str] = set()
    try:
        sources = ctx.workspace.sources()
    except ValueError:
        return seen
    for sample in sources:
        for member, spec in members.items():
            data = sample.get(member)
            if not isinstance(data, (bytes, bytearray)) or not (
                isinstance(spec, TensorSpec) or _holds_floats(spec)
            ):
                continue
            try:
                value = decode_member(spec, data)
            except Exception:  # an unreadable member holds no dtype to vary
                continue
            for leaf in _tensor_leaves(value):
                name = str(leaf.dtype).removeprefix("torch.")
                if name in FLOAT_DTYPES:
                    seen.add(name)
    return seen


def _tensor_leaves(value: Any, depth: int = 0) -> list[Any]:
    import numpy as np

    if depth > 8:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return [torch.from_numpy(np.ascontiguousarray(value[:0]))]
    if isinstance(value, Mapping):
        return [leaf for item in value.values() for leaf in _tensor_leaves(item, depth + 1)]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _tensor_leaves(item, depth + 1)]
    return []


def _was_cast(path: Any) -> bool:
    """Whether the derivation of ``path`` cast any member (see ``synthetic.derive``)."""
    from primus_energon.synthetic import Manifest

    edits = Manifest.load(path).options.get("derived", {}).get("edits", [])
    return any("cast to" in edit and "failed" not in edit for edit in edits)


def _check_dataset(
    ctx: CheckContext,
    claims: ClaimRecorder,
    members: dict,
    path: Any,
    label: str,
    dtype_claim: bool,
    schema: Any = None,
) -> dict | None:
    """Run every sample of ``path`` through the per-sample pipeline (the cooker and the first encode stage,
    on one held TaskEncoder) and judge where each member went (:class:`~primus_energon.conformance.engine.judge.
    MemberJudge`: identity, then flow, then form); returns the first raw sample (a template)."""
    raw = ctx.raw(path)
    where = f"dataset {label} ({path.name})"
    flow = Flow(ctx, path, members)
    runs: list[tuple[int, dict, Any]] = []
    with claims.claim("cooks") as claim:
        for index, sample in enumerate(raw):
            claim.examined()
            if flow.decoded(index) is None:
                claim.problem(f"{where}: the target's decoder refused the clean sample {sample['__key__']!r}")
                continue
            try:
                run = flow.base(index)
            except TargetError as error:
                claim.problem(f"{where}: {error.message}")
                continue
            runs.append((index, sample, run))
    schema = ctx.workspace.schema(ctx.encodings()[0]) if schema is None else schema
    siblings = _siblings(members)
    judge = MemberJudge(claims, flow, where, ctx.transforms, ctx.profile.name)
    judged: list[int] = []
    for index, sample, run in runs:
        output = run.output
        judge.output(sample["__key__"], output)
        held = {
            m
            for m in siblings
            if m in sample
            and not (dtype_claim and not (isinstance(members[m], TensorSpec) or _holds_floats(members[m])))
            and holds(output, m, members[m], sample[m])
        }
        for member, spec in members.items():
            if member not in sample or (
                dtype_claim and not (isinstance(spec, TensorSpec) or _holds_floats(spec))
            ):
                continue
            if raw_holder(output, sample[member], spec) is not None:
                # passed on as read (decoded later, e.g. in batch()): every leaf is intact
                for name in ({"dtypes"} if dtype_claim else _leaf_kinds(spec)) | {"unmatched"}:
                    with claims.claim(name) as claim:
                        claim.examined()
                continue
            kept = [o for o in siblings.get(member, ()) if o in held]
            lost_because = (
                f" (the output holds its siblings {kept[:3]}{' ...' if len(kept) > 3 else ''}: members of the "
                "same kind and name pattern, one item each; a target that drops some on purpose, such as frame "
                "subsampling, can xfail this claim with that reason)"
                if kept
                else ""
            )
            for expected in expectations(
                member, spec, sample[member], required=is_required(schema, member, spec)
            ):
                judge.expectation(
                    index,
                    sample["__key__"],
                    expected,
                    output,
                    "dtypes" if dtype_claim else None,
                    lost_because,
                    cooked=run.cooked if run.stage else None,
                    stage=run.stage,
                )
        if index < judge.flow_samples:
            judged.append(index)
    judge.finish(judged if not dtype_claim else (), across=not dtype_claim)
    if judge.transformed and not dtype_claim:
        ctx.details.setdefault("fidelity_transforms", {}).update(judge.transformed)
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
        kinds_seen |= {kind for spec in members.values() for kind in _leaf_kinds(spec)}
        derived = bool(ctx.workspace.dataset)
        has_float = any(
            (isinstance(s, TensorSpec) and s.dtype in FLOAT_DTYPES)
            # derived from a user's samples, float .npy arrays and pickled tensors are cast too
            or (derived and _holds_floats(s))
            for s in members.values()
        )
        float_seen |= has_float
        main = ctx.main_dataset(encoding)
        template = _check_dataset(ctx, claims, members, main, "main", dtype_claim=False, schema=schema)
        checked += len(ctx.raw(main))
        dtypes: tuple[str, ...] = ("bfloat16", "float16")
        if derived and has_float:
            # Only what the user's samples vary varies: data of a dtype they never hold is outside their format
            # (a reader that casts to the model's dtype is right on their data, whatever it would do to other data).
            seen = _float_dtypes(ctx, members)
            dtypes = (
                tuple(d for d in ("bfloat16", "float16", "float32") if d in seen) if len(seen) > 1 else ()
            )
            if not dtypes:
                claims.not_applicable(
                    "dtypes",
                    f"every floating-point value of your samples is {'/'.join(sorted(seen)) or 'of one dtype'}: "
                    "data of another dtype is outside your format, so none is derived",
                )
        if has_float:
            for dtype in dtypes:
                if derived and not any(_castable(spec, dtype) for spec in members.values()):
                    continue  # every floating-point member is of that dtype already
                try:
                    path = ctx.generated(encoding, f"dtype-{dtype}", dtype=dtype, num_samples=16)
                except Inconclusive as error:  # the other claims go on, on the user's own data
                    claims.inconclusive("dtypes", error.reason)
                    continue
                if derived and not _was_cast(path):
                    continue  # nothing of the user's data is of another dtype there (already that dtype)
                _check_dataset(ctx, claims, members, path, dtype, dtype_claim=True, schema=schema)
                checked += len(ctx.raw(path))
        if template is not None:
            if any(isinstance(spec, TextSpec) and m in template for m, spec in members.items()):
                with claims.claim("text") as claim:
                    claim.examined(_edge_cases(ctx, members, template))
            with claims.claim("payloads") as claim:
                # a kind of member whose claim failed already is not judged again (one root cause once)
                said = {name for name in ("tensors", "dtypes", "text") if claims.failed(name)}
                claim.examined(_hypothesis_payloads(ctx, members, template, said))
    for name in ("tensors", "text", "images", "other"):
        if name not in kinds_seen:
            claims.not_applicable(name, f"the data format has no {_NOUN[name]} members")
        else:  # seen, but no output field holds one, and none is required: fidelity/unmatched says so
            claims.not_applicable(
                name, f"no output field holds a {_NOUN[name]} member (see fidelity/unmatched)"
            )
    if not float_seen:
        claims.not_applicable("dtypes", "the data format has no floating-point tensor members")
    if not any(k in kinds_seen for k in ("tensors", "text")):
        claims.not_applicable("payloads", "hypothesis draws tensors and texts; the format has neither")
    claims.not_applicable(
        "transformed", "every member reaches its field as it is or through a recognised transform"
    )
    claims.not_applicable("masks", "no output carries a mask beside token ids or padded embeddings")
    details: dict = {"samples": checked}
    if ctx.details.get("fidelity_transforms"):
        details["transforms"] = ctx.details["fidelity_transforms"]
    return details


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
        output = cook(
            ctx.target, decode_like_target(ctx, sample), sample_index=index, seed=ctx.seed, as_plain=True
        )
        for member in text_members:
            problem = _mismatch(members[member], member, sample[member], output, ctx.transforms)
            if problem:
                raise PropertyFailure(
                    f"caption edge case {text[:40]!r}: sample {sample['__key__']!r}: {problem}"
                )
    return len(EDGE_TEXTS) if text_members else 0


def _hypothesis_payloads(
    ctx: CheckContext, members: dict, template: dict, said: set[str] = frozenset()
) -> int:
    """Cook the template sample with hypothesis-drawn tensor values/dtypes and caption texts (as member
    bytes, decoded by the target's decoder as in production)."""
    texts = st.one_of(
        st.text(st.characters(exclude_categories=("Cs",)), max_size=200),
        st.text(st.characters(exclude_categories=("Cs",)), min_size=1000, max_size=4000),
    )
    counter = {"n": 0}

    @ctx.hypothesis_settings()
    @given(data=st.data())
    def run(data: Any) -> None:
        sample = dict(template)
        for member, spec in members.items():
            if member not in sample:
                continue
            if isinstance(spec, TensorSpec) and spec.dtype in FLOAT_DTYPES:
                # on a user's data, the dtype its samples hold (another dtype is outside their format)
                choices = [spec.dtype] if ctx.workspace.dataset else ["float32", "bfloat16", "float16"]
                dtype = getattr(torch, data.draw(st.sampled_from(choices), label=member))
                seed = data.draw(st.integers(0, 2**31 - 1), label=f"{member} seed")
                scale = data.draw(st.sampled_from([1.0, 1e-30, 1e4, 1e38]), label=f"{member} scale")
                shape = decode_member(spec, sample[member]).shape
                generator = torch.Generator().manual_seed(seed)
                tensor = (torch.randn(shape, generator=generator) * scale).to(dtype)
                sample[member] = _tensor_bytes(tensor)
            elif isinstance(spec, TextSpec):
                sample[member] = data.draw(texts, label=member).encode("utf-8")
        counter["n"] += 1
        # The key and the sample index follow from the drawn payloads, so that hypothesis replaying an example
        # cooks it as the first time (a target drawing from the per-sample seed or the key gets the same draw).
        digest = hashlib.sha256(b"".join(v for v in sample.values() if isinstance(v, bytes))).hexdigest()
        sample["__key__"] = f"{template['__key__']}_drawn{digest[:12]}"
        index = int(digest[12:18], 16)
        output = cook(
            ctx.target, decode_like_target(ctx, sample), sample_index=index, seed=ctx.seed, as_plain=True
        )
        for member, spec in members.items():
            if member in sample and isinstance(spec, (TensorSpec, TextSpec)):
                if claim_of(spec) in said or (isinstance(spec, TensorSpec) and "dtypes" in said):
                    continue
                problem = _mismatch(spec, member, sample[member], output, ctx.transforms)
                if problem:
                    raise PropertyFailure(f"hypothesis payload for sample {sample['__key__']!r}: {problem}")

    run()
    return counter["n"]
