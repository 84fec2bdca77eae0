"""The raw read: every shard file's bytes read in order, and timed. The ceiling no loader of those shards
reaches, measured by the conformance throughput property and the benchmarks alike.

Contract:

* :func:`read_once` reads each file from start to end through an unbuffered handle with ``readinto`` into
  one reused buffer (as large as the largest file, at most :data:`MAX_BUFFER_BYTES`) and returns the bytes
  read; nothing is decoded or kept.
* :func:`time_reads` reads once untimed (so the page cache is warm and the numbers are the memory-bandwidth
  ceiling, not the disk's), then times whole passes: at least ``min_passes``, and more until
  ``min_seconds`` have passed, at most ``max_passes``. It returns each pass's seconds and the bytes one
  pass reads (:class:`RawRead`).
* :func:`timed_passes` is that timing loop for any pass (the benchmarks time a memcpy with it too).

Only the standard library is imported, so a process that measures nothing else starts fast.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_BUFFER_BYTES", "RawRead", "read_buffer", "read_once", "time_reads", "timed_passes"]

#: The largest read buffer: bigger reads do not read faster.
MAX_BUFFER_BYTES = 1 << 24


@dataclass(frozen=True)
class RawRead:
    """The timed passes of a raw read: seconds per pass, and the bytes every pass read."""

    seconds: tuple[float, ...]
    bytes_per_pass: int

    @property
    def bytes_per_s(self) -> float:
        """Bytes per second over all the timed passes together."""
        return self.bytes_per_pass * len(self.seconds) / sum(self.seconds)


def read_buffer(paths: Sequence[Path]) -> memoryview:
    """A buffer for :func:`read_once`: the size of the largest file, at most :data:`MAX_BUFFER_BYTES`, at
    least one byte."""
    largest = max((Path(p).stat().st_size for p in paths), default=0)
    return memoryview(bytearray(max(1, min(largest, MAX_BUFFER_BYTES))))


def read_once(paths: Sequence[Path], buffer: memoryview | None = None) -> int:
    """Read every file of ``paths`` in order, ``readinto`` ``buffer`` (by default :func:`read_buffer`'s);
    the bytes read."""
    view = read_buffer(paths) if buffer is None else buffer
    read = 0
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while n := handle.readinto(view):
                read += n
    return read


def timed_passes(
    one_pass: Callable[[], object], min_passes: int, min_seconds: float, max_passes: int
) -> list[float]:
    """Seconds of each timed call of ``one_pass``, after one untimed call: at least ``min_passes`` calls, and
    more while fewer than ``min_seconds`` have passed since the first timed one, but no more than
    ``max_passes`` (unless ``min_passes`` asks for more)."""
    one_pass()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < min_passes or (
        time.perf_counter() - started < min_seconds and len(times) < max_passes
    ):
        t0 = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - t0)
    return times


def time_reads(
    paths: Sequence[Path], *, min_passes: int = 3, min_seconds: float = 0.2, max_passes: int = 50
) -> RawRead:
    """Time raw reads of ``paths`` (see the module's contract); the first, untimed pass warms the page cache."""
    buffer = read_buffer(paths)
    read: list[int] = []

    def one_pass() -> None:
        read.append(read_once(paths, buffer))

    seconds = timed_passes(one_pass, min_passes, min_seconds, max_passes)
    return RawRead(seconds=tuple(seconds), bytes_per_pass=read[0])
