"""One home for what differs between the Energon releases this project supports (5.2 through 7.4).

Nothing outside this module tests a release number: the rest of the project asks it what the installed
release does. What differs between 5.x/6.x and 7.x:

- **Decoding.** Energon 5.x and 6.x decode shard members inside the dataset (``auto_decode=True`` by
  default: images to tensors, ``.pth`` through ``torch.load`` and ``.pickle`` through ``pickle.loads``,
  webdataset's defaults), and know no ``TaskEncoder.decoder``; 7.x decode with the TaskEncoder's
  ``decoder`` (a ``SampleDecoder`` by default). Here a TaskEncoder that *declares* a ``decoder`` (a class or
  instance attribute, None included) decides on every release: :func:`get_train_dataset` and
  :func:`get_val_dataset` read its datasets with ``auto_decode=False`` on 5.x/6.x and put its decoder (if
  any) where the dataset's own would run. One that declares none gets what its release does in training:
  :func:`training_decoder` says what reaches its cookers.
- **Samples.** 5.x/6.x samples carry ``__subflavor__`` (a string, deprecated in 6, gone in 7) beside
  ``__subflavors__``, both without defaults; 7.x add ``__sources__``. :data:`SAMPLE_BASE_FIELDS`,
  :data:`HAS_SOURCES`, :data:`HAS_SUBFLAVOR`, and :func:`sample_dataclass` (the decorator Energon's own
  samples use on the release: ``edataclass``, ``dataclass_slots`` or ``dataclass``).
- **Stages.** ``preencode_sample``/``postencode_sample`` and ``TaskEncoder.decoder`` exist since 7.0:
  :data:`TASK_ENCODER_STAGES`, :func:`overrides`.
- **Cookers.** 5.x/6.x ``Cooker`` also filters on ``is_subflavor`` and ``condition(crude_sample)``, is
  matched per sample and raises ``NotImplementedError`` when none matches; 7.0 requires cookers to be
  ``@stateless``: :func:`cooker_filters`, :data:`STATELESS_COOKERS_REQUIRED`.
- **Repeat.** ``repeat=False`` on 5.x/6.x wants integer repetitions (``SAMPLE_REPETITIONS``) and no
  ``RepeatDataset`` around a plain dataset; :data:`REPEAT_FALSE_NEEDS_BLEND_EPOCHIZED`.
- **Loaders.** 5.2's ``get_savable_loader`` has no ``prefetch_factor``; only 7.x have the watchdog:
  :func:`savable_loader`.
- **Paths.** ``EPath.write_text`` is 7.x only: :func:`write_text`.

- **Error handlers.** Since Energon 7.3 a ``WorkerConfig(global_error_handler=...)`` decides what every
  stage of the pipeline does with an exception (log and skip, or raise). Energon 7.0-7.2 have no such field:
  each wrapper dataset (``MapDataset``, ``BatchDataset``, ``PackingDataset``, ...) holds its own
  ``error_handler``, logging and skipping by default. :func:`worker_config` takes the handler on every
  version, and :func:`get_train_dataset` / :func:`get_val_dataset` hand it, on 7.0-7.2, to every wrapper of
  the pipeline they build, so a caller asking for ``reraise_exception`` gets it there too.
- **Sample keys.** Energon 7.0-7.2 name a sample ``"<shard>/<key>"`` (e.g. ``shard-000000.tar/s_000001``);
  since 7.3 ``__key__`` is the key alone. :func:`energon_key` says what Energon calls a sample of a shard.
- **Choosing a cooker.** Since 7.3 a TaskEncoder picks the cooker for each dataset when the loader is
  built (no match: ``ValueError`` at build time); 7.0-7.2 look it up per sample (no match: the error comes
  with the first sample). :data:`COOKERS_CHOSEN_PER_SAMPLE` says which.
- **Skipping a sample.** Energon 7.3 defines ``SkipSample`` twice; the one it exports reaches the error
  handler as an error (see :data:`SKIP_SAMPLE_TYPES`). :func:`reraise_exception` lets it skip the sample.
- **The stock handlers.** ``log_exception`` and ``reraise_exception`` are exported at the top level since
  7.3; before, ``log_exception`` lives in ``megatron.energon.wrappers._log_exception``, and the
  ``reraise_exception`` of ``megatron.energon.flavors.webdataset.structs`` wraps the error in a bare
  ``Exception``: here it raises the error as it is, as on 7.3+.
- **The loader's watchdog.** Where Energon's loaders take ``watchdog_timeout_seconds``, each iteration of a
  loader starts a watchdog thread that ``Watchdog.watch_iter`` never finishes: in a loader without workers
  (``num_workers=0``) it stays for the life of the process, waking every second. :data:`SHORT_LOADER_SETTINGS`
  turns it (and the periodic ``gc.collect()``) off for short loaders in a long-lived process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import os
import tempfile
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import megatron.energon as _energon
from megatron.energon import SavableDataset, WorkerConfig

__all__ = [
    "ENERGON_VERSION",
    "SUPPORTED_RANGE",
    "SUPPORTED_RANGE_TEXT",
    "release_problem",
    "release_label",
    "SAMPLE_BASE_FIELDS",
    "HAS_SOURCES",
    "HAS_SUBFLAVOR",
    "sample_dataclass",
    "DECODES_IN_DATASET",
    "SampleDecoderBase",
    "declares_decoder",
    "training_decoder",
    "missing_decoding_dependency",
    "release_default_decoder",
    "TASK_ENCODER_STAGES",
    "overrides",
    "cooker_filters",
    "describe_filters",
    "is_no_cooker_error",
    "NO_COOKER_BEHAVIOUR",
    "STATELESS_COOKERS_REQUIRED",
    "NO_COOKER_ERRORS",
    "REPEAT_FALSE_NEEDS_BLEND_EPOCHIZED",
    "RESTORES_SAMPLE_INDEX_WITHOUT_WORKERS",
    "savable_loader",
    "write_text",
    "HAS_GLOBAL_ERROR_HANDLER",
    "ErrorHandler",
    "log_exception",
    "reraise_exception",
    "SKIP_SAMPLE_TYPES",
    "KEYS_NAME_THEIR_SHARD",
    "COOKERS_CHOSEN_PER_SAMPLE",
    "energon_key",
    "key_in_shard",
    "worker_config",
    "get_train_dataset",
    "get_val_dataset",
    "short_loader",
    "SHORT_LOADER_SETTINGS",
]

#: ``(exception, sample, sources)``: what Energon calls for a sample a stage raised on.
ErrorHandler = Callable[..., None]


def _version() -> tuple[int, ...]:
    try:
        text = version("megatron-energon")
    except PackageNotFoundError:  # an unpacked source tree: the newest behaviour
        return (7, 4, 0)
    return tuple(int(part) for part in text.split("+")[0].split(".")[:3] if part.isdigit())


#: The installed megatron-energon release, e.g. ``(7, 4, 1)``.
ENERGON_VERSION: tuple[int, ...] = _version()

# The supported range is known from metadata alone (environment.py, imported by the torch-free side).
from .environment import SUPPORTED_RANGE, SUPPORTED_RANGE_TEXT, release_writes_sqlite_index  # noqa: E402, F401


def release_label() -> str:
    """``"megatron-energon 6.0.1"``: the release that runs (and judges) the data path."""
    try:
        return f"megatron-energon {version('megatron-energon')}"
    except PackageNotFoundError:
        return "megatron-energon (source tree, taken as 7.4)"


def release_problem(found: tuple[int, ...] | None = None) -> str | None:
    """One line when the installed release (or ``found``) is outside :data:`SUPPORTED_RANGE`, else None."""
    from .environment import release_problem as problem

    return problem(ENERGON_VERSION if found is None else found)


#: True where ``WorkerConfig`` has ``global_error_handler`` (Energon 7.3 and later).
HAS_GLOBAL_ERROR_HANDLER: bool = "global_error_handler" in {f.name for f in dataclasses.fields(WorkerConfig)}

#: True where ``__key__`` is ``"<shard>/<key>"`` (Energon 7.0-7.2).
KEYS_NAME_THEIR_SHARD: bool = ENERGON_VERSION < (7, 3)
#: Energon 7.0-7.2 look the cooker up per sample, so "no cooker matches" surfaces at the first sample.
COOKERS_CHOSEN_PER_SAMPLE: bool = ENERGON_VERSION < (7, 3)


def energon_key(shard: str, key: str) -> str:
    """The ``__key__`` Energon gives the sample ``key`` of the tar shard ``shard`` (its path relative to the
    dataset, e.g. ``shard-000000.tar``)."""
    return f"{shard}/{key}" if KEYS_NAME_THEIR_SHARD else key


def key_in_shard(key: str, shard: str | None = None) -> str:
    """The inverse of :func:`energon_key`: the key a sample has inside its tar shard (what its member names
    start with), from the ``__key__`` Energon gave it. Without ``shard``, the prefix up to the first
    ``.tar/`` is taken for the shard's path."""
    if not KEYS_NAME_THEIR_SHARD:
        return key
    if shard and key.startswith(f"{shard}/"):
        return key[len(shard) + 1 :]
    head, found, tail = key.partition(".tar/")
    return tail if found and tail else key


