"""Targets built by factories of the project's own (``def make_task_encoder(): return WanTaskEncoder(...)``),
given as ``MODULE:factory`` or ``MODULE:factory(NAME=VALUE, ...)``; and factories that fail or return the
wrong kind of object, which are usage errors."""

from __future__ import annotations

from typing import Any

from megatron.energon import Cooker, TaskEncoder

from primus_energon import PREENCODED_COOKER, EncodedDiffusionTaskEncoder, MegatronDataloaderWrapper

#: how many TaskEncoders :func:`make_task_encoder` has built in this process
BUILT = {"task_encoders": 0}


def make_task_encoder() -> TaskEncoder:
    """A TaskEncoder factory: the reference TaskEncoder, a new one per call (as a class builds)."""
    BUILT["task_encoders"] += 1
    return EncodedDiffusionTaskEncoder()


def make_task_encoder_class() -> type[TaskEncoder]:
    """A factory returning the TaskEncoder class (built with no arguments for every loader)."""
    return EncodedDiffusionTaskEncoder


_SHARED = EncodedDiffusionTaskEncoder()


def shared_task_encoder() -> TaskEncoder:
    """A factory handing out one instance (as ``functools.cache`` would): copied for every loader."""
    return _SHARED


def make_cooker() -> Cooker:
    """A cooker factory without arguments: the reference preencoded cooker."""
    return PREENCODED_COOKER


def make_cook_function(encoding: str = "preencoded") -> Any:
    """A cooker factory with a default argument, returning the bare (``@stateless``) cook function."""
    assert encoding == "preencoded", encoding
    return PREENCODED_COOKER.cook


def make_wrapper() -> type:
    """A wrapper factory: returns the wrapper class, built as ``Wrapper(loader, **arguments)`` (here and in
    the wrapper property's child process)."""
    return MegatronDataloaderWrapper


def returns_text() -> str:
    """A factory returning neither a TaskEncoder, a cooker nor a wrapper class."""
    return "not a target"


def raises() -> TaskEncoder:
    """A factory that cannot build (as one whose tokenizer is missing)."""
    raise OSError("tokenizer.json not found")
