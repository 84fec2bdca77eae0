"""Fresh processes without an interpreter start each: a fork server per hash seed.

The suite's child halves (determinism's runs, the torch.distributed ranks of sharding and restart, the
code-execution probe) each ran ``python -m primus_energon.conformance.processes.runner`` in a new interpreter, and the
ranks under ``torch.distributed.run``, whose agent is one more: importing torch and Energon, about 1.7 CPU
seconds a process, was half of what a ci run spent on 2 cores. A fork server is one interpreter, started
with a given ``PYTHONHASHSEED``, that imports torch, numpy, Energon and the runner's modules (never the
target's own module) and then forks one child per request, which runs the runner's command line.

Python's ``multiprocessing`` forkserver is the same design; it is not used because a process gets one of
it, whose hash seed cannot be chosen, and its children run a pickled function in the server's environment.

A forked child is fresh wherever a target can tell, except where it is its server's copy (below):

* its hash seed is its server's, and there is one server per ``PYTHONHASHSEED`` asked for, so runs meant
  to differ in it (determinism's two runs, restart's saving and restoring processes, every rank of one job)
  run on servers of their own;
* the target's module is imported in the child, never in the server;
* Python's ``random`` is reseeded at the fork (its own at-fork hook) and numpy's global generator from the
  OS, as a new interpreter seeds them; torch's is reseeded where a new interpreter's is random (torch 2.13)
  and left at torch's fixed default where that is what a new interpreter gets (older torch);
* its environment, working directory, standard streams and command line (``sys.argv[0]`` the runner's
  file, as ``python -m`` sets it) are the request's, and torch's thread count follows ``OMP_NUM_THREADS``;
* it leads a session of its own (stopping it stops the loader workers it forks; what is left of that
  session when it ends is ended with it), keeps its server's address-space cap and core-file limit, and dies
  with its server; a server ends its children and itself when the process that started it closes it or
  goes away.

What it shares with its server, and so with every other child of that server: the modules imported before
the fork, in their state just after import, and the memory layout (``id(object())``, ``hash(object())``,
where a new tensor lands are alike in two children of one server, where two new interpreters differ). So
no claim compares two children of one server: runs compared have different hash seeds, hence servers.
The runner then puts the global generators in the planted state its request names
(``PRIMUS_CONFORMANCE_RNG_PLANT``), different for every run compared. A server has more than one thread
(numpy's OpenBLAS starts its pool at import): it forks from its main thread, which lives as long as it does
(the death signal of a child follows the thread that forked it), and the child holds only that thread.
Ranks get what
``torch.distributed.run --standalone`` gives its ranks, the store included: the parent hosts it, as the
agent does. Where forking is not available (not Linux), :func:`supported` is False, and where a server
cannot take a request (:class:`ForkUnavailable`) callers start interpreters as before.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
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
    "ForkUnavailable",
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
    "primus_energon.conformance.processes.runner",
    "primus_energon.conformance.properties.determinism",
    "primus_energon.conformance.properties.sharding",
    "primus_energon.conformance.properties.restart",
    "primus_energon.conformance.properties._probe",
)
#: seconds a server may take to import :data:`PRELOAD` before callers start interpreters instead
READY_TIMEOUT_S = 300.0
#: the largest request a server reads (a command line and an environment)
_MESSAGE_BYTES = 1 << 20
#: how often a server reaps its children when no request comes
_REAP_S = 0.05
#: the module whose ``main(argv)`` a child calls unless the request names another
RUNNER = "primus_energon.conformance.processes.runner"


def supported() -> bool:
    """Whether children can be forked from a server here (Linux: ``fork``, descriptor passing, and
    ``PR_SET_PDEATHSIG`` so that a child dies with its server)."""
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds") and hasattr(os, "fork")


def rank_environments(world: int, port: int, run_id: str) -> list[dict[str, str]]:
    """The variables ``torch.distributed.run --standalone`` gives each of ``world`` ranks on one node, whose
    store (the agent's there, the caller's here) listens at ``127.0.0.1:port``."""
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
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        }
        for rank in range(world)
    ]


# --- the client: handles on forked children, and the servers ------------------------------------------


class ForkUnavailable(Exception):
    """A server cannot take a request (it ended, or the request does not fit its socket): start an
    interpreter instead."""


def _kill_session(pid: int) -> None:
    """SIGKILL the session ``pid`` leads and ``pid`` itself (should it not have left its server's yet)."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


class Forked:
    """A child forked by a :class:`ForkServer`, with what callers use of ``subprocess.Popen``: ``pid``,
    ``poll()``, ``wait(timeout)``, ``returncode`` (negative: the signal that ended it) and ``kill()``
    (its whole session: the loader workers it forked go with it)."""

    def __init__(self, args: list[str], stderr: IO[bytes]) -> None:
        self.args = args
        self._stderr = stderr
        self._pid: int | None = None
        self._cancelled = False
        self._forked = threading.Event()
        self._ended = threading.Event()
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        """The child's pid once its server has forked it (None: it never was)."""
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
        if not self._forked.wait(30.0):  # not forked yet: killed as soon as it is (see _set_pid)
            self._cancelled = True
            self._end(-signal.SIGKILL, "killed before its fork server forked it")
            return
        if self._pid is not None:
            _kill_session(self._pid)

    # called by the server's reader thread
    def _set_pid(self, pid: int) -> None:
        self._pid = pid
        self._forked.set()
        if self._cancelled:
            _kill_session(pid)

    def _end(self, returncode: int, why: str = "") -> None:
        """It ended with ``returncode``; ``why``, when the suite ended it, goes to its stderr (the failure
        message quotes that)."""
        if self._ended.is_set():
            return
        if why:
            with contextlib.suppress(OSError, ValueError):
                self._stderr.write(f"\n[primus-energon conformance] {why}\n".encode())
                self._stderr.flush()
        self.returncode = returncode
        self._forked.set()
        self._ended.set()


class ForkedGroup:
    """The ranks of one torch.distributed run, as one process the way ``torch.distributed.run`` presents
    them: it ends when every rank has ended; the first rank to fail ends the others and gives its status.
    ``store`` (the job's TCPStore, hosted here as the agent hosts it) lives as long as the group runs."""

    def __init__(self, ranks: Sequence[Forked], store: Any = None) -> None:
        self.ranks = list(ranks)
        self.args = self.ranks[0].args
        self.store = store
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
        if self.returncode is not None:
            self.store = None  # the job is over: its store closes
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(_REAP_S)
        for rank in self.ranks:  # the others were killed: reaped before the caller looks
            with contextlib.suppress(subprocess.TimeoutExpired):
                rank.wait(30.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        for rank in self.ranks:
            rank.kill()


class ForkServer:
    """One server process (started by ``start(command, env=..., pass_fds=...)``, which gives it a session,
    the suite's process tag and the address-space cap; ended by ``stop(child)``, which also ends every
    process carrying its tag: its forked children and theirs show its environment) and its requests."""

    def __init__(
        self, start: Callable[..., Any], stop: Callable[[Any], None], env: Mapping[str, str]
    ) -> None:
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-m", __name__, "--socket", str(theirs.fileno())]
        try:
            self.child = start(command, env=dict(env), pass_fds=[theirs.fileno()])
        except BaseException:
            self._socket.close()
            raise
        finally:
            theirs.close()
        self._stop = stop
        self._lock = threading.Lock()
        self._next = 0
        self._requests: dict[int, Forked] = {}
        self._ready = threading.Event()
        self.problem = ""  # why it cannot serve (it did not import, it ended)
        self._reader = threading.Thread(target=self._read, daemon=True, name="conformance-forkserver")
        self._reader.start()

    def ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        """Wait until it has imported what it preloads; False if it cannot serve (one that has not imported
        within ``timeout`` is ended, so that no later request waits for it again)."""
        if not self._ready.wait(timeout):
            self.problem = f"the fork server did not import what it preloads within {timeout:.0f} s"
            self.close()
        return not self.problem

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
        whole environment and ``cwd``, its output to ``stdout`` and ``stderr``; call when :meth:`ready`.
        :class:`ForkUnavailable` when the server cannot take it."""
        request = {"entry": entry, "argv": list(argv), "env": dict(env), "cwd": cwd}
        with self._lock:
            if self.problem:
                raise ForkUnavailable(self.problem)
            self._next += 1
            request["id"] = ident = self._next
            handle = Forked([entry, *argv], stderr)
            self._requests[ident] = handle
            try:
                socket.send_fds(
                    self._socket, [json.dumps(request).encode()], [stdout.fileno(), stderr.fileno()]
                )
            except OSError as error:  # gone, or a request larger than the socket takes (a huge environment)
                del self._requests[ident]
                raise ForkUnavailable(f"the fork server did not take the request ({error})") from None
        return handle

    def close(self) -> None:
        """End the server: a ready one kills its children and exits; then its session and every process
        that carries its tag are ended."""
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.child.process.wait(2.0 if self._ready.is_set() and not self.problem else 0.0)
        self._stop(self.child)
        self._reader.join(10.0)
        with contextlib.suppress(OSError):
            self._socket.close()

    def _read(self) -> None:
        why = "the fork server ended"
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
                    why = f"the fork server could not import what it preloads: {message['failed']}"
                    self.problem = why
                    self._ready.set()
                    break
                elif "pid" in message:
                    handle = self._requests.get(message["id"])
                    if handle is not None:
                        handle._set_pid(message["pid"])
                elif "status" in message or "error" in message:
                    with self._lock:
                        handle = self._requests.pop(message["id"], None)
                    if handle is not None:
                        handle._end(message.get("status", 1), message.get("error", ""))
        finally:
            with self._lock:
                self.problem = self.problem or why
                pending, self._requests = list(self._requests.values()), {}
            self._ready.set()
            for handle in pending:  # killed with the server (PR_SET_PDEATHSIG)
                handle._end(-signal.SIGKILL, f"{why} while this process ran; it was ended with it")


class ForkServers:
    """The fork servers of one check, one per ``PYTHONHASHSEED``, started on first use (or by
    :meth:`warm`) with ``start`` and ``env(hashseed)``, and ended (``stop``) by :meth:`close`."""

    def __init__(
        self, start: Callable[..., Any], stop: Callable[[Any], None], env: Callable[[int], dict[str, str]]
    ) -> None:
        self._start = start
        self._stop = stop
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
                self._servers[hashseed] = ForkServer(self._start, self._stop, self._env(hashseed))
            return self._servers[hashseed]

    def close(self) -> None:
        with self._lock:
            self.closed = True
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.close()


# --- the server ----------------------------------------------------------------------------------------

#: the seed a new interpreter's torch generator starts from where it is not random (torch before 2.13)
_TORCH_DEFAULT_SEED = 67280421310721


def _serve(sock: socket.socket) -> None:
    try:
        for module in PRELOAD:
            importlib.import_module(module)
    except BaseException:  # noqa: BLE001 - said to the client, which starts interpreters instead
        sock.send(json.dumps({"failed": traceback.format_exc(limit=3)[-2000:]}).encode())
        return
    import gc

    gc.freeze()  # what the children share stays shared (the collector does not touch those pages)
    server = os.getpid()
    sock.send(b'{"ready": true}')
    children: dict[int, int] = {}
    try:
        while True:
            readable, _, _ = select.select([sock], [], [], _REAP_S)
            _reap(children, sock)
            if not readable:
                continue
            data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 2)
            if not data:  # the client closed or went away
                break
            request = json.loads(data)
            for stream in (sys.stdout, sys.stderr):  # nothing buffered here is written again by a child
                stream.flush()
            try:
                pid = os.fork()
            except OSError as error:  # out of memory or processes: the request fails, the server serves on
                sock.send(
                    json.dumps(
                        {"id": request["id"], "error": f"the fork server could not fork: {error}"}
                    ).encode()
                )
                pid = -1
            if pid == 0:
                _child(request, fds, sock, server)  # never returns
            for fd in fds:
                os.close(fd)
            if pid > 0:
                children[pid] = request["id"]
                sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())
    except OSError:  # the client went away while we answered
        pass
    finally:
        for pid in children:
            _kill_session(pid)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _reap(children: dict[int, int], sock: socket.socket) -> None:
    """Reap the children that ended, end what is left of their sessions (loader workers a child left
    running), and send each one's exit status."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ident = children.pop(pid, None)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # its session outlives it while a member does (no pid reuse)
        if ident is not None:
            sock.send(json.dumps({"id": ident, "status": os.waitstatus_to_exitcode(status)}).encode())


def _child(request: dict[str, Any], fds: list[int], sock: socket.socket, server: int) -> None:
    code = 1
    try:
        os.setsid()
        _die_with(server)
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
        spec = importlib.util.find_spec(request["entry"])
        sys.argv = [spec.origin if spec and spec.origin else request["entry"], *request["argv"]]
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


def _die_with(server: int) -> None:
    """SIGKILL this process when its server ends (``PR_SET_PDEATHSIG``, which follows the thread that forked:
    the server's main thread, alive as long as the server), and end now if it already has (reparented, to init or to a subreaper)."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != server:
        os._exit(1)


def _fresh_state() -> None:
    """What a new interpreter would have that a fork does not: global generators seeded as a new
    interpreter seeds them (``random`` is reseeded by its own at-fork hook), torch's thread count from
    ``OMP_NUM_THREADS``. (The server installs no signal handler: the child's are an interpreter's.)"""
    import numpy
    import torch

    numpy.random.seed()
    if torch.initial_seed() != _TORCH_DEFAULT_SEED:  # a new interpreter's torch generator is random here
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
