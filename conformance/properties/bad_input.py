"""Property 10, bad input and security: a faulty sample (a required member missing, truncated or garbage
bytes, a value of the wrong type, a caption that is not UTF-8) makes the target raise an error that names
the sample, never hang, skip silently or fill in a default such as zeros; a payload whose unpickling would
run code is refused and nothing runs, through the bare cooker and through the full loading path."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from megatron.energon import SkipSample

from synthetic import ImageSpec, Schema, TensorSpec, TextSpec
from synthetic.manifest import Manifest

from ..context import CheckContext
from ..data import read_crude
from ..execution import build_loader, closing, cook
from ._common import TimedOut, call_with_timeout, error_names_sample, fail

#: Members a reference format may lack: the preencoded caption (Primus' encoded pipeline writes none).
OPTIONAL_MEMBERS = {("preencoded", "caption.txt")}
COOK_TIMEOUT_S = 30.0


def _mutations(member: str, spec: Any, value: Any, decoded: bool) -> Iterator[tuple[str, Any]]:
    yield "missing", None
    yield "wrong type (an int)", 12345
    if decoded or not isinstance(value, (bytes, bytearray)):
        return
    if isinstance(spec, TextSpec):
        yield "not UTF-8", b"caption \xff\xfe\xfd not utf-8"
        return
    if isinstance(spec, (TensorSpec, ImageSpec)):
        yield "truncated", bytes(value[: len(value) // 2])
        yield "garbage bytes", b"\x00garbage\xff" * 8


def _bad_samples(ctx: CheckContext, encoding: str | None, crude: list[dict]) -> Iterator[tuple[str, dict]]:
    schema = ctx.workspace.schema(encoding)
    decoded = ctx.target.wants_decoded
    template = crude[0]
    for member, spec in schema.members.items():
        if member not in template:
            continue
        for label, bad in _mutations(member, spec, template[member], decoded):
            if label == "missing" and (schema.encoding, member) in OPTIONAL_MEMBERS:
                continue
            sample = copy.deepcopy(template)
            if bad is None:
                del sample[member]
            else:
                sample[member] = bad
            yield f"member {member!r} {label}", sample


def _expect_error(ctx: CheckContext, what: str, sample: dict) -> None:
    key = sample["__key__"]
    try:
        output = call_with_timeout(lambda: cook(ctx.target, sample, seed=ctx.seed), COOK_TIMEOUT_S)
    except TimedOut:
        fail(
            f"{what}: cooking sample {key!r} hung (no result after {COOK_TIMEOUT_S:.0f} s)",
            ctx.reproduce("bad_input"),
        )
    except SkipSample:
        fail(
            f"{what}: the cooker raised SkipSample for {key!r}, so the bad sample would vanish silently; raise an "
            "error that names the sample instead (Energon logs and counts it)",
            ctx.reproduce("bad_input"),
        )
    except Exception as error:
        if not error_names_sample(error, key):
            fail(
                f"{what}: the error does not name the sample {key!r}: {type(error).__name__}: {str(error)[:300]}. "
                "Put the sample's __key__ (and its shard) in the message",
                ctx.reproduce("bad_input"),
            )
        return
    fail(
        f"{what}: cooking sample {key!r} succeeded (output {type(output).__name__}) instead of raising: a faulty "
        "sample must not become a training sample with a silent default",
        ctx.reproduce("bad_input"),
    )


def _malicious(ctx: CheckContext, encoding: str | None) -> dict:
    schema = ctx.workspace.schema(encoding)
    if not any(isinstance(spec, TensorSpec) for spec in schema.members.values()):
        # A format without tensor members (raw images) still meets .pth members in the wild; the decoder
        # of the loading path must leave them alone too.
        members = {**schema.members, "payload.pth": TensorSpec((4,), "float32")}
        schema = Schema(encoding=schema.encoding, members=members, subflavors=schema.subflavors)
    path = ctx.workspace.generated(
        encoding, "malicious", schema=schema, num_samples=8, shard_size=4, faults={"malicious-pickle": 1}
    )
    manifest = Manifest.load(path)
    marker = Path(manifest.marker_path)
    (fault,) = [f for f in manifest.faults if f.kind == "malicious-pickle"]
    marker.unlink(missing_ok=True)
    (sample,) = [s for s in read_crude(path) if s["__key__"] == fault.key]
    if ctx.target.input_form == "bytes":
        try:
            cook(ctx.target, sample, seed=ctx.seed)
        except Exception:
            pass
        if marker.exists():
            fail(
                f"the bare cooker unpickled the code-running payload in member {fault.member!r} of sample "
                f"{fault.key!r}: the marker file {str(marker)!r} appeared. Load tensors with "
                "torch.load(..., weights_only=True) or primus_energon.load_tensor",
                ctx.reproduce("bad_input"),
            )
    try:
        with closing(
            build_loader(ctx.target, path, batch_size=1, num_workers=0, mode="val", on_error="skip")
        ) as loader:
            for _ in loader:
                pass
    except Exception:
        pass
    if marker.exists():
        fail(
            f"loading the shard through {ctx.target.describe()} ran the code in member {fault.member!r} of sample "
            f"{fault.key!r} (the marker file {str(marker)!r} appeared). Energon's default SampleDecoder unpickles "
            ".pth members with full unpickling (weights_only off): set `decoder = None` (decode in the cooker with "
            "weights_only=True) or use primus_energon.decoding.SafeSampleDecoder",
            ctx.reproduce("bad_input"),
        )
    return {"malicious_member": fault.member}


def check(ctx: CheckContext) -> dict:
    checked = []
    for encoding in ctx.encodings():
        crude = read_crude(ctx.main_dataset(encoding), decoded=ctx.target.wants_decoded)
        for what, sample in _bad_samples(ctx, encoding, crude):
            _expect_error(ctx, what, sample)
            checked.append(what)
        _malicious(ctx, encoding)
    return {"faults": checked}
