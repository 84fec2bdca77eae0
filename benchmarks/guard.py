"""The load guard: other people's CPU use during a measurement, on a shared machine (Linux).

:func:`run_guarded` runs one measurement (a callable that starts and waits for child processes) and adds
``foreign_cores`` to its result: the cores other processes kept busy meanwhile, i.e. the machine's busy
CPU time from ``/proc/stat`` minus this process's children's, over the wall time. With a :class:`Guard` it
first waits for a quiet machine and repeats a measurement that others disturbed by more than
``Guard.max_foreign`` cores, ``Guard.retries`` times at most; the last try of one that stayed disturbed is
marked ``contaminated``. Where ``/proc/stat`` is missing nothing is waited for or recorded.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Guard", "machine_busy_s", "run_guarded", "wait_for_quiet"]


@dataclass(frozen=True)
class Guard:
    """How much foreign load a measurement tolerates: cores, retries, and seconds to wait for quiet."""

    max_foreign: float = 0.5
    retries: int = 2
    max_wait: float = 120.0


def machine_busy_s() -> float | None:
    """CPU-seconds the whole machine has been busy since boot (``/proc/stat``), or None where unavailable."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_for_quiet(max_foreign: float, max_wait: float) -> float:
    """Poll half-second windows (nothing of this harness runs meanwhile) until the machine's busy CPU is under
    ``max_foreign`` cores or ``max_wait`` seconds have passed; returns the seconds waited."""
    waited = 0.0
    while waited < max_wait:
        before = machine_busy_s()
        if before is None:
            return waited
        time.sleep(0.5)
        waited += 0.5
        if machine_busy_s() - before <= 0.5 * max_foreign:
            return waited - 0.5
    return waited


def run_guarded(measure: Callable[[], dict[str, Any]], guard: Guard | None) -> dict[str, Any]:
    """``measure()``'s result plus ``foreign_cores``, ``attempts`` and ``waited_s`` (see the module); with
    ``guard``, retried while disturbed. A result with an ``error`` key is never retried."""
    attempts = 1 + guard.retries if guard else 1
    waited = 0.0
    result: dict[str, Any] = {}
    for attempt in range(1, attempts + 1):
        if guard:
            waited += wait_for_quiet(guard.max_foreign, guard.max_wait)
        busy, own, started = machine_busy_s(), _children_cpu_s(), time.perf_counter()
        result = measure()
        elapsed = time.perf_counter() - started
        if busy is not None:
            foreign = (machine_busy_s() - busy - (_children_cpu_s() - own)) / elapsed
            result["foreign_cores"] = max(0.0, foreign)
        result.update(attempts=attempt, waited_s=waited)
        if not guard or "error" in result or result.get("foreign_cores", 0.0) <= guard.max_foreign:
            return result
    result["contaminated"] = True
    return result
