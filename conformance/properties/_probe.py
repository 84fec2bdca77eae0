"""The code-execution probe: does loading a hostile shard through the target, as it is, run code?

A probe dataset holds one clean sample and, for each member the format has plus the extra members a
hostile shard can carry (``payload.pth``, ``payload.pickle``, ``payload.pyd``, ``payload.npy`` holding
objects), one sample in which that member is a pickle whose unpickling runs code. The code only writes a
marker file named after the sample and member, holding the Python stack that unpickled it, so the
verdict can say which member ran, in which sample, and what ran it: the target's decoder (Energon's
``SampleDecoder``, i.e. webdataset's handlers) or the target's own load (``torch.load`` without
``weights_only=True``, ``pickle.loads``, ``np.load(allow_pickle=True)``).

The target's full loading path (decoder, cooker, ``encode_sample``, ``batch``) reads the probe dataset in
a fresh process (``python -m primus_energon.conformance.processes.runner probe``), once in the environment as it is and once with
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, which makes every ``torch.load`` that does not pass
``weights_only=True`` itself unpickle anything (it is commonly set to load old checkpoints). torch reads
that variable at each ``torch.load`` call, so one process serves both runs, one after the other.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pickle
import re
import tarfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from primus_energon.datasets.preparation import prepare_shards, write_dataset_yaml
from primus_energon.energon_compat import DECODES_IN_DATASET, key_in_shard

from ..core.rendering import describe_error

__all__ = [
    "EXTRA_MEMBERS",
    "PROBE_DIR_VARIABLE",
    "ENVIRONMENTS",
    "Finding",
    "build_probe_dataset",
    "hostile_bytes",
    "load_everything",
    "probe_all",
    "read_findings",
    "slug",
]

#: Members a hostile shard can add, whatever the format: each is decoded by unpickling somewhere.
EXTRA_MEMBERS = ("payload.pth", "payload.pickle", "payload.pyd", "payload.npy")
#: Where the payload writes its marker (set by the probe for each run; inherited by worker processes).
PROBE_DIR_VARIABLE = "PRIMUS_CONFORMANCE_PROBE_DIR"
#: The environments the probe loads in: label -> extra environment variables.
ENVIRONMENTS: dict[str, dict[str, str]] = {
    "default": {},
    "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1": {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
}
_PAYLOAD = (
    "import os, traceback\n"
    "_d = os.environ.get({variable!r}) or {fallback!r}\n"
    "os.makedirs(_d, exist_ok=True)\n"
    "with open(os.path.join(_d, {name!r}), 'w') as _f:\n"
    "    _f.write(''.join(traceback.format_stack()))\n"
)
_SEPARATOR = "--"


class _RunsWhenUnpickled:
    """Unpickles to ``exec(code)``: the code writes a marker file and nothing else. A safe reader
    (``torch.load(..., weights_only=True)``, a restricted unpickler) refuses ``builtins.exec``."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (exec, (self.code,))


def hostile_bytes(member: str, marker_name: str, fallback_dir: str) -> bytes:
    """The bytes of a hostile ``member``: a ``torch.save`` archive for ``.pth``/``.pt``, an object array
    for ``.npy``, a plain pickle for anything else; unpickling any of them writes ``marker_name``."""
    code = _PAYLOAD.format(variable=PROBE_DIR_VARIABLE, fallback=fallback_dir, name=marker_name)
    payload = _RunsWhenUnpickled(code)
    extension = member.rsplit(".", 1)[-1].lower()
    buffer = io.BytesIO()
    if extension in ("pth", "pt"):
        torch.save(payload, buffer)
        return buffer.getvalue()
    if extension == "npy":
        array = np.empty(1, dtype=object)
        array[0] = payload
        np.save(buffer, array, allow_pickle=True)
        return buffer.getvalue()
    return pickle.dumps(payload, protocol=2)


def _marker_name(key: str, member: str) -> str:
    # A key may hold "/" (a webdataset key with directories): quoted, the marker is one file name.
    return f"{urllib.parse.quote(key, safe='')}{_SEPARATOR}{member}"