if hasattr(_energon, "log_exception"):
    log_exception = _energon.log_exception
else:  # Energon 7.0-7.2
    from megatron.energon.wrappers._log_exception import log_exception  # noqa: F401


def _skip_sample_types() -> tuple[type[BaseException], ...]:
    found = {_energon.SkipSample}
    for module in ("megatron.energon.errors", "megatron.energon.wrappers.skip"):
        try:
            found.add(importlib.import_module(module).SkipSample)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


#: Every class Energon calls ``SkipSample``. Energon 7.3 has two: ``megatron.energon.SkipSample`` (from
#: ``wrappers.skip``), the one user code raises, and ``errors.SkipSample``, the one its pipeline catches;
#: the first reaches the error handler like any error (the default handler logs it and skips the sample).
SKIP_SAMPLE_TYPES: tuple[type[BaseException], ...] = _skip_sample_types()


def reraise_exception(error: Exception, sample: Any, sources: Any = None) -> None:
    """Raise the exception as it is, on every release (7.0-7.2's own wraps it in a bare ``Exception`` holding
    the whole sample's text). A ``SkipSample`` is not an error: it returns, and Energon skips the sample,
    as 7.4 does before any handler is asked (7.3 hands the class user code raises to the handler)."""
    if isinstance(error, SKIP_SAMPLE_TYPES):
        return
    raise error


