"""Helpers shared by the property checks: reading output fields, expected member values, timeouts."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from primus_energon.energon_compat import SAMPLE_BASE_FIELDS

from ..core import breadcrumbs
from ..core.results import PropertyFailure
from ..oracles.fields import MISSING, field_names, get_field

__all__ = [
    "MISSING",
    "field_names",
    "get_field",
    "batch_keys",
    "call_with_timeout",
    "TimedOut",
    "error_names_sample",
]

#: The fields of the installed release's ``Sample`` (``basic_sample_keys``): ``__key__``,
#: ``__restore_key__``, ``__subflavors__``, and ``__sources__`` (7.x) or ``__subflavor__`` (5.x/6.x).
BASIC_KEYS = SAMPLE_BASE_FIELDS


def batch_keys(batch: Any) -> list[str] | None:
    """The sample keys a batch exposes, in batch order: its ``__key__`` list (a dict, dataclass or Energon
    ``Batch``), or the ``__key__`` of each sample of a list batch. None when the batch does not say."""
    if isinstance(batch, (list, tuple)):
        keys = [get_field(sample, "__key__") for sample in batch]
        return keys if keys and all(isinstance(k, str) for k in keys) else None
    keys = get_field(batch, "__key__")
    if isinstance(keys, (list, tuple)) and all(isinstance(k, str) for k in keys):
        return list(keys)
    return None


class TimedOut(Exception):
    pass


#: the name of the suite's helper threads running one call with a time limit (conduct never reports them)
CALL_THREAD_NAME = "conformance-call"


def call_with_timeout(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()`` in a daemon thread; raises :class:`TimedOut` when it has not returned after ``seconds``.

    A hung call cannot be killed from Python: the check reports it and goes on. Energon keeps the active
    worker config of a single-process loader in class attributes, which the hung call still holds; they are
    released here so that the suite's next loader can start (the hung call keeps running in its thread)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as error:  # handed back to the caller below
            outcome["error"] = error

    # Code the target runs here inherits this thread's daemon flag. In the supervised process (which the
    # suite ends itself) it is not a daemon, as Energon's own threads are not: a thread the target starts
    # without daemon=True is then seen for what it is in training (conduct/threads). In the Python API's
    # process a hung call must not keep the user's interpreter from exiting, so there it is one.
    thread = threading.Thread(target=run, daemon=not breadcrumbs.publishing(), name=CALL_THREAD_NAME)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        from megatron.energon import WorkerConfig

        WorkerConfig.active_worker_config = None
        WorkerConfig._sample_index_stack = None
        raise TimedOut(f"no result after {seconds:.0f} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def error_names_sample(error: BaseException, key: str) -> bool:
    """True when the error (or an error it was raised from) mentions the sample key."""
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < 8:
        if key in str(current):
            return True
        # Follow what a traceback shows: the cause, or the context unless `raise ... from None` hid it.
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
        seen += 1
    return False


def fail(message: str, reproduce: str = "") -> None:
    raise PropertyFailure(message, reproduce=reproduce)
