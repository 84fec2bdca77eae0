"""The global random generators (Python's ``random``, numpy's, torch's) put into states of the suite's own.

A target that draws from a global generator nobody seeded (``random.shuffle`` in a packer, ``torch.rand`` in
an augmentation) gets whatever state the process happens to be in: two runs of a check may then draw alike
by chance, and the verdict would depend on luck. Every check that could catch such a draw plants a known,
different state before each run it compares (:func:`planted`), so an unseeded draw differs every time and the
same command gives the same verdict every time; the caller's own states are put back afterwards.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch

__all__ = ["plant", "planted", "saved", "states"]

#: Where planted states come from: far from any seed a target would pick, and advanced past the seeded state
#: by a few draws, so no ``manual_seed``/``seed`` call of the target can reproduce them.
_BASE = 0x5EED_C0DE_2026


def states() -> tuple:
    """The three global generators' states, comparable with ``==``."""
    return (torch.get_rng_state().numpy().tobytes(), repr(np.random.get_state()), random.getstate())


def plant(index: int) -> tuple:
    """Put the global generators into planted state ``index`` (a different one for every index) and
    return it (:func:`states`)."""
    seed = _BASE + 104_729 * index
    draws = 3 + index % 5
    torch.manual_seed(seed)
    torch.rand(draws)
    np.random.seed(seed % 2**32)
    np.random.random_sample(draws)
    random.seed(seed)
    for _ in range(draws):
        random.random()
    return states()


@contextlib.contextmanager
def saved() -> Iterator[None]:
    """Put the caller's global generator states back on exit."""
    torch_state, numpy_state, python_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        np.random.set_state(numpy_state)
        random.setstate(python_state)


@contextlib.contextmanager
def planted(index: int) -> Iterator[tuple]:
    """Run the block with the global generators in planted state ``index``; the caller's states come back."""
    with saved():
        yield plant(index)
