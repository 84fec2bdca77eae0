"""A child entry for the fork-server tests (``entry=`` of ``ForkServer.fork``): ``main(argv)`` does what
``argv[0]`` says."""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> None:
    what, *rest = argv
    if what == "state":
        import random

        import numpy
        import torch

        state = {
            "pid": os.getpid(),
            "hash": hash("primus-energon"),
            # the memory layout: where a new object lands, and the hash a plain object gets from it
            "layout": [id(object()), hash(object()), id(torch.empty(0))],
            "random": random.random(),
            "numpy": float(numpy.random.rand()),
            "torch": float(torch.rand(1)),
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "argv": sys.argv,
            "threads": torch.get_num_threads(),
            "session_leader": os.getsid(0) == os.getpid(),
            "zoo_imported": "tests.conformance_zoo.formats" in sys.modules,
        }
        with open(rest[0], "w", encoding="utf-8") as out:
            json.dump(state, out)
        print("to stdout")
        print("to stderr", file=sys.stderr)
    elif what == "exit":
        raise SystemExit(int(rest[0]))
    elif what == "raise":
        raise ValueError("raised in the child")
    elif what == "sleep":
        time.sleep(600)
    elif what in ("orphan", "grandchild"):  # a loader worker (forked, in the child's session) ...
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        with open(rest[0], "w", encoding="utf-8") as out:
            out.write(str(pid))
        if what == "orphan":  # ... left running by a child that ends
            os._exit(0)
        time.sleep(600)