#: On 7.0-7.2, by ``id(config)``: each config made by :func:`worker_config` (kept alive, so that its id is
#: not reused) and its handler, for the datasets built with it. The config is a slotted, unhashable
#: dataclass there: it takes no extra attribute and cannot be a key.
_HANDLERS: dict[int, tuple[WorkerConfig, ErrorHandler]] = {}


def worker_config(*, error_handler: ErrorHandler | None = None, **fields: Any) -> WorkerConfig:
    """``WorkerConfig(**fields)`` whose pipeline hands every exception to ``error_handler`` (Energon's
    default when None), on every Energon 7 release; build datasets with it through this module's
    :func:`get_train_dataset` / :func:`get_val_dataset`."""
    if error_handler is not None and HAS_GLOBAL_ERROR_HANDLER:
        fields["global_error_handler"] = error_handler
    config = WorkerConfig(**fields)
    if error_handler is not None and not HAS_GLOBAL_ERROR_HANDLER:
        _HANDLERS[id(config)] = (config, error_handler)
    return config


def get_train_dataset(
    path: str | os.PathLike, *, worker_config: WorkerConfig, **kwargs: Any
) -> SavableDataset:
    """Energon's ``get_train_dataset``, with the config's error handler in force on every release, and
    the TaskEncoder's own decoder where it declares one (see the module docstring)."""
    kwargs, decoder = _dataset_kwargs(kwargs.get("task_encoder"), kwargs)
    if REPEAT_FALSE_NEEDS_BLEND_EPOCHIZED and kwargs.get("repeat", True) is False:
        with _one_epoch_metadataset(path) as once:
            dataset = _energon.get_train_dataset(once, worker_config=worker_config, **kwargs)
    else:
        dataset = _energon.get_train_dataset(path, worker_config=worker_config, **kwargs)
    if decoder is not None:
        _install_decoder(dataset, decoder)
    return _route_errors(dataset, worker_config)


def get_val_dataset(path: str | os.PathLike, *, worker_config: WorkerConfig, **kwargs: Any) -> SavableDataset:
    """Energon's ``get_val_dataset``, as :func:`get_train_dataset`."""
    kwargs, decoder = _dataset_kwargs(kwargs.get("task_encoder"), kwargs)
    dataset = _energon.get_val_dataset(path, worker_config=worker_config, **kwargs)
    if decoder is not None:
        _install_decoder(dataset, decoder)
    return _route_errors(dataset, worker_config)


