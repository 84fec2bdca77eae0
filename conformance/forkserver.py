"""Fresh processes without an interpreter start each: a fork server per hash seed.

The suite's child halves (determinism's runs, the torch.distributed ranks of sharding and restart, the
code-execution probe) each ran ``python -m primus_energon.conformance.runner`` in a new interpreter, and the
ranks under ``torch.distributed.run``, whose agent is one more: importing torch and Energon, about 1.7 CPU
seconds a process, was half of what a ci run spent on 2 cores. A fork server is one interpreter, started
with a given ``PYTHONHASHSEED``, that imports torch, numpy, Energon and the runner's modules (never the
target's own module) and then forks one child per request, which runs the runner's command line.

Python's ``multiprocessing`` forkserver is the same design; it is not used because a process gets one of
it, whose hash seed cannot be chosen, and its children run a pickled function in the server's environment.

A forked child is fresh wherever a target can tell:

* its hash seed is its server's, and there is one server per ``PYTHONHASHSEED`` asked for, so runs meant
  to differ in it (determinism's two runs, restart's saving and restoring processes) still do;
* the target's module is imported in the child, never in the server;
* Python's ``random`` is reseeded at the fork (its own at-fork hook); numpy's and torch's global generators
  are reseeded from the OS in the child, as a new interpreter seeds them;
* its environment, working directory, standard streams and command line are the request's, and torch's
  thread count follows ``OMP_NUM_THREADS`` as it would at start-up;
* it leads a session of its own (stopping it stops the loader workers it forks), keeps its server's
  address-space cap and core-file limit, and dies with its server; a server ends its children and itself
  when the process that started it closes it or goes away.

What it shares: the modules imported before the fork, in their state just after import. Where forking is
not available (not Linux), :func:`supported` is False and callers start interpreters as before.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

__all__ = [
    "PRELOAD",
    "RUNNER",
    "ForkServer",
    "ForkServers",
    "Forked",
    "ForkedGroup",
    "rank_environments",
    "supported",
]

#: what a server imports before it forks: what every child half imports anyway (torch, numpy, Energon,
#: torch.distributed for the ranks) and the runner with the modules of its subcommands
PRELOAD = (
    "numpy",
    "torch",
    "torch.distributed",
    "megatron.energon",
    "primus_energon.conformance.runner",
    "primus_energon.conformance.properties.determinism",
    "primus_energon.conformance.properties.sharding",
    "primus_energon.conformance.properties.restart",
    "primus_energon.conformance.probe",
)
#: seconds a server may take to import :data:`PRELOAD` before callers start interpreters instead
READY_TIMEOUT_S = 300.0
#: the largest request a server reads (a command line and an environment)
_MESSAGE_BYTES = 1 << 20
#: how often a server reaps its children when no request comes
_REAP_S = 0.05
#: the module whose ``main(argv)`` a child calls unless the request names another
RUNNER = "primus_energon.conformance.runner"


def supported() -> bool:
    """Whether children can be forked from a server here (Linux: ``fork``, descriptor passing, and
    ``PR_SET_PDEATHSIG`` so that a child dies with its server)."""
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds") and hasattr(os, "fork")


def rank_environments(world: int, port: int, run_id: str) -> list[dict[str, str]]:
    """The variables ``torch.distributed.run --standalone`` gives each of ``world`` ranks on one node
    (rank 0 serves the store at ``127.0.0.1:port``, as without an elastic agent)."""
    return [
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world),
            "ROLE_NAME": "default",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": run_id,
        }
        for rank in range(world)
    ]


# --- the client: handles on forked children, and the servers ------------------------------------------


class Forked:
    """A child forked by a :class:`ForkServer`, with what callers use of ``subprocess.Popen``: ``pid``,
    ``poll()``, ``wait(timeout)``, ``returncode`` (negative: the signal that ended it) and ``kill()``
    (its whole session: the loader workers it forked go with it)."""

    def __init__(self, server: ForkServer, args: list[str]) -> None:
        self.args = args
        self._server = server
        self._pid: int | None = None
        self._forked = threading.Event()
        self._ended = threading.Event()
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        """The child's pid once its server has forked it (None: the server ended first)."""
        self._forked.wait(READY_TIMEOUT_S)
        return self._pid

    def poll(self) -> int | None:
        return self.returncode if self._ended.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self._ended.is_set():
            return
        if not self._forked.wait(30.0):  # the server never got to it: end the server (and so the request)
            self._server.close()
            return
        if self._pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pid, signal.SIGKILL)

    # called by the server's reader thread
    def _set_pid(self, pid: int) -> None:
        self._pid = pid
        self._forked.set()

    def _set_ended(self, returncode: int) -> None:
        self.returncode = returncode
        self._forked.set()
        self._ended.set()


