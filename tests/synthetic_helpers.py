"""Shared pieces of the synthetic-generator tests: tiny shapes, a dataset cache, a real Energon reader, a
reference checker that reports faults, and assertion helpers whose messages name key, member and values."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from primus_energon.synthetic import Manifest, Schema, generate_dataset
from primus_energon.synthetic.schema import FLOAT_DTYPES, TensorSpec, TextSpec

REPO = Path(__file__).resolve().parents[1]
#: tiny preencoded shapes: a test dataset costs milliseconds
SMALL = {"latents": (4, 8, 8), "prompt_embeds": (7, 16), "pooled_prompt_embeds": (16,)}

_CACHE: dict[str, tuple[Path, Manifest]] = {}


def cached_dataset(tmp_path_factory: Any, name: str, **kwargs: Any) -> tuple[Path, Manifest]:
    """Generate dataset `name` once per test process (session fixtures of several modules share it)."""
    if name not in _CACHE:
        path = tmp_path_factory.mktemp("synth") / name
        _CACHE[name] = (path, generate_dataset(path, **kwargs))
    return _CACHE[name]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- reading through Energon -------------------------------------------------------------------------------------
@dataclass
class Loaded:
    """What Energon yielded: crude samples in order, and the exception that ended iteration, if any."""

    samples: list[dict[str, Any]] = field(default_factory=list)
    error: BaseException | None = None

    def keys(self) -> list[str]:
        return [s["__key__"] for s in self.samples]


def _make_task_encoder() -> Any:
    from megatron.energon import Cooker, DefaultTaskEncoder, stateless

    @stateless
    def cook_crude(crude: dict) -> dict:
        # bytes in, bytes out: decoder = None, so nothing is unpickled or decoded here
        from primus_energon.energon_compat import key_in_shard

        out = {k: v for k, v in crude.items() if not k.startswith("__")}
        sources = crude.get("__sources__") or ()
        out["__shard__"] = sources[0].shard_name if sources else None
        # the key as the manifest has it: Energon 7.0-7.2 put "<shard>/" in front of it
        out["__key__"] = key_in_shard(crude["__key__"], out["__shard__"])
        out["__subflavors__"] = dict(crude.get("__subflavors__") or {})
        return out

    class CrudeTaskEncoder(DefaultTaskEncoder):
        decoder = None
        cookers = [Cooker(cook_crude)]

        def batch(self, samples: list) -> list:
            return samples

    return CrudeTaskEncoder()


def load_with_energon(path: Path | str, split: str = "train") -> Loaded:
    """One sequential pass over `split` with `get_val_dataset` + `get_loader`, ``decoder = None``."""
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    out = Loaded()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = get_val_dataset(
            str(path),
            split_part=split,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            batch_size=1,
            task_encoder=_make_task_encoder(),
        )
        try:
            for batch in get_loader(ds):
                out.samples.extend(batch)
        except (
            Exception
        ) as exc:  # a broken shard ends iteration (Energon reads tars outside its error handler)
            out.error = exc
    return out


def load_blend(path: Path | str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """The first `n` samples of the train split of a metadataset (weighted blend, repeating)."""
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = get_train_dataset(
            str(path),
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0, seed_offset=seed),
            batch_size=1,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            task_encoder=_make_task_encoder(),
        )
        out: list[dict[str, Any]] = []
        for batch in get_loader(ds):
            out.extend(batch)
            if len(out) >= n:
                break
    return out[:n]


# -- reading the files directly ----------------------------------------------------------------------------------
def tar_members(path: Path) -> list[tuple[str, bytes]]:
    """(name, bytes) of every member of a complete tar, in order."""
    with tarfile.open(path, "r:") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]


def tensor_of(data: bytes) -> torch.Tensor:
    """A .pth payload loaded safely (weights_only=True)."""
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


# -- assertions that read as sentences ---------------------------------------------------------------------------
def assert_yields_manifest(loaded: Loaded, manifest: Manifest, split: str = "train") -> None:
    """Energon yielded exactly the manifest's samples of `split`, in order, each member matching its digest."""
    assert loaded.error is None, f"Energon stopped with {type(loaded.error).__name__}: {loaded.error}"
    expected = manifest.keys(split)
    assert loaded.keys() == expected, (
        f"Energon yielded keys {loaded.keys()[:5]}... ({len(loaded.samples)}), manifest lists "
        f"{expected[:5]}... ({len(expected)}) for split {split!r}"
    )
    for got in loaded.samples:
        record = manifest.sample(got["__key__"])
        names = sorted(k for k in got if not k.startswith("__"))
        assert names == sorted(record.members), (
            f"sample {record.key}: Energon gave members {names}, manifest lists {sorted(record.members)}"
        )
        assert got["__shard__"] == record.shard, (
            f"sample {record.key}: shard {got['__shard__']} != {record.shard}"
        )
        for name, member in record.members.items():
            assert sha(got[name]) == member.sha256, (
                f"sample {record.key} member {name}: sha256 {sha(got[name])[:12]} != manifest {member.sha256[:12]}"
            )
            assert len(got[name]) == member.size, f"sample {record.key} member {name}: size mismatch"


