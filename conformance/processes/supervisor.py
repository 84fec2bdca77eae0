"""The verdict process never runs a target's code: each target runs in a supervised process of its own
(:mod:`primus_energon.conformance.processes.worker`), asked to run one property at a time.

The supervisor bounds every request (a time budget per property, and per call into the target, read off
the breadcrumbs the worker publishes), and turns every way the worker can stop answering into a finding
about the target: it exited (``os._exit``, ``sys.exit`` from a thread), a signal killed it (a segfault in a
decoder, the kernel's OOM killer), or a call did not return within its budget (with the stack of the stuck
thread, written by faulthandler, which no Python signal handler of the target can stand in the way of). The
property it happened in fails on the claim that was running, naming the call; the next property gets a
fresh process. No outcome of a target's call can make a property pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import breadcrumbs
from ..core.results import ClaimResult, PropertyResult
from .children import Child, child_env, start, stop

__all__ = [
    "WorkerGone",
    "Supervisor",
    "SupervisedTarget",
    "gone_result",
    "DEFAULT_PROPERTY_TIMEOUT_S",
]

#: seconds one property may take in all (the restart property's torch.distributed runs take the longest)
DEFAULT_PROPERTY_TIMEOUT_S = 1200.0
#: seconds past the call budget before the supervisor ends a call (the checks' own limits fire first)
CALL_GRACE_S = 30.0  # (at most the call budget itself)
#: seconds to import and build a target
RESOLVE_TIMEOUT_S = 300.0
_POLL_S = 0.25
_RESOLVING = "importing and building the target"


@dataclass
class WorkerGone(Exception):
    """The supervised process stopped answering: ``how`` is "ended" or "stuck"."""

    how: str
    what: str
    where: dict[str, Any] = field(default_factory=dict)
    stack: str = ""
    output: str = ""

    def __str__(self) -> str:
        return self.what


class Supervisor:
    """One supervised worker process and its request/reply pipes."""

    def __init__(self, folder: Path, *, call_timeout_s: float) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        # Its own temporary folder, removed when it ends however it ends: what it and the processes it starts
        # leave there (torch.distributed's torchelastic_* logs, a property's folders after a crash) goes with
        # it. Short, beside the user's: multiprocessing puts Unix sockets in it (108 bytes a path at most).
        self.tmp = Path(tempfile.mkdtemp(prefix="cf-"))
        self.call_timeout_s = call_timeout_s
        self.progress = folder / "progress.json"
        self.stacks = folder / "stacks.txt"
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        command = [
            sys.executable,
            "-m",
            __package__ + ".worker",
            "--requests",
            str(to_child_r),
            "--replies",
            str(from_child_w),
            "--progress",
            str(self.progress),
            "--stacks",
            str(self.stacks),
        ]
        try:
            self.child: Child = start(
                command,
                env=child_env(TMPDIR=str(self.tmp)),
                pass_fds=(to_child_r, from_child_w),
                die_with_parent=True,
                memory_cap=False,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.child.process.pid

    def request(self, message: dict[str, Any], *, timeout_s: float, what: str) -> dict[str, Any]:
        """Send ``message`` and wait for the reply; :class:`WorkerGone` if the process ends or is stuck."""
        self.send(message, what=what)
        return self.receive(timeout_s=timeout_s, what=what)

    def send(self, message: dict[str, Any], *, what: str) -> None:
        """Send one request (:class:`WorkerGone` if the process is gone)."""
        try:
            os.write(self._to_child, (json.dumps(message) + "\n").encode())
        except OSError:
            raise self._ended(what) from None

    def receive(self, *, timeout_s: float, what: str) -> dict[str, Any]:
        """The reply to the request sent last; :class:`WorkerGone` if the process ends or is stuck."""
        started = time.monotonic()
        while True:
            ready, _, _ = select.select([self._from_child], [], [], _POLL_S)
            if ready:
                chunk = os.read(self._from_child, 1 << 16)
                if not chunk:
                    raise self._ended(what)
                self._buffer += chunk
                if b"\n" in self._buffer:
                    line, _, self._buffer = self._buffer.partition(b"\n")
                    return json.loads(line)
                continue
            if self.child.process.poll() is not None:
                raise self._ended(what)
            where = breadcrumbs.read(str(self.progress))
            since = where.get("since")
            if where.get("call") and isinstance(since, (int, float)):
                running = time.time() - since
                if running > self.call_timeout_s + min(CALL_GRACE_S, self.call_timeout_s):
                    raise self._stuck(
                        f"{where['call']} did not return within {self.call_timeout_s:.0f} s (ended after "
                        f"{running:.0f} s)",
                        where,
                    )
            if time.monotonic() - started > timeout_s:
                doing = where.get("call") or where.get("claim") or what
                raise self._stuck(
                    f"{what} did not finish within {timeout_s:.0f} s (it was at: {doing})", where
                )

    def _ended(self, what: str) -> WorkerGone:
        where = breadcrumbs.read(str(self.progress))
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.child.process.wait(5)
        code = self.child.process.poll()
        stop(self.child)
        if code is None:
            status = "closed its end of the supervisor's pipe"
        elif code < 0:
            status = f"was killed by signal {_signal_name(-code)}"
        else:
            status = f"exited with status {code}"
        doing = where.get("call") or where.get("claim") or what
        return WorkerGone(
            "ended",
            f"the process running the target {status} during {doing}",
            where,
            self._stack(where, fatal=True),
            self._output(),
        )

    def _stuck(self, what: str, where: dict[str, Any]) -> WorkerGone:
        before = self.stacks.stat().st_size if self.stacks.exists() else 0
        with contextlib.suppress(OSError):
            os.kill(self.pid, _stack_signal())
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            time.sleep(0.1)
            size = self.stacks.stat().st_size if self.stacks.exists() else 0
            if size > before:
                time.sleep(0.2)  # the rest of the dump
                break
        stop(self.child)
        return WorkerGone("stuck", what, where, self._stack(where, fatal=False), self._output())

    def _stack(self, where: dict[str, Any], *, fatal: bool) -> str:
        """The stack of the thread that made the call (else the current thread) from the last dump."""
        try:
            text = self.stacks.read_text(errors="replace")
        except OSError:
            return ""
        if not text.strip():
            return ""
        blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text.strip())
        if fatal and not any(b.startswith("Fatal Python error") or "Fatal" in b[:80] for b in blocks):
            return ""
        wanted = where.get("thread")
        chosen = None
        for block in blocks:
            match = re.match(
                r"(?:Current thread|Thread) (0x[0-9a-f]+)",
                block.split("\n", 1)[-1] if block.startswith("Fatal") else block,
            )
            if match and isinstance(wanted, int) and int(match.group(1), 16) == wanted:
                chosen = block
        if chosen is None:
            chosen = next((b for b in blocks if "Current thread" in b), blocks[-1])
        lines = [
            line for line in chosen.splitlines() if line.strip() and not line.startswith("Extension modules")
        ]
        return "\n".join(lines[:24])

    def _output(self, limit: int = 1500) -> str:
        text = self.child.stderr_tail(limit)
        with contextlib.suppress(OSError):
            self.child.stdout.seek(0)
            out = self.child.stdout.read().decode("utf-8", "replace")[-limit:]
            if out.strip():
                text = (out.strip() + "\n" + text).strip()
        return text[-limit:]

    def close(self) -> None:
        if self.child.process.poll() is None:
            with contextlib.suppress(WorkerGone, OSError, ValueError):
                self.request({"op": "close"}, timeout_s=60.0, what="closing")
        stop(self.child)
        for fd in (self._to_child, self._from_child):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _stack_signal() -> int:
    from .worker import STACK_SIGNAL

    return STACK_SIGNAL


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


class SupervisedTarget:
    """A target as the pytest process knows it: its spec and kind, and a supervised worker that has built
    it. Properties run through :meth:`run`; after a worker is gone, the next property starts a fresh one."""

    def __init__(
        self,
        kind: str,
        spec: str,
        *,
        resolve: dict[str, Any],
        folder: Path,
        call_timeout_s: float,
        property_timeout_s: float = DEFAULT_PROPERTY_TIMEOUT_S,
    ) -> None:
        self.kind = kind
        self.spec = spec
        self.folder = folder
        self.call_timeout_s = call_timeout_s
        self.property_timeout_s = property_timeout_s
        self._resolve = {"op": "resolve", "spec": spec, "kind": kind, **resolve}
        self._context: dict[str, Any] | None = None
        self._incarnation = 0
        self.name = spec
        self.description = spec
        #: what the worker found this environment lacks (:meth:`started`), one line each with its fix
        self.environment: list[str] = []
        self.reproduce: dict[str, str] = {}
        self.strict = False
        self.supervisor: Supervisor | None = None
        #: the accepted property's result (every other property consults it; a fresh worker gets it)
        self.accepted: dict[str, Any] | None = None
        #: ``[property id, Leftovers as a dict]`` observed so far, in every worker (conduct reports them)
        self.observations: list[list[Any]] = []
        #: how earlier workers stopped: (what, first stack line in the target) -> property id
        self._gone: dict[tuple[str, str], str] = {}

    def start(self) -> str | None:
        """Start a worker and build the target there; a usage problem (one line) or None."""
        self.launch()
        return self.started()

    def launch(self) -> None:
        """Start a worker and ask it to build the target (:meth:`started` waits for the answer)."""
        self._incarnation += 1
        self.supervisor = Supervisor(
            self.folder / f"worker-{self._incarnation}", call_timeout_s=self.call_timeout_s
        )
        self._launch_error: WorkerGone | None = None
        try:
            self.supervisor.send(self._resolve, what=_RESOLVING)
        except WorkerGone as gone:
            self._launch_error = gone

    def started(self) -> str | None:
        """The launched worker's answer: a usage problem (one line) or None."""
        assert self.supervisor is not None
        try:
            if self._launch_error is not None:
                raise self._launch_error
            reply = self.supervisor.receive(timeout_s=RESOLVE_TIMEOUT_S, what=_RESOLVING)
        except WorkerGone as gone:
            detail = (
                f"; last lines it wrote: {' '.join(gone.output.split())[-400:]}"
                if gone.output.strip()
                else ""
            )
            return f"{gone.what}{detail}"
        if "environment" in reply:
            self.environment = list(reply["environment"])
            return "; ".join(self.environment)
        if "problem" in reply or "error" in reply:
            return reply.get("problem") or reply["error"]
        self.name, self.description = reply["name"], reply["describe"]
        return None

    def open(self, context: dict[str, Any], remaining: list[str]) -> None:
        """Make the context (datasets, children started ahead for ``remaining`` properties) in the worker."""
        self._context = dict(context)
        self.strict = bool(context.get("strict"))
        try:
            if self.supervisor is None or self.supervisor.child.process.poll() is not None:
                self._restart(remaining)  # pytest closed this target before (its tests interleave)
            else:
                self._open(remaining)
        except WorkerGone:
            self._drop()  # the first property run starts a worker again, and reports how it stops

    def _open(self, remaining: list[str]) -> None:
        assert self.supervisor is not None and self._context is not None
        context = {
            **self._context,
            # a fresh worker after one that stopped makes its datasets anew, beside the first one's
            "workdir": str(
                Path(self._context["workdir"])
                / ("" if self._incarnation == 1 else f"after-restart-{self._incarnation}")
            ),
            "accepted": self.accepted,
            "observations": self.observations,
        }
        reply = self.supervisor.request(
            {"op": "context", **context, "prestart": remaining},
            timeout_s=self.property_timeout_s,
            what="making the datasets",
        )
        if "error" in reply:
            raise RuntimeError(
                f"making the conformance datasets failed: {reply['error']}\n{reply.get('traceback', '')}"
            )
        self.reproduce = reply["reproduce"]

    def run(self, property_id: str, expected: dict[str, str], remaining: list[str]) -> PropertyResult:
        """One property's result; a worker that ends or hangs fails the claim that was running."""
        from ..properties import get_property

        prop = get_property(property_id)
        try:
            if self.supervisor is None or self.supervisor.child.process.poll() is not None:
                self._restart([property_id, *remaining])
            assert self.supervisor is not None
            reply = self.supervisor.request(
                {"op": "run", "property": property_id, "expected": expected},
                timeout_s=self.property_timeout_s,
                what=f"property {property_id}",
            )
        except WorkerGone as gone:
            self._drop()
            signature = (gone.what, gone.stack.split("\n", 3)[-1][:300])
            earlier = self._gone.setdefault(signature, prop.id)
            result = gone_result(prop, self.spec, gone, self.reproduce.get(prop.id, ""), same_as=earlier)
            if prop.id == "accepted":
                self.accepted = result.to_dict()
            return result
        if "error" in reply:
            raise RuntimeError(
                f"the conformance worker failed: {reply['error']}\n{reply.get('traceback', '')}"
            )
        result = PropertyResult.from_dict(reply["result"])
        if property_id == "accepted":
            self.accepted = reply["result"]
        if reply.get("leftovers") is not None:
            self.observations.append([property_id, reply["leftovers"]])
        return result

    def _restart(self, remaining: list[str]) -> None:
        """A fresh worker (the last one stopped), with the target built and the context made again."""
        self._drop()
        problem = self.start()
        if problem is not None:
            raise WorkerGone("ended", problem)
        self._open(remaining)

    def _drop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.close()
            self.supervisor = None

    def release(self) -> None:
        """End the context (pytest is done with this target for now) and keep the process for the next:
        under pytest-xdist a target's tests interleave with others', and each set-up would otherwise import
        torch and Energon again."""
        if self.supervisor is None or self.supervisor.child.process.poll() is not None:
            return
        try:
            self.supervisor.request({"op": "release"}, timeout_s=120.0, what="ending the checks' processes")
        except WorkerGone:
            self._drop()

    def close(self) -> None:
        if self.supervisor is not None:
            self.supervisor.close()
            self.supervisor = None


