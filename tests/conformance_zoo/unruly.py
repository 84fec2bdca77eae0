"""Targets that are otherwise correct and misbehave towards the process running them, one way each (as data
code does by accident): they end it, crash it, hang it, or leave threads, processes and files behind. The
suite must name each in bounded time, never certify it, and leave nothing running
(tests/test_conformance_supervised.py)."""

from __future__ import annotations

import ctypes
import itertools
import os
import subprocess
import sys
import threading
import time
from typing import Any

from megatron.energon import Cooker, stateless

from primus_energon import PREENCODED_COOKER, EncodedDiffusionTaskEncoder, MegatronDataloaderWrapper

_PREENCODED = {"encoding": "preencoded"}
#: calls of each misbehaving function in this process (the misbehaviour comes on a later call, not the first)
_calls: dict[str, itertools.count] = {}


def _nth(name: str) -> int:
    return next(_calls.setdefault(name, itertools.count(1)))


class ExitsInBatch(EncodedDiffusionTaskEncoder):
    """``batch()`` ends the process with status 0 on its 4th call (a debug hook left in)."""

    def batch(self, samples: list[Any]) -> Any:
        if _nth("batch") == 4:
            os._exit(0)
        return super().batch(samples)


@stateless
def _cook_segfaults(sample: dict) -> Any:
    if _nth("segfault") == 4:
        ctypes.string_at(0)  # a crash in native code (a video decoder reading freed memory)
    return PREENCODED_COOKER.cook(sample)


#: crashes with SIGSEGV on its 4th sample
SEGFAULTS = Cooker(_cook_segfaults, has_subflavors=_PREENCODED)


class SegfaultsInWorkers(EncodedDiffusionTaskEncoder):
    """``encode_sample`` crashes with SIGSEGV on the 3rd sample of a loader worker process (a native decoder
    that only misbehaves under fork), never in the main process: torch reports the worker's death in the main
    process from its SIGCHLD handler, wherever that process happens to be."""

    def encode_sample(self, sample: Any) -> Any:
        import torch.utils.data

        if torch.utils.data.get_worker_info() is not None and _nth("worker segfault") == 3:
            ctypes.string_at(0)
        return super().encode_sample(sample)


class DeadlocksOnFifthNext(MegatronDataloaderWrapper):
    """Its 5th ``next()`` takes a non-reentrant lock it already holds: it never returns."""

    def __init__(self, dataloader: Any, **kwargs: Any) -> None:
        super().__init__(dataloader, **kwargs)
        self._lock = threading.Lock()
        self._nexts = 0

    def __next__(self) -> Any:
        self._nexts += 1
        if self._nexts == 5:
            with self._lock:
                self._lock.acquire()
        return super().__next__()


_prefetch: list[threading.Thread] = []


def _prefetch_forever() -> None:
    while True:  # waits for work that never comes
        time.sleep(0.5)


@stateless
def _cook_starts_thread(sample: dict) -> Any:
    if not _prefetch:
        thread = threading.Thread(target=_prefetch_forever, name="prefetch")  # not a daemon
        _prefetch.append(thread)
        thread.start()
    return PREENCODED_COOKER.cook(sample)


#: starts a non-daemon thread that never ends (a training process could not exit)
STARTS_THREAD = Cooker(_cook_starts_thread, has_subflavors=_PREENCODED)

_helpers: list[subprocess.Popen] = []


@stateless
def _cook_starts_helpers(sample: dict) -> Any:
    if not _helpers:
        for _ in range(3):  # never waited for
            _helpers.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]))
    return PREENCODED_COOKER.cook(sample)


#: starts three helper processes on its first sample and never waits for them
STARTS_HELPERS = Cooker(_cook_starts_helpers, has_subflavors=_PREENCODED)


@stateless
def _cook_writes_debug_files(sample: dict) -> Any:
    cooked = PREENCODED_COOKER.cook(sample)
    if _nth("debug") <= 3:
        with open(f"debug_{sample['__key__']}.txt", "w") as out:  # into the current folder
            out.write(repr(cooked.latents.shape))
    return cooked


#: writes debug_<key>.txt into the current folder for its first three samples
WRITES_DEBUG_FILES = Cooker(_cook_writes_debug_files, has_subflavors=_PREENCODED)


@stateless
def _cook_closes_stdout(sample: dict) -> Any:
    if _nth("stdout") == 2:
        print(f"cooking {sample['__key__']}", flush=True)
        sys.stdout.close()  # a logging set-up that closes the stream it replaced
    return PREENCODED_COOKER.cook(sample)


#: closes sys.stdout on its second sample; otherwise correct
CLOSES_STDOUT = Cooker(_cook_closes_stdout, has_subflavors=_PREENCODED)


@stateless
def _cook_slowly(sample: dict) -> Any:
    time.sleep(0.4)  # a heavy decode: slow, but every call returns
    return PREENCODED_COOKER.cook(sample)


#: correct, and slow (0.4 s a sample): many batches together outlast a short call budget, none alone does
SLOW_BUT_STEADY = Cooker(_cook_slowly, has_subflavors=_PREENCODED)
