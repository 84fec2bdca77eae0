"""What a target leaves behind when a property's work is done: threads still running, processes still
alive, files written into the folder it runs in (judged by :mod:`~primus_energon.conformance.properties.conduct`).

Each property runs between a :func:`snapshot` and an :func:`observe`; what is new and has not ended after a
short grace is named. Processes found are ended (so the next property starts clean); threads cannot be.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Snapshot", "Leftovers", "snapshot", "observe", "WATCH_LIMIT"]

#: a folder with more entries than this is not watched for writes (walking it would cost more than a check)
WATCH_LIMIT = 20_000
#: folders never walked: version control, environments, caches (a target's import writes __pycache__)
_SKIP_DIRS = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".nox", ".tox", "node_modules"}
)
#: how long what a property started may take to end on its own once the property is done
SETTLE_S = 2.0
#: the suite's own helper threads (properties._common.CALL_THREAD_NAME): a call that hung is reported there
_SUITE_THREADS = ("conformance-call",)
_TAG_VARIABLE = "PRIMUS_CONFORMANCE_CHILD"  # = subprocesses.CHILD_TAG_VARIABLE (no import: layer order)


@dataclass
class Snapshot:
    """The state before a property: threads alive, and the watched folder's files (None: not watched)."""

    threads: frozenset[int]
    folder: Path | None
    files: dict[str, tuple[int, int]] | None
    #: threads and processes already named (reported once, not waited for again)
    known: set[Any] = field(default_factory=set)


@dataclass
class Leftovers:
    """What a property left behind; each entry is one line a user can act on."""

    threads: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    #: why the folder was not watched, if it was not
    unwatched: str = ""

    def __bool__(self) -> bool:
        return bool(self.threads or self.processes or self.files)


def snapshot(folder: str | os.PathLike | None, known: set[Any] | None = None) -> Snapshot:
    """The threads alive now and the files under ``folder`` (the folder the target runs in)."""
    path = Path(folder).resolve() if folder is not None else None
    return Snapshot(
        frozenset(t.ident for t in threading.enumerate() if t.ident is not None),
        path,
        _files(path) if path is not None else None,
        known if known is not None else set(),
    )


def observe(before: Snapshot, *, exclude: tuple[str | os.PathLike, ...] = ()) -> Leftovers:
    """What is new since ``before`` and has not ended within :data:`SETTLE_S`: non-daemon threads, processes
    this one started (directly, or orphaned ones carrying its tag) that are not the suite's own children
    (those carry a tag of their own), files created, changed or removed under the watched folder outside
    ``exclude``. Processes found are killed."""
    out = Leftovers()
    gc.collect()  # a loader dropped without close() ends its workers when collected
    deadline = time.monotonic() + SETTLE_S
    threads = [
        t
        for t in threading.enumerate()
        if t.ident not in before.threads
        and not t.daemon
        and t is not threading.main_thread()
        and not t.name.startswith(_SUITE_THREADS)
        and ("thread", t.ident) not in before.known
    ]
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    for thread in threads:
        if thread.is_alive():
            before.known.add(("thread", thread.ident))
            out.threads.append(f"thread {thread.name!r} (not a daemon) is still running, {_where(thread)}")
    pids = [p for p in _leftover_processes() if ("pid", p) not in before.known]
    while pids and time.monotonic() < deadline:
        time.sleep(0.1)
        pids = [p for p in pids if _alive(p)]
    for pid in pids:
        before.known.add(("pid", pid))
        out.processes.append(f"process {pid} ({_command(pid)}) is still running; the suite ended it")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if before.folder is not None:
        after = _files(before.folder)
        if before.files is None or after is None:
            out.unwatched = (
                f"{before.folder} has more than {WATCH_LIMIT} entries; writes into it were not watched"
            )
        else:
            skip = tuple(str(Path(p).resolve()) for p in exclude) + _suite_temporaries()
            changed = sorted(
                path
                for path in set(before.files) | set(after)
                if before.files.get(path) != after.get(path) and not path.startswith(skip)
            )
            for path in changed:
                what = (
                    "written" if path not in before.files else "removed" if path not in after else "changed"
                )
                out.files.append(f"{path} ({what})")
    return out