def gone_result(
    prop: Any, target: str, gone: WorkerGone, reproduce: str, *, same_as: str | None = None
) -> PropertyResult:
    """A property whose worker ended or hung: the claim that was running fails (harm: crash), naming the
    call, the exit status or the budget, the stack and the last lines written; the others are not judged.
    ``same_as``: the property where the worker stopped the same way first (one root cause is reported
    once: here every claim is skipped, pointing there)."""
    running = gone.where.get("claim")
    if same_as is not None and same_as != prop.id:
        reason = f"not judged: the process running the target stopped here as it did in property {same_as}: {gone.what}"
        claims = [ClaimResult(c.id, c.title, c.harm.label, "skip", reason) for c in prop.claims]
        return PropertyResult(property=prop.id, target=target, verdict="skip", message=reason, claims=claims)
    declared = [c for c in prop.claims]
    if running not in {c.id for c in declared}:
        running = declared[0].id
    if gone.how == "ended":
        harm = (
            "in training this ends the rank, and the job with it (a clean exit status makes the job look "
            "finished); the target's code ended it: os._exit or sys.exit in a thread, a signal, a crash in "
            "native code, or the system ran out of memory"
        )
    else:
        harm = "in training a hang stalls every rank at its next collective until the job's timeout"
    message = f"{gone.what}: {harm}"
    if gone.stack:
        message += "\nstack (most recent call first):\n" + gone.stack
    if gone.output.strip():
        message += "\nlast lines the process wrote:\n" + gone.output.strip()
    fix = (
        "run the call named above on its own (the reproduce command) and look for what ends the process or never "
        "returns; a data pipeline must raise an exception for a sample it cannot handle"
    )
    claims = []
    for claim in declared:
        if claim.id == running:
            claims.append(ClaimResult(claim.id, claim.title, "crash", "fail", message, fix))
        else:
            claims.append(
                ClaimResult(
                    claim.id,
                    claim.title,
                    claim.harm.label,
                    "skip",
                    f"not judged: the process running the target stopped during {running}",
                )
            )
    return PropertyResult(
        property=prop.id,
        target=target,
        verdict="fail",
        message=f"[crash] {running}: " + message.replace("\n", "\n    ") + f"\n    fix: {fix}",
        reproduce=reproduce,
        claims=claims,
        details={"supervisor": {"how": gone.how, "where": gone.where}},
    )
