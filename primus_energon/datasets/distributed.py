"""Validation spread over the ranks of a torchrun job: ``torchrun --nnodes N --nproc-per-node K -m
primus_energon validate PATH --json report.json``.

Rank 0 runs the whole validation (metadata, metadatasets, cross-checks, whole-dataset analysis) exactly as a
single process does, except that the shards of each dataset are read by all ranks: `DistributedScanner`
splits them by size (largest first, each to the rank with the fewest bytes so far), every rank scans its
share with its own ``--workers`` processes, and rank 0 puts the results back in shard order. The report is
therefore the one a single process writes, plus ``distributed: {world_size, ranks: {shard: rank}}``.

The ranks talk through torchrun's own key-value store (``torch.distributed.rendezvous("env://")``); no
process group and no collective is used, so a rank that fails or stops cannot block the others in a
collective. Each rank beats a heartbeat into the store every second. Rank 0 fails the run (exit status 3)
naming the rank and its shards when a rank reports an error, or when its heartbeat stops for
``--rank-timeout`` seconds; the other ranks then stop. Results travel as JSON, never as pickles. Progress
(bytes read by all ranks) is shown on rank 0 only.
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from ..storage import DatasetPath, dataset_dir
from .scan import ShardScan, scan_from_dict, scan_to_dict

__all__ = [
    "RANK_TIMEOUT_S",
    "DistributedScanner",
    "RankFailure",
    "RankGroup",
    "assign_shards",
    "serve",
    "torchrun_world",
]

#: how long a rank may go without a heartbeat before the run fails (``--rank-timeout``)
RANK_TIMEOUT_S = 300.0
_HEARTBEAT_S = 1.0
_POLL_S = 0.1


class RankFailure(Exception):
    """A rank failed or stopped responding; the message names the rank, its shards and what happened."""


def torchrun_world() -> tuple[int, int] | None:
    """(rank, world size) when this process is one of several ranks started by torchrun (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set, world size > 1); None otherwise."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    if world <= 1 or not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
        return None
    return rank, world


