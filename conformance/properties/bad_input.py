"""Property 10, bad input and security.

``code_execution`` (always runs, even when the target cannot cook clean data): loading a shard whose
members run code when unpickled, through the target as it is, in a fresh process, in the environment as
it is and with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, runs nothing (:mod:`primus_energon.conformance.properties._probe`).

The other claims: a faulty sample (a required member missing, truncated or garbage bytes, a tensor member
that holds a dict instead, a caption that is not UTF-8) goes through the target's pipeline as in
production (member bytes through its decoder, its cooker, and for a TaskEncoder ``encode_sample`` and
``batch()``) and must end in an error: Energon's handler then logs the sample and counts it. A sample that comes out (a silent default such as zeros), vanishes
through ``SkipSample`` (nothing logged, nothing counted) or hangs is a defect. An error that does not name
the sample is advice: Energon's handler logs the sample's key and shard for every exception anyway.
"""

from __future__ import annotations

import copy
import io
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from megatron.energon import DefaultTaskEncoder, SkipSample

from primus_energon.energon_compat import DECODES_IN_DATASET, SKIP_SAMPLE_TYPES, release_label
from primus_energon.synthetic.schema import (
    BytesSpec,
    ImageSpec,
    JsonSpec,
    NpySpec,
    PickleSpec,
    TensorSpec,
    TextSpec,
)

from ..core.claims import ClaimCheck, ClaimRecorder, Harm, claims_of
from ..core.results import PropertyFailure, PropertySkipped
from ..engine.calls import TargetError, cook, encode, worker_context
from ..engine.context import CheckContext, decode_like_target
from ..oracles.expectations import holds, identical, is_required
from ..processes.children import Child, child_target_args, finish, start_runner, stop
from ._common import MISSING, TimedOut, call_with_timeout, error_names_sample, get_field
from ._probe import ENVIRONMENTS, EXTRA_MEMBERS, build_probe_dataset, probe_all, read_findings, slug

CLAIMS = claims_of(
    "bad_input",
    (
        "code_execution",
        "loading a shard whose members run code when unpickled (.pth, .pickle, .pyd, .npy with objects) runs "
        "nothing, also with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1",
        Harm.SECURITY,
        "never unpickle shard data: decoder = primus_energon.decoding.SafeSampleDecoder() (decodes .pth, "
        ".pickle/.pyd and .npy members without running code); or decoder = None and read each member yourself: "
        ".pth with torch.load(..., weights_only=True) passed explicitly (or primus_energon.read_tensor), pickled "
        "members with primus_energon.safe_loads, .npy with np.load(..., allow_pickle=False)",
        {"always": True},
    ),
    (
        "missing_member",
        "a sample without a required member (or a leaf of a pickled dict) raises an error (no silent default, "
        "no silent skip, no hang)",
        Harm.BAD_INPUT,
        "raise an error when a required member is missing",
    ),
    (
        "corrupt_payload",
        "truncated or garbage member bytes raise an error (no silent default, no silent skip, no hang)",
        Harm.BAD_INPUT,
        "let the decode error propagate (do not catch it and fill in a default)",
    ),
    (
        "wrong_type",
        "a tensor member that holds something else (a dict with the tensor inside) raises an error",
        Harm.BAD_INPUT,
        "check that what was read is a tensor (isinstance) and raise TypeError otherwise",
    ),
    (
        "not_utf8",
        "a caption that is not UTF-8 raises an error (no replacement characters, no silent skip)",
        Harm.BAD_INPUT,
        "decode with bytes.decode('utf-8') (strict), not errors='replace'/'ignore'",
    ),
    (
        "names_sample",
        "the error raised for a faulty sample names it (its __key__)",
        Harm.ADVICE,
        "put the sample's __key__ (and member) in the message; Energon's handler also logs key and shard",
    ),
)

