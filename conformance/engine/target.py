"""Resolving ``MODULE:ATTR`` into a conformance target: a cooker, a TaskEncoder or a dataloader wrapper.

A cooker target is an Energon :class:`~megatron.energon.Cooker` or a bare (``@stateless``) cook function;
the suite runs it inside a harness TaskEncoder that adds nothing but the cooker and a list-batching
``batch()``. A TaskEncoder target is a class or an instance, run as it is, decoder included. A wrapper
target is a class built as ``Wrapper(loader)`` (a ``MegatronDataloaderWrapper`` as Megatron-style training
loops use); the loaders it is checked around use the reference ``EncodedDiffusionTaskEncoder``.

A spec may carry keyword arguments of literal values (:mod:`~primus_energon.conformance.core.specs`):
``MODULE:Class(seq_length=1024)`` builds a TaskEncoder as ``Class(seq_length=1024)`` for every loader,
``MODULE:make_cooker(size=3)`` calls a cooker factory once, ``MODULE:Wrapper(steps=2)`` builds a wrapper as
``Wrapper(loader, steps=2)``.

ATTR may also name a factory of the user's own (a function, or another callable that is no class), called
with the spec's arguments or with none: a TaskEncoder factory for every loader, where a class would be
built, returning a TaskEncoder instance (or a class, then built with no arguments); a cooker factory once,
returning a Cooker or cook function. A cook function is told from a factory by its signature, without
calling it: it is ``@stateless`` or requires a positional argument (the crude sample); a factory requires
none. A wrapper is named by its class: the wrapper property rebuilds it from the spec in a child process.
"""

from __future__ import annotations

import copy
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from megatron.energon import Cooker, DefaultTaskEncoder, TaskEncoder, stateless
from megatron.energon.task_encoder.base import get_stateless

from primus_energon.decoding import SafeSampleDecoder
from primus_energon.energon_compat import (
    DECODES_IN_DATASET,
    declares_decoder,
    missing_decoding_dependency,
    release_default_decoder,
    training_decoder,
)

from ..core.rendering import describe_error
from ..core.results import Inconclusive
from ..core.specs import check_literal_kwargs, format_spec, parse_spec, short_name

__all__ = ["Target", "resolve_target", "load_object", "HarnessTaskEncoder", "InputForm"]

#: What members a cooker target receives: ``bytes`` (no decoder) or ``decoded`` (tensors, str, PIL
#: images, produced by a safe decoder that never unpickles objects).
InputForm = Literal["bytes", "decoded"]


def load_object(spec: str) -> Any:
    """Import ``MODULE:ATTR`` (ATTR may be dotted: ``pkg.mod:Class.attr``); arguments, if the spec has
    any, are not applied (see :func:`resolve_target`)."""
    spec = parse_spec(spec)[0]
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

    #: ``MODULE:ATTR``, with its arguments if it has any (``MODULE:Cls(a=1)``): what rebuilds the target
    spec: str
    kind: Literal["cooker", "task_encoder", "wrapper"]
    #: the cooker, the TaskEncoder class or instance (or factory), the wrapper class
    obj: Any
    input_form: InputForm = "bytes"
    #: keyword arguments (literals) the TaskEncoder class or factory, or the wrapper, is built with
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: what ``MODULE:ATTR`` names, when it is not ``obj`` itself (a cooker factory: ``obj`` is its product)
    source: Any = None
    #: ``--conformance-packing-buffer-size``: the packing buffer of every loader that packs (else the
    #: property's own choice)
    packing_buffer_size: int | None = None
    #: ``--conformance-batch-size``: the batch size (packs per batch) of every loader that packs (else the
    #: property's own choice)
    batch_size: int | None = None
    #: what a TaskEncoder factory returned when the target was resolved: a factory that returns it again
    #: hands out one instance, copied for every loader (checks instrument the TaskEncoder they get)
    built: Any = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        """Short id used in test ids and reports."""
        return short_name(self.spec)

    @property
    def named(self) -> Any:
        """The object ``MODULE:ATTR`` names (a factory, for a cooker built by one)."""
        return self.obj if self.source is None else self.source

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
        return self.decoder() is not None

    def environment_problem(self) -> str | None:
        """One line with its fix when this environment cannot run the target as it trains, although it can
        run the suite: on Energon 6.x a TaskEncoder that relies on the dataset's default decoding needs the
        release's av-decode extra (its decoder is built with AV decoding whatever the data). None otherwise."""
        if not DECODES_IN_DATASET or self.kind == "cooker":
            return None
        try:
            task_encoder = self.make_task_encoder()
        except Exception:  # the target's own failure to build: judged by the properties, not here
            return None
        if declares_decoder(task_encoder):
            return None
        try:
            release_default_decoder()
        except ImportError as error:
            return missing_decoding_dependency(error)
        return None

    def decoder(self) -> Any:
        """The decoder Energon applies before the target's cookers in training, on the installed release:
        a TaskEncoder's own ``decoder`` (on 5.x/6.x, where it declares none, the dataset's default decoding);
        for a cooker, none (``input_form="bytes"``) or the safe decoder (``"decoded"``)."""
        try:
            return training_decoder(self.make_task_encoder())
        except ImportError as error:  # the release's own decoder cannot be built here: the environment's
            environment = missing_decoding_dependency(error)
            if environment is None:
                raise
            raise Inconclusive(environment) from error

    def make_task_encoder(self) -> TaskEncoder:
        if self.kind == "cooker":
            return HarnessTaskEncoder(self.cookers[0], self.input_form)
        if self.kind == "wrapper":
            from primus_energon import EncodedDiffusionTaskEncoder

            return EncodedDiffusionTaskEncoder()
        if isinstance(self.obj, TaskEncoder):
            return self.obj
        built = self.obj(**self.kwargs)  # a class, or a factory: for every loader
        if isinstance(self.obj, type):
            return built
        if isinstance(built, type):
            return built()
        return copy.copy(built) if built is self.built else built

    def make_wrapper(self, loader: Any) -> Any:
        """The wrapper target built around ``loader``: ``Wrapper(loader, **kwargs)``."""
        return self.obj(loader, **self.kwargs)

    def describe(self) -> str:
        what = {"cooker": "cooker", "task_encoder": "TaskEncoder", "wrapper": "wrapper"}[self.kind]
        return f"{what} {self.spec}"


