"""Rank coordination for distributed generation (``RANK``/``WORLD_SIZE`` as `torchrun` sets them).

Every rank plans the same dataset; rank ``r`` writes shards ``r, r + W, r + 2W, ...`` (names are global shard
indices, so they never collide), rank 0 prepares the output directory first and finalizes last. The ranks talk
over a gloo process group: the caller's if one is initialized (a new gloo group on the same ranks), otherwise
one made from ``MASTER_ADDR``/``MASTER_PORT`` and torn down afterwards. The output directory must be on a
filesystem every rank sees.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .errors import SyntheticError

__all__ = ["Coordinator", "SingleProcess", "coordinator_from_env"]

#: how long a rank waits for the others (shards of a large dataset take a while)
TIMEOUT = timedelta(hours=6)


@dataclass
class SingleProcess:
    """The trivial coordinator: one process does everything."""

    rank: int = 0
    world_size: int = 1

    def broadcast(self, obj: Any) -> Any:
        return obj

    def gather(self, obj: Any) -> list[Any] | None:
        return [obj]

    def close(self) -> None:
        pass


class Coordinator:
    """Broadcast from and gather to rank 0 over a gloo group."""

    def __init__(self, rank: int, world_size: int) -> None:
        import torch.distributed as dist

        self.rank, self.world_size = rank, world_size
        self._dist = dist
        self._owns_default = False
        if dist.is_initialized():
            if dist.get_world_size() != world_size or dist.get_rank() != rank:
                raise SyntheticError(
                    f"RANK/WORLD_SIZE say {rank}/{world_size} but the initialized process group is "
                    f"{dist.get_rank()}/{dist.get_world_size()}; unset them or make them agree"
                )
            self._group = dist.new_group(backend="gloo", timeout=TIMEOUT)
        else:
            missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
            if missing:
                raise SyntheticError(
                    f"RANK/WORLD_SIZE are set ({rank}/{world_size}) but {' and '.join(missing)} not; launch "
                    "with torchrun, set them, or unset RANK/WORLD_SIZE for single-process generation"
                )
            dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=TIMEOUT)
            self._owns_default = True
            self._group = None

    def broadcast(self, obj: Any) -> Any:
        box = [obj if self.rank == 0 else None]
        self._dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        self._dist.gather_object(obj, out, dst=0, group=self._group)
        return out

    def close(self) -> None:
        if self._owns_default:
            self._dist.destroy_process_group()
        elif self._group is not None:
            self._dist.destroy_process_group(self._group)


def coordinator_from_env() -> SingleProcess | Coordinator:
    """`Coordinator` when ``WORLD_SIZE`` > 1 is set, else `SingleProcess`."""
    raw_world, raw_rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    if raw_world is None and raw_rank is None:
        return SingleProcess()
    try:
        world = int(raw_world if raw_world is not None else "1")
        rank = int(raw_rank if raw_rank is not None else "0")
    except ValueError:
        raise SyntheticError(f"RANK={raw_rank!r} and WORLD_SIZE={raw_world!r} must be integers") from None
    if world < 1 or not (0 <= rank < world):
        raise SyntheticError(f"need 0 <= RANK < WORLD_SIZE, got RANK={rank} WORLD_SIZE={world}")
    if world == 1:
        return SingleProcess()
    return Coordinator(rank, world)
