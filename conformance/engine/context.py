"""What every property check receives: the target, its data, the profile and the run's options."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from primus_energon.synthetic import example_schemas

from ..core.declarations import Transform
from ..core.profiles import Profile
from ..core.results import Inconclusive
from ..core.specs import shell_quote
from ..data.workspace import Workspace, read_crude
from ..processes.children import fork_servers
from ..processes.forkserver import ForkServers
from .calls import target_call
from .target import Target

__all__ = ["CheckContext"]

T = TypeVar("T")


#: samples of a derived dataset read to find one the target should cook (:meth:`CheckContext.generated`)
_DERIVED_PROBE_SAMPLES = 16


@dataclass
class CheckContext:
    target: Target
    workspace: Workspace
    profile: Profile
    seed: int = 0
    #: ``--encoding``: the encoding to generate instead of the one the target's cookers ask for
    encoding: str | None = None
    #: ``--min-samples-per-s``: makes the throughput property pass/fail
    min_samples_per_s: float | None = None
    #: ``--conformance-strict``: advice claims fail the run too
    strict: bool = False
    #: a child process (fresh-process checks, torch.distributed ranks, the code-execution probe) is
    #: killed, with its whole process tree, after this many seconds
    timeout_s: float = 300.0
    #: an in-process call into the target (cooking one sample, the first batch) may take this long
    call_timeout_s: float = 60.0
    #: ``--resume-hooks SAVE,LOAD``: the user's checkpoint functions, ``MODULE:FUNC`` each, called as
    #: ``save(loader, directory, rank)`` / ``load(loader, directory, rank)`` (the restart property)
    resume_hooks: tuple[str, ...] = ()
    #: the folder the target runs in, watched for files its code writes (None: not watched)
    watched_folder: Path | None = None
    #: folders under it that are the suite's own (its scratch folder), never reported
    watch_exclude: tuple[str, ...] = ()
    #: ``--conformance-transform``: deliberate transforms of fields, checked as declared (see
    #: :mod:`~primus_energon.conformance.core.declarations`)
    transforms: tuple[Transform, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    #: why samples could not be read (decoder errors), for claims that examined nothing
    read_errors: list[str] = field(default_factory=list)
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)
    #: what properties started ahead of their checks (child processes), by property id
    _started: dict[str, Any] = field(default_factory=dict, repr=False)
    _fork_servers: ForkServers | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.workspace.together and not self.workspace.dataset:
            # The formats checked together share their tensor fields' shapes (Workspace.schema).
            self.workspace.together = tuple(self.encodings())

    def declared_encodings(self) -> list[str | None]:
        """The ``encoding`` subflavor each of the target's cookers asks for, in cooker order (None: any)."""
        seen: list[str | None] = []
        for cooker in self.target.cookers:
            value = (cooker.has_subflavors or {}).get("encoding")
            value = None if value is None else str(value)
            if value not in seen:
                seen.append(value)
        return seen

    def encodings(self) -> list[str | None]:
        """One encoding per data format the target is checked on: ``--conformance-encoding``; the user's
        dataset's; the ``--conformance-schema`` files'; else every format the target's cookers declare that
        the suite has data for (built in or a shipped example schema; see :meth:`formats`)."""
        if self.encoding:
            return [self.encoding]
        if self.workspace.dataset:
            return [self.workspace.schema(None).encoding]
        if self.workspace.schema_files:
            return list(dict.fromkeys(s.encoding for s in self.workspace.user_schemas()))
        declared = self.declared_encodings()
        known = [e for e in declared if self.workspace.knows(e)]
        if None in known and len(known) > 1 and "preencoded" in known:
            known.remove(None)  # a catch-all cooker and a preencoded one: the same data
        return known or declared[:1] or [None]

    def format_problem(self) -> str | None:
        """Why no format of the target can be checked (every encoding its cookers declare is unknown and
        no option gives data), else None."""
        if self.workspace.dataset and self.workspace.schema_files:
            from primus_energon.synthetic import SyntheticError

            try:  # the user's schema refines the format inferred from the dataset, or they disagree
                self.workspace.schema(None)
            except (ValueError, SyntheticError) as error:
                return str(error)
        if self.encoding or self.workspace.dataset or self.workspace.schema_files:
            return None
        declared = self.declared_encodings()
        if declared and not any(self.workspace.knows(e) for e in declared):
            names = ", ".join(repr(e) for e in declared)
            return (
                f"its cookers ask for encoding {names}, which the suite has no data for (it knows preencoded, "
                f"raw and the example formats {', '.join(sorted(example_schemas()))}): pass "
                "--conformance-schema FILE describing each format, or --conformance-dataset PATH"
            )
        return None

    def formats(self) -> dict[str, Any]:
        """The formats checked (encoding and where its layout came from) and those the target's cookers
        declare but the suite has no data for, with what to do."""
        checked = self.encodings()
        out: dict[str, Any] = {
            "checked": [{"encoding": e or "preencoded", "source": self.workspace.source(e)} for e in checked],
            "not_checked": [],
        }
        if not (self.encoding or self.workspace.dataset or self.workspace.schema_files):
            for encoding in self.declared_encodings():
                if encoding not in checked and not self.workspace.knows(encoding):
                    out["not_checked"].append(
                        {
                            "encoding": encoding,
                            "why": f"the suite has no data of encoding {encoding!r}: pass --conformance-schema "
                            f"FILE describing it (`encoding: {encoding}`), once per format",
                        }
                    )
        return out

    def main_dataset(self, encoding: str | None = None) -> Path:
        return self.workspace.main(encoding if encoding is not None else self.encodings()[0])

    def generated(self, encoding: str | None, variant: str = "main", **options: Any) -> Path:
        """The dataset a check needs (:meth:`Workspace.generated`: derived from the user's samples with
        ``--conformance-dataset``, else generated). A derived dataset is first tried on the target: where
        the target cannot cook the derived copy of a user's sample that it cooks as the user stored it,
        no verdict on the derived data would be about the target, and the claim asking for it is
        inconclusive (:class:`~primus_energon.conformance.core.results.Inconclusive`, saying why)."""
        try:
            path = self.workspace.generated(encoding, variant, **options)
        except ValueError as error:  # no sample of the user's dataset could be derived from
            if not self.workspace.dataset:
                raise
            raise Inconclusive(
                f"the suite could not derive a {variant!r} dataset from yours: {error}"
            ) from None
        if self.workspace.is_derived(path) and self.target.kind != "wrapper":
            problem = self.cached(("derived-cooks", str(path)), lambda: self._derived_problem(path))
            if problem:
                raise Inconclusive(problem)
        return path

    def _derived_problem(self, path: Path) -> str:
        """Why the target cannot cook the derived dataset ``path`` although it cooks the user's own samples
        ("" when it cooks the first clean derived sample, or when it cannot cook the user's sample either:
        that is a finding of its own, reported by the claims on the user's data)."""
        from primus_energon.synthetic import Manifest

        from .calls import TargetError, cook

        manifest = Manifest.load(path)
        source_keys = manifest.options.get("derived", {}).get("source_keys", {})
        damaged = manifest.damaged_keys()
        # the checks use the edited copies (values rolled, cast to another dtype): try one of those first
        edited = {
            str(e).split(": ", 1)[0].split(".", 1)[0]
            for e in manifest.options.get("derived", {}).get("edits", [])
        }
        # the first samples only, read for this question and not kept (a derived dataset of large samples
        # would otherwise be held in memory for one cook)
        clean = [
            s
            for s in self.crude(path, limit=_DERIVED_PROBE_SAMPLES, keep=False)
            if s.get("__key__") not in damaged
        ]
        derived = next((s for s in clean if s.get("__key__") in edited), None) or next(iter(clean), None)
        if derived is None:
            return ""
        try:
            cook(self.target, derived, seed=self.seed)
            return ""
        except TargetError as error:
            failure = error.message
        user_key = source_keys.get(str(derived.get("__key__")))
        main = self.main_dataset()
        own = next((s for s in self.crude(main) if s.get("__key__") == user_key), None)
        if own is None:
            return ""
        try:
            cook(self.target, own, seed=self.seed)
        except TargetError:
            return ""
        how = (
            "re-keyed and resharded, its values edited inside their own format"
            if derived.get("__key__") in edited
            else "the same members, re-keyed and resharded"
        )
        return (
            f"the target cooks your sample {user_key!r} but not its copy {derived.get('__key__')!r} in the "
            f"dataset the suite derived from your samples ({path.name}: {how}): "
            f"{' '.join(failure.split())[:300]}. A target that depends on the key's form, on the shard it is "
            "read from or on exact member values cannot be judged on derived data"
        )

    def hypothesis_settings(self, max_examples: int | None = None) -> Any:
        """hypothesis's settings for the profile: its examples, derandomised, no database, shrinking only
        where the profile shrinks."""
        from hypothesis import HealthCheck, Phase, settings

        profile = self.profile
        return settings(
            max_examples=max_examples if max_examples is not None else profile.max_examples,
            derandomize=profile.derandomize,
            deadline=None,
            database=None,
            print_blob=True,
            suppress_health_check=list(HealthCheck),
            phases=[p for p in Phase if profile.shrink or p is not Phase.shrink],
        )

    def cached(self, key: Any, compute: Callable[[], T]) -> T:
        """``compute()`` once per context (e.g. the accepted preflight every property consults)."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def finished(self, property_id: str) -> None:
        """Property ``property_id`` is done: the datasets only finished properties used are removed
        (:meth:`Workspace.finished`), and what this context kept of them (their samples read, whether the
        target cooks them) with them."""
        removed = {str(path) for path in self.workspace.finished(property_id)}
        if not removed:
            return
        for key in list(self._cache):
            if isinstance(key, tuple) and any(str(part) in removed for part in key):
                del self._cache[key]

    def held_task_encoder(self) -> Any:
        """The one TaskEncoder instance the in-process checks run every sample through, as a loader worker
        holds one for a whole epoch: state it keeps between samples (a cache, a reused buffer) meets them
        all. Loaders build their own, as Energon does."""
        return self.cached("held-task-encoder", self.target.make_task_encoder)

    def started(self, key: str, start: Callable[[], Any]) -> Any:
        """What ``start()`` returned the first time it was asked for ``key`` (a property starting child
        processes ahead of its check: :data:`~primus_energon.conformance.properties.Property.prestart`); an
        exception ``start()`` raised is raised again on every call. What it returned must have ``close()``."""
        if key not in self._started:
            try:
                self._started[key] = (start(), None)
            except Exception as error:  # raised again where the property asks for it
                self._started[key] = (None, error)
        value, error = self._started[key]
        if error is not None:
            raise error
        return value

    def release(self, key: str) -> None:
        """Close what was started for ``key``, if anything (its processes end, its files go)."""
        value, _ = self._started.pop(key, (None, None))
        if value is not None:
            value.close()

    @property
    def fork_servers(self) -> ForkServers:
        """The fork servers this context's fresh processes are forked from
        (:func:`~primus_energon.conformance.processes.children.start_runner`), ended by :meth:`close`."""
        if self._fork_servers is None:
            self._fork_servers = fork_servers()
        return self._fork_servers

    def close(self) -> None:
        """Release everything started; no child process of this context outlives it."""
        for key in list(self._started):
            self.release(key)
        if self._fork_servers is not None:  # last: what was forked from them has ended above
            self._fork_servers.close()
            self._fork_servers = None

    def crude(self, path: Path, *, limit: int | None = None, keep: bool = True) -> list[dict]:
        """The crude samples of ``path`` as the target's cookers receive them: decoded by the target's own
        decoder (a TaskEncoder's ``decoder``; for a cooker, none or the safe one of ``--input-form
        decoded``), so verdicts describe the pipeline as it runs. Fresh copies on every call; with
        ``keep=False`` only the first ``limit`` are read, and nothing is kept for the next call."""
        decoder = self.target.decoder()
        if not keep:
            errors: list[str] = []
            return read_crude(path, decoder=decoder, errors=errors, limit=limit)
        if decoder is None:  # what the cookers receive is the shard's bytes: one read serves both
            samples = self.cached(("raw", str(path)), lambda: self._read(path, None))
        else:
            samples = self.cached(("crude", str(path)), lambda: self._read(path, decoder))
        return copy.deepcopy(samples[:limit] if limit is not None else samples)

    def raw(self, path: Path, *, limit: int | None = None) -> list[dict]:
        """The crude samples of ``path`` with every member as the bytes in the shard."""
        samples = self.cached(("raw", str(path)), lambda: self._read(path, None))
        return list(samples[:limit] if limit is not None else samples)

    def _read(self, path: Path, decoder: Any) -> list[dict]:
        errors: list[str] = []
        samples = read_crude(path, decoder=decoder, errors=errors)
        if errors:
            which = "the target's decoder" if decoder is not None else "Energon"
            self.read_errors.extend(f"{which} refused {line}" for line in errors)
        return samples

    def unreadable(self) -> str:
        """Why samples could not be read, if any were refused (else "")."""
        if not self.read_errors:
            return ""
        shown = "; ".join(dict.fromkeys(self.read_errors[:4]))
        return f"{len(self.read_errors)} sample(s) could not be read: {shown}"

    def reproduce(self, property_id: str) -> str:
        """A command that re-runs one property on this target."""
        flag = {"cooker": "--cooker", "task_encoder": "--task-encoder", "wrapper": "--wrapper"}[
            self.target.kind
        ]
        extra = f" --conformance-profile {self.profile.name}"
        # The --conformance-* spellings work everywhere (the short ones may belong to another plugin).
        if self.workspace.dataset:
            extra += f" --conformance-dataset {shell_quote(str(self.workspace.dataset))}"
        for schema_file in self.workspace.schema_files:
            extra += f" --conformance-schema {shell_quote(str(schema_file))}"
        if self.encoding:
            extra += f" --conformance-encoding {self.encoding}"
        if getattr(self.target, "input_form", "bytes") != "bytes":
            extra += f" --conformance-input-form {self.target.input_form}"
        if self.min_samples_per_s is not None:
            extra += f" --conformance-min-samples-per-s {self.min_samples_per_s:g}"
        if getattr(self.target, "packing_buffer_size", None) is not None:
            extra += f" --conformance-packing-buffer-size {self.target.packing_buffer_size}"
        if getattr(self.target, "batch_size", None) is not None:
            extra += f" --conformance-batch-size {self.target.batch_size}"
        if self.resume_hooks:
            extra += f" --resume-hooks {shell_quote(','.join(self.resume_hooks))}"
        for transform in self.transforms:
            extra += f" --conformance-transform {shell_quote(str(transform))}"
        return (
            f"pytest {flag} {shell_quote(self.target.spec)}{extra} "
            f"--conformance-property {property_id.partition('/')[0]}"
        )


def decode_like_target(ctx: Any, sample: dict) -> dict:
    """``sample`` (member bytes) as the target's cookers receive it: through the target's own decoder,
    if it has one. A decoder error on benign data is the target's (:class:`~primus_energon.conformance.engine.calls.TargetError`)."""
    decoder = ctx.cached("decoder", ctx.target.decoder)
    if decoder is None:
        return dict(sample)
    with target_call(f"the target's decoder on sample {sample.get('__key__')!r}"):
        return decoder(dict(sample))
