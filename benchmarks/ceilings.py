"""The physical limits measured beside the pipelines, and the decode cost of one member in each format.

* :func:`raw_read`: the raw read of :mod:`primus_energon.rawread` (every shard file read in order,
  ``readinto`` one reused buffer, page cache warm). No loader reads its input faster.
* :func:`memcpy`: a single-core copy of as many bytes as the shards hold (``numpy.copyto`` from one
  shard-sized buffer into another, shard by shard). A pipeline that copies every byte once more than it
  must pays about this much again.
* :func:`pinned_h2d`: host-to-device copy bandwidth from pinned memory (CUDA only; see ``benchmarks.gpu``).
* :func:`decode_costs`: microseconds to turn one member's bytes into a tensor, per member and per format
  (the safe reader with and without a copy, ``torch.load(weights_only=True)``, webdataset's default
  handler, ``.npy`` through ``numpy.load``, and the floor's ``torch.frombuffer``).
"""

from __future__ import annotations

import io
import statistics
import tarfile
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from primus_energon.rawread import time_reads, timed_passes

if TYPE_CHECKING:  # torch is imported where it is needed, so that raw_read and memcpy start fast
    import torch

__all__ = [
    "raw_read",
    "memcpy",
    "pinned_h2d",
    "decode_costs",
    "first_sample_members",
    "shard_paths",
    "TENSOR_MEMBERS",
]

#: The tensor members of a preencoded sample.
TENSOR_MEMBERS: tuple[str, ...] = ("latents.pth", "prompt_embeds.pth", "pooled_prompt_embeds.pth")


def shard_paths(path: Path) -> list[Path]:
    """The dataset's shard files, in order."""
    return sorted(Path(path).glob("*.tar"))


GB = 1e9
#: Timed passes of a ceiling at the most (more than ``passes`` only while under ``min_seconds``).
MAX_PASSES = 200


def raw_read(shards: list[Path], passes: int = 5, min_seconds: float = 0.5) -> dict[str, Any]:
    """The raw read of ``shards`` (:func:`primus_energon.rawread.time_reads`, at most 200 passes); per-pass
    seconds and the bytes per pass."""
    measured = time_reads(shards, min_passes=passes, min_seconds=min_seconds, max_passes=MAX_PASSES)
    return {"seconds": list(measured.seconds), "bytes_per_pass": measured.bytes_per_pass}


def memcpy(shards: list[Path], passes: int = 5, min_seconds: float = 0.5) -> dict[str, Any]:
    """Single-core copy of as many bytes as each shard holds, shard by shard, between two preallocated buffers."""
    sizes = [s.stat().st_size for s in shards]
    source = np.frombuffer(Path(shards[int(np.argmax(sizes))]).read_bytes(), dtype=np.uint8).copy()
    target = np.empty_like(source)

    def one_pass() -> int:
        for size in sizes:
            np.copyto(target[:size], source[:size])
        return sum(sizes)

    seconds = timed_passes(one_pass, passes, min_seconds, MAX_PASSES)
    return {"seconds": seconds, "bytes_per_pass": sum(sizes)}


def pinned_h2d(nbytes: int, repeats: int = 20, device: str = "cuda") -> dict[str, float]:
    """Host-to-device bandwidth (GB/s) of ``nbytes`` copies from pinned memory, on a side stream.

    Times ``repeats`` back-to-back ``copy_(non_blocking=True)`` with CUDA events after two warm-up copies;
    returns the median and the best GB/s of single copies and the GB/s of the whole burst.
    """
    import torch

    source = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    source.fill_(1)
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device=device)
    with torch.cuda.stream(stream):
        for _ in range(2):
            target.copy_(source, non_blocking=True)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(repeats + 1)]
        events[0].record(stream)
        for i in range(repeats):
            target.copy_(source, non_blocking=True)
            events[i + 1].record(stream)
    stream.synchronize()
    per_copy = [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(repeats)]
    total = events[0].elapsed_time(events[-1]) / 1e3
    return {
        "nbytes": nbytes,
        "gb_per_s_median": nbytes / statistics.median(per_copy) / GB,
        "gb_per_s_best": nbytes / min(per_copy) / GB,
        "gb_per_s_burst": nbytes * repeats / total / GB,
    }


