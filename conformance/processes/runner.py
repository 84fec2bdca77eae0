"""The child entry point: ``python -m primus_energon.conformance.processes.runner SUBCOMMAND ...`` rebuilds the target
from its spec in a fresh process and runs one property's child half there::

    python -m primus_energon.conformance.processes.runner determinism --spec M:A --kind cooker --input-form bytes \\
        --seed 0 --dataset DIR [--dataset DIR ...] --workers 0,1,2 --batches 6 --batch-size 4 --out FILE.json
    python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2 \\
        -m primus_energon.conformance.processes.runner shard --spec M:A --kind task_encoder --dataset DIR --out DIR
    python -m primus_energon.conformance.processes.runner probe --spec M:A --kind task_encoder --dataset DIR \\
        --markers DIR --out FILE.json

The suite forks these from a fork server (:mod:`~primus_energon.conformance.processes.forkserver`), which calls
:func:`main` with the same arguments; the commands above are what reproduces a run by hand.

Each subcommand's arguments and work live beside the property they serve (``add_child_arguments`` and
``run_child`` in :mod:`~primus_energon.conformance.properties.determinism`,
:mod:`~primus_energon.conformance.properties.sharding` and :mod:`~primus_energon.conformance.properties._probe`); the
parent side is :mod:`primus_energon.conformance.processes.children`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["CHILDREN", "main"]

#: subcommand -> the module holding its ``add_child_arguments(parser)`` and ``run_child(target, options)``
CHILDREN = {
    "determinism": "primus_energon.conformance.properties.determinism",
    "shard": "primus_energon.conformance.properties.sharding",
    "probe": "primus_energon.conformance.properties._probe",
    "restart": "primus_energon.conformance.properties.restart",
}


def main(argv: Sequence[str] | None = None) -> None:
    """Parse ``argv``, rebuild the target, run the subcommand's child half."""
    from ..engine.target import resolve_target

    parser = argparse.ArgumentParser(
        prog="python -m primus_energon.conformance.processes.runner", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {name: importlib.import_module(module) for name, module in CHILDREN.items()}
    for name, module in modules.items():
        p = sub.add_parser(name)
        p.add_argument("--spec", required=True, help="MODULE:ATTR of the target")
        p.add_argument("--kind", required=True, choices=["cooker", "task_encoder", "wrapper"])
        p.add_argument("--input-form", default="bytes", choices=["bytes", "decoded"])
        p.add_argument("--dataset", action="append", required=True, help="prepared dataset (repeatable)")
        module.add_child_arguments(p)
    options = parser.parse_args(argv)
    _plant_generators()
    target = resolve_target(options.spec, kind=options.kind, input_form=options.input_form)
    gc.freeze()  # as in make_context: Energon's gc.collect() before each fork then skips the imports
    modules[options.command].run_child(target, options)
    # Done: a thread the target left running (not a daemon) must not keep this process from exiting, which
    # the parent would wait out as a hang; the parent's conduct property names such threads.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _plant_generators() -> None:
    """Put the global generators in the planted state the parent asked for (``RNG_PLANT_VARIABLE``, plus this
    process's torch.distributed rank): a known state per run, so that what a target draws from them without
    a seed differs between the runs a check compares, every time (as it would in training, where nothing
    makes two processes agree); without the variable (a run by hand), they stay as the interpreter seeded them."""
    from ..engine.rngs import plant
    from .children import RNG_PLANT_VARIABLE

    index = os.environ.get(RNG_PLANT_VARIABLE, "")
    if index.isdigit():
        plant(int(index) + int(os.environ.get("RANK", "0") or 0))


if __name__ == "__main__":
    main()