#: Members a reference format may lack: the preencoded caption (Primus' encoded pipeline writes none).
OPTIONAL_MEMBERS = {("preencoded", "caption.txt")}
#: mutation label -> claim ("non_finite": reported in the details, never a verdict)
_CLAIM_OF = {
    "missing": "missing_member",
    "truncated": "corrupt_payload",
    "garbage bytes": "corrupt_payload",
    "garbage after its header": "corrupt_payload",
    "a dict instead of a tensor": "wrong_type",
    "not UTF-8": "not_utf8",
    "NaN values": "non_finite",
    "Inf values": "non_finite",
}


def _not_a_tensor(value: bytes) -> bytes:
    """A ``.pth`` that holds a dict with the tensor inside instead of the tensor (a saved state: a step
    counter first, then the tensor): a member of the wrong type that every tensor reader decodes without
    complaint, and that a reader coercing it to "the first tensor in it" turns into the wrong data."""
    from ..oracles.expectations import decode_member

    buffer = io.BytesIO()
    torch.save({"step": torch.tensor([7]), "tensor": decode_member(TensorSpec(()), value)}, buffer)
    return buffer.getvalue()


def _non_finite(value: bytes, fill: float) -> bytes:
    """The same tensor with every fourth value replaced by ``fill`` (a valid file, finite elsewhere)."""
    import torch

    from ..oracles.expectations import decode_member

    tensor = decode_member(TensorSpec(()), value).clone()
    tensor.view(-1)[::4] = fill
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()


