"""Targets that misbehave in one way each, as data code does by accident, otherwise correct: the suite must
name the misbehaviour (or pass a harmless one) and never call it a defect of its own."""

from __future__ import annotations

import signal
from typing import Any

from megatron.energon import stateless

from primus_energon import cook_preencoded_diffusion


class UnprintableError(ValueError):
    """An exception whose message cannot be rendered: ``str()`` raises."""

    def __str__(self) -> str:
        raise IndexError("the message table has no entry for this error")


@stateless
def cook_raises_unprintable_error(sample: dict) -> Any:
    """Raises on every sample an exception whose ``__str__`` raises."""
    raise UnprintableError(sample["__key__"])


class SelfReferencing:
    """A value whose ``__repr__`` recurses without end."""

    def __repr__(self) -> str:
        return f"SelfReferencing({self!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SelfReferencing)

    __hash__ = object.__hash__


@stateless
def cook_with_recursive_repr_field(sample: dict) -> dict[str, Any]:
    """Correct data, plus a field holding an object whose ``repr`` recurses."""
    cooked = cook_preencoded_diffusion(sample)
    out = {
        name: getattr(cooked, name)
        for name in ("latents", "prompt_embeds", "pooled_prompt_embeds", "caption")
    }
    return {"__key__": sample["__key__"], **out, "meta": SelfReferencing()}


def _alarm(signum: int, frame: Any) -> None:
    raise TimeoutError("video decode timed out")


@stateless
def cook_with_decode_alarm(sample: dict) -> Any:
    """Arms ``signal.alarm`` as its own decode timeout (1 s; the decode takes microseconds) and disarms it:
    correct, and the suite must not mistake the target's own signal handling for its own failure."""
    previous = signal.signal(signal.SIGALRM, _alarm) if _main_thread() else None
    if previous is not None:
        signal.alarm(1)
    try:
        return cook_preencoded_diffusion(sample)
    finally:
        if previous is not None:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


@stateless
def cook_leaves_alarm_armed(sample: dict) -> Any:
    """Arms ``signal.alarm`` as its decode timeout and returns without cancelling it: the alarm fires a
    second later in whatever code runs then (in training: the step), raising the handler's TimeoutError."""
    if _main_thread():
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(1)
    return cook_preencoded_diffusion(sample)
