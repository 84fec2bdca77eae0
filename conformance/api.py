"""The Python API: run the properties on a target and get structured results, without pytest."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .core.declarations import parse_transforms
from .core.options import RunOptions
from .core.results import PropertyResult
from .core.specs import check_literal_kwargs, format_spec, parse_spec
from .engine.session import make_context, prestart, run_property
from .engine.target import InputForm, Target, resolve_target
from .properties import PROPERTIES, Property

__all__ = ["check_cooker", "check_task_encoder", "check_wrapper"]


@dataclass(frozen=True)
class _Requested:
    """A target as asked for, not built: what a supervised check hands its supervised process, which
    imports and builds it there (the caller imports nothing of the target)."""

    kind: str
    spec: str
    input_form: str = "bytes"
    packing_buffer_size: int | None = None
    batch_size: int | None = None

    def describe(self) -> str:
        return f"{self.kind.replace('_', ' ')} {self.spec}"


def _target(
    obj: Any, *, kind: str, supervised: bool, kwargs: Mapping[str, Any] | None, **settings: Any
) -> Target | _Requested:
    """The target to check: built here (:func:`resolve_target`), or with ``supervised`` only named, its
    spec read from the string (or the object's module and name) without importing or calling anything."""
    if not supervised:
        return resolve_target(obj, kind=kind, kwargs=kwargs, **settings)
    if isinstance(obj, str):
        base, spec_kwargs = parse_spec(obj)
    else:  # the caller holds the object already: its name, nothing of it called
        base = f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', type(obj).__qualname__)}"
        spec_kwargs = {}
    args = check_literal_kwargs(base, {**spec_kwargs, **(kwargs or {})})
    for setting in ("packing_buffer_size", "batch_size"):
        value = settings.get(setting)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{setting.replace('_', ' ')} {value!r} is not a positive integer")
    return _Requested(kind, format_spec(base, args), **settings)


def _check(
    target: Target | _Requested,
    properties: Iterable[str] | None,
    expected_failures: dict[str, str] | None,
    **options: Any,
) -> list[PropertyResult]:
    wanted = set(properties) if properties is not None else None
    selected = [
        prop
        for prop in PROPERTIES
        if (wanted is None and target.kind in prop.applies_to) or (wanted is not None and prop.id in wanted)
    ]
    workdir = options.pop("workdir", None)
    run = RunOptions.from_keywords(
        {**options, "transforms": [str(t) for t in parse_transforms(options.get("transforms"))]}
    )
    if isinstance(target, _Requested):
        run = dataclasses.replace(
            run,
            input_form=target.input_form,
            packing_buffer_size=target.packing_buffer_size,
            batch_size=target.batch_size,
        )
        return _check_supervised(target, selected, expected_failures, run, workdir)
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        ctx = make_context(target, **run.context_request(str(workdir or tmp)))
        try:
            prestart(ctx, selected)
            return [run_property(prop, ctx, expected_failures=expected_failures) for prop in selected]
        finally:
            ctx.close()


def _check_supervised(
    target: _Requested,
    selected: list[Property],
    expected_failures: dict[str, str] | None,
    run: RunOptions,
    workdir: str | Path | None,
) -> list[PropertyResult]:
    """:func:`_check` with the target in a supervised process of its own, as the pytest plugin runs it (see
    :mod:`~primus_energon.conformance.processes.supervisor`): a target that ends, crashes or hangs that
    process is a verdict, never the caller's end."""
    from .processes.supervisor import SupervisedTarget

    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        supervised = SupervisedTarget(
            target.kind,
            target.spec,
            resolve=run.target_request(),
            folder=Path(tmp) / "targets",
            call_timeout_s=float(run.call_timeout_s or 60.0),
        )
        try:
            problem = supervised.start()
            if problem is not None:
                raise ValueError(
                    f"{target.describe()} cannot run supervised: {problem} (a supervised target is rebuilt from "
                    "its MODULE:ATTR spec in a fresh process)"
                )
            ids = [prop.id for prop in selected]
            supervised.open(run.context_request(str(workdir or Path(tmp) / "data")), ids)
            return [
                supervised.run(prop.id, dict(expected_failures or {}), ids[index + 1 :])
                for index, prop in enumerate(selected)
            ]
        finally:
            supervised.close()


def check_cooker(
    cooker: Any,
    *,
    properties: Iterable[str] | None = None,
    input_form: InputForm = "bytes",
    expected_failures: dict[str, str] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    packing_buffer_size: int | None = None,
    batch_size: int | None = None,
    **options: Any,
) -> list[PropertyResult]:
    """Check a ``Cooker``, a ``@stateless`` cook function, or ``"module:attr"`` naming one; with
    ``kwargs`` (or ``"module:factory(NAME=VALUE, ...)"``), the cooker a factory returns for them.

    ``kwargs`` values must be literals (numbers, strings, bytes, booleans, None, and tuples, lists, sets and
    dicts of those), so that fresh processes and the reproduce command rebuild the same target.
    ``packing_buffer_size`` and ``batch_size`` set the loaders that pack (default: the TaskEncoder's own
    ``packing_buffer_size`` attribute, else the packing property's 8, and 2 packs per batch).
    Options: ``profile`` ("quick", "ci", "thorough"), ``seed``, ``encoding``, ``schema`` (file),
    ``dataset`` (a prepared dataset, read only), ``min_samples_per_s``, ``strict`` (advice and
    inconclusive claims fail too),
    ``timeout_s`` (child processes), ``call_timeout_s`` (one in-process call), ``workdir``, ``watch`` (the
    folder watched for files the target writes, default the current one; None: not watched),
    ``transforms`` (declared transforms, lines such as ``'caption: dropout rate=0.1 to=""'``; see
    :mod:`~primus_energon.conformance.core.declarations`),
    ``supervised`` (default False: the target runs in this process; True: in a supervised process of its
    own, as ``pytest --cooker ...`` runs it, so that a target that exits, crashes or hangs is a verdict;
    the target must then be given as an importable ``"module:attr"``).
    ``expected_failures`` maps property ids or claim ids to reasons (sklearn's
    ``expected_failed_checks``). Returns one result per property; ``result.claims`` has each claim's.
    """
    target = _target(
        cooker,
        kind="cooker",
        supervised=bool(options.pop("supervised", False)),
        input_form=input_form,
        kwargs=kwargs,
        packing_buffer_size=packing_buffer_size,
        batch_size=batch_size,
    )
    return _check(target, properties, expected_failures, **options)


def check_task_encoder(
    task_encoder: Any,
    *,
    properties: Iterable[str] | None = None,
    expected_failures: dict[str, str] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    packing_buffer_size: int | None = None,
    batch_size: int | None = None,
    **options: Any,
) -> list[PropertyResult]:
    """Check a TaskEncoder instance, a class (built as ``Class(**kwargs)`` for every loader; no kwargs:
    ``Class()``), a factory returning one, or ``"module:attr"`` / ``"module:Class(NAME=VALUE, ...)"``
    naming one; see :func:`check_cooker` for ``kwargs`` and the options."""
    target = _target(
        task_encoder,
        kind="task_encoder",
        supervised=bool(options.pop("supervised", False)),
        kwargs=kwargs,
        packing_buffer_size=packing_buffer_size,
        batch_size=batch_size,
    )
    return _check(target, properties, expected_failures, **options)


def check_wrapper(
    wrapper: Any,
    *,
    properties: Iterable[str] | None = None,
    expected_failures: dict[str, str] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> list[PropertyResult]:
    """Check a dataloader wrapper class (built as ``Wrapper(loader, **kwargs)``, like
    ``primus_energon.MegatronDataloaderWrapper``) or ``"module:attr"`` naming one, against the wrapper
    property; see :func:`check_cooker` for ``kwargs`` and the options."""
    target = _target(
        wrapper, kind="wrapper", supervised=bool(options.pop("supervised", False)), kwargs=kwargs
    )
    return _check(target, properties, expected_failures, **options)