@contextlib.contextmanager
def _one_epoch_metadataset(path: str | os.PathLike) -> Iterator[str | os.PathLike]:
    """On Energon 5.x/6.x, ``repeat=False`` asserts integer repetitions, which a plain dataset has not
    (its weight is None): read once, a dataset directory is given as a metadataset of it alone blended
    with ``repetitions: 1`` (``blend_epochized``, Energon's own one-epoch form there), which builds the
    same pipeline without ``RepeatDataset``. A metadataset file is given as it is."""
    text = str(path)
    if text.endswith((".yaml", ".yml")) or "://" in text:
        yield path
        return
    import yaml

    with tempfile.TemporaryDirectory(prefix="primus-energon-once-") as folder:
        once = os.path.join(folder, "once.yaml")
        document = {
            "__module__": "megatron.energon",
            "__class__": "MetadatasetV2",
            "splits": {
                split: {"blend_epochized": [{"repetitions": 1, "path": os.path.abspath(text)}]}
                for split in ("train", "val", "test")
            },
        }
        with open(once, "w", encoding="utf-8") as stream:
            yaml.safe_dump(document, stream)
        yield once


def _route_errors(dataset: SavableDataset, config: WorkerConfig) -> SavableDataset:
    entry = None if HAS_GLOBAL_ERROR_HANDLER else _HANDLERS.get(id(config))
    if entry is None or entry[0] is not config:
        return dataset
    handler = entry[1]
    for node in _nodes(dataset):
        if "error_handler" in getattr(node, "__dict__", {}):
            node.error_handler = _Handler(handler)
    return dataset


class _Handler:
    """Energon 7.0-7.2 call a wrapper's handler as ``(exception, sample)`` or with ``sources`` too."""

    def __init__(self, handler: ErrorHandler) -> None:
        self.handler = handler

    def __call__(self, error: Exception, sample: Any, sources: Any = None) -> None:
        self.handler(error, sample, sources)


def _short_loader_settings() -> dict[str, Any]:
    from megatron.energon.savable_loader import SavableDataLoader

    settings: dict[str, Any] = {"gc_collect_every_n_steps": 0}
    if "watchdog_timeout_seconds" in inspect.signature(SavableDataLoader.__init__).parameters:
        settings["watchdog_timeout_seconds"] = None
    return settings


#: Loader settings (``get_savable_loader``, ``BasicDataLoader``) for the many short loaders of one long-lived
#: process (the conformance suite builds dozens per target). Neither setting changes a sample or a state:
#: - ``gc_collect_every_n_steps=0``: Energon's GcDataset runs ``gc.collect()`` as each iteration starts and
#:   every few batches, a safeguard for days-long runs that costs ~0.15 s a loader in a process holding
#:   torch, pytest and hypothesis.
#: - ``watchdog_timeout_seconds=None`` (where the loaders have a watchdog): each iteration starts a watchdog
#:   thread that is never finished; without workers it stays, waking every second. Hundreds pile up, and a
#:   loader that forks its workers from such a process can wait out torch's 5-second join per worker when it
#:   shuts down. The suite's own time limits (:func:`call_with_timeout`, child timeouts) stand in for it.
SHORT_LOADER_SETTINGS: dict[str, Any] = _short_loader_settings()


def short_loader(dataset: SavableDataset) -> Any:
    """Energon's plain (not savable) loader for a short read of ``dataset``, with
    :data:`SHORT_LOADER_SETTINGS`. Same samples, same order as ``megatron.energon.get_loader(dataset)``."""
    from megatron.energon.savable_loader import BasicDataLoader

    return BasicDataLoader(dataset, **SHORT_LOADER_SETTINGS)


# -- samples ---------------------------------------------------------------------------------------------------

#: The fields every Energon sample carries, in the release's order: ``__key__``, ``__restore_key__``, then
#: ``__subflavor__`` and ``__subflavors__`` (5.x/6.x) or ``__subflavors__`` and ``__sources__`` (7.x).
SAMPLE_BASE_FIELDS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(_energon.Sample))
#: True where samples carry ``__sources__`` (Energon 7.0 and later).
HAS_SOURCES: bool = "__sources__" in SAMPLE_BASE_FIELDS
#: True where samples carry the string ``__subflavor__`` (Energon 5.x and 6.x).
HAS_SUBFLAVOR: bool = "__subflavor__" in SAMPLE_BASE_FIELDS