def build_probe_dataset(
    out: Path, clean: list[dict], subflavors: dict[str, Any], members: list[str]
) -> list[tuple[str, str]]:
    """Write the probe dataset into ``out`` from ``clean`` raw samples (at least ``len(members) + 1``):
    sample 0 stays clean, sample ``i + 1`` gets a hostile ``members[i]``. Returns ``(key, member)`` of each
    hostile member."""
    if len(clean) < len(members) + 1:
        raise ValueError(f"the probe needs {len(members) + 1} clean samples, got {len(clean)}")
    out.mkdir(parents=True, exist_ok=True)
    fallback = str(out.parent / f"{out.name}.markers")
    shard = out / "probe-000000.tar"
    poisoned = []
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as tar:
        for index, sample in enumerate(clean[: len(members) + 1]):
            key = key_in_shard(str(sample["__key__"]), sample.get("__shard__"))
            entries = {name: bytes(value) for name, value in sample.items() if not name.startswith("__")}
            if index:
                member = members[index - 1]
                entries[member] = hostile_bytes(member, _marker_name(key, member), fallback)
                poisoned.append((key, member))
            for name, data in entries.items():
                info = tarfile.TarInfo(f"{key}.{name}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    prepare_shards(out, [shard.name], shard_splits=["train"])
    write_dataset_yaml(out, subflavors)
    return poisoned


@dataclass(frozen=True)
class Finding:
    """A hostile member whose code ran."""

    key: str
    member: str
    environment: str
    stack: str

    @property
    def ran_by(self) -> str:
        """What unpickled it, from the stack: ``decoder``, ``target`` (with where) or ``unknown``."""
        return _ran_by(self.stack)[0]

    @property
    def where(self) -> str:
        return _ran_by(self.stack)[1]


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_DECODER_FILES = (
    "webdataset/autodecode.py",
    "webdataset/handlers.py",
    "energon/flavors/webdataset/sample_decoder.py",
)
_LIBRARY_PARTS = (
    "/torch/",
    "/numpy/",
    "/megatron/energon/",
    "/webdataset/",
    "/conformance/",
    "/multiprocessing/",
    "/threading.py",
    "/pickle.py",
    "/runpy.py",
    "<string>",
    "<frozen",
)


def _ran_by(stack: str) -> tuple[str, str]:
    frames = [(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(stack)]
    if any(file.replace("\\", "/").endswith(_DECODER_FILES) for file, _, _ in frames):
        if DECODES_IN_DATASET:
            return "decoder", "the dataset's decoder (the release's auto_decode: webdataset's handlers)"
        return "decoder", "the TaskEncoder's decoder (Energon's SampleDecoder: webdataset's handlers)"
    stdlib = os.path.dirname(os.__file__)
    for file, line, func in reversed(frames):
        normal = file.replace("\\", "/")
        if any(part in normal for part in _LIBRARY_PARTS) or file.startswith(stdlib):
            continue
        return "target", f"the target's own code at {file}:{line} (in {func})"
    return "unknown", "an unidentified caller (see the marker's stack)"


def read_findings(markers: Path, environment: str) -> list[Finding]:
    """The hostile members whose code ran in one probe run (marker files in ``markers``)."""
    findings = []
    for marker in sorted(markers.glob(f"*{_SEPARATOR}*")) if markers.is_dir() else []:
        quoted, _, member = marker.name.partition(_SEPARATOR)
        key = urllib.parse.unquote(quoted)
        findings.append(
            Finding(key, member, environment, marker.read_text(encoding="utf-8", errors="replace"))
        )
    return findings


@contextlib.contextmanager
def environment(variables: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the block (the in-process probe of a target no child can rebuild)."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def load_everything(target: Any, dataset: str | os.PathLike, *, limit: int = 64) -> dict[str, Any]:
    """Read every sample of ``dataset`` through ``target``'s full loading path (validation mode, no
    workers), logging and counting the errors as Energon's default handler would; returns
    ``{"batches", "errors", "reached", "stopped"}``: ``reached`` counts the samples the loading path got to
    (batched or refused), ``stopped`` why loading ended early. Used by the probe child and the in-process
    fallback."""
    from primus_energon.energon_compat import get_val_dataset, short_loader, worker_config

    errors: list[str] = []
    refused = [0]
    stopped = ""

    def record(error: Exception, sample: Any, sources: Any) -> None:
        refused[0] += 1
        if len(errors) < 32:
            errors.append(f"{describe_error(error, 200)}")

    config = worker_config(rank=0, world_size=1, num_workers=0, error_handler=record)
    batches = 0
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            dataset_ = get_val_dataset(
                str(dataset),
                split_part="train",
                worker_config=config,
                batch_size=1,
                task_encoder=target.make_task_encoder(),
            )
            for _ in short_loader(dataset_):
                batches += 1
                if batches >= limit:
                    break
        except Exception as error:  # the target cannot load the probe at all: the markers still tell
            stopped = f"{describe_error(error, 300)}"
    return {"batches": batches, "errors": errors, "reached": batches + refused[0], "stopped": stopped}


def slug(label: str) -> str:
    """A file-name form of an environment label."""
    return "".join(c if c.isalnum() else "_" for c in label)


def probe_all(target: Any, datasets: list[str], markers: Path, out: Path | None = None) -> dict[str, dict]:
    """Load every probe dataset through ``target`` once per environment of :data:`ENVIRONMENTS`, markers
    going to ``markers/<dataset index>/<environment>``; returns ``{"<index>": {label: outcome}}`` and, with
    ``out``, rewrites it there after each run (a run cut short by a timeout leaves the earlier ones)."""
    results: dict[str, dict] = {}
    for index, dataset in enumerate(datasets):
        for label, variables in ENVIRONMENTS.items():
            directory = markers / str(index) / slug(label)
            directory.mkdir(parents=True, exist_ok=True)
            with environment({**variables, PROBE_DIR_VARIABLE: str(directory)}):
                results.setdefault(str(index), {})[label] = load_everything(target, dataset)
            if out is not None:
                out.write_text(json.dumps(results), encoding="utf-8")
    return results


# --- the child half: python -m primus_energon.conformance.processes.runner probe --------------------------------------


def add_child_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--markers", required=True, help="directory the hostile payloads write into")
    parser.add_argument("--out", required=True)


def run_child(target: Any, options: argparse.Namespace) -> None:
    """:func:`probe_all` over every ``--dataset``; writes ``{dataset index: {environment: outcome}}``."""
    probe_all(target, options.dataset, Path(options.markers), Path(options.out))