class ForkedGroup:
    """The ranks of one torch.distributed run, as one process the way ``torch.distributed.run`` presents
    them: it ends when every rank has ended; the first rank to fail ends the others and gives its status."""

    def __init__(self, ranks: Sequence[Forked]) -> None:
        self.ranks = list(ranks)
        self.args = self.ranks[0].args
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        return self.ranks[0].pid

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        codes = [rank.poll() for rank in self.ranks]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            self.kill()
            self.returncode = failed[0]
        elif all(code == 0 for code in codes):
            self.returncode = 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(_REAP_S)
        for rank in self.ranks:  # the others were killed: reaped before the caller looks
            rank.wait(30.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        for rank in self.ranks:
            rank.kill()


class ForkServer:
    """One server process (started by ``start(command, env)``, which gives it a session, the suite's
    process tag and the address-space cap) and the requests sent to it."""

    def __init__(self, start: Callable[..., Any], env: Mapping[str, str]) -> None:
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-m", __name__, "--socket", str(theirs.fileno())]
        try:
            self.child = start(command, env=dict(env), pass_fds=[theirs.fileno()])
        finally:
            theirs.close()
        self._lock = threading.Lock()
        self._next = 0
        self._requests: dict[int, Forked] = {}
        self._ready = threading.Event()
        self.problem = ""  # why it cannot serve (it did not import, it ended)
        self._reader = threading.Thread(target=self._read, daemon=True, name="conformance-forkserver")
        self._reader.start()

    def ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        """Wait until it has imported what it preloads; False if it cannot serve."""
        self._ready.wait(timeout)
        return self._ready.is_set() and not self.problem

    def fork(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        stdout: IO[bytes],
        stderr: IO[bytes],
        entry: str = RUNNER,
    ) -> Forked:
        """Fork a child that calls ``main(argv)`` of the module ``entry`` (the runner), with ``env`` as its
        whole environment and ``cwd``, its output to ``stdout`` and ``stderr``; call when :meth:`ready`."""
        with self._lock:
            self._next += 1
            ident = self._next
            handle = Forked(self, [entry, *argv])
            self._requests[ident] = handle
            request = {"id": ident, "entry": entry, "argv": list(argv), "env": dict(env), "cwd": cwd}
            message = json.dumps(request).encode()
            try:
                socket.send_fds(self._socket, [message], [stdout.fileno(), stderr.fileno()])
            except OSError as error:
                del self._requests[ident]
                handle._set_ended(-signal.SIGKILL)
                self.problem = self.problem or f"the fork server did not take the request ({error})"
        return handle

    def close(self) -> None:
        """End the server: a ready one kills its children and exits (they die with it in any case); one
        still importing is killed."""
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        try:
            self.child.process.wait(2.0 if self._ready.is_set() else 0.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.process.pid, signal.SIGKILL)
            self.child.process.wait()
        self._reader.join(10.0)
        with contextlib.suppress(OSError):
            self._socket.close()

    def _read(self) -> None:
        try:
            while True:
                try:
                    data = self._socket.recv(_MESSAGE_BYTES)
                except OSError:
                    break
                if not data:
                    break
                message = json.loads(data)
                if "ready" in message:
                    self._ready.set()
                elif "failed" in message:
                    self.problem = f"the fork server could not import what it preloads: {message['failed']}"
                    self._ready.set()
                elif "pid" in message:
                    handle = self._requests.get(message["id"])
                    if handle is not None:
                        handle._set_pid(message["pid"])
                elif "status" in message:
                    with self._lock:
                        handle = self._requests.pop(message["id"], None)
                    if handle is not None:
                        handle._set_ended(message["status"])
        finally:
            self.problem = self.problem or "the fork server ended"
            self._ready.set()
            with self._lock:
                for handle in self._requests.values():  # killed with the server
                    handle._set_ended(-signal.SIGKILL)
                self._requests.clear()


class ForkServers:
    """The fork servers of one check, one per ``PYTHONHASHSEED``, started on first use (or by
    :meth:`warm`) and ended by :meth:`close`."""

    def __init__(self, start: Callable[..., Any], env: Callable[[int], dict[str, str]]) -> None:
        self._start = start
        self._env = env
        self._servers: dict[int, ForkServer] = {}
        self._lock = threading.Lock()
        self.closed = False

    def warm(self, hashseeds: Sequence[int]) -> None:
        """Start the servers for ``hashseeds`` now, so that their imports overlap the caller's work."""
        for hashseed in hashseeds:
            self.server(hashseed)

    def server(self, hashseed: int) -> ForkServer | None:
        """The server for ``hashseed``, started if need be; None when closed or not :func:`supported`."""
        if not supported():
            return None
        with self._lock:
            if self.closed:
                return None
            if hashseed not in self._servers:
                self._servers[hashseed] = ForkServer(self._start, self._env(hashseed))
            return self._servers[hashseed]

    def close(self) -> None:
        with self._lock:
            self.closed = True
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.close()


# --- the server ----------------------------------------------------------------------------------------


def _serve(sock: socket.socket) -> None:
    try:
        for module in PRELOAD:
            importlib.import_module(module)
    except BaseException:  # noqa: BLE001 - said to the client, which starts interpreters instead
        sock.send(json.dumps({"failed": traceback.format_exc(limit=3)[-2000:]}).encode())
        return
    import gc

    gc.freeze()  # what the children share stays shared (the collector does not touch those pages)
    sock.send(b'{"ready": true}')
    children: dict[int, int] = {}
    while True:
        readable, _, _ = select.select([sock], [], [], _REAP_S)
        _reap(children, sock)
        if not readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 2)
        except OSError:
            break
        if not data:  # the client closed or went away
            break
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            _child(request, fds, sock)  # never returns
        for fd in fds:
            os.close(fd)
        children[pid] = request["id"]
        sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())
    for pid in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _reap(children: dict[int, int], sock: socket.socket) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ident = children.pop(pid, None)
        if ident is not None:
            with contextlib.suppress(OSError):
                sock.send(json.dumps({"id": ident, "status": os.waitstatus_to_exitcode(status)}).encode())