def _sample_decorator() -> Callable[[type], type]:
    try:  # 7.x: keyword-only, slotted, extendable (a module of this name on every 7 release)
        return importlib.import_module("megatron.energon.edataclass").edataclass
    except ImportError:
        pass
    try:  # 6.x: slotted
        return importlib.import_module("megatron.energon.dataclass_slots").dataclass_slots
    except ImportError:  # 5.x: a plain dataclass, as Energon's own samples there
        return dataclasses.dataclass


#: The decorator Energon's own sample classes use on the installed release; a ``Sample`` subclass made
#: with it is built and batched by Energon as its own are.
sample_dataclass: Callable[[type], type] = _sample_decorator()


# -- decoding ----------------------------------------------------------------------------------------------------

#: True where the dataset decodes members (``auto_decode``) and TaskEncoders have no ``decoder``
#: (Energon 5.x and 6.x).
DECODES_IN_DATASET: bool = not hasattr(_energon.TaskEncoder, "decoder")

if hasattr(_energon, "SampleDecoder"):
    SampleDecoderBase: type = _energon.SampleDecoder
else:  # 5.x/6.x: decoders are plain callables on a sample dict; this base holds the common interface

    class SampleDecoderBase:  # type: ignore[no-redef]
        """What a decoder is on Energon 5.x/6.x, which have no ``SampleDecoder``: a callable that takes a
        sample dict (``{"__key__": ..., "member.ext": bytes, ...}``) and returns it with members decoded."""

        _decoder: Callable[[dict], dict]
        _config: dict

        def __call__(self, sample: dict) -> dict:
            return self._decoder(sample)

        def config(self) -> dict:
            return dict(self._config)


_NOT_DECLARED = object()


def _declared_decoder(task_encoder: Any) -> Any:
    """The ``decoder`` a TaskEncoder declares itself (None included), or ``_NOT_DECLARED``; on 7.x every
    TaskEncoder has one (Energon's default ``SampleDecoder``)."""
    return getattr(task_encoder, "decoder", _NOT_DECLARED)


def declares_decoder(task_encoder: Any) -> bool:
    """Whether ``task_encoder`` says itself how members are decoded (always on 7.x; on 5.x/6.x when it has
    a ``decoder`` attribute of its own, None meaning "members stay bytes")."""
    return _declared_decoder(task_encoder) is not _NOT_DECLARED


def release_default_decoder(image_decode: str = "torchrgb") -> Callable[[dict], dict]:
    """The decoder an Energon 5.x/6.x dataset applies to each sample by default (``auto_decode=True``):
    webdataset's autodecoder with the release's image and video handlers. On 7.x: ``SampleDecoder()``."""
    import webdataset

    if not DECODES_IN_DATASET:
        return _energon.SampleDecoder()
    from megatron.energon.flavors.webdataset.default_decoder_webdataset import DefaultDecoderWebdatasetFactory

    if hasattr(DefaultDecoderWebdatasetFactory, "_video_decoder"):  # 5.x: the factory's own method
        video: Any = functools.partial(DefaultDecoderWebdatasetFactory._video_decoder, None)
    else:  # 6.x: AVDecoder, built as the factory builds it (it refuses without the av-decode extra)
        try:
            from megatron.energon.av import AVDecoder
        except ImportError as error:
            raise ImportError(f"AV decoding is not available. Missing dependency: {error}") from error
        video = AVDecoder(
            audio_clip_duration=1,
            audio_num_clips=-1,
            video_decode_audio=False,
            video_num_frames=64,
            video_out_frame_size=(224, 224),
            video_decode="torch",
        )
    return webdataset.autodecode.Decoder([webdataset.autodecode.imagehandler(image_decode), video])


def missing_decoding_dependency(error: BaseException) -> str | None:
    """One line, with the fix, when ``error`` says the release's own decoding cannot run here for want of an
    optional dependency (Energon 6.x builds its default decoder with AV decoding, which needs the
    ``av-decode`` extra, even for data without audio or video); else None."""
    text = str(error)
    if not isinstance(error, ImportError) or "AV decoding is not available" not in text:
        return None
    missing = text.rsplit("Missing dependency:", 1)[-1].strip() if "Missing dependency:" in text else "?"
    return (
        f"{release_label()} decodes members in the dataset with a decoder that needs its av-decode extra, "
        f"which does not import here ({missing}): install it with the versions of the training environment, "
        f"pip install 'megatron-energon[av-decode]=={version('megatron-energon')}', or give the TaskEncoder "
        "`decoder = None` so that members reach the cookers as bytes"
    )


