"""The record saved with a loader state: an unchanged restore continues exactly, every change Energon cannot
continue from is refused by name, moved data and record-less states restore with a warning, and the state
survives ``torch.save`` into a fresh process. Real Energon loaders over small generated datasets."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from primus_energon import (
    EncodedDiffusionTaskEncoder,
    MegatronDataloaderWrapper,
    ResumeChangeWarning,
    ResumeMismatchError,
    ResumeUncheckedWarning,
    get_loader,
)
from primus_energon.resume import STATE_MARKER, loader_record
from primus_energon.synthetic import generate_dataset, write_metadataset
from tests.helpers import SMALL_SHAPES

REPO = Path(__file__).parents[1]
#: get_loader's arguments unless a test says otherwise: one rank, two workers, unshuffled buffer.
DEFAULTS: dict[str, Any] = {"batch_size": 4, "num_workers": 2, "seed": 0, "rank": 0, "world_size": 1}


def _build(path: Path, **changes: Any) -> MegatronDataloaderWrapper:
    return get_loader(path, EncodedDiffusionTaskEncoder, **(DEFAULTS | changes))


def _keys(loader: MegatronDataloaderWrapper, n: int) -> list[list[str]]:
    return [list(next(loader)["__key__"]) for _ in range(n)]


def _save(path: Path, k: int = 2, **config: Any) -> Any:
    """The state ``save_state()`` returns after ``k`` batches of a loader built with ``config``."""
    # each loader is closed as soon as it is read: one freed by the garbage collector with its workers
    # running waits out torch's 5-second join per worker
    with _build(path, **config) as loader:
        _keys(loader, k)
        return loader.save_state()


def _refused(path: Path, state: Any, allow: set[str] | frozenset[str] = frozenset(), **config: Any):
    """Restore ``state`` into a fresh loader built with ``config``; the ResumeMismatchError it raises."""
    with _build(path, **config) as loader, pytest.raises(ResumeMismatchError) as caught:
        loader.restore_state(state, allow_changes=allow)
    return caught.value


def _names(error: ResumeMismatchError) -> set[str]:
    return {change.name for change in error.changes}


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """24 preencoded samples in 4 shards of 6 (keys s1_000000..s1_000023), this test's own copy."""
    out = tmp_path / "data"
    generate_dataset(out, num_samples=24, shard_size=6, seed=1, shapes=SMALL_SHAPES)
    return out


# --- an unchanged configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_workers", "save_at", "rank", "world_size"),
    [(0, 1, 0, 1), (0, 7, 0, 1), (2, 2, 0, 1), (2, 7, 0, 1), (2, 2, 1, 2)],
    ids=["nw0-k1", "nw0-k7-past-epoch", "nw2-k2", "nw2-k7-past-epoch", "nw2-rank1of2"],
)
def test_unchanged_configuration_continues_exactly(
    preencoded_dataset: Path, num_workers: int, save_at: int, rank: int, world_size: int
) -> None:
    config = {"num_workers": num_workers, "seed": 5, "rank": rank, "world_size": world_size}
    with _build(preencoded_dataset, **config) as reference:
        _keys(reference, save_at)
        state = reference.save_state()
        expected = _keys(reference, 6)

    assert state[STATE_MARKER] == 1 and set(state) == {STATE_MARKER, "record", "state"}
    record = state["record"]
    assert (record["rank"], record["world_size"], record["num_workers"], record["seed"]) == (
        rank,
        world_size,
        num_workers,
        5,
    )
    assert record["micro_batch_size"] == 4
    (data,) = record["datasets"]
    assert data["path"] == str(preencoded_dataset)
    assert data["shards"] == [[f"shard-00000{i}.tar", 6] for i in range(4)]
    assert (data["num_shards"], data["num_samples"]) == (4, 24)
    assert json.loads(json.dumps(record)) == record, "the record is plain data"

    with _build(preencoded_dataset, **config) as restored:
        restored.restore_state(state)
        assert _keys(restored, 6) == expected
    with _build(preencoded_dataset, **config) as uninterrupted:
        assert _keys(uninterrupted, save_at + 6)[save_at:] == expected


