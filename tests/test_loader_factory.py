"""The loader factory: modes, seeds, metadatasets, argument errors, and sharding across ranks."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from primus_energon import EncodedDiffusionTaskEncoder, MegatronDataloaderWrapper, get_loader, resolve_rank
from primus_energon.synthetic import write_metadataset
from tests.helpers import read_members

REPO = Path(__file__).parents[1]


def _keys(loader_or_batches) -> list[str]:
    return [key for batch in loader_or_batches for key in batch["__key__"]]


def test_returns_a_wrapper_around_energons_savable_loader(preencoded_dataset: Path) -> None:
    loader = get_loader(preencoded_dataset, EncodedDiffusionTaskEncoder(), batch_size=2, num_workers=0)
    assert isinstance(loader, MegatronDataloaderWrapper)
    assert type(loader.dataloader).__name__ == "SavableDataLoader"


def test_val_mode_is_sequential_and_one_pass(preencoded_dataset: Path) -> None:
    loader = get_loader(
        preencoded_dataset,
        EncodedDiffusionTaskEncoder,
        batch_size=5,
        num_workers=0,
        mode="val",
        split_part="train",
    )
    keys = _keys(loader.dataloader)
    assert keys == sorted(read_members(preencoded_dataset)), "shard order, then sample order"


def test_train_mode_shuffles_and_repeats_deterministically(preencoded_dataset: Path) -> None:
    def first(seed: int, n: int = 9) -> list[str]:
        loader = get_loader(
            preencoded_dataset, EncodedDiffusionTaskEncoder, batch_size=4, num_workers=0, seed=seed
        )
        return _keys(next(loader) for _ in range(n))

    run = first(0)
    assert run == first(0), "same seed, same order"
    assert run != first(1), "another seed, another order"
    assert run[:24] != sorted(run[:24]), "training order is shuffled"
    assert sorted(run[:24]) == sorted(read_members(preencoded_dataset)), (
        "the first epoch covers every sample once"
    )
    assert len(run) == 36, "it repeats past the epoch"


def test_train_mode_without_repeat_gives_one_epoch(preencoded_dataset: Path) -> None:
    loader = get_loader(
        preencoded_dataset, EncodedDiffusionTaskEncoder, batch_size=4, num_workers=0, repeat=False
    )
    assert sorted(_keys(loader.dataloader)) == sorted(read_members(preencoded_dataset))


@pytest.mark.parametrize("legacy", [False, True])
def test_metadataset_path(preencoded_dataset: Path, tmp_path: Path, legacy: bool) -> None:
    blend = write_metadataset(
        tmp_path / "blend.yaml", [(preencoded_dataset, 1.0, {"source": "a"})], legacy=legacy
    )
    loader = get_loader(blend, EncodedDiffusionTaskEncoder, batch_size=4, num_workers=0)
    keys = _keys(next(loader) for _ in range(6))
    assert set(keys) <= set(read_members(preencoded_dataset)) and len(keys) == 24


@pytest.mark.parametrize("mode", ["val", "train"])
def test_ranks_cover_one_epoch_disjointly(preencoded_dataset: Path, mode: str) -> None:
    per_rank = []
    for rank in range(2):
        loader = get_loader(
            preencoded_dataset,
            EncodedDiffusionTaskEncoder,
            batch_size=3,
            num_workers=0,
            mode=mode,
            split_part="train",
            repeat=False,
            rank=rank,
            world_size=2,
        )
        per_rank.append(_keys(loader.dataloader))
    assert set(per_rank[0]).isdisjoint(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == sorted(read_members(preencoded_dataset))
    assert all(len(keys) == len(set(keys)) for keys in per_rank)


@pytest.mark.slow
def test_real_torch_distributed_ranks_get_disjoint_parts(preencoded_dataset: Path, tmp_path: Path) -> None:
    """Two gloo processes started by torchrun; the factory takes rank and world size from torch.distributed."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))
    }
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes=1",
            "--nproc-per-node=2",
            str(REPO / "tests" / "dist_rank_keys.py"),
            str(preencoded_dataset),
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [p["world_size"] for p in parts] == [2, 2] and [p["rank"] for p in parts] == [0, 1]
    assert set(parts[0]["keys"]).isdisjoint(parts[1]["keys"])
    assert sorted(parts[0]["keys"] + parts[1]["keys"]) == sorted(read_members(preencoded_dataset))
    assert all("contradict torch.distributed" in p["contradiction"] for p in parts)


