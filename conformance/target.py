"""Resolving ``MODULE:ATTR`` into a conformance target: a cooker, a TaskEncoder or a dataloader wrapper.

A cooker target is an Energon :class:`~megatron.energon.Cooker` or a bare (``@stateless``) cook function;
the suite runs it inside a harness TaskEncoder that adds nothing but the cooker and a list-batching
``batch()``. A TaskEncoder target is a class (built with no arguments) or an instance, run as it is,
decoder included. A wrapper target is a class built as ``Wrapper(loader)`` (a
``MegatronDataloaderWrapper`` as Megatron-style training loops use); the loaders it is checked around use the reference
``EncodedDiffusionTaskEncoder``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from megatron.energon import Cooker, DefaultTaskEncoder, TaskEncoder, stateless

from primus_energon.decoding import SafeSampleDecoder

__all__ = ["Target", "resolve_target", "load_object", "HarnessTaskEncoder", "InputForm"]

#: What members a cooker target receives: ``bytes`` (no decoder) or ``decoded`` (tensors, str, PIL
#: images, produced by a safe decoder that never unpickles objects).
InputForm = Literal["bytes", "decoded"]


def load_object(spec: str) -> Any:
    """Import ``MODULE:ATTR`` (ATTR may be dotted: ``pkg.mod:Class.attr``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not MODULE:ATTR (for example mypkg.cookers:cook_x)")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"cannot import module {module_name!r} of {spec!r}: {error}") from error
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{spec!r}: {module_name!r} has no attribute {attr!r}") from None
    return obj


class HarnessTaskEncoder(DefaultTaskEncoder):
    """Runs one cooker target through Energon: its cooker, no ``encode_sample``, and ``batch()`` returning
    the list of cooked samples (so every output field reaches the checks unchanged)."""

    def __init__(self, cooker: Cooker, input_form: InputForm = "bytes") -> None:
        super().__init__()
        self.cookers = [cooker]
        self.decoder = SafeSampleDecoder() if input_form == "decoded" else None

    @stateless
    def batch(self, samples: list[Any]) -> list[Any]:
        return list(samples)


@dataclass
class Target:
    """A thing under test. ``make_task_encoder()`` builds a fresh TaskEncoder for each loader."""

    spec: str
    kind: Literal["cooker", "task_encoder", "wrapper"]
    obj: Any
    input_form: InputForm = "bytes"

    @property
    def name(self) -> str:
        """Short id used in test ids and reports."""
        return self.spec.rpartition(":")[2] if ":" in self.spec else self.spec

    @property
    def cookers(self) -> list[Cooker]:
        """The target's cookers, in dispatch order."""
        if self.kind == "cooker":
            return [self.obj if isinstance(self.obj, Cooker) else Cooker(self.obj)]
        if self.kind == "wrapper":
            return []  # the wrapper's data comes from the reference TaskEncoder; it declares no format
        return list(getattr(self.make_task_encoder(), "cookers", None) or [])

    @property
    def subflavors(self) -> Mapping[str, Any] | None:
        """``has_subflavors`` of the first cooker (what data the target expects), or None."""
        cookers = self.cookers
        return cookers[0].has_subflavors if cookers else None

    @property
    def encoding(self) -> str | None:
        """The ``encoding`` subflavor the target's first cooker asks for, if any."""
        subflavors = self.subflavors or {}
        value = subflavors.get("encoding")
        return None if value is None else str(value)

    @property
    def wants_decoded(self) -> bool:
        """Whether the target's cookers receive decoded members (a TaskEncoder with a decoder, or a cooker
        checked with ``input_form="decoded"``). In-process checks then decode with a safe decoder."""
        if self.kind == "cooker":
            return self.input_form == "decoded"
        return getattr(self.make_task_encoder(), "decoder", None) is not None

    def decoder(self) -> Any:
        """The decoder Energon applies before the target's cookers: a TaskEncoder's own ``decoder``; for a
        cooker, none (``input_form="bytes"``) or the safe decoder (``"decoded"``)."""
        return getattr(self.make_task_encoder(), "decoder", None)

    def make_task_encoder(self) -> TaskEncoder:
        if self.kind == "cooker":
            return HarnessTaskEncoder(self.cookers[0], self.input_form)
        if self.kind == "wrapper":
            from primus_energon import EncodedDiffusionTaskEncoder

            return EncodedDiffusionTaskEncoder()
        if isinstance(self.obj, type):
            return self.obj()
        return self.obj

    def describe(self) -> str:
        what = {"cooker": "cooker", "task_encoder": "TaskEncoder", "wrapper": "wrapper"}[self.kind]
        return f"{what} {self.spec}"


def resolve_target(spec: str | Any, *, kind: str | None = None, input_form: InputForm = "bytes") -> Target:
    """A :class:`Target` from ``MODULE:ATTR`` or from the object itself.

    ``kind`` ("cooker" or "task_encoder") is inferred when not given: a ``Cooker`` or a function is a
    cooker, a ``TaskEncoder`` class or instance a TaskEncoder. A TaskEncoder class must build with no
    arguments. Raises ``ValueError`` with a one-line explanation otherwise (wrong kind: which option to
    use instead)."""
    obj = load_object(spec) if isinstance(spec, str) else spec
    label = spec if isinstance(spec, str) else f"{getattr(obj, '__module__', '?')}:{_qualname(obj)}"
    if kind == "wrapper":
        if not isinstance(obj, type) or issubclass(obj, TaskEncoder):
            raise ValueError(
                f"{label} is {_describe_object(obj)}, not a wrapper class (built as Wrapper(loader), like "
                "primus_energon.MegatronDataloaderWrapper)"
            )
        return Target(spec=label, kind="wrapper", obj=obj)
    is_te_class = isinstance(obj, type) and issubclass(obj, TaskEncoder)
    is_te = is_te_class or isinstance(obj, TaskEncoder)
    is_cooker = isinstance(obj, Cooker) or (callable(obj) and not isinstance(obj, type) and not is_te)
    if kind is None:
        kind = "task_encoder" if is_te else "cooker" if is_cooker else None
    what = _describe_object(obj)
    if kind == "task_encoder" and not is_te:
        hint = f"; check it with --cooker {label}" if is_cooker else ""
        raise ValueError(f"{label} is {what}, not a TaskEncoder class or instance{hint}")
    if kind == "cooker" and not is_cooker:
        hint = f"; check it with --task-encoder {label}" if is_te else ""
        raise ValueError(f"{label} is {what}, not an Energon Cooker or a cook function{hint}")
    if kind is None:
        raise ValueError(f"{label} is {what}: neither a Cooker/cook function nor a TaskEncoder")
    if is_te_class and kind == "task_encoder":
        try:
            obj()
        except Exception as error:
            raise ValueError(
                f"{label} cannot be built with no arguments ({type(error).__name__}: {error}); name a "
                "module-level instance instead (MODULE:INSTANCE)"
            ) from None
    return Target(spec=label, kind=kind, obj=obj, input_form=input_form)  # type: ignore[arg-type]


def _describe_object(obj: Any) -> str:
    if isinstance(obj, type) and issubclass(obj, TaskEncoder):
        return "a TaskEncoder class"
    if isinstance(obj, TaskEncoder):
        return "a TaskEncoder instance"
    if isinstance(obj, Cooker):
        return "a Cooker"
    if isinstance(obj, type):
        return f"a class ({obj.__qualname__})"
    if callable(obj):
        return "a function"
    kind = type(obj).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


def _qualname(obj: Any) -> str:
    if isinstance(obj, Cooker):
        return _qualname(obj.cook)
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__


def cook_function(cooker: Cooker) -> Callable[..., Any]:
    """The callable Energon calls for ``cooker``."""
    return cooker.cook
