"""Running a target in fresh processes, parent side: build the child's command and environment, start it
in a session of its own, wait for it with a time limit, and end it and everything it started.

The child side is :mod:`primus_energon.conformance.processes.runner` (``python -m primus_energon.conformance.processes.runner
SUBCOMMAND``); each property that uses a child keeps its half in its own module. :func:`start_runner` forks
the runner from a fork server (:mod:`primus_energon.conformance.processes.forkserver`) where one can serve, and starts
a new interpreter (``torch.distributed.run`` for ranks) where none can; the command it records is the
latter either way, which is what reproduces the run.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import primus_energon

from ..core.results import PropertyFailure, PropertySkipped
from .forkserver import ForkedGroup, ForkServers, ForkUnavailable, rank_environments

if TYPE_CHECKING:  # the target module imports Energon (and torch): not needed to start a child process
    from ..engine.target import Target

__all__ = [
    "Background",
    "DEFAULT_TIMEOUT_S",
    "CHILD_TAG_VARIABLE",
    "Child",
    "HASHSEEDS",
    "child_target_args",
    "child_env",
    "fork_servers",
    "start",
    "start_runner",
    "rank_hashseeds",
    "RNG_PLANT_VARIABLE",
    "finish",
    "stop",
    "tagged_processes",
    "runner_command",
    "torchrun_command",
]

#: The directory ``primus_energon`` is imported from (a checkout's root, or site-packages).
_IMPORT_ROOT = Path(primus_energon.__file__).resolve().parents[1]
#: Every child process is killed after this many seconds and the property fails, naming the command.
DEFAULT_TIMEOUT_S = 300.0
#: Every process the suite starts (and everything those start: workers, torch.distributed ranks in sessions
#: of their own) inherits this variable with a value unique to its check, so
#: :func:`stop` can find and end all of them, whatever process group or session they moved to.
CHILD_TAG_VARIABLE = "PRIMUS_CONFORMANCE_CHILD"
_DIST_VARS = ("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_", "GROUP_", "ROLE_", "TORCHELASTIC_")
#: The child entry point.
RUNNER = __package__ + ".runner"
#: The hash seeds of the suite's fresh processes: runs meant to differ in it take one each (determinism's two
#: runs, restart's saving and restoring processes, the ranks of one job: :func:`rank_hashseeds`), every other
#: run the first.
HASHSEEDS = (1, 2)
#: The variable that tells a runner child which planted state (:func:`~primus_energon.conformance.engine.rngs.plant`)
#: to put Python's, numpy's and torch's global generators in before it builds the target (rank r of a job adds
#: r): a known state, different for every run a check compares (it follows the run's hash seed), so a draw
#: from a generator nobody seeded differs between them in every run of the suite, not by chance.
RNG_PLANT_VARIABLE = "PRIMUS_CONFORMANCE_RNG_PLANT"


def child_target_args(target: Target) -> list[str]:
    """Arguments that rebuild ``target`` in a fresh process, or ``PropertySkipped`` when its spec does
    not import to the same object there (an object defined in ``__main__``, in a function, ...)."""
    module = target.spec.partition(":")[0]
    reason = None
    if module == "__main__":
        reason = "it is defined in __main__, which a fresh process does not run"
    else:
        try:
            from ..engine.target import load_object

            loaded = load_object(target.spec)
        except Exception as error:  # not importable: say why
            reason = f"{target.spec!r} is not importable ({error})"
        else:
            named = getattr(target, "named", target.obj)
            same = loaded is named or loaded is getattr(named, "cook", object())
            if not same:
                reason = f"{target.spec!r} imports to another object than the one given"
    if reason:
        raise PropertySkipped(
            f"{target.describe()} cannot be rebuilt in a fresh process: {reason}. Pass it as MODULE:ATTR "
            "of an importable module (defined at module level) to run this property"
        )
    return ["--spec", target.spec, "--kind", target.kind, "--input-form", target.input_form]


def _search_path() -> list[str]:
    """The parent's import path (and this package's root) without the interpreter's own directories and
    site-packages, which the child has anyway; ``python -m`` adds the working directory itself."""
    skip = tuple(
        os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    )
    out: list[str] = []
    for entry in [str(_IMPORT_ROOT), *sys.path]:
        path = os.path.realpath(entry or os.getcwd())
        if not os.path.isdir(path) or path.startswith(skip) or "-packages" in path:
            continue
        if path not in out:
            out.append(path)
    return out


def child_env(hashseed: int | None = None, **extra: str) -> dict[str, str]:
    """The parent's environment without torch.distributed variables, with the parent's import path on
    ``PYTHONPATH`` (so the target's module imports in the child) and ``PYTHONHASHSEED`` if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DIST_VARS)}
    paths = _search_path() + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if hashseed is not None:
        env["PYTHONHASHSEED"] = str(hashseed)
    env.update(extra)
    return env


@dataclass
class Child:
    """A started child process; its output goes to temporary files (no pipe can fill up)."""

    command: list[str]
    env_shown: dict[str, str]
    #: a ``subprocess.Popen``, or a forked child (:class:`~primus_energon.conformance.processes.forkserver.Forked`,
    #: :class:`~primus_energon.conformance.processes.forkserver.ForkedGroup`) with the same ``pid``, ``poll``, ``wait``,
    #: ``returncode`` and ``kill``
    process: Any
    stdout: IO[bytes]
    stderr: IO[bytes]
    tag: str = ""
    started: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0

    def describe(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env_shown.items())
        return (prefix + " " if prefix else "") + shlex.join(self.command)

    def stderr_tail(self, limit: int = 2000) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode("utf-8", "replace")
        lines, after_warning = [], False
        for line in text.splitlines():
            if "Warning" in line or "warnings.warn" in line:
                after_warning = True  # a warning, and the source line Python shows under it
                continue
            if after_warning and line.startswith((" ", "\t")):
                continue
            after_warning = False
            lines.append(line)
        text = "\n".join(lines)
        return text[-limit:]


#: Overrides the address-space cap of the suite's child processes, in GiB (0: no cap).
CHILD_MEMORY_VARIABLE = "PRIMUS_CONFORMANCE_CHILD_MEMORY_GIB"
#: The least address space a child gets: torch and Energon alone reserve a few GiB of it.
MIN_CHILD_MEMORY = 8 << 30


def child_memory_cap() -> int | None:
    """Bytes of address space each child process (and every process it starts: loader workers, ranks)
    may use: the machine's physical memory (at least :data:`MIN_CHILD_MEMORY`), or
    ``$PRIMUS_CONFORMANCE_CHILD_MEMORY_GIB``; None for no cap. A target that allocates past it gets a
    MemoryError, which the failure names, instead of taking the machine's memory."""
    override = os.environ.get(CHILD_MEMORY_VARIABLE)
    if override is not None:
        try:
            gib = float(override)
        except ValueError:
            return None
        return int(gib * (1 << 30)) if gib > 0 else None
    from primus_energon.datasets.limits import physical_memory

    physical = physical_memory()
    return max(MIN_CHILD_MEMORY, physical) if physical else None


def _preexec(cap: int | None, die_with_parent: bool) -> Any:
    """The new process's limits: its address space capped at ``cap`` bytes (None: not capped), no core
    files (a crash in a target's native code must not write gigabytes into the user's folder), and, with
    ``die_with_parent``, the kernel ends it when the process that started it dies (even by SIGKILL)."""

    import resource  # here, not in the forked child: an import there can deadlock on a lock another thread held

    prctl = None
    if die_with_parent and sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl

    def limit() -> None:
        if cap is not None:
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            wanted = cap if hard == resource.RLIM_INFINITY else min(cap, hard)
            if soft == resource.RLIM_INFINITY or soft > wanted:
                resource.setrlimit(resource.RLIMIT_AS, (wanted, hard))
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        if prctl is not None:
            prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return limit


def start(
    args: Sequence[str],
    *,
    env: dict[str, str],
    show_env: Sequence[str] = (),
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
    die_with_parent: bool = False,
    memory_cap: bool = True,
) -> Child:
    """Start ``args`` (a full command) in a new session, tagged (see :data:`CHILD_TAG_VARIABLE`) so that
    :func:`stop` can end it and every process it starts, with its address space capped
    (:func:`child_memory_cap`) and no core files. A child's tag extends the tag of the process starting
    it, so stopping a process also stops the children the suite started from it. ``die_with_parent``:
    the kernel kills it when this thread's process dies (only for children started from the main thread).
    ``memory_cap=False``: no address-space cap (the supervised process, which runs the target as the caller's
    own process did: a CUDA context alone reserves more address space than any cap would allow)."""
    stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    tag = _new_tag()
    process = subprocess.Popen(
        list(args),
        env={**env, CHILD_TAG_VARIABLE: tag},
        cwd=cwd or os.getcwd(),
        stdout=stdout,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
        preexec_fn=_preexec(child_memory_cap() if memory_cap else None, die_with_parent),
    )
    return Child(list(args), {k: env[k] for k in show_env if k in env}, process, stdout, stderr, tag)


def _new_tag() -> str:
    """A new child's tag: this process's own tag extended, or a new one."""
    inherited = os.environ.get(CHILD_TAG_VARIABLE)
    return f"{inherited}.{uuid.uuid4().hex}" if inherited else uuid.uuid4().hex


def tagged_processes(tag: str) -> list[int]:
    """Process ids whose environment holds ``CHILD_TAG_VARIABLE=tag`` or a tag extending it (the children
    the suite started from them; Linux ``/proc``; elsewhere [])."""
    needle = f"{CHILD_TAG_VARIABLE}={tag}".encode()
    nested = needle + b"."
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if any(item == needle or item.startswith(nested) for item in environ.split(b"\0")):
            found.append(int(entry.name))
    return found


def stop(child: Child) -> None:
    """Kill ``child``, every process of its session, and every process that inherited its tag (workers,
    torch.distributed ranks in sessions of their own); returns when none is left."""
    if child.process.poll() is None:
        if not isinstance(child.process, subprocess.Popen):
            child.process.kill()  # a forked child: its session (or each rank's)
        else:
            try:
                os.killpg(child.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                child.process.kill()
    child.process.wait()
    if not child.tag:
        return
    for _ in range(50):
        left = tagged_processes(child.tag)
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def finish(child: Child, *, what: str, reproduce: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Wait for ``child``; a timeout or a non-zero exit is a :class:`PropertyFailure` naming the command."""
    remaining = max(1.0, timeout - (time.perf_counter() - child.started))
    try:
        child.process.wait(remaining)
    except subprocess.TimeoutExpired:
        stop(child)
        raise PropertyFailure(
            f"{what} did not finish within {timeout:.0f} s (killed); a loader must not hang. Command: "
            f"{child.describe()}\n{child.stderr_tail()}",
            reproduce=reproduce,
        ) from None
    child.seconds = round(time.perf_counter() - child.started, 2)
    if child.process.returncode != 0:
        tail = child.stderr_tail()
        cap = child_memory_cap()
        limit = (
            f" (the suite caps each child process at {cap / (1 << 30):.1f} GiB of address space; "
            f"{CHILD_MEMORY_VARIABLE}=GIB changes it, 0 lifts it)"
            if cap and "MemoryError" in tail
            else ""
        )
        raise PropertyFailure(
            f"{what} exited with status {child.process.returncode}{limit}; expected it to load the target and "
            f"finish. Command: {child.describe()}\nlast lines of its stderr:\n{tail}",
            reproduce=reproduce,
        )


def runner_command(subcommand: str, args: Sequence[str]) -> list[str]:
    """``python -m primus_energon.conformance.processes.runner SUBCOMMAND ARGS`` with this interpreter."""
    return [sys.executable, "-m", RUNNER, subcommand, *args]


def torchrun_command(nproc: int, subcommand: str, args: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone`` with ``nproc`` ranks running the runner."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "-m",
        RUNNER,
        subcommand,
        *args,
    ]


def fork_servers() -> ForkServers:
    """Fork servers for :func:`start_runner`, one per hash seed, each started like any child (:func:`start`:
    its own session, the suite's tag, the address-space cap); the caller closes them."""
    return ForkServers(start, stop, lambda hashseed: child_env(hashseed))


def start_runner(
    subcommand: str,
    args: Sequence[str],
    *,
    servers: ForkServers | None,
    hashseed: int | None = None,
    world: int = 1,
    show_env: Sequence[str] = (),
    **extra_env: str,
) -> Child:
    """Run the runner's ``subcommand`` with ``args`` in a fresh process, or with ``world`` > 1 as that many
    torch.distributed ranks on this node (the variables and the store ``torch.distributed.run --standalone``
    gives its ranks; gloo on the loopback address), forked from ``servers`` where they can serve: under
    ``hashseed`` (None: the first of :data:`HASHSEEDS`), rank r under the hash seed r places after it (as
    torchrun's ranks, each with its own). Else a new interpreter (``torch.distributed.run`` for ranks) with
    ``PYTHONHASHSEED=hashseed`` (unset for None). ``extra_env``: more variables (``OMP_NUM_THREADS``)."""
    command = torchrun_command(world, subcommand, args) if world > 1 else runner_command(subcommand, args)
    seeds = rank_hashseeds(hashseed, world)
    extra_env = {RNG_PLANT_VARIABLE: str(seeds[0]), **extra_env}
    show_env = [*show_env, RNG_PLANT_VARIABLE]
    chosen = [servers.server(seed) if servers is not None else None for seed in dict.fromkeys(seeds)]
    if all(server is not None and server.ready() for server in chosen):
        try:
            return _fork_runner(command, [subcommand, *args], servers, seeds, show_env, extra_env)  # type: ignore[arg-type]
        except ForkUnavailable:
            pass  # a server that cannot take it: an interpreter instead
    return start(command, env=child_env(hashseed, **extra_env), show_env=show_env)


def rank_hashseeds(hashseed: int | None, world: int) -> list[int]:
    """The hash seed of each of ``world`` forked ranks, all different (each rank has a server of its own):
    ``hashseed`` (None: the first of :data:`HASHSEEDS`) for rank 0, the next ones for the next ranks, round
    :data:`HASHSEEDS` extended by 3, 4, ... to ``world`` seeds where it holds fewer."""
    seeds = list(HASHSEEDS) + list(range(max(HASHSEEDS) + 1, max(HASHSEEDS) + 1 + world - len(HASHSEEDS)))
    first = seeds.index(hashseed) if hashseed in seeds else 0
    return [seeds[(first + rank) % len(seeds)] for rank in range(world)]


def _fork_runner(
    command: list[str],
    argv: list[str],
    servers: ForkServers,
    seeds: list[int],
    show_env: Sequence[str],
    extra_env: dict[str, str],
) -> Child:
    """:func:`start_runner`'s forked half: one child per entry of ``seeds`` (the hash seed of each rank)."""
    stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    # The tag a child started here would get (:func:`start`): what it starts by exec carries it. (The forked
    # child's own /proc environment, and so its forked loader workers', shows its server's: stopping the
    # server finds those; stopping the child ends its session.)
    tag = _new_tag()
    cwd = os.getcwd()
    store, ranks = None, [{}]
    if len(seeds) > 1:
        from torch.distributed import TCPStore  # as the agent of torch.distributed.run hosts it

        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        ranks = rank_environments(len(seeds), store.port, uuid.uuid4().hex)
    forked, shown = [], child_env(seeds[0], **extra_env)
    try:
        for seed, rank in zip(seeds, ranks, strict=True):
            server = servers.server(seed)
            if server is None:
                raise ForkUnavailable("the fork servers are closed")
            env = {**shown, "PYTHONHASHSEED": str(seed), **rank, CHILD_TAG_VARIABLE: tag}
            forked.append(server.fork(argv, env=env, cwd=cwd, stdout=stdout, stderr=stderr))
    except ForkUnavailable:
        for child in forked:
            child.kill()
        raise
    process: Any = forked[0] if len(forked) == 1 else ForkedGroup(forked, store)
    return Child(command, {k: shown[k] for k in show_env if k in shown}, process, stdout, stderr, tag)


class Background:
    """Child processes a property starts ahead of its check, so that their start-up (building the target,
    making loaders; importing torch and Energon too where they are not forked) overlaps the checks that run
    before it; with a directory for their
    output, and what the property needs to know later about what it started (``info``). :meth:`close` ends
    every child and everything it started, and removes the directory."""

    def __init__(self, prefix: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.children: dict[str, Child] = {}
        self.info: dict[str, Any] = {}

    def start(self, name: str, args: Sequence[str], **options: Any) -> Child:
        """:func:`start` ``args`` as child ``name``."""
        self.children[name] = start(args, **options)
        return self.children[name]

    def start_runner(self, name: str, subcommand: str, args: Sequence[str], **options: Any) -> Child:
        """:func:`start_runner` as child ``name``."""
        self.children[name] = start_runner(subcommand, args, **options)
        return self.children[name]

    def close(self) -> None:
        for child in self.children.values():
            stop(child)
        shutil.rmtree(self.dir, ignore_errors=True)
