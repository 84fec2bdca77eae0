"""The supervised process that runs a target: ``python -m primus_energon.conformance.processes.worker``.

The pytest process gives the verdicts and never runs a target's code; it starts one of these per target
(:mod:`primus_energon.conformance.processes.supervisor`) and sends it requests, one JSON object per line on the
``--requests`` descriptor; each gets one JSON reply on ``--replies``:

* ``{"op": "resolve", "spec", "kind", "options", "resume_hooks", "encoding", "schema", "dataset",
  "profile"}``: check the environment, import and build the target; ``{"ok": true, "name", "describe"}``,
  ``{"environment": [LINE, ...]}`` (what this environment lacks to run the suite, each with its fix) or
  ``{"problem": TEXT}`` (a usage error: it does not import, is of the wrong kind, its data format is unknown);
* ``{"op": "context", ...make_context options, "prestart": [property ids]}``: make the datasets and start
  the properties' child processes ahead; ``{"ok": true, "reproduce": {property id: command}}``;
* ``{"op": "run", "property", "expected"}``: one property; ``{"result": PropertyResult.to_dict()}``;
* ``{"op": "release"}``: end the context's children, keep the target for another context;
* ``{"op": "close"}``: end the context's children and exit.

What it is doing meanwhile (property, claim, call into the target) is published as breadcrumbs; a stack
of every thread is written to ``--stacks`` on SIGUSR2 and on a fatal signal (faulthandler: no Python
signal handler involved, so a target's own handlers do not stand in the way).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import gc
import json
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "STACK_SIGNAL"]

#: the signal the supervisor sends for a stack of every thread before it ends a stuck process
STACK_SIGNAL = signal.SIGUSR2


class _Worker:
    def __init__(self) -> None:
        self.target: Any = None
        self.ctx: Any = None
        self.options: dict[str, Any] = {}
        self.seal: Any = None

    def resolve(self, request: dict[str, Any]) -> dict[str, Any]:
        # First what this environment lacks (the pytest process leaves the check to this one, which imports
        # torch and Energon anyway): before anything below imports them.
        from primus_energon.environment import probe_local_paths, problems

        broken = problems() or [line for line in [probe_local_paths()] if line]
        if broken:
            return {"environment": broken}
        from ..core.profiles import PROFILES
        from ..data.workspace import Workspace
        from ..engine.context import CheckContext
        from ..engine.seal import take
        from ..engine.session import parse_resume_hooks
        from ..engine.target import resolve_target
        from ..properties import PROPERTIES

        for prop in PROPERTIES:  # every property module imported, so that the seal covers it
            prop.claims  # noqa: B018 -- imports the module
        self.seal = take()
        try:
            self.target = resolve_target(request["spec"], kind=request["kind"], **request.get("options", {}))
            parse_resume_hooks(request.get("resume_hooks"))
        except Exception as error:  # any import-time failure of the user's module, said in one line
            return {"problem": " ".join(str(error).split()) or type(error).__name__}
        missing = self.target.environment_problem()
        if missing is not None:
            return {"environment": [missing]}
        workspace = Workspace(
            Path("."), schema_files=request.get("schema") or [], dataset=request.get("dataset")
        )
        ctx = CheckContext(
            self.target, workspace, PROFILES[request["profile"]], encoding=request.get("encoding")
        )
        problem = ctx.format_problem()
        if problem:
            return {"problem": problem}
        return {"ok": True, "name": self.target.name, "describe": self.target.describe()}

    def context(self, request: dict[str, Any]) -> dict[str, Any]:
        from ..engine.session import make_context, prestart
        from ..properties import PROPERTIES

        options = dict(request)
        options.pop("op")
        self.release()  # a context made before (pytest set this target up again)
        wanted = set(options.pop("prestart", []))
        accepted = options.pop("accepted", None)
        observations = options.pop("observations", None) or []
        self.ctx = make_context(self.target, **options)
        if observations:  # what the earlier workers saw left behind, for the conduct property
            from ..engine.leftovers import Leftovers
            from ..properties.conduct import OBSERVATIONS

            seen = self.ctx.cached(OBSERVATIONS, list)
            seen.extend((pid, Leftovers(**left)) for pid, left in observations)
        if accepted is not None:  # judged by an earlier worker (which then stopped): not run again
            from ..core.results import PropertyResult

            self.ctx.cached("accepted-result", lambda: PropertyResult.from_dict(accepted))
        prestart(self.ctx, [prop for prop in PROPERTIES if prop.id in wanted])
        return {"ok": True, "reproduce": {prop.id: self.ctx.reproduce(prop.id) for prop in PROPERTIES}}

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        from ..core import breadcrumbs
        from ..engine.session import run_property
        from ..properties import get_property

        prop = get_property(request["property"])
        from ..properties.conduct import OBSERVATIONS

        seen = self.ctx.cached(OBSERVATIONS, list)
        before = len(seen)
        with breadcrumbs.mark(property=prop.id, claim=None, call=None):
            result = run_property(prop, self.ctx, expected_failures=request.get("expected") or {})
        left = dataclasses.asdict(seen[-1][1]) if len(seen) > before else None
        broken = self.seal.broken() if self.seal is not None else []
        if broken:
            result = _untrusted(result, broken)
        return {"result": result.to_dict(), "leftovers": left}

    def release(self, request: dict[str, Any] | None = None) -> dict[str, Any]:
        """End the context (its children, its datasets' use); the target stays built for the next one."""
        if self.ctx is not None:
            self.ctx.close()
            self.ctx = None
        return {"released": True}

    def close(self) -> dict[str, Any]:
        self.release()
        return {"closed": True}


def _untrusted(result: Any, broken: list[str]) -> Any:
    """``result`` with every claim failed: the target changed the suite's code in this process
    (:mod:`~primus_energon.conformance.engine.seal`), so no verdict judged here can be trusted."""
    shown = ", ".join(broken[:4]) + (f" and {len(broken) - 4} more" if len(broken) > 4 else "")
    message = (
        f"the target changed the conformance suite's own code in the process that runs it ({shown} replaced): "
        "no verdict judged in that process can be trusted, so every claim fails"
    )
    fix = "do not patch primus_energon.conformance from the data path (at import or in any call)"
    claims = [dataclasses.replace(claim, verdict="fail", message=message, fix=fix) for claim in result.claims]
    return dataclasses.replace(result, verdict="fail", message=message, claims=claims)


def _send(fd: int, reply: dict[str, Any]) -> None:
    data = (json.dumps(reply, default=str) + "\n").encode("utf-8", "replace")
    while data:
        written = os.write(fd, data)
        data = data[written:]


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the supervisor's requests until it says ``close`` or its end of the pipe closes."""
    parser = argparse.ArgumentParser(
        prog="python -m primus_energon.conformance.processes.worker", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--requests", type=int, required=True, help="descriptor the requests arrive on")
    parser.add_argument("--replies", type=int, required=True, help="descriptor the replies go to")
    parser.add_argument("--progress", required=True, help="file for the breadcrumbs")
    parser.add_argument("--stacks", required=True, help="file for thread stacks (SIGUSR2, fatal signals)")
    options = parser.parse_args(argv)
    stacks = open(options.stacks, "w")  # noqa: SIM115 -- faulthandler writes to it until the process ends
    faulthandler.enable(file=stacks, all_threads=True)
    faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True, chain=False)

    from ..core import breadcrumbs

    breadcrumbs.publish_to(options.progress)
    from ..engine import session  # noqa: F401 -- torch and Energon now, while the other targets' workers start too

    worker = _Worker()
    requests = os.fdopen(options.requests, "rb")
    gc.freeze()
    while True:
        line = requests.readline()
        if not line:
            break  # the supervisor is gone
        request = json.loads(line)
        op = request.get("op")
        try:
            served = op in ("resolve", "context", "run", "release")
            reply = getattr(worker, op)(request) if served else worker.close()
        except BaseException as error:  # noqa: BLE001 -- told to the supervisor, which judges it
            reply = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-4000:]}
        _send(options.replies, reply)
        if op == "close":
            break
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # the target may have closed or replaced them
            stream.flush()
    # A thread the target left running must not keep this process alive (the supervisor named it already).
    os._exit(0)


if __name__ == "__main__":
    main()