def training_decoder(task_encoder: Any) -> Callable[[dict], dict] | None:
    """What decodes each sample before ``task_encoder``'s cookers in training, on the installed release
    (None: the cookers get the members' bytes): its ``decoder``, where it declares one; on 5.x/6.x
    otherwise the dataset's default decoding (:func:`release_default_decoder`)."""
    declared = _declared_decoder(task_encoder)
    if declared is not _NOT_DECLARED:
        return declared
    return release_default_decoder()


def _dataset_kwargs(task_encoder: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """On 5.x/6.x, a TaskEncoder that declares a decoder has its datasets read undecoded (its decoder is
    put in afterwards by :func:`_install_decoder`)."""
    if not DECODES_IN_DATASET or task_encoder is None:
        return kwargs, None
    declared = _declared_decoder(task_encoder)
    if declared is _NOT_DECLARED or "auto_decode" in kwargs:
        return kwargs, None
    return {**kwargs, "auto_decode": False}, declared


def _install_decoder(dataset: SavableDataset, decoder: Any) -> None:
    """Put ``decoder`` where an Energon 5.x/6.x dataset's own decoder runs (``load_sample`` of each
    webdataset factory the pipeline reads through), so that it runs in the loader workers as 7.x runs a
    TaskEncoder's decoder."""
    from megatron.energon.flavors.webdataset.default_decoder_webdataset import DefaultDecoderWebdatasetFactory

    for node in _nodes(dataset):
        function = getattr(node, "map_fn", None) if isinstance(node, SavableDataset) else None
        owner = getattr(function, "__self__", None)
        if isinstance(owner, DefaultDecoderWebdatasetFactory):
            owner._decoder = decoder


def _nodes(dataset: Any) -> list[Any]:
    """Every object of a dataset pipeline (wrappers, their inner datasets, lists of them), each once."""
    seen: set[int] = set()
    stack: list[Any] = [dataset]
    found: list[Any] = []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, (list, tuple)):
            stack.extend(node)
            continue
        if not isinstance(node, SavableDataset):
            continue
        found.append(node)
        stack.extend(vars(node).values() if hasattr(node, "__dict__") else ())
        for slot in getattr(type(node), "__slots__", ()):
            stack.append(getattr(node, slot, None))
    return found


# -- TaskEncoder stages and cookers -----------------------------------------------------------------------------

#: The per-sample and per-batch stages the installed release's TaskEncoder runs, in pipeline order.
TASK_ENCODER_STAGES: tuple[str, ...] = tuple(
    stage
    for stage in (
        "cook_crude_sample",
        "preencode_sample",
        "encode_sample",
        "select_samples_to_pack",
        "pack_selected_samples",
        "postencode_sample",
        "batch",
        "encode_batch",
    )
    if hasattr(_energon.TaskEncoder, stage)
)


def overrides(task_encoder: Any, stage: str, bases: tuple[type, ...] | None = None) -> bool:
    """Whether the pipeline Energon builds for ``task_encoder`` (an instance) runs its own ``stage``: the
    release has the stage, and the TaskEncoder's is not the one of ``bases`` (Energon's ``TaskEncoder``
    by default). Energon's own test where the release has one (7.x ``_is_overridden``); the same rule on
    5.x/6.x, which compare ``__func__`` with ``TaskEncoder``'s."""
    if stage not in TASK_ENCODER_STAGES:
        return False
    method = getattr(task_encoder, stage)
    own_test = getattr(task_encoder, "_is_overridden", None)
    if own_test is not None:
        return bool(own_test(method, bases=bases) if bases is not None else own_test(method))
    function = getattr(method, "__func__", None)
    if function is None:  # set on the instance, or not a method: always the TaskEncoder's own
        return True
    return all(function is not getattr(base, stage, None) for base in (bases or (_energon.TaskEncoder,)))


#: Energon 7.0 and later refuse a cooker whose ``cook`` is not ``@stateless``.
STATELESS_COOKERS_REQUIRED: bool = ENERGON_VERSION >= (7, 0)

