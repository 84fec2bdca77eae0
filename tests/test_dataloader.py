"""MegatronDataloaderWrapper: cycling, empty inputs, save/restore through Energon's savable loader."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from primus_energon import (
    EmptyDataloaderError,
    EncodedDiffusionTaskEncoder,
    EnergonDataloader,
    MegatronDataloaderWrapper,
    get_loader,
)


def _take(loader, n: int) -> list[dict]:
    return [next(loader) for _ in range(n)]


def _fingerprint(batches: list[dict]) -> list[tuple]:
    """Keys, captions and the exact bytes of every tensor, batch by batch."""
    out = []
    for batch in batches:
        tensors = tuple(
            batch[f].contiguous().view(torch.uint8).numpy().tobytes()
            for f in ("latents", "prompt_embeds", "pooled_prompt_embeds")
        )
        out.append((tuple(batch["__key__"]), tuple(batch["caption"]), tensors))
    return out


def test_cycles_over_a_list_forever() -> None:
    wrapper = MegatronDataloaderWrapper([1, 2, 3])
    assert [next(wrapper) for _ in range(8)] == [1, 2, 3, 1, 2, 3, 1, 2]
    assert iter(wrapper) is wrapper and len(wrapper) == 3


def test_cycles_past_an_energon_epoch(preencoded_dataset: Path) -> None:
    loader = get_loader(
        preencoded_dataset,
        EncodedDiffusionTaskEncoder,
        batch_size=4,
        num_workers=0,
        mode="val",
        split_part="train",
    )
    epoch = len(loader)
    assert epoch == 6
    keys = [b["__key__"] for b in _take(loader, 2 * epoch + 1)]
    assert keys[:epoch] == keys[epoch : 2 * epoch], "a val pass is sequential, so every pass is the same"
    assert keys[2 * epoch] == keys[0]
    assert len({k for batch in keys[:epoch] for k in batch}) == 24


def test_empty_iterable_raises_instead_of_spinning() -> None:
    with pytest.raises(EmptyDataloaderError, match="yielded no items"):
        next(MegatronDataloaderWrapper([]))


def test_exhausted_one_shot_iterator_raises_after_its_only_pass() -> None:
    wrapper = MegatronDataloaderWrapper(x for x in "ab")
    assert [next(wrapper), next(wrapper)] == ["a", "b"]
    with pytest.raises(EmptyDataloaderError, match="pass 2.*one-shot"):
        next(wrapper)


def test_save_and_restore_without_a_savable_loader() -> None:
    wrapper = MegatronDataloaderWrapper([1, 2, 3])
    next(wrapper)
    assert wrapper.save_state() is None
    wrapper.restore_state(None)  # the initial state: a fresh pass
    assert next(wrapper) == 1
    with pytest.raises(TypeError, match="no restore_state_rank"):
        wrapper.restore_state({"something": 1})


def test_deprecated_alias_warns_and_behaves_the_same() -> None:
    with pytest.warns(DeprecationWarning, match="EnergonDataloader is deprecated"):
        wrapper = EnergonDataloader([7, 8])
    assert isinstance(wrapper, MegatronDataloaderWrapper)
    assert [next(wrapper) for _ in range(3)] == [7, 8, 7]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("save_at", [0, 3, 7])
def test_restored_run_continues_exactly(preencoded_dataset: Path, num_workers: int, save_at: int) -> None:
    """Save after ``save_at`` batches (7 crosses the 6-batch epoch); a fresh restored loader continues identically."""

    def build() -> MegatronDataloaderWrapper:
        return get_loader(
            preencoded_dataset, EncodedDiffusionTaskEncoder, batch_size=4, num_workers=num_workers, seed=11
        )

    # each loader is closed as soon as it is read: one dropped with its workers running waits out torch's
    # 5-second join per worker when the garbage collector frees it, in whichever test that happens
    with build() as reference:
        _take(reference, save_at)
        state = reference.save_state()
        expected = _fingerprint(_take(reference, 8))

    with build() as restored:
        restored.restore_state(state)
        assert _fingerprint(_take(restored, 8)) == expected

    with build() as fresh:
        assert _fingerprint(_take(fresh, save_at + 8))[save_at:] == expected, "the uninterrupted run agrees"


def test_same_state_can_be_restored_twice_mid_run(preencoded_dataset: Path) -> None:
    """Energon consumes the state object it restores; the wrapper must restore a copy."""
    loader = get_loader(preencoded_dataset, EncodedDiffusionTaskEncoder, batch_size=4, num_workers=0, seed=2)
    _take(loader, 4)
    state = loader.save_state()
    snapshot = copy.deepcopy(state)
    expected = _fingerprint(_take(loader, 5))
    loader.restore_state(state)  # takes effect from the next batch, on the same wrapper
    assert _fingerprint(_take(loader, 5)) == expected
    loader.restore_state(state)
    assert _fingerprint(_take(loader, 5)) == expected
    assert repr(state) == repr(snapshot)


def test_restore_into_running_worker_loader_is_a_clear_error(preencoded_dataset: Path) -> None:
    def build() -> MegatronDataloaderWrapper:
        return get_loader(
            preencoded_dataset, EncodedDiffusionTaskEncoder, batch_size=4, num_workers=2, seed=2
        )

    with build() as loader:
        _take(loader, 2)
        state = loader.save_state()
        with pytest.raises(RuntimeError, match="restored only before its first batch"):
            loader.restore_state(state)
        continued = _fingerprint(_take(loader, 3))  # the refused restore left the running pass intact
    with build() as reference:
        assert _fingerprint(_take(reference, 5))[2:] == continued


def test_close_stops_worker_processes(preencoded_dataset: Path) -> None:
    import multiprocessing

    before = {p.pid for p in multiprocessing.active_children()}
    loader = get_loader(preencoded_dataset, EncodedDiffusionTaskEncoder, batch_size=4, num_workers=2, seed=2)
    next(loader)
    workers = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert len(workers) == 2
    loader.close()
    for worker in workers:
        worker.join(timeout=30)
    assert not any(worker.is_alive() for worker in workers)
    with pytest.raises(RuntimeError, match="closed"):
        next(loader)
