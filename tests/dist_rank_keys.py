"""Run under torchrun by test_loader_factory: each rank writes the keys of its one-epoch share."""

import json
import sys
from pathlib import Path

import torch.distributed as dist

from primus_energon import EncodedDiffusionTaskEncoder, get_loader, resolve_rank

dataset, out = sys.argv[1], Path(sys.argv[2])
dist.init_process_group("gloo")
loader = get_loader(
    dataset, EncodedDiffusionTaskEncoder, batch_size=3, num_workers=0, mode="train", repeat=False
)
keys = [key for batch in loader.dataloader for key in batch["__key__"]]
rank, world = dist.get_rank(), dist.get_world_size()
try:  # explicit values that contradict torch.distributed must be refused
    resolve_rank(rank=(rank + 1) % world, world_size=world)
    contradiction = "accepted"
except ValueError as error:
    contradiction = str(error)
record = {"rank": rank, "world_size": world, "keys": keys, "contradiction": contradiction}
(out / f"rank{rank}.json").write_text(json.dumps(record))
dist.barrier()
dist.destroy_process_group()