def first_sample_members(shard: Path) -> dict[str, bytes]:
    """The members of the first sample in ``shard``, by member name (``latents.pth``, ...)."""
    members: dict[str, bytes] = {}
    key = None
    with tarfile.open(shard, mode="r|") as tar:
        for info in tar:
            stem, _, member = info.name.partition(".")
            if key is not None and stem != key:
                break
            key = stem
            handle = tar.extractfile(info)
            if handle is not None:
                members[member] = handle.read()
    return members


def _to_npy(tensor: torch.Tensor) -> bytes:
    """``.npy`` bytes of ``tensor`` (bfloat16, which numpy lacks, is stored as its uint16 bit pattern)."""
    import torch

    array = tensor.view(torch.uint16).numpy() if tensor.dtype == torch.bfloat16 else tensor.numpy()
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _npy_reader(dtype: torch.dtype) -> Callable[[bytes], torch.Tensor]:
    import torch

    def read(data: bytes) -> torch.Tensor:
        tensor = torch.from_numpy(np.load(io.BytesIO(data), allow_pickle=False))
        return tensor.view(torch.bfloat16) if dtype == torch.bfloat16 else tensor

    return read


def _webdataset_default_handler_unsafe(data: bytes) -> Any:
    """UNSAFE, benchmark-only: webdataset's default ``.pth`` handler (it unpickles); own payloads only."""
    from webdataset import autodecode

    return autodecode.torch_loads(data)


def decode_costs(shard: Path, min_seconds: float = 0.05) -> dict[str, dict[str, float]]:
    """Microseconds per member to decode the first sample's tensor members of ``shard``, per format.

    Returns ``{member: {format: µs}}``; the formats are ``read_tensor(copy=False)`` (the reference: a view,
    the layout cached after the first call), ``read_tensor(copy=True)``, ``read_tensor(cache=False)`` (a
    view, parsed in full each time), ``torch.load(weights_only=True)``, ``webdataset default (unpickles)``,
    ``npy (numpy.load)`` of the same tensor and ``frombuffer (floor)``. Also ``bytes`` (the member size).
    """
    import torch

    from primus_energon.tensorfile import read_tensor

    members = first_sample_members(shard)
    costs: dict[str, dict[str, float]] = {}
    for member in TENSOR_MEMBERS:
        data = members[member]
        tensor = read_tensor(data, copy=True)
        npy = _to_npy(tensor)
        formats: dict[str, tuple[Callable[[bytes], Any], bytes]] = {
            "read_tensor(copy=False) (reference)": (
                lambda d: read_tensor(d, copy=False, fallback=True),
                data,
            ),
            "read_tensor(copy=True)": (lambda d: read_tensor(d, copy=True, fallback=True), data),
            "read_tensor(cache=False)": (
                lambda d: read_tensor(d, copy=False, fallback=True, cache=False),
                data,
            ),
            "torch.load(weights_only=True)": (
                lambda d: torch.load(io.BytesIO(d), map_location="cpu", weights_only=True),
                data,
            ),
            "webdataset default (unpickles)": (_webdataset_default_handler_unsafe, data),
            "npy (numpy.load)": (_npy_reader(tensor.dtype), npy),
            "frombuffer (floor)": (lambda d: torch.frombuffer(d, dtype=torch.uint8), data),
        }
        row: dict[str, float] = {"bytes": float(len(data))}
        for name, (fn, payload) in formats.items():
            timer = timeit.Timer(lambda fn=fn, payload=payload: fn(payload))
            number, _ = timer.autorange()
            number = max(1, int(number * min_seconds / 0.2))
            samples = timer.repeat(repeat=5, number=number)
            row[name] = min(samples) / number * 1e6
        costs[member] = row
    return costs