def test_argument_errors(preencoded_dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="neither a dataset directory nor a metadataset"):
        get_loader(tmp_path / "missing", EncodedDiffusionTaskEncoder, batch_size=1)
    with pytest.raises(FileNotFoundError, match=r"dataset\.yaml"):
        get_loader(tmp_path, EncodedDiffusionTaskEncoder, batch_size=1)
    with pytest.raises(ValueError, match="mode must be"):
        get_loader(preencoded_dataset, EncodedDiffusionTaskEncoder, batch_size=1, mode="test")
    with pytest.raises(ValueError, match="batch_size"):
        get_loader(preencoded_dataset, EncodedDiffusionTaskEncoder, batch_size=0)
    with pytest.raises(ValueError, match="both rank and world_size"):
        resolve_rank(rank=1)
    with pytest.raises(ValueError, match="0 <= rank < world_size"):
        resolve_rank(rank=2, world_size=2)
    assert resolve_rank() == (0, 1)


def _wrapper_types(dataset: object) -> list[str]:
    """The types of Energon's dataset wrappers, outermost first."""
    names = []
    while dataset is not None:
        names.append(type(dataset).__name__)
        dataset = getattr(dataset, "dataset", None)
    return names


def test_garbage_collection_is_off_by_default_and_can_be_set(preencoded_dataset: Path) -> None:
    with get_loader(preencoded_dataset, EncodedDiffusionTaskEncoder, batch_size=4, num_workers=0) as off:
        assert "GcDataset" not in _wrapper_types(off.dataloader.dataset)
    with get_loader(
        preencoded_dataset,
        EncodedDiffusionTaskEncoder,
        batch_size=4,
        num_workers=0,
        gc_collect_every_n_steps=10,
    ) as on:
        assert "GcDataset" in _wrapper_types(on.dataloader.dataset)


class _Cycle:
    """An object that refers to itself: reference counting never frees it, only the garbage collector."""

    def __init__(self, payload: object) -> None:
        self.payload, self.me = payload, self


class _CyclicTaskEncoder(EncodedDiffusionTaskEncoder):
    """A deliberately leaky TaskEncoder: each batch leaves cyclic garbage behind that holds its latents."""

    def batch(self, samples: list) -> dict:
        out = super().batch(samples)
        _Cycle(out["latents"])
        return out


def _batches_alive_after_dropping(dataset: Path, task_encoder: type, count: int = 8) -> int:
    """How many of `count` dropped batches are still alive with the garbage collector off (the last one
    may be held by the loader's generators until the next step, so it is not counted)."""
    gc.collect()
    gc.disable()
    try:
        with get_loader(dataset, task_encoder, batch_size=4, num_workers=0) as loader:
            refs = []
            for _ in range(count + 1):
                batch = next(loader)
                refs.append(weakref.ref(batch["latents"]))
                del batch
            return sum(ref() is not None for ref in refs[:-1])
    finally:
        gc.enable()


def test_reference_batches_are_freed_without_the_garbage_collector(preencoded_dataset: Path) -> None:
    """Why garbage collection can be off: the reference path makes no reference cycles, so each batch is
    freed as soon as it is dropped. A TaskEncoder that makes cycles keeps every batch until a collection."""
    assert _batches_alive_after_dropping(preencoded_dataset, EncodedDiffusionTaskEncoder) == 0
    assert _batches_alive_after_dropping(preencoded_dataset, _CyclicTaskEncoder) == 8
