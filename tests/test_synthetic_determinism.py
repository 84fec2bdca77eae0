"""Same seed and options give byte-identical shards and manifest, whatever the worker count or rank split;
another seed gives different content."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from primus_energon.synthetic import Manifest, SyntheticError, generate_dataset

try:
    from . import synthetic_helpers as h
except ImportError:
    import synthetic_helpers as h

FAULTS = [
    "missing-member",
    "nan-tensor:2",
    "duplicate-key",
    "dotted-key",
    "malicious-pickle",
    "truncated-shard",
]
CLI_ARGS = [
    "--samples", "30", "--shard-size", "4", "--seed", "7", "--variable-shapes", "--split", "0.6,0.2,0.2",
    "--shape", "latents=4x8x8", "--shape", "prompt_embeds=7x16", "--shape", "pooled_prompt_embeds=16",
    "--dtype", "bfloat16", "--fault", "missing-member", "--fault", "duplicate-key", "--fault", "empty-shard",
]  # fmt: skip


def _options(tmp_path: Path, **over):
    base = dict(
        num_samples=30,
        shard_size=4,
        seed=7,
        shapes=h.SMALL,
        variable_shapes=True,
        split=(0.6, 0.2, 0.2),
        faults=FAULTS,
        marker_path=tmp_path / "marker.PWNED",
    )
    return {**base, **over}


def test_same_seed_and_options_give_identical_bytes(tmp_path):
    a = generate_dataset(tmp_path / "a", **_options(tmp_path))
    b = generate_dataset(tmp_path / "b", **_options(tmp_path))
    h.assert_same_dataset(tmp_path / "a", tmp_path / "b")
    assert a.to_json() == b.to_json()


def test_raw_images_are_deterministic_too(tmp_path):
    for name in ("a", "b"):
        for fmt in ("jpg", "png", "webp"):
            generate_dataset(tmp_path / name / fmt, encoding="raw", num_samples=6, shard_size=3, image_format=fmt,
                             variable_shapes=True, seed=3)  # fmt: skip
    for fmt in ("jpg", "png", "webp"):
        h.assert_same_dataset(tmp_path / "a" / fmt, tmp_path / "b" / fmt)


def test_another_seed_gives_different_content(tmp_path):
    a = generate_dataset(tmp_path / "a", **_options(tmp_path, faults=None, variable_shapes=False))
    b = generate_dataset(tmp_path / "b", **_options(tmp_path, faults=None, variable_shapes=False, seed=8))
    digests_a = {m.sha256 for s in a for m in s.members.values()}
    digests_b = {m.sha256 for s in b for m in s.members.values()}
    assert not digests_a & digests_b, f"{len(digests_a & digests_b)} members are equal across seeds"
    assert len(digests_a) == sum(len(s.members) for s in a), "two members of one dataset are equal"
    assert not set(a.keys()) & set(b.keys()), "default keys collide across seeds"


@pytest.mark.slow
def test_worker_count_does_not_change_the_bytes(tmp_path):
    generate_dataset(tmp_path / "w1", **_options(tmp_path), workers=1)
    generate_dataset(tmp_path / "w2", **_options(tmp_path), workers=2, progress=True)
    h.assert_same_dataset(tmp_path / "w1", tmp_path / "w2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_torchrun_ranks_write_the_single_process_dataset(tmp_path):
    generate_dataset(
        tmp_path / "single",
        num_samples=30,
        shard_size=4,
        seed=7,
        variable_shapes=True,
        split=(0.6, 0.2, 0.2),
        shapes=h.SMALL,
        dtype="bfloat16",
        faults=["missing-member", "duplicate-key", "empty-shard"],
    )
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    cmd = [
        str(torchrun), "--nnodes=1", "--nproc-per-node=2", f"--master-port={_free_port()}", "--master-addr=127.0.0.1",
        "-m", "primus_energon.synthetic", "generate", str(tmp_path / "ranks"), *CLI_ARGS, "--workers", "1",
    ]  # fmt: skip
    import subprocess

    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    h.assert_same_dataset(tmp_path / "single", tmp_path / "ranks")
    assert not [p.name for p in (tmp_path / "ranks").iterdir() if p.name.endswith(".tmp")]
    m = Manifest.load(tmp_path / "ranks")
    broken = {f.shard for f in m.faults if f.kind == "empty-shard"}
    broken_splits = {s.split for s in m.shards if s.name in broken}
    split = next(name for name in ("test", "val", "train") if name not in broken_splits)
    loaded = h.load_with_energon(tmp_path / "ranks", split)
    assert loaded.error is None and loaded.keys() == m.keys(split)


def test_rank_variables_without_a_rendezvous_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(SyntheticError, match="MASTER_ADDR and MASTER_PORT not; launch with torchrun"):
        generate_dataset(tmp_path / "x", num_samples=4, shapes=h.SMALL)
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(SyntheticError, match="0 <= RANK < WORLD_SIZE"):
        generate_dataset(tmp_path / "x", num_samples=4, shapes=h.SMALL)


def test_distributed_false_ignores_rank_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    m = generate_dataset(tmp_path / "solo", num_samples=4, shard_size=2, shapes=h.SMALL, distributed=False)
    assert [s.name for s in m.shards] == ["shard-000000.tar", "shard-000001.tar"], (
        "rank 1 must not skip shards"
    )
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(SyntheticError, match="distributed=True needs RANK and WORLD_SIZE"):
        generate_dataset(tmp_path / "x", num_samples=4, shapes=h.SMALL, distributed=True)


def test_a_faulted_dataset_regenerates_identically_after_overwrite(tmp_path):
    out = tmp_path / "ds"
    generate_dataset(out, **_options(tmp_path))
    first = h.dataset_bytes(out)
    shutil.copytree(out, tmp_path / "kept")
    generate_dataset(out, **_options(tmp_path), overwrite=True)
    assert h.dataset_bytes(out) == first