def _child(request: dict[str, Any], fds: list[int], sock: socket.socket) -> None:
    code = 1
    try:
        os.setsid()
        _die_with_parent()
        sock.close()
        stdout, stderr = fds
        null = os.open(os.devnull, os.O_RDONLY)
        for source, target in ((null, 0), (stdout, 1), (stderr, 2)):
            os.dup2(source, target)
        for fd in (null, stdout, stderr):
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.reconfigure(line_buffering=True, write_through=True)  # as ``python -u``
        _fresh_state()
        sys.argv = [request["entry"], *request["argv"]]
        importlib.import_module(request["entry"]).main(request["argv"])
        code = 0
    except SystemExit as ended:
        code = ended.code if isinstance(ended.code, int) else (0 if ended.code is None else 1)
        if not isinstance(ended.code, int | None):
            print(ended.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - what an interpreter prints for an uncaught exception
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _die_with_parent() -> None:
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the server ended before the line above took effect
        os._exit(1)


def _fresh_state() -> None:
    """What a new interpreter would have that a fork does not: global generators seeded from the OS
    (``random`` is reseeded by its own at-fork hook), torch's thread count from ``OMP_NUM_THREADS``. (The
    server installs no signal handler: the child's are an interpreter's defaults already.)"""
    import numpy
    import torch

    numpy.random.seed()
    torch.seed()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", type=int, required=True, help="the descriptor of the request socket")
    options = parser.parse_args(argv)
    sock = socket.socket(fileno=options.socket)
    try:
        _serve(sock)
    finally:
        sock.close()


if __name__ == "__main__":
    main()