def test_unchanged_blend_continues_exactly(preencoded_dataset: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    generate_dataset(other, num_samples=24, shard_size=6, seed=2, shapes=SMALL_SHAPES)
    blend = write_metadataset(tmp_path / "blend.yaml", [(preencoded_dataset, 1.0), (other, 3.0)])
    with _build(blend) as reference:
        _keys(reference, 3)
        state = reference.save_state()
        expected = _keys(reference, 6)
    assert [(d["path"], d["weight"]) for d in state["record"]["datasets"]] == [
        (str(preencoded_dataset), 0.25),
        (str(other), 0.75),
    ]
    with _build(blend) as restored:
        restored.restore_state(state)
        assert _keys(restored, 6) == expected
    assert {k[:3] for batch in expected for k in batch} == {"s1_", "s2_"}, "both datasets are read"


# --- each change refused by name ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("saved", "restored", "name", "phrase"),
    [
        (
            {"rank": 0, "world_size": 2},
            {"rank": 0, "world_size": 1},
            "world_size",
            "the data-parallel world size is 1; the state was saved by rank 0 of 2",
        ),
        (
            {"rank": 0, "world_size": 1},
            {"rank": 0, "world_size": 2},
            "world_size",
            "the data-parallel world size is 2; the state was saved by rank 0 of 1",
        ),
        (
            {"rank": 1, "world_size": 2},
            {"rank": 0, "world_size": 2},
            "rank",
            "this is data-parallel rank 0; the state is rank 1's",
        ),
        ({"seed": 0}, {"seed": 1}, "seed", "the seed is 1; the state was saved with seed 0"),
        ({"num_workers": 2}, {"num_workers": 0}, "num_workers", "Resume with num_workers=2"),
        (
            {"num_workers": 2},
            {"num_workers": 1},
            "num_workers",
            "num_workers is 1; the state was saved with 2",
        ),
        ({"batch_size": 4}, {"batch_size": 8}, "micro_batch_size", "the micro batch size is 8"),
        ({"batch_size": 4}, {"batch_size": 3}, "micro_batch_size", "only a divisor of 4, with workers"),
        (
            {"shuffle_buffer_size": 8},
            {"shuffle_buffer_size": 16},
            "setting",
            "ShuffleBufferDataset.size: 8 -> 16",
        ),
        (
            {"shuffle_buffer_size": None},
            {"shuffle_buffer_size": 8},
            "setting",
            "ShuffleBufferDataset.size: '(absent)' -> 8",
        ),
    ],
    ids=[
        "world-2to1",
        "world-1to2",
        "rank-1at0",
        "seed",
        "nw-2to0",
        "nw-2to1",
        "bs-4to8",
        "bs-4to3",
        "shuffle",
        "shuffle-on",
    ],
)
def test_each_change_is_refused_by_name(
    preencoded_dataset: Path, saved: dict, restored: dict, name: str, phrase: str
) -> None:
    state = _save(preencoded_dataset, **saved)
    error = _refused(preencoded_dataset, state, **restored)
    assert isinstance(error, ValueError)
    assert _names(error) == {name}
    assert phrase in str(error)
    assert str(error).startswith("cannot resume (rank ")
    assert "1 difference:" in str(error)
    (change,) = error.changes
    assert not change.harmless and not change.allowable
    assert "To accept" not in str(error), "nothing here can be allowed"


def test_a_refused_restore_leaves_the_loader_at_its_start(preencoded_dataset: Path) -> None:
    state = _save(preencoded_dataset, rank=0, world_size=2)
    with _build(preencoded_dataset) as loader:
        with pytest.raises(ResumeMismatchError):
            loader.restore_state(state)
        after_refusal = _keys(loader, 3)
    with _build(preencoded_dataset) as fresh:
        assert _keys(fresh, 3) == after_refusal