def _mutations(spec: Any, value: Any) -> Iterator[tuple[str, str, Any]]:
    """``(label, stage, bad value)``; stage "bytes" mutates the member bytes before the target's decoder,
    stage "value" removes the member after it."""
    yield "missing", "value", None
    if not isinstance(value, (bytes, bytearray)):
        return
    if isinstance(spec, TextSpec):
        yield "not UTF-8", "bytes", b"caption \xff\xfe\xfd not utf-8"
    elif isinstance(spec, (TensorSpec, ImageSpec, NpySpec, PickleSpec, JsonSpec)):
        yield "truncated", "bytes", bytes(value[: len(value) // 2])
        yield "garbage bytes", "bytes", b"\x00garbage\xff" * 8
        if not isinstance(spec, JsonSpec) and len(value) >= 64:
            # the container's own header (a JPEG's SOI marker, the .npy header, the zip's first entry),
            # then garbage: a reader that trusts the signature gets as far as the payload
            yield "garbage after its header", "bytes", bytes(value[:32]) + b"\x00garbage\xff" * 8
    elif isinstance(spec, BytesSpec) and spec.dtype is not None and len(value) > 1:
        # raw tensor bytes have no header: a cut-short member decodes to a shorter tensor unless checked
        yield "truncated", "bytes", bytes(value[: len(value) // 2])
    if isinstance(spec, TensorSpec):
        yield "a dict instead of a tensor", "bytes", _not_a_tensor(bytes(value))
        if spec.dtype in ("float32", "bfloat16", "float16", "float64"):
            yield "NaN values", "bytes", _non_finite(bytes(value), float("nan"))
            yield "Inf values", "bytes", _non_finite(bytes(value), float("inf"))
    if isinstance(spec, PickleSpec) and spec.structure == "dict":
        from primus_energon.safepickle import safe_loads
        from primus_energon.synthetic.payloads import pickle_bytes

        structure = safe_loads(bytes(value))
        for leaf in spec.leaves:
            if isinstance(structure, dict) and leaf in structure:
                rest = {k: v for k, v in structure.items() if k != leaf}
                yield f"leaf {leaf!r} missing", "bytes", pickle_bytes(rest, spec.protocol)


@dataclass
class Delivered:
    """A faulty sample that came through the pipeline: as cooked (and encoded), the clean companion it
    was batched with, and the batch."""

    faulty: Any
    clean: Any
    batch: Any


class _StacksOnlyWithItsKind(Exception):
    """The faulty sample was encoded, and failed to batch only beside a clean sample of another shape."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _outcome(
    ctx: CheckContext, template: dict, sample: dict, stage: str, member: str, bad: Any
) -> tuple[str, Any]:
    """Run one faulty sample through the target's pipeline as in production: member bytes through the
    target's decoder, its cooker, and for a TaskEncoder ``encode_sample`` and ``batch()`` (beside a clean
    sample, so that a value that stacks can). ``("error", exception)`` when some stage raised,
    ``("decoder", exception)`` when the decoder refused it, ``("skip", None)``, ``("hang", None)`` or
    ``("output", value)`` when it came out."""
    sample = dict(sample)
    if stage == "bytes":
        sample[member] = bad
    try:
        decoded = decode_like_target(ctx, sample)
    except Exception as error:  # the decoder refused it: Energon logs and counts the sample
        return "decoder", error
    if stage == "value":
        decoded.pop(member, None)

    def encoded(crude: dict, *, clean: bool) -> Any:
        output = cook(ctx.target, crude, seed=ctx.seed, clean=clean)
        task_encoder = ctx.cached("task-encoder", ctx.target.make_task_encoder)
        outputs = encode(task_encoder, output, seed=ctx.seed)
        if not outputs:  # a generator that yields nothing drops the sample as SkipSample does
            raise SkipSample()
        return outputs[0]

    def pipeline() -> Any:
        if ctx.target.kind != "task_encoder":
            # A cooker's output goes on to Energon's default batch() (what a TaskEncoder without one of
            # its own does): a wrong kind of object fails there, loudly, as it would in training.
            faulty = cook(ctx.target, decoded, seed=ctx.seed, clean=False)
            companion = cook(ctx.target, decode_like_target(ctx, template), seed=ctx.seed)
            with worker_context(ctx.seed, 0):
                batch = DefaultTaskEncoder().batch([faulty, companion])
            return Delivered(faulty, companion, batch)
        faulty = encoded(decoded, clean=False)
        companion = encoded(decode_like_target(ctx, template), clean=True)
        task_encoder = ctx.cached("task-encoder", ctx.target.make_task_encoder)
        with worker_context(ctx.seed, 0):
            try:
                return Delivered(faulty, companion, task_encoder.batch([faulty, companion]))
            except Exception as error:
                # A default whose shape differs from the suite's small data (DFM's zero CLIP embedding is
                # [768]) fails to stack beside a clean sample here, but not in a run on full-sized data:
                # the faulty sample batched with its own kind shows whether the failure was only that.
                try:
                    task_encoder.batch([faulty, copy.deepcopy(faulty)])
                except Exception:
                    raise error from None
                raise _StacksOnlyWithItsKind(error) from error

    try:
        return "output", call_with_timeout(pipeline, ctx.call_timeout_s)
    except _StacksOnlyWithItsKind as only:
        return "output-shape", only.error
    except TimedOut:
        return "hang", None
    except SKIP_SAMPLE_TYPES:
        return "skip", None
    except TargetError:
        raise  # the clean companion sample failed: not this claim's finding
    except Exception as error:
        return "error", error


def _judge(
    ctx: CheckContext,
    claims: ClaimRecorder,
    label: str,
    what: str,
    key: str,
    kind: str,
    value: Any,
    filtered: dict[str, int],
    non_finite: dict[str, str],
    fault: Fault | None = None,
) -> None:
    if _CLAIM_OF.get(label) == "non_finite":
        # NaN/Inf values are valid data of a bad sample: refusing them, filtering them (SkipSample, as NeMo
        # and DFM do) or leaving them to the training loop are choices, so nothing fails; the report says
        # which was made and counts what was filtered
        outcome = {"skip": "filtered (SkipSample)", "error": "refused (an error)"}.get(kind, "batched")
        non_finite[what] = outcome
        if kind == "skip":
            filtered[label] = filtered.get(label, 0) + 1
        return
    with claims.claim(_CLAIM_OF.get(label, "missing_member")) as claim:  # "leaf 'x' missing"
        claim.examined()
        if kind == "hang":
            claim.problem(
                f"{what}: the target hung on sample {key!r} (no result after {ctx.call_timeout_s:.0f} s)"
            )
        elif kind == "skip":
            claim.problem(
                f"{what}: the target raised SkipSample for {key!r}, so the faulty sample vanishes with nothing "
                "logged or counted; raise an error instead (Energon logs and counts it)"
            )
        elif kind == "output":
            harm = _harm(value, fault)
            if harm is not None:
                where = "in a batch" if ctx.target.kind == "task_encoder" else "cooked and batched"
                claim.problem(f"{what}: sample {key!r} came out {where} instead of raising an error: {harm}")
        elif kind == "output-shape":
            claim.problem(
                f"{what}: sample {key!r} was cooked and encoded into a sample instead of raising an error. It "
                "failed to batch beside a clean sample of the suite's small data only because its shape differs "
                f"({type(value).__name__}: {' '.join(str(value).split())[:160]}); batched with samples of its own "
                "shape it goes through, so beside data of that shape (a fixed-size default, or bytes read as "
                "a tensor whatever they hold) it trains"
            )
    if kind == "error":
        with claims.claim("names_sample") as claim:
            claim.examined()
            if not error_names_sample(value, key):
                claim.problem(
                    f"{what}: the error does not name the sample {key!r}: {type(value).__name__}: "
                    f"{' '.join(str(value).split())[:200]}"
                )


@dataclass
class Fault:
    """What was done to a member, for judging what came out: its name, its spec, the clean member's bytes
    and the bad value put in its place (None: removed)."""

    member: str
    spec: Any
    clean: bytes
    bad: Any


def _harm(delivered: Delivered, fault: Fault | None) -> str | None:
    """Why a faulty sample that came out is bad input turned into training data, or None when it is not:
    the fields that hold the member in the clean sample hold, in the faulty one, a value of another kind
    (None, a dict: the next tensor or text operation fails loudly) or the true data itself (a ``.pth``
    dict unwrapped to the tensor it holds). A value of the same kind that is not the data (zeros, a
    default, a coerced tensor, replacement characters) is the defect; so is a field no clean value could
    be followed into."""
    from ..oracles.expectations import decode_member, expectations, locate

    if fault is None:
        return "a silent default"
    dropped = _dropped_by_batch(delivered)
    if dropped:
        return dropped
    try:
        expected = list(expectations(fault.member, fault.spec, fault.clean, required=True))
    except Exception:
        return "a silent default"
    holders = [name for e in expected if (name := locate(e, delivered.clean)[0]) is not None]
    if not holders:
        if _same_data(delivered.faulty, delivered.clean):
            return None  # the faulty member changed nothing that trains (passed on, then dropped)
        return "a silent default (no field of the clean sample could be followed to the member)"
    truth = None
    if isinstance(fault.spec, TensorSpec):
        try:
            truth = decode_member(fault.spec, fault.clean)
        except Exception:
            truth = None
    for name in dict.fromkeys(holders):
        clean_value = get_field(delivered.clean, name)
        faulty_value = get_field(delivered.faulty, name)
        if faulty_value is MISSING or faulty_value is None:
            continue  # nothing in its place: the first operation on it fails
        if isinstance(fault.bad, (bytes, bytearray)) and isinstance(faulty_value, (bytes, bytearray)):
            if bytes(faulty_value) == bytes(fault.bad):
                continue  # passed on as read: the stage that decodes it is where it fails
        same_kind = (isinstance(clean_value, torch.Tensor) and isinstance(faulty_value, torch.Tensor)) or (
            isinstance(clean_value, str) and isinstance(faulty_value, str)
        )
        if not same_kind:
            continue  # the wrong kind of object: loud at the first tensor or text operation
        if (
            isinstance(truth, torch.Tensor)
            and isinstance(faulty_value, torch.Tensor)
            and identical(faulty_value, truth)
        ):
            continue  # the true data, unwrapped
        described = (
            f"a {str(faulty_value.dtype).removeprefix('torch.')} tensor of shape {list(faulty_value.shape)}"
            if isinstance(faulty_value, torch.Tensor)
            else f"the text {faulty_value[:40]!r}"
        )
        return f"field {name!r} holds {described}, plausible data the shard never had (a silent default)"
    return None


def _dropped_by_batch(delivered: Delivered) -> str | None:
    """A batch of the faulty sample and its clean companion (the same sample, one member changed) that
    holds the companion and not the faulty sample: batch() left it out without an error, so nothing is
    logged or counted (a silent skip). Told by the data first: the faulty sample's own payloads (those
    that differ from the companion's) in the batch, or the payloads both share occurring once; the
    keys only where the batch carries them whole in a list of keys."""
    from ..oracles.payloads import KEY, identity, trace

    faulty, clean = trace([delivered.faulty, delivered.clean], delivered.batch, ["faulty", "clean"]).samples
    message = "batch() left it out of the batch without an error: a silent skip that nothing logs or counts"
    clean_values = {identity(p) for path, p in clean.payloads.items() if path != KEY}
    # the faulty sample's own payloads: values the companion does not have (a dict's inner tensor that
    # equals the clean tensor is no evidence that the faulty sample is in the batch)
    own = [path for path, p in faulty.payloads.items() if path != KEY and identity(p) not in clean_values]
    if any(faulty.places[path] for path in own):
        return None  # the faulty sample is in the batch (what it holds there is judged next)
    shared = [
        path
        for path, places in clean.places.items()
        if path != KEY and places and path in faulty.places and faulty.places[path] == places
    ]
    if shared:
        return message if all(len(clean.places[path]) == 1 for path in shared) else None
    whole = [p for p in clean.places.get(KEY, []) if p.how == "equal text"]
    if whole and not faulty.places.get(KEY):
        return message
    return None


def _same_data(a: Any, b: Any) -> bool:
    """Whether two outputs carry the same payloads (tensors and texts, keys left out) at the same paths."""
    from ..oracles.payloads import identity, payloads

    def data(output: Any) -> list[tuple[str, Any]]:
        return sorted((p.path, identity(p)) for p in payloads(output))

    return data(a) == data(b)


def _depends_on(ctx: CheckContext, template: dict, member: str) -> bool:
    """Whether the target's output depends on ``member`` (told by behaviour, where its value could not be
    found in the output): without it, the pipeline raises, skips, hangs, or puts out other data."""
    # The same key with and without the member: a target whose output depends on the key (a seed drawn
    # from it) gives the same output for both when the member is not used.
    sample = {**template, "__key__": f"{template['__key__']}_without"}
    kind, without = _outcome(ctx, template, sample, "value", member, None)
    if kind != "output":
        return True
    kind, with_it = _outcome(ctx, template, sample, "bytes", member, template[member])
    if kind != "output":
        return True  # the clean sample itself does not come out under this key: cannot tell, so used

    return not _same_data(without.faulty, with_it.faulty)


def _clean_output(ctx: CheckContext, template: dict) -> Any:
    """The target's output for the clean template sample (which members it uses): cooked, and for a
    TaskEncoder encoded as its pipeline does (a member its cooker passes on and ``encode_sample`` drops,
    such as a provenance record, is not used); None when it cannot be had in time (then every member is
    treated as used; the accepted and fidelity claims say why)."""

    def output() -> Any:
        cooked = cook(ctx.target, decode_like_target(ctx, template), seed=ctx.seed)
        if ctx.target.kind != "task_encoder":
            return cooked
        task_encoder = ctx.cached("task-encoder", ctx.target.make_task_encoder)
        encoded = encode(task_encoder, cooked, seed=ctx.seed)
        return encoded[0] if encoded else cooked

    try:
        return call_with_timeout(output, ctx.call_timeout_s)
    except Exception:
        return None


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    details: dict[str, Any] = {}
    # The probe's fresh process (started ahead, see prestart) runs while the faults are tried here; its
    # claim is judged when both are done.
    probe = ctx.started("bad_input", lambda: prestart(ctx))
    if not claims.only_always:  # blocked (the target cannot cook clean data): only the probe runs
        _faults(ctx, claims, details)
    with claims.claim("code_execution") as claim:
        details["probe"] = probe.judge(claim)
    return details


def _faults(ctx: CheckContext, claims: ClaimRecorder, details: dict[str, Any]) -> None:
    """Every fault of every member, cooked and encoded as the target does; the verdicts go to their claims."""
    checked = []
    opaque: list[str] = []  # members of bytes the suite cannot read
    filtered: dict[str, int] = {}
    non_finite: dict[str, str] = {}
    details["filtered"] = filtered  # faulty samples the target dropped with SkipSample on purpose, by cause
    details["non_finite"] = non_finite  # what the target did with NaN/Inf tensors
    for encoding in ctx.encodings():
        schema = ctx.workspace.schema(encoding)
        raw = ctx.raw(ctx.main_dataset(encoding), limit=1)
        if not raw:
            for name in set(_CLAIM_OF.values()) - {"non_finite"}:
                with claims.claim(name) as claim:
                    claim.nothing_because(ctx.unreadable() or "the dataset has no samples")
            continue
        template = raw[0]
        clean = _clean_output(ctx, template)
        for member, spec in schema.members.items():
            if member not in template:
                continue
            unused = clean is not None and not holds(clean, member, spec, template[member])
            if unused and not is_required(schema, member, spec):
                # Not found by value (it may be transformed: rearranged, padded, cast): used when the
                # output changes, or the pipeline stops, without it.
                unused = not _depends_on(ctx, template, member)
            if not is_required(schema, member, spec) and unused:
                # the target does not use this member (a provenance sidecar): its faults cannot reach training
                details.setdefault("members_not_used", []).append(member)
                continue
            if isinstance(spec, BytesSpec) and spec.dtype is None:
                opaque.append(member)  # no fault of its content is known to be wrong (see below)
            for label, stage, bad in _mutations(spec, template[member]):
                if label == "missing" and (schema.encoding, member) in OPTIONAL_MEMBERS:
                    continue
                what = f"member {member!r}: {label}"
                # Each faulty sample has a key of its own, as in a real shard (a cache keyed by __key__
                # must not turn this into a purity verdict).
                sample = {**template, "__key__": f"{template['__key__']}_fault{len(checked):02d}"}
                kind, value = _outcome(ctx, template, sample, stage, member, bad)
                fault = Fault(member, spec, bytes(template[member]), bad if stage == "bytes" else None)
                _judge(ctx, claims, label, what, sample["__key__"], kind, value, filtered, non_finite, fault)
                checked.append(what)
    if opaque:
        # Bytes the suite cannot read (no signature it knows, nothing decodes them) may be any custom
        # encoding: a truncated or garbled copy may be valid data of it, so no fault of their content can
        # be judged. That is a limit of the suite, not a pass.
        claims.inconclusive(
            "corrupt_payload",
            f"member(s) {sorted(set(opaque))} hold bytes the suite cannot read (no known signature; nothing "
            "decodes them), so it cannot make a fault of their content that is known to be corrupt; describe "
            "them with --conformance-schema (e.g. kind: bytes, dtype: bfloat16, shape: [...]) to have them "
            "checked",
        )
    if details.get("members_not_used"):
        claims.not_applicable(
            "missing_member",
            f"the target uses none of the members {details['members_not_used']} (its output is the same "
            "without each of them), so no fault of theirs can reach training",
        )
    for name in ("not_utf8", "corrupt_payload", "wrong_type"):
        claims.not_applicable(name, "the data format has no member of this kind")
    claims.not_applicable("names_sample", "no faulty sample raised an error whose message could be read")
    details["faults"] = checked


# --- the code-execution probe ---------------------------------------------------------------------------


def _probe_dataset(ctx: CheckContext, encoding: str | None) -> tuple[Path, list[tuple[str, str]]]:
    schema = ctx.workspace.schema(encoding)
    members = [m for m in schema.members] + [m for m in EXTRA_MEMBERS if m not in schema.members]
    # The probe only loads (decoder, cooker): whether the target cooks the derived copies does not matter
    # to what it asks, so the dataset is not tried on the target first (ctx.generated would).
    base = ctx.workspace.generated(
        encoding, "probe", num_samples=len(members) + 1, shard_size=len(members) + 1
    )
    out = ctx.workspace.root / f"{base.name}-hostile"
    poisoned_file = out / "poisoned.json"
    if poisoned_file.exists():
        return out, [tuple(p) for p in json.loads(poisoned_file.read_text())]
    poisoned = build_probe_dataset(out, ctx.raw(base), ctx.workspace.subflavors(base), members)
    poisoned_file.write_text(json.dumps(poisoned))
    return out, poisoned


def prestart(ctx: CheckContext) -> _Probe:
    """Build the probe datasets and start the probe's fresh process."""
    return _Probe(ctx)


class _Probe:
    """The code-execution probe: hostile probe datasets loaded through the target in a fresh process
    (:func:`primus_energon.conformance.properties._probe.probe_all`), started when made and ended by :meth:`close`; in
    this process instead, at :meth:`judge`, when the target cannot be rebuilt in another."""

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.child: Child | None = None
        self.probes = [_probe_dataset(ctx, encoding) for encoding in ctx.encodings()]
        self.tmp = Path(tempfile.mkdtemp(prefix="conformance-probe-"))
        self.markers, self.out = self.tmp / "markers", self.tmp / "probe.json"
        # where a payload writes when the probe's variable did not reach its process
        self.fallbacks = [path.parent / f"{path.name}.markers" for path, _ in self.probes]
        for fallback in self.fallbacks:
            shutil.rmtree(fallback, ignore_errors=True)
        self.datasets = [str(path) for path, _ in self.probes]
        try:
            self.args: list[str] | None = child_target_args(ctx.target)
        except PropertySkipped:
            self.args = None
        if self.args is not None:
            datasets_args = [arg for dataset in self.datasets for arg in ("--dataset", dataset)]
            self.child = start_runner(
                "probe",
                [*self.args, *datasets_args, "--markers", str(self.markers), "--out", str(self.out)],
                servers=ctx.fork_servers,
            )

    def close(self) -> None:
        if self.child is not None:
            stop(self.child)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _outcomes(self) -> dict[str, Any]:
        """``{dataset index: {environment: outcome}}``; ``{"incomplete": why}`` joins what finished when
        the probe did not."""
        ctx = self.ctx
        if self.child is None:
            try:
                found = call_with_timeout(
                    lambda: probe_all(ctx.target, self.datasets, self.markers, self.out), ctx.timeout_s
                )
                return {**found, "process": "in-process (the target cannot be rebuilt in a fresh process)"}
            except TimedOut:
                return {**_partial(self.out), "incomplete": f"loading hung for {ctx.timeout_s:.0f} s"}
        try:
            finish(self.child, what="the probe process", reproduce="", timeout=ctx.timeout_s)
        except PropertyFailure as failure:  # hung (killed) or crashed: the runs that finished still count
            return {**_partial(self.out), "incomplete": failure.message}
        return _partial(self.out)

    def judge(self, claim: ClaimCheck) -> dict:
        """Wait for the probe and report every hostile member whose code ran."""
        ctx = self.ctx
        outcomes = self._outcomes()
        runs = []
        every: list[tuple[str, Any]] = []
        for index, ((path, poisoned), fallback) in enumerate(zip(self.probes, self.fallbacks, strict=True)):
            done = outcomes.get(str(index), {})
            findings = [
                f
                for label in ENVIRONMENTS
                for f in read_findings(self.markers / str(index) / slug(label), label)
            ]
            every += [(path.name, f) for f in findings + read_findings(fallback, "default")]
            for label in ENVIRONMENTS:
                outcome = done.get(label) or {
                    "incomplete": outcomes.get("incomplete", "the probe did not get to it")
                }
                if outcome.get("incomplete"):
                    claim.problem(
                        f"the probe could not finish loading the hostile shard through {ctx.target.describe()} "
                        f"({label} environment): {outcome['incomplete']}; code execution is not ruled out"
                    )
                elif outcome.get("reached"):
                    claim.examined(len(poisoned))
            runs.append({"dataset": path.name, "members": sorted({m for _, m in poisoned}), "outcomes": done})
        _report(ctx, claim, every)
        if not claim.count and not claim.problems:
            stopped = "; ".join(
                dict.fromkeys(o.get("stopped", "") for r in runs for o in r["outcomes"].values())
            )
            raise PropertySkipped(
                f"the target's loader stops before it reaches any sample ({stopped or 'no sample was loaded'}), "
                "so no member reached a decoder or a cooker; fix what accepted reports first"
            )
        return {"runs": runs, "process": outcomes.get("process", "a fresh process")}


def _partial(out: Path) -> dict[str, Any]:
    try:
        return json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _report(ctx: CheckContext, claim: ClaimCheck, findings: list[tuple[str, Any]]) -> None:
    """One problem per cause (what unpickled, in which environments), over every probe dataset, naming
    every member, sample and dataset."""
    by_member: dict[tuple[str, str, str], list] = {}
    for dataset, finding in findings:
        by_member.setdefault((dataset, finding.key, finding.member), []).append(finding)
    by_cause: dict[tuple[str, str, bool], list[str]] = {}
    extra: set[str] = set()
    for (dataset, key, member), found in sorted(by_member.items()):
        if member in EXTRA_MEMBERS:
            extra.add(member)
        environments = sorted({f.environment for f in found})
        only_forced = environments == ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1"]
        cause = (found[0].ran_by, found[0].where, only_forced, len(environments) > 1)
        by_cause.setdefault(cause, []).append(f"{member!r} (sample {key!r} of {dataset})")
    for (ran_by, where, only_forced, both), members in by_cause.items():
        if only_forced:
            when = "only with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1, i.e. a torch.load without an explicit weights_only=True"
        else:
            when = "in the default environment" + (
                " and with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1" if both else ""
            )
        if ran_by == "decoder" and DECODES_IN_DATASET:
            fix = (
                f"{release_label()} decodes members in the dataset (auto_decode=True by default: webdataset's "
                "decoder gives .pth to torch.load with weights_only off and .pickle/.pyd to pickle.loads). Pass "
                "auto_decode=False to get_train_dataset/get_val_dataset and read members in the cooker with "
                "torch.load(..., weights_only=True) or primus_energon.read_tensor (or give the TaskEncoder "
                "`decoder = None` and build loaders with primus_energon.get_loader, which does that)"
            )
        elif ran_by == "decoder":
            fix = (
                "set `decoder = None` and read members in the cooker with torch.load(..., weights_only=True) or "
                "primus_energon.read_tensor, or use primus_energon.decoding.SafeSampleDecoder: Energon's "
                "SampleDecoder gives .pth to torch.load with weights_only off and .pickle/.pyd to pickle.loads"
            )
        elif only_forced:
            fix = "pass weights_only=True explicitly to torch.load (the environment variable cannot override that)"
        else:
            fix = (
                "never unpickle shard data (pickle.loads, np.load(allow_pickle=True), torch.load(weights_only=False)); "
                "read tensors with torch.load(..., weights_only=True) or primus_energon.read_tensor"
            )
        noun = "member" if len(members) == 1 else f"{len(members)} members"
        shown = members[:6] + ([f"{len(members) - 6} more"] if len(members) > 6 else [])
        note = (
            f" ({', '.join(repr(m) for m in sorted(extra))} {'is a member' if len(extra) == 1 else 'are members'} the probe adds to the format's own: a "
            "shard may hold any member, and a decoder that decodes every member by its extension runs it "
            "whether the cooker reads it or not)"
            if extra and ran_by == "decoder"
            else ""
        )
        claim.problem(
            f"{noun} {', '.join(shown)} ran code from the shard when {where} unpickled "
            f"{'it' if len(members) == 1 else 'them'}, {when}{note}. Fix: {fix}"
        )