#: What Energon raises when no cooker matches a sample: ``ValueError`` ("No cooker found ...", 7.x) or
#: ``NotImplementedError`` ("... not providing a way to cook them", 5.x/6.x).
NO_COOKER_ERRORS: tuple[type[BaseException], ...] = (
    (ValueError,) if ENERGON_VERSION >= (7, 0) else (NotImplementedError, ValueError)
)


#: The wording of Energon's own "no cooker matches" errors (7.x, then 5.x/6.x).
_NO_COOKER_WORDING = ("No cooker found", "not providing a way to cook them")


#: How the installed release reports a dataset no cooker matches, for error and fix texts.
NO_COOKER_BEHAVIOUR: str = (
    "Energon raises ValueError 'No cooker found for subflavors: ...' when the loader is built"
    if not COOKERS_CHOSEN_PER_SAMPLE
    else (
        "Energon raises 'No cooker found for subflavors' at the first sample"
        if ENERGON_VERSION >= (7, 0)
        else "Energon raises NotImplementedError 'You are using crude samples but not providing a way to cook "
        "them' at the first sample"
    )
)


def is_no_cooker_error(error: BaseException) -> bool:
    """Whether ``error`` is the installed release's own "no cooker matches this sample" error."""
    return isinstance(error, NO_COOKER_ERRORS) and any(text in str(error) for text in _NO_COOKER_WORDING)


def cooker_filters(cooker: Any) -> tuple[str | None, dict | None, Callable[[dict], bool] | None]:
    """``(is_subflavor, has_subflavors, condition)`` of an Energon ``Cooker``: all three filter on
    5.x/6.x (a crude sample matches when every given one does); 7.x have ``has_subflavors`` only."""
    return (
        getattr(cooker, "is_subflavor", None),
        getattr(cooker, "has_subflavors", None),
        getattr(cooker, "condition", None),
    )


#: False on 5.x: a loader without workers saves no sample index, so after a restore the index (hence the
#: per-sample seeds of ``@stateless(restore_seeds=True)`` and the outer ``__restore_key__`` index) starts at 0.
RESTORES_SAMPLE_INDEX_WITHOUT_WORKERS: bool = ENERGON_VERSION >= (6, 0)


def describe_filters(cooker: Any) -> Any:
    """A cooker's filters as error messages name them: its ``has_subflavors``, or, where ``is_subflavor`` or
    ``condition`` (5.x/6.x) is set, a dict of all three."""
    is_subflavor, has_subflavors, condition = cooker_filters(cooker)
    if is_subflavor is None and condition is None:
        return has_subflavors
    return {"is_subflavor": is_subflavor, "has_subflavors": has_subflavors, "condition": condition}


#: On 5.x/6.x, ``repeat=False`` accepts only integer repetitions and blends by repeating samples
#: (``blend_epochized``); a plain dataset read once is built without ``RepeatDataset`` there.
REPEAT_FALSE_NEEDS_BLEND_EPOCHIZED: bool = ENERGON_VERSION < (7, 0)


# -- loaders and paths -------------------------------------------------------------------------------------------


def savable_loader(dataset: SavableDataset, **kwargs: Any) -> Any:
    """``megatron.energon.get_savable_loader(dataset, **kwargs)`` on every release: a setting the release
    does not have is left out when it asks for that release's own behaviour (``prefetch_factor=2`` on 5.2,
    ``watchdog_timeout_seconds`` where there is no watchdog), and refused with a clear error otherwise."""
    accepted = inspect.signature(_energon.get_savable_loader).parameters
    defaults = {"prefetch_factor": 2}
    for name in [name for name in kwargs if name not in accepted]:
        value = kwargs.pop(name)
        if name == "watchdog_timeout_seconds" or (name in defaults and value == defaults[name]):
            continue
        raise TypeError(
            f"{name}={value!r}: {release_label()}'s get_savable_loader has no {name!r} setting; "
            "leave it at its default or use a newer megatron-energon"
        )
    return _energon.get_savable_loader(dataset, **kwargs)


def write_text(path: Any, text: str) -> None:
    """Write ``text`` to an Energon ``EPath`` (or any path with ``open``); ``EPath.write_text`` is 7.x only."""
    with path.open("w") as stream:
        stream.write(text)