def assign_shards(names: Sequence[str], sizes: Sequence[int], world_size: int) -> list[list[str]]:
    """Each rank's shards: largest first, each to the rank holding the fewest bytes so far (the lowest rank
    on a tie); each rank's list in shard order. Deterministic for given names and sizes."""
    load = [0] * world_size
    owner: dict[str, int] = {}
    for i in sorted(range(len(names)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owner[names[i]] = rank
        load[rank] += sizes[i]
    return [[n for n in names if owner[n] == r] for r in range(world_size)]


class RankGroup:
    """This rank's handle on the job: torchrun's store (under a key prefix of this run) and a heartbeat
    thread. `timeout_s`: how long a silent rank is waited for."""

    def __init__(self, timeout_s: float = RANK_TIMEOUT_S) -> None:
        import torch.distributed as dist

        wait = max(timeout_s, 30.0)
        try:
            store, self.rank, self.world_size = next(
                dist.rendezvous("env://", timeout=timedelta(seconds=wait))
            )
        except Exception as error:  # torch raises several types for a store that does not come up
            raise RankFailure(
                f"rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')} could not join the job's store at "
                f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} within {wait:g} s (a rank that "
                f"never started, or a network problem): {type(error).__name__}: {error}"
            ) from error
        run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        self.store = dist.PrefixStore(f"primus-energon/validate/{run}/", store)
        self.timeout_s = timeout_s
        self._stop = threading.Event()
        self.store.add(f"alive/{self.rank}", 1)
        self._beat = threading.Thread(target=self._heartbeat, name="validate-heartbeat", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(_HEARTBEAT_S):
            try:
                self.store.add(f"alive/{self.rank}", 1)
            except Exception:  # the store is gone: the job is ending
                return

    def beats(self, rank: int) -> int:
        """How many heartbeats `rank` has sent."""
        return int(self.store.add(f"alive/{rank}", 0))

    def has(self, key: str) -> bool:
        return bool(self.store.check([key]))

    def get(self, key: str) -> str:
        return self.store.get(key).decode("utf-8")

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def close(self) -> None:
        self._stop.set()


class _Silence:
    """When each watched rank was last heard from."""

    def __init__(self, group: RankGroup, ranks: Sequence[int]) -> None:
        self.group = group
        now = time.monotonic()
        self.last = {r: (group.beats(r), now) for r in ranks}

    def silent_for(self, rank: int) -> float:
        beats, since = self.last[rank]
        now_beats = self.group.beats(rank)
        if now_beats != beats:
            self.last[rank] = (now_beats, time.monotonic())
            return 0.0
        return time.monotonic() - since


def _shard_list(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "") if names else "no shards"


class DistributedScanner:
    """Rank 0's shard reader for `validate_dataset`: scans with all ranks (see the module docstring)."""

    def __init__(self, group: RankGroup, *, progress: bool | None = None) -> None:
        if group.rank != 0:
            raise ValueError("DistributedScanner runs on rank 0; the other ranks run serve()")
        self.group = group
        self.world_size = group.world_size
        self.progress = progress
        self._job = 0
        self._placements: dict[str, dict[str, int]] = {}
        #: rank -> (dataset, shards) of the reads not reported yet
        self.waiting_for: dict[int, tuple[str, list[str]]] = {}

    def __call__(
        self,
        root: str | os.PathLike[str] | DatasetPath,
        names: Sequence[str],
        *,
        workers: int = 1,
        decode: bool = True,
        progress: bool | None = False,
        desc: str = "validate",
    ) -> list[ShardScan]:
        """The scans of `names` under `root`, in that order, read by all ranks."""
        from .validate import _progress_bar, scan_shards, shard_sizes

        location = dataset_dir(root)
        sizes = shard_sizes(location, names)
        plan = assign_shards(list(names), sizes, self.world_size)
        job, self._job = self._job, self._job + 1
        self._placements[str(location)] = {n: r for r, shard_list in enumerate(plan) for n in shard_list}
        self.waiting_for = {r: (str(location), plan[r]) for r in range(1, self.world_size)}
        self.group.set(f"job/{job}", json.dumps({"root": str(location), "decode": decode, "shards": plan}))
        own: dict[str, Any] = {"bytes": 0}

        def scan_own() -> None:
            def count(n: int) -> None:
                own["bytes"] += n

            try:
                own["scans"] = scan_shards(
                    location, plan[0], workers=workers, decode=decode, progress=False, on_bytes=count
                )
            except BaseException as error:  # re-raised in the calling thread
                own["error"] = error

        thread = threading.Thread(target=scan_own, name="validate-rank0", daemon=True)
        thread.start()
        bar = _progress_bar(sum(sizes), f"{desc} ({self.world_size} ranks)", self.progress)
        silence = _Silence(self.group, range(1, self.world_size))
        pending = set(range(1, self.world_size))
        results: dict[int, list[ShardScan]] = {}
        try:
            while pending or thread.is_alive():
                for rank in sorted(pending):
                    if self.group.has(f"error/{job}/{rank}"):
                        raise RankFailure(
                            f"rank {rank} of {self.world_size} failed while reading its shards of {location} "
                            f"({_shard_list(plan[rank])}): {self.group.get(f'error/{job}/{rank}')}"
                        )
                    if self.group.has(f"result/{job}/{rank}"):
                        doc = json.loads(self.group.get(f"result/{job}/{rank}"))
                        results[rank] = [scan_from_dict(d) for d in doc]
                        pending.discard(rank)
                        self.waiting_for.pop(rank, None)
                        continue
                    quiet = silence.silent_for(rank)
                    if quiet > self.group.timeout_s:
                        raise RankFailure(
                            f"rank {rank} of {self.world_size} stopped responding (no heartbeat for "
                            f"{quiet:.0f} s, --rank-timeout {self.group.timeout_s:g}) while reading its shards of "
                            f"{location} ({_shard_list(plan[rank])}); its node may have failed or the process "
                            "hung. Nothing was reported for those shards"
                        )
                done = own["bytes"] + sum(
                    int(self.group.store.add(f"bytes/{job}/{r}", 0)) for r in range(1, self.world_size)
                )
                bar.update(max(0, min(done, bar.total) - bar.n))
                if pending or thread.is_alive():
                    time.sleep(_POLL_S)
        finally:
            bar.close()
        thread.join()
        if "error" in own:
            raise own["error"]
        results[0] = own["scans"]
        by_name = {s.name: s for scans in results.values() for s in scans}
        return [by_name[n] for n in names if n in by_name]

    def unfinished(self) -> str:
        """Which ranks have not reported, and their shards (for a run stopped from outside)."""
        if not self.waiting_for:
            return "no shards were being read" if self._job else "before any shard was assigned"
        return "; ".join(
            f"rank {r} had not reported its shards of {where} ({_shard_list(names)})"
            for r, (where, names) in sorted(self.waiting_for.items())
        )

    def placement(self, root: DatasetPath, names: Sequence[str]) -> dict[str, Any]:
        """The report's ``distributed`` entry for the dataset at `root`: world size and shard -> rank."""
        ranks = self._placements.get(str(root), {})
        return {"world_size": self.world_size, "ranks": {n: ranks[n] for n in names if n in ranks}}

    def finish(self) -> None:
        """Tell the other ranks that validation is over (they exit 0)."""
        self.group.set("stop", "done")

    def abort(self, message: str) -> None:
        """Tell the other ranks that the run failed (they stop and exit)."""
        self.group.set("stop", f"abort: {message}")


def serve(group: RankGroup, *, workers: int = 1) -> int:
    """A rank other than 0: scan the shards rank 0 assigns, job after job, until it says stop. Returns the
    exit status: 0 when rank 0 finished, 1 when this rank failed, 3 when rank 0 aborted or went silent."""
    from .validate import scan_shards

    job = 0
    failed = False
    silence = _Silence(group, [0])
    while True:
        if group.has("stop"):
            return 1 if failed else (0 if group.get("stop") == "done" else 3)
        if not failed and group.has(f"job/{job}"):
            doc = json.loads(group.get(f"job/{job}"))
            names = doc["shards"][group.rank]
            counter = f"bytes/{job}/{group.rank}"
            try:
                scans = scan_shards(
                    doc["root"],
                    names,
                    workers=workers,
                    decode=doc["decode"],
                    progress=False,
                    on_bytes=lambda n, key=counter: group.store.add(key, n),
                )
                group.set(f"result/{job}/{group.rank}", json.dumps([scan_to_dict(s) for s in scans]))
            except Exception as error:  # said to rank 0, which fails the run naming this rank
                detail = traceback.format_exception_only(type(error), error)[-1].strip()
                group.set(f"error/{job}/{group.rank}", detail)
                failed = True
            job += 1
            continue
        if silence.silent_for(0) > group.timeout_s:
            return 3
        time.sleep(_POLL_S)