@pytest.mark.parametrize("restored_batch", [8, 3])
def test_a_larger_or_non_divisor_micro_batch_is_refused_even_when_allowed(
    preencoded_dataset: Path, restored_batch: int
) -> None:
    state = _save(preencoded_dataset)
    error = _refused(preencoded_dataset, state, {"micro_batch_size"}, batch_size=restored_batch)
    assert _names(error) == {"micro_batch_size"}
    (change,) = error.changes
    assert (change.saved, change.current, change.allowable) == (4, restored_batch, False)
    assert "Resume with micro batch size 4" in str(error)


def test_a_halved_micro_batch_without_workers_is_refused_even_when_allowed(preencoded_dataset: Path) -> None:
    state = _save(preencoded_dataset, num_workers=0)
    error = _refused(preencoded_dataset, state, {"micro_batch_size"}, num_workers=0, batch_size=2)
    assert _names(error) == {"micro_batch_size"}
    assert not error.changes[0].allowable
    assert "only a divisor of 4, with workers, is defined" in str(error)


def test_a_halved_micro_batch_with_workers_is_refused_unless_allowed_and_then_loses_no_key(
    preencoded_dataset: Path,
) -> None:
    one_epoch = {"repeat": False}  # a single pass: what the save and the restore deliver is one epoch
    with _build(preencoded_dataset, **one_epoch) as reference:
        before = _keys(reference, 2)
        state = reference.save_state()
        after = [list(batch["__key__"]) for batch in reference.dataloader]  # the rest of the pass
    epoch = Counter(k for batch in before + after for k in batch)
    assert len(epoch) == 24 and set(epoch.values()) == {1}

    error = _refused(preencoded_dataset, state, batch_size=2, **one_epoch)
    assert _names(error) == {"micro_batch_size"}
    assert error.changes[0].allowable
    assert "no sample is skipped" in str(error)
    assert (
        "To accept micro_batch_size deliberately: restore_state(state, allow_changes={'micro_batch_size'})"
        in str(error)
    )

    with _build(preencoded_dataset, batch_size=2, **one_epoch) as restored:
        with pytest.warns(ResumeChangeWarning, match="the micro batch size is 2; the state was saved with 4"):
            restored.restore_state(state, allow_changes={"micro_batch_size"})
        continued = [list(batch["__key__"]) for batch in restored.dataloader]
    assert {len(batch) for batch in continued} == {2}
    assert Counter(k for batch in before + continued for k in batch) == epoch, "no key lost or repeated"

    # Energon scales the positions in the state object it restores; the caller's state stays as saved
    with _build(preencoded_dataset, batch_size=2, **one_epoch) as again:
        with pytest.warns(ResumeChangeWarning):
            again.restore_state(state, allow_changes={"micro_batch_size"})
        assert [list(batch["__key__"]) for batch in again.dataloader] == continued


def _regenerate(path: Path, num_samples: int) -> None:
    generate_dataset(path, num_samples=num_samples, shard_size=6, seed=1, shapes=SMALL_SHAPES, overwrite=True)


def test_a_shard_added_in_place_is_refused_naming_it(dataset: Path) -> None:
    state = _save(dataset, num_workers=0)
    _regenerate(dataset, 30)  # the same 4 shards (a deterministic generator) and a fifth
    error = _refused(dataset, state, num_workers=0)
    assert _names(error) == {"shards"}
    assert f"dataset {str(dataset)!r} changed since the save" in str(error)
    assert "4 shards / 24 samples then, 5 / 30 now (added shard-000004.tar (6))" in str(error)


def test_a_removed_shard_is_refused_naming_it(dataset: Path) -> None:
    state = _save(dataset)
    _regenerate(dataset, 18)
    error = _refused(dataset, state)
    assert _names(error) == {"shards"}
    assert "4 shards / 24 samples then, 3 / 18 now (removed shard-000003.tar (6))" in str(error)


def test_a_resized_shard_is_refused_naming_it(dataset: Path) -> None:
    state = _save(dataset, num_workers=0)
    _regenerate(dataset, 22)
    error = _refused(dataset, state, num_workers=0)
    assert _names(error) == {"shards"}
    assert "changed sample counts of shard-000003.tar (6 -> 4)" in str(error)