#: what the suite and the libraries it runs create in the temporary directory (its own folders, a supervised
#: process's private one, multiprocessing's and torch.distributed's): never the target's writes
_SUITE_TEMP_PREFIXES = ("conformance-", "cf-", "pymp-", "torchelastic_", "tmp")


def _suite_temporaries() -> tuple[str, ...]:
    """Path prefixes of the suite's own temporary files, for a watched folder that is (or holds) the
    temporary directory; this process's temporary directory itself where it is a private one (``cf-``)."""
    temp = Path(tempfile.gettempdir()).resolve()
    if temp.name.startswith("cf-"):
        return (str(temp),)
    return tuple(str(temp / prefix) for prefix in _SUITE_TEMP_PREFIXES)


def _where(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return "its stack unavailable"
    frames = [f for f in traceback.extract_stack(frame) if not f.filename.endswith(("threading.py",))]
    if not frames:
        target = getattr(thread, "_target", None)  # threading keeps what it runs here since Python 3.0
        name = getattr(target, "__qualname__", None) or type(target).__name__
        module = getattr(target, "__module__", None) or "an unknown module"
        return f"running {name} (of {module})" if target is not None else "in the standard library"
    last = frames[-1]
    return f"now at {last.filename}:{last.lineno} in {last.name}"


def _files(folder: Path) -> dict[str, tuple[int, int]] | None:
    """``{path: (mtime_ns, size)}`` of the files under ``folder``; None past :data:`WATCH_LIMIT` entries."""
    found: dict[str, tuple[int, int]] = {}
    stack = [folder]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            if len(found) + len(stack) > WATCH_LIMIT:
                return None
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in _SKIP_DIRS:
                        stack.append(Path(entry.path))
                    continue
                stat = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            found[entry.path] = (stat.st_mtime_ns, stat.st_size)
    return found


def _proc_table() -> dict[int, tuple[int, str]]:
    """``{pid: (parent pid, state)}`` of every process (Linux ``/proc``; elsewhere {})."""
    table: dict[int, tuple[int, str]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return table
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) >= 2:
            table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def _tag(pid: int) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = f"{_TAG_VARIABLE}=".encode()
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode("ascii", "replace")
    return None


def _leftover_processes() -> list[int]:
    """Live processes started from this one (its descendants, and orphans carrying its tag), except the
    suite's own children (a tag of their own) and what they started."""
    me = os.getpid()
    mine = os.environ.get(_TAG_VARIABLE)
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: list[int] = []
    stack = list(children.get(me, []))
    while stack:
        pid = stack.pop()
        tag = _tag(pid)
        if tag is not None and tag != mine:
            continue  # the suite's own child process, with everything it started
        if table[pid][1] != "Z" and not _infrastructure(pid):
            found.append(pid)
        stack.extend(children.get(pid, []))
    if mine:
        for pid, (_, state) in table.items():
            if (
                pid != me
                and pid not in found
                and state != "Z"
                and _tag(pid) == mine
                and not _descends(pid, me, table)
                and not _infrastructure(pid)
            ):
                found.append(pid)
    return sorted(found)


#: helper processes Python's multiprocessing starts once per process and keeps until it exits (they hold
#: no data and end with it): started for the suite's loaders as much as for the target
_INFRASTRUCTURE = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _infrastructure(pid: int) -> bool:
    command = _command(pid)
    return any(name in command for name in _INFRASTRUCTURE)


def _descends(pid: int, ancestor: int, table: dict[int, tuple[int, str]]) -> bool:
    seen = 0
    while pid in table and seen < 64:
        pid = table[pid][0]
        if pid == ancestor:
            return True
        seen += 1
    return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "command unknown"
    text = " ".join(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)
    return text[:200] or "command unknown"