# -- a reference checker: reports what is wrong with a sample, the way a conformance reader should ------------
def check_crude(crude: dict[str, Any], schema: Schema) -> list[tuple[str, str | None]]:
    """(fault kind, member) for everything wrong with one crude sample (bytes) against `schema`."""
    found: list[tuple[str, str | None]] = []
    names = [k for k in crude if not k.startswith("__")]
    if (
        names
        and not any(n in schema.members for n in names)
        and all("." in n and n.split(".", 1)[1] in schema.members for n in names)
    ):
        return [("dotted-key", None)]
    for name, spec in schema.members.items():
        if name not in crude:
            found.append(("missing-member", name))
            continue
        data = crude[name]
        if isinstance(spec, TensorSpec):
            if data[:2] != b"PK":
                found.append(("garbage-payload", name))
                continue
            try:
                t = tensor_of(data)
            except Exception:
                found.append(("malicious-pickle", name))
                continue
            if str(t.dtype).removeprefix("torch.") != spec.dtype:
                found.append(("wrong-dtype", name))
            elif tuple(t.shape) != spec.shape:
                found.append(("wrong-shape", name))
            elif spec.dtype in FLOAT_DTYPES and torch.isnan(t).any():
                found.append(("nan-tensor", name))
        elif isinstance(spec, TextSpec):
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                found.append(("non-utf8-caption", name))
        elif data[:1] == b"\x00":
            found.append(("garbage-payload", name))
    return found


def report_faults(samples: Sequence[dict[str, Any]], schema: Schema) -> set[tuple[str, str, str | None]]:
    """(kind, key, member) for every fault the reference checker sees in a stream of crude samples."""
    report: set[tuple[str, str, str | None]] = set()
    seen: dict[str, int] = {}
    for crude in samples:
        key = crude["__key__"]
        seen[key] = seen.get(key, 0) + 1
        for kind, member in check_crude(crude, schema):
            report.add((kind, key, member))
    for key, count in seen.items():
        if count > 1:
            report.add(("duplicate-key", key, None))
    return report


# -- subprocesses ------------------------------------------------------------------------------------------------
def run_cli(
    args: Iterable[str], *, module: bool = True, env: dict[str, str] | None = None, cwd: Path | None = None
):
    """Run the CLI as ``python -m primus_energon.synthetic`` (or the ``primus-synth`` script) and capture its output."""
    exe = (
        [sys.executable, "-m", "primus_energon.synthetic"]
        if module
        else [str(Path(sys.executable).parent / "primus-synth")]
    )
    full_env = {**os.environ, **(env or {})}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if env is None or var not in env:
            full_env.pop(var, None)
    return subprocess.run(
        [*exe, *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=300, check=False
    )


def dataset_bytes(path: Path) -> dict[str, bytes]:
    """Every shard and the manifest of a dataset, by file name."""
    files = sorted(p for p in path.iterdir() if p.suffix == ".tar" or p.name == "manifest.json")
    return {p.name: p.read_bytes() for p in files}


def assert_same_dataset(a: Path, b: Path) -> None:
    fa, fb = dataset_bytes(a), dataset_bytes(b)
    assert sorted(fa) == sorted(fb), f"{a.name} has files {sorted(fa)}, {b.name} has {sorted(fb)}"
    differing = [n for n in fa if fa[n] != fb[n]]
    assert not differing, f"{a.name} and {b.name} differ in {differing}"