def test_a_blend_weight_change_is_refused(preencoded_dataset: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    generate_dataset(other, num_samples=24, shard_size=6, seed=2, shapes=SMALL_SHAPES)
    saved_blend = write_metadataset(tmp_path / "saved.yaml", [(preencoded_dataset, 1.0), (other, 3.0)])
    changed_blend = write_metadataset(tmp_path / "changed.yaml", [(preencoded_dataset, 1.0), (other, 1.0)])
    state = _save(saved_blend, num_workers=0)
    error = _refused(changed_blend, state, num_workers=0)
    assert _names(error) == {"weight"}
    assert [(c.saved, c.current) for c in error.changes] == [(0.25, 0.5), (0.75, 0.5)]
    assert f"the blend weight of {str(preencoded_dataset)!r} changed from 0.25 to 0.5" in str(error)
    assert f"the blend weight of {str(other)!r} changed from 0.75 to 0.5" in str(error)
    # the same weights in another file restore as they are
    same = write_metadataset(tmp_path / "same.yaml", [(preencoded_dataset, 2.0), (other, 6.0)])
    with _build(same, num_workers=0) as loader:
        loader.restore_state(state)


def test_several_changes_are_listed_in_one_error(preencoded_dataset: Path) -> None:
    state = _save(preencoded_dataset, rank=1, world_size=2, shuffle_buffer_size=8)
    error = _refused(
        preencoded_dataset,
        state,
        {"micro_batch_size"},  # 4 -> 8 cannot be allowed, and allowing it hides nothing
        rank=0,
        world_size=1,
        seed=1,
        num_workers=0,
        batch_size=8,
        shuffle_buffer_size=16,
    )
    assert [c.name for c in error.changes] == [
        "world_size",
        "num_workers",
        "seed",
        "micro_batch_size",
        "setting",
    ]
    message = str(error)
    assert message.startswith("cannot resume (rank 0 of 1)")
    assert "5 differences:" in message
    for phrase in (
        "the state was saved by rank 1 of 2",
        "num_workers is 0; the state was saved with 2",
        "the seed is 1; the state was saved with seed 0",
        "the micro batch size is 8; the state was saved with 4",
        "ShuffleBufferDataset.size: 8 -> 16",
    ):
        assert phrase in message


def test_an_energon_release_change_is_refused_unless_allowed(preencoded_dataset: Path) -> None:
    with _build(preencoded_dataset) as reference:
        _keys(reference, 2)
        state = reference.save_state()
        expected = _keys(reference, 4)
    older = copy.deepcopy(state)
    older["record"]["energon"] = "7.3.2"
    error = _refused(preencoded_dataset, older)
    assert _names(error) == {"energon"}
    assert f"the state was saved by Energon 7.3.2; this is {state['record']['energon']}" in str(error)
    with _build(preencoded_dataset) as restored:
        with pytest.warns(ResumeChangeWarning, match="saved by Energon 7.3.2"):
            restored.restore_state(older, allow_changes={"energon"})
        assert _keys(restored, 4) == expected


def test_only_changes_with_a_defined_continuation_can_be_allowed(preencoded_dataset: Path) -> None:
    state = _save(preencoded_dataset, num_workers=0)
    with _build(preencoded_dataset, num_workers=0, seed=1) as loader:
        with pytest.raises(
            ValueError, match="only \\['energon', 'micro_batch_size'\\] can be allowed"
        ) as caught:
            loader.restore_state(state, allow_changes={"seed"})
    assert not isinstance(caught.value, ResumeMismatchError)


# --- changes that continue, and states without a record ----------------------------------------------


def test_a_moved_dataset_continues_exactly_with_a_warning(dataset: Path, tmp_path: Path) -> None:
    with _build(dataset) as reference:
        _keys(reference, 3)
        state = reference.save_state()
        expected = _keys(reference, 6)
    moved = shutil.copytree(dataset, tmp_path / "moved")
    with _build(moved) as restored:
        with pytest.warns(ResumeChangeWarning, match="is now read from") as caught:
            restored.restore_state(state)
        assert _keys(restored, 6) == expected
    (warning,) = [w for w in caught if issubclass(w.category, ResumeChangeWarning)]
    assert f"dataset {str(dataset)!r} is now read from {str(moved)!r}" in str(warning.message)


def test_a_raw_energon_state_restores_exactly_but_unchecked(preencoded_dataset: Path) -> None:
    with _build(preencoded_dataset) as reference:
        _keys(reference, 3)
        raw = reference.dataloader.save_state_rank()
        expected = _keys(reference, 6)
    assert not isinstance(raw, dict) or STATE_MARKER not in raw
    with _build(preencoded_dataset) as restored:
        with pytest.warns(ResumeUncheckedWarning, match="saved without a record of its configuration"):
            restored.restore_state(raw)
        assert _keys(restored, 6) == expected


def test_the_saved_state_needs_weights_only_false(preencoded_dataset: Path, tmp_path: Path) -> None:
    """The record is plain data, but Energon's state is made of its own classes: torch.load's safe
    weights_only mode refuses the file, and weights_only=False (own checkpoints only) reads it back."""
    state = _save(preencoded_dataset, num_workers=0)
    torch.save(state, tmp_path / "state.pt")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(tmp_path / "state.pt", weights_only=True)
    loaded = torch.load(tmp_path / "state.pt", weights_only=False)  # the test's own file
    assert loaded["record"] == state["record"]
    with _build(preencoded_dataset, num_workers=0) as loader:
        loader.restore_state(loaded)


def test_a_loader_without_a_record_saves_and_restores_none() -> None:
    assert loader_record([1, 2, 3]) is None
    assert loader_record(object()) is None
    wrapper = MegatronDataloaderWrapper([1, 2, 3])
    assert [next(wrapper), next(wrapper)] == [1, 2]
    assert wrapper.save_state() is None
    wrapper.restore_state(None)
    assert next(wrapper) == 1


# --- torch.save into a fresh process -----------------------------------------------------------------

_SAVE = """
import json, sys, torch
from primus_energon import EncodedDiffusionTaskEncoder, get_loader
path, out = sys.argv[1], sys.argv[2]
with get_loader(path, EncodedDiffusionTaskEncoder, batch_size=4, num_workers=2, seed=3, rank=0, world_size=2) as loader:
    for _ in range(3):
        next(loader)
    torch.save(loader.save_state(), out)
    print(json.dumps([list(next(loader)["__key__"]) for _ in range(5)]))
"""

_RESTORE = """
import json, sys, torch
from primus_energon import EncodedDiffusionTaskEncoder, get_loader
path, out, world_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
state = torch.load(out, weights_only=False)  # Energon's state classes: only for one's own checkpoints
with get_loader(
    path, EncodedDiffusionTaskEncoder, batch_size=4, num_workers=2, seed=3, rank=0, world_size=world_size
) as loader:
    loader.restore_state(state)
    print(json.dumps([list(next(loader)["__key__"]) for _ in range(5)]))
"""


def _python(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_a_saved_state_resumes_in_a_fresh_process(preencoded_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "rank0.pt"
    saved = _python(_SAVE, str(preencoded_dataset), str(out))
    assert saved.returncode == 0, saved.stderr
    expected = json.loads(saved.stdout.splitlines()[-1])
    assert len(expected) == 5 and all(len(batch) == 4 for batch in expected)

    restored = _python(_RESTORE, str(preencoded_dataset), str(out), "2")
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout.splitlines()[-1]) == expected

    refused = _python(_RESTORE, str(preencoded_dataset), str(out), "1")
    assert refused.returncode == 1
    assert "primus_energon.resume.ResumeMismatchError: cannot resume (rank 0 of 1)" in refused.stderr
    assert "the data-parallel world size is 1; the state was saved by rank 0 of 2" in refused.stderr
    assert refused.stdout == ""
