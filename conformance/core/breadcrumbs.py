"""Where a supervised check is now: which property, which claim, which call into the target (and since
when), published to a file the supervising process reads (:mod:`primus_energon.conformance.processes.supervisor`).

The supervisor needs it only when the process running the target stops answering or ends: it then names
the call that was running ("the wrapper's next() (batch 4) did not return within 90 s"), never a guess.
Outside a supervised process (the Python API, the suite's own tests) nothing is published and each mark
costs one attribute test.

Only the main thread's calls are published: it is the thread the check waits on. A call the suite runs in
a helper thread with its own time limit (``call_with_timeout``) reports its own hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["RECORD_BYTES", "publish_to", "publishing", "mark", "read", "current"]

#: the fixed size of the record the file holds (rewritten in place, padded with spaces)
RECORD_BYTES = 4096

_fd: int | None = None
_state: dict[str, Any] = {}
_lock = threading.Lock()


def publish_to(path: str | None) -> None:
    """Publish every mark from now on to ``path`` (None: stop publishing)."""
    global _fd
    if _fd is not None:
        os.close(_fd)
        _fd = None
    if path is not None:
        _fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        _write()


def publishing() -> bool:
    """True in a supervised process (marks go to the supervisor)."""
    return _fd is not None


def current() -> dict[str, Any]:
    """A copy of what is published now."""
    return dict(_state)


@contextlib.contextmanager
def mark(**fields: Any) -> Iterator[None]:
    """Publish ``fields`` (``property``, ``claim``, ``call``) for the duration of the block; a ``call`` also
    records when it began and its thread. What was there before comes back on exit."""
    if _fd is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    with _lock:
        before = dict(_state)
        if fields.get("call") is not None:
            fields = {**fields, "since": time.time(), "thread": threading.get_ident()}
        elif "call" in fields:
            fields = {**fields, "since": None, "thread": None}
        _state.update(fields)
        _write()
    try:
        yield
    finally:
        with _lock:
            _state.clear()
            _state.update(before)
            _write()


def _write() -> None:
    if _fd is None:
        return
    data = json.dumps(_state, default=str).encode("utf-8", "replace")
    if len(data) > RECORD_BYTES:
        trimmed = {k: (str(v)[:500] if isinstance(v, str) else v) for k, v in _state.items()}
        data = json.dumps(trimmed, default=str).encode("utf-8", "replace")[:RECORD_BYTES]
    try:
        os.pwrite(_fd, data.ljust(RECORD_BYTES), 0)
    except OSError:  # the supervisor's folder is gone: nothing to tell
        pass


def read(path: str) -> dict[str, Any]:
    """What ``path`` holds now ({} when it is missing or caught mid-write)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(RECORD_BYTES)
        value = json.loads(data.decode("utf-8", "replace").strip() or "{}")
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
