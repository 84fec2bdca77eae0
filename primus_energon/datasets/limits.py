"""Resource limits for checking hostile members: a time budget per member, an address-space cap per worker.

What each limit bounds, and what happens when one is hit (the member becomes a ``limit-exceeded`` problem
of its shard, key and member, naming the limit; the scan goes on with the next member):

* **time** (`ScanLimits.member_seconds`, default 60 s): wall-clock seconds for checking one member. A
  ``SIGALRM`` timer interrupts the check between Python bytecodes; work inside one C call (a numpy or torch
  kernel, an image decoder) finishes first, and is bounded by the size checks that run before it. Armed
  only in a process's main thread and when nothing else handles ``SIGALRM`` (a program's own alarm is left
  alone); `validate`'s worker processes always arm it.
* **memory** (`ScanLimits.worker_memory`, default physical memory / workers): bytes of address space a
  scanner worker process may take beyond what it held before the shard (its start-up and the shard's own
  memory map), set with ``setrlimit(RLIMIT_AS)`` for each shard. An allocation past it raises MemoryError
  in the check instead of pushing the machine into the OOM killer. Applied to worker processes only
  (``workers`` > 1, torchrun ranks' workers) and, under the ``primus-energon`` command, to its own
  process while it scans a shard (``ScanLimits.cap_in_process``); a library call scanning in the caller's
  process leaves the caller's limits alone.

The readers' own budgets (pickle objects, nesting depth, bytes, JSON depth, ``.npy`` and tensor-file
declared sizes) are in `primus_energon.safepickle` and `primus_energon.datasets.checks`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_LIMITS",
    "MemberTimeout",
    "ScanLimits",
    "cap_address_space",
    "current_limits",
    "failure_problem_fields",
    "member_deadline",
    "set_limits",
    "worker_budget",
]


@dataclass(frozen=True)
class ScanLimits:
    """`member_seconds`: the time budget for checking one member (None: none). `worker_memory`: bytes of
    address space a worker process may add while scanning one shard (None: physical memory / workers)."""

    member_seconds: float | None = 60.0
    worker_memory: int | None = None
    #: also cap this process's address space while it scans a shard itself (the command line sets it)
    cap_in_process: bool = False


DEFAULT_LIMITS = ScanLimits()
_CURRENT: list[ScanLimits] = [DEFAULT_LIMITS]

#: the least address space a worker gets beyond its start-up size and the shard's mapping
MIN_WORKER_MEMORY = 1 << 30


def set_limits(limits: ScanLimits) -> ScanLimits:
    """Make `limits` the ones `scan_shards` uses in this process (validate's ``--member-timeout`` and
    ``--worker-memory`` set them); returns the previous ones."""
    previous = _CURRENT[0]
    _CURRENT[0] = limits
    return previous


def current_limits() -> ScanLimits:
    """The limits `scan_shards` uses in this process (`DEFAULT_LIMITS` unless `set_limits` changed them)."""
    return _CURRENT[0]


def worker_budget(limits: ScanLimits, workers: int) -> int:
    """The address space (bytes) a worker may add for one shard, besides the shard's own mapping."""
    if limits.worker_memory is not None:
        return limits.worker_memory
    return max(MIN_WORKER_MEMORY, physical_memory() // max(1, workers))


class MemberTimeout(BaseException):
    """Raised inside a member check when its time budget runs out. A BaseException, so that the checkers'
    own ``except Exception`` (which turn a reader's failure into ``garbage-payload``) do not swallow it."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"checking the member took longer than its {seconds:g}-second time budget")
        self.seconds = seconds


def _on_alarm(signum: int, frame: Any) -> None:
    raise MemberTimeout(_ARMED[-1] if _ARMED else 0.0)


_ARMED: list[float] = []


@contextlib.contextmanager
def member_deadline(seconds: float | None) -> Iterator[bool]:
    """Raise `MemberTimeout` in the body if it runs longer than `seconds` (wall clock); yields whether the
    timer is armed (not in a thread other than the main one, nor where another SIGALRM handler is set)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.getsignal(signal.SIGALRM)
    if previous not in (signal.SIG_DFL, signal.SIG_IGN, None, _on_alarm):
        yield False
        return
    signal.signal(signal.SIGALRM, _on_alarm)
    _ARMED.append(seconds)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _ARMED.pop()
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)


def _address_space() -> int:
    """This process's virtual memory size in bytes (VmSize)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def physical_memory() -> int:
    """Bytes of physical memory (0 where unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return 0


def cap_address_space(extra: int) -> int | None:
    """Cap this process's address space at its current size plus `extra` bytes (``RLIMIT_AS``, soft limit,
    so it can be raised again for the next shard); returns the cap, or None where it cannot be set."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    current = _address_space()
    if not current:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = current + max(0, extra)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ValueError, OSError):
        return None
    return cap


@contextlib.contextmanager
def capped(extra: int | None) -> Iterator[int | None]:
    """`cap_address_space(extra)` for the body, then the previous soft limit again (None: no cap)."""
    if extra is None:
        yield None
        return
    import resource

    previous = resource.getrlimit(resource.RLIMIT_AS)
    cap = cap_address_space(extra)
    try:
        yield cap
    finally:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, previous)


def current_cap() -> int | None:
    """The address-space cap of this process (None: unlimited)."""
    try:
        import resource
    except ImportError:  # pragma: no cover
        return None
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def failure_problem_fields(exc: BaseException) -> tuple[str, str, dict[str, Any]]:
    """(code, message, detail) of the problem for an exception raised while checking a member: a time or
    memory limit is ``limit-exceeded`` naming it, anything else ``check-failed`` naming the exception."""
    if isinstance(exc, MemberTimeout):
        return (
            "limit-exceeded",
            f"{exc}; the check was stopped and nothing from the member was used",
            {"limit": "time", "budget": exc.seconds},
        )
    text = str(exc)
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and "can't allocate memory" in text):
        cap = current_cap()
        where = f"this scanner's {_gib(cap)} address-space cap" if cap else "the memory available"
        return (
            "limit-exceeded",
            f"checking the member needed more memory than {where} ({type(exc).__name__}: {text[:120]})",
            {"limit": "memory", "budget": cap},
        )
    if isinstance(exc, RecursionError):
        return (
            "limit-exceeded",
            f"checking the member nested deeper than Python's recursion limit ({text[:120]})",
            {"limit": "depth", "budget": None},
        )
    return (
        "check-failed",
        f"checking the member raised {type(exc).__name__}: {text[:200]}",
        {"exception": type(exc).__name__},
    )
