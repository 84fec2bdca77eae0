"""Trainer checkpoint hooks for the restart property (``--resume-hooks SAVE,LOAD``), each pair called as
``save(loader, directory, rank)`` / ``load(loader, directory, rank)`` with ``loader`` the object the
training loop iterates (here ``MegatronDataloaderWrapper`` around Energon's loader). The broken pairs
have the defects trainers were seen to ship; the first pair is correct."""

from __future__ import annotations

import os
from typing import Any

import torch


def _file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"dataloader_rank{rank:03d}.pt")


def save(loader: Any, directory: str, rank: int) -> None:
    """Correct: each rank saves the wrapper's state (which carries its configuration record) in its own file."""
    torch.save(loader.save_state(), _file(directory, rank))


def load(loader: Any, directory: str, rank: int) -> None:
    """Correct: each rank restores its own file, before the first batch; a rank with no file is an error."""
    path = _file(directory, rank)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"no dataloader state for rank {rank} in {directory}: was it saved by fewer ranks?"
        )
    loader.restore_state(torch.load(path, weights_only=False))


def save_raw(loader: Any, directory: str, rank: int) -> None:
    """Passes Energon's bare state through: no record of rank, world size, seed or shards."""
    torch.save(loader.dataloader.save_state_rank(), _file(directory, rank))


def load_raw(loader: Any, directory: str, rank: int) -> None:
    """Restores Energon's bare state if there is one, else starts fresh (silent at another world size)."""
    path = _file(directory, rank)
    if os.path.exists(path):
        loader.dataloader.restore_state_rank(torch.load(path, weights_only=False))


def load_rank0(loader: Any, directory: str, rank: int) -> None:
    """Every rank restores rank 0's file (the rank left out of the file name when loading)."""
    state = torch.load(_file(directory, 0), weights_only=False)
    loader.dataloader.restore_state_rank(state.get("state") if isinstance(state, dict) else state)


def save_after_iter(loader: Any, directory: str, rank: int) -> None:
    """Saves whatever ``iter()`` of the loader returns, duck typed: torch's iterator has no
    save_state_rank(), so nothing is saved, without a word (the state was replaced by the iterator)."""
    iterator = iter(loader.dataloader)
    save_state = getattr(iterator, "save_state_rank", None)
    torch.save(save_state() if save_state is not None else None, _file(directory, rank))


def save_nothing(loader: Any, directory: str, rank: int) -> None:
    """A checkpoint without loader state: the model is saved, the loader is forgotten."""


def load_if_present(loader: Any, directory: str, rank: int) -> None:
    """Restores the rank's file if it exists, else starts fresh, without a word."""
    path = _file(directory, rank)
    if os.path.exists(path):
        loader.restore_state(torch.load(path, weights_only=False))