def resolve_target(
    spec: str | Any,
    *,
    kind: str | None = None,
    input_form: InputForm = "bytes",
    kwargs: Mapping[str, Any] | None = None,
    packing_buffer_size: int | None = None,
    batch_size: int | None = None,
) -> Target:
    """A :class:`Target` from ``MODULE:ATTR``, ``MODULE:ATTR(NAME=VALUE, ...)`` or the object itself.

    ``kind`` ("cooker", "task_encoder" or "wrapper") is inferred when not given: a ``Cooker`` or a cook
    function is a cooker, a ``TaskEncoder`` class or instance a TaskEncoder, a factory what it returns.
    Arguments (from the spec, then ``kwargs``; literal values only) build a TaskEncoder class or factory
    (``Cls(**kwargs)``, for every loader), are passed to a cooker factory once (its result must be a Cooker
    or cook function), or to a wrapper after the loader. Without arguments a TaskEncoder class must build
    with no arguments, and a factory (:func:`_is_factory`: a callable that is no class and requires no
    positional argument) is called with none. Raises ``ValueError`` with a one-line explanation otherwise
    (wrong kind: which option to use instead; a factory that raises or returns the wrong kind: what it did)."""
    if isinstance(spec, str):
        base, spec_kwargs = parse_spec(spec)
        obj = load_object(base)
    else:
        obj, spec_kwargs = spec, {}
        base = f"{getattr(obj, '__module__', '?')}:{_qualname(obj)}"
    args = check_literal_kwargs(base, {**spec_kwargs, **(kwargs or {})})
    label = format_spec(base, args)
    called = f"{base}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
    for setting, value in (("packing buffer size", packing_buffer_size), ("batch size", batch_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{setting} {value!r} is not a positive integer")
    if kind == "wrapper":
        # A zero-argument factory returns the wrapper class; the spec's arguments are the wrapper's, as for
        # a class: Wrapper(loader, **arguments). The wrapper property's child process resolves it alike.
        if _is_factory(obj):
            obj = _call_factory(obj, {}, f"{base}()")
        if not isinstance(obj, type) or issubclass(obj, TaskEncoder):
            raise ValueError(
                f"{label} is {_describe_object(obj)}, not a wrapper class (built as Wrapper(loader), like "
                "primus_energon.MegatronDataloaderWrapper) or a zero-argument factory returning one"
            )
        return Target(spec=label, kind="wrapper", obj=obj, kwargs=args)
    source = None
    if (
        kind != "task_encoder"
        and not _is_te(obj)
        and not isinstance(obj, Cooker)
        and ((args and callable(obj)) or _is_factory(obj))
    ):
        # A cooker factory: called once, here; its product is the target, the factory what a fresh process
        # imports.
        product = _call_factory(obj, args, called)
        if _is_te(product) and kind is None:
            kind = "task_encoder"  # a TaskEncoder factory: called again for every loader
        else:
            source, obj = obj, product
    is_te_class = isinstance(obj, type) and issubclass(obj, TaskEncoder)
    is_te = is_te_class or isinstance(obj, TaskEncoder)
    is_factory = (
        kind == "task_encoder"
        and source is None
        and not is_te
        and (bool(args) and callable(obj) or _is_factory(obj))
    )
    is_cooker = isinstance(obj, Cooker) or (callable(obj) and not isinstance(obj, type) and not is_te)
    if kind is None:
        kind = "task_encoder" if is_te else "cooker" if is_cooker else None
    what = _describe_object(obj)
    subject = f"{label} is" if source is None else f"{called} returned"  # a cooker factory's product
    if kind == "task_encoder" and not (is_te or is_factory):
        if is_cooker and not isinstance(obj, Cooker):
            what = f"{what} that takes the sample (a cook function; a factory takes no arguments)"
        hint = f"; check it with --cooker {label}" if is_cooker else ""
        raise ValueError(f"{subject} {what}, not a TaskEncoder class or instance{hint}")
    if kind == "cooker" and not is_cooker:
        hint = (
            f"; check it with --task-encoder {label}"
            if is_te
            else "; a factory given to --cooker must return the cooker to check"
            if source is not None
            else ""
        )
        raise ValueError(f"{subject} {what}, not an Energon Cooker or a cook function{hint}")
    if kind is None:
        raise ValueError(f"{subject} {what}: neither a Cooker/cook function nor a TaskEncoder")
    if kind == "cooker" and args and source is None:
        raise ValueError(
            f"{label}: {base} is {what}, which takes no arguments; arguments go to a factory that returns the "
            "cooker (MODULE:make_cooker(NAME=VALUE, ...))"
        )
    built = None
    if kind == "task_encoder":
        if args and isinstance(obj, TaskEncoder):
            raise ValueError(
                f"{label}: {base} is a TaskEncoder instance, which takes no arguments; name its class (or a "
                "factory) with the arguments instead"
            )
        if is_te_class:
            _build_class(obj, args, base, called)
        elif is_factory:
            built = _call_factory(obj, args, called)
            if isinstance(built, type) and issubclass(built, TaskEncoder):
                _build_class(
                    built, {}, f"{called} returned {_qualname(built)}, which", f"{_qualname(built)}()"
                )
                built = None
            elif not isinstance(built, TaskEncoder):
                is_cooker_product = isinstance(built, Cooker) or (
                    callable(built) and not isinstance(built, type)
                )
                hint = (
                    f"; check it with --cooker {label}"
                    if is_cooker_product
                    else "; a factory given to --task-encoder must return the TaskEncoder to check"
                )
                raise ValueError(
                    f"{called} returned {_describe_object(built)}, not a TaskEncoder class or instance{hint}"
                )
    return Target(
        spec=label,
        kind=kind,  # type: ignore[arg-type]
        obj=obj,
        input_form=input_form,
        kwargs=args if kind == "task_encoder" else {},
        source=source,
        packing_buffer_size=packing_buffer_size,
        batch_size=batch_size,
        built=built,
    )


def _is_factory(obj: Any) -> bool:
    """Whether ``obj`` is a factory of the user's own, called to build the target: a callable that is no
    class, ``TaskEncoder`` or ``Cooker``, and no cook function (those are ``@stateless`` or take the crude
    sample: a positional argument without default, or ``*args``; a callable without a signature counts
    as one too). A factory requires no positional argument (keyword arguments come from the spec)."""
    if isinstance(obj, (type, TaskEncoder, Cooker)) or not callable(obj) or get_stateless(obj):
        return False
    try:
        parameters = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return not any(
        p.kind == inspect.Parameter.VAR_POSITIONAL or (p.kind in positional and p.default is p.empty)
        for p in parameters
    )


def _failure(error: Exception) -> str:
    return f"{describe_error(error)}"


def _call_factory(obj: Any, args: Mapping[str, Any], called: str) -> Any:
    """``obj(**args)``, a factory's product; ``ValueError`` naming the call and the exception if it raises."""
    try:
        return obj(**args)
    except Exception as error:
        fix = (
            "check the argument names and values"
            if args
            else "give its arguments in the spec (MODULE:factory(NAME=VALUE, ...)) if it needs any"
        )
        raise ValueError(f"{called} failed ({_failure(error)}); {fix}") from None


def _build_class(cls: type, args: Mapping[str, Any], base: str, called: str) -> None:
    """Build a TaskEncoder class once with ``args``; ``ValueError`` saying why it cannot be built, or what it
    returned, if that fails."""
    try:
        built = cls(**args)
    except Exception as error:
        how = f"with {called.partition('(')[2][:-1]}" if args else "with no arguments"
        fix = (
            "check the argument names and values"
            if args
            else "give its arguments in the spec (MODULE:Class(NAME=VALUE, ...)) or name a module-level "
            "instance (MODULE:INSTANCE)"
        )
        raise ValueError(f"{base} cannot be built {how} ({_failure(error)}); {fix}") from None
    if not isinstance(built, TaskEncoder):
        raise ValueError(f"{called} returned {_describe_object(built)}, not a TaskEncoder instance")


def _is_te(obj: Any) -> bool:
    return (isinstance(obj, type) and issubclass(obj, TaskEncoder)) or isinstance(obj, TaskEncoder)


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
