"""The payload sizes, the generated datasets and the pipelines the throughput benchmarks measure.

Every pipeline reads the same generated shards and yields batches of ``batch_size`` samples, endlessly:

* ``reference``: :func:`primus_energon.get_loader` with :class:`~primus_energon.EncodedDiffusionTaskEncoder`
  (no decoder; the cooker reads tensors with :func:`~primus_energon.tensorfile.read_tensor` as views of the
  member bytes, most payloads through its layout cache; ``batch()``'s stack is the only copy);
* ``floor``: the same loader and the same ``batch()`` with a cooker that decodes nothing: zero-copy
  ``torch.frombuffer`` uint8 views of the member bytes. Inside the stock loader no cooker beats it;
* ``reference_copying`` (diagnostic): the reference with the copying cooker ``cook_preencoded_diffusion``
  (tensors own their memory; the stack copies them again): what zero-copy cooking gains;
* ``reference_uncached`` (diagnostic): the reference with ``read_tensor(cache=False)``: what the layout
  cache gains;
* ``guide``: the baseline TaskEncoder a straightforward Energon integration writes: Energon's default
  ``SampleDecoder`` decodes ``.pth`` members by unpickling them, a cooker that reads the decoded members
  into a ``DiffusionSample`` (:func:`cook_guide`), and a ``batch()`` that ``torch.stack``-s the three
  tensors. The default decoder runs code from a shard, so this pipeline exists only to be measured on
  the benchmark's own freshly generated shards (see :class:`GuideTaskEncoderUnsafe`);
* ``webdataset``: plain ``webdataset.WebDataset(...).decode().to_tuple(...).batched(...)`` in a
  ``DataLoader``; its default ``.pth`` handler unpickles too (own shards only, as above);
* ``tarfile``: Python's ``tarfile`` in stream mode, ``torch.load(weights_only=True)`` per tensor member,
  ``torch.stack`` per batch, in a ``DataLoader``.

The Energon pipelines use the loader factory's settings (whatever :func:`primus_energon.get_loader`
defaults to, plus the ``settings`` of a sweep); the guide pipeline uses Energon's stock
``get_savable_loader`` settings (:data:`ENERGON_STOCK_SETTINGS`), as that baseline does.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import shutil
import tarfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from megatron.energon import Cooker, DefaultTaskEncoder, SampleDecoder, basic_sample_keys, stateless
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from primus_energon import PREENCODED_COOKER, DiffusionSample, EncodedDiffusionTaskEncoder, get_loader
from primus_energon.formats import SIZES
from primus_energon.payloads import decode_text
from primus_energon.tensorfile import read_tensor

from .ceilings import TENSOR_MEMBERS, shard_paths

__all__ = [
    "PAYLOADS",
    "QUICK_PAYLOADS",
    "PIPELINES",
    "ENERGON_STOCK_SETTINGS",
    "TENSOR_MEMBERS",
    "CAPTION_MEMBER",
    "PayloadSpec",
    "Pipeline",
    "make_dataset",
    "shard_paths",
    "batch_size_of",
    "quiet_warnings",
]

#: The caption member of a preencoded sample (the tensor members: ``TENSOR_MEMBERS``).
CAPTION_MEMBER = "caption.txt"
_FIELDS = {
    "latents.pth": "latents",
    "prompt_embeds.pth": "prompt_embeds",
    "pooled_prompt_embeds.pth": "pooled",
}

#: Energon 7.4.1's own defaults of ``get_savable_loader`` (``GC_DEFAULT_EVERY_N_ITER``, ``prefetch_factor``).
ENERGON_STOCK_SETTINGS: dict[str, Any] = {"gc_collect_every_n_steps": 10, "prefetch_factor": 2}


@dataclass(frozen=True)
class PayloadSpec:
    """One payload size: tensor shapes and dtype, and the dataset the benchmark generates for it."""

    name: str
    label: str
    shapes: Mapping[str, tuple[int, ...]]
    dtype: str
    num_samples: int
    shard_size: int
    epochs_per_pass: int = 2
    seed: int = 0

    def key(self) -> str:
        """A short digest of everything that determines the generated shards."""
        blob = json.dumps({k: v for k, v in asdict(self).items() if k != "epochs_per_pass"}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def num_shards(self) -> int:
        return math.ceil(self.num_samples / self.shard_size)


_SMALL, _FLUX, _TINY = (dict(SIZES[name]) for name in ("small", "flux", "tiny"))

#: The payload sizes of the full run (small f32 and FLUX-sized bf16 samples, primus_energon.formats.SIZES).
PAYLOADS: dict[str, PayloadSpec] = {
    "small": PayloadSpec(
        "small",
        "small: f32 latents [16,32,32], prompt [77,256], pooled [768]",
        _SMALL,
        "float32",
        500,
        50,
        epochs_per_pass=1,
    ),
    "flux": PayloadSpec(
        "flux",
        "FLUX-sized: bf16 latents [16,64,64], prompt [512,4096], pooled [768]",
        _FLUX,
        "bfloat16",
        100,
        10,
    ),
    # not part of the default run: the smoke test's size
    "tiny": PayloadSpec(
        "tiny", "tiny: f32 latents [4,8,8], prompt [7,16], pooled [16]", _TINY, "float32", 32, 8
    ),
}
#: The same sizes with fewer samples, for ``--quick``.
QUICK_PAYLOADS: dict[str, PayloadSpec] = {
    "small": PayloadSpec(**{**asdict(PAYLOADS["small"]), "num_samples": 128, "shard_size": 32}),
    "flux": PayloadSpec(**{**asdict(PAYLOADS["flux"]), "num_samples": 24, "shard_size": 6}),
    "tiny": PAYLOADS["tiny"],
}


def make_dataset(root: Path, spec: PayloadSpec, workers: int = 1) -> Path:
    """Generate (or reuse, when ``root`` already holds it) the prepared dataset of ``spec``; returns its path.

    ``workers`` processes write the shards (the shards do not depend on it)."""
    from primus_energon.synthetic import generate_dataset

    path = Path(root) / f"{spec.name}-{spec.key()}"
    stamp = path / ".bench-complete"
    if stamp.is_file():
        return path
    if path.exists():
        shutil.rmtree(path)
    generate_dataset(
        path,
        num_samples=spec.num_samples,
        shard_size=spec.shard_size,
        seed=spec.seed,
        dtype=spec.dtype,
        shapes={k: tuple(v) for k, v in spec.shapes.items()},
        workers=workers,
    )
    stamp.write_text(json.dumps(asdict(spec)))
    return path


def batch_size_of(batch: Any) -> int:
    """Samples in a batch of any pipeline (the leading size of its first tensor)."""
    values = batch.values() if isinstance(batch, dict) else batch
    for value in values:
        if isinstance(value, torch.Tensor):
            return int(value.shape[0])
    raise TypeError(f"no tensor in batch of type {type(batch).__name__}")


def quiet_warnings() -> None:
    """Silence the warnings every pipeline would print once per process (none of them is about speed)."""
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    warnings.filterwarnings("ignore", message=".*given buffer is not writable.*")
    warnings.filterwarnings("ignore", message=".*shardshuffle.*")


# --- Energon pipelines -----------------------------------------------------------------------------------


@stateless
def cook_floor(sample: dict) -> DiffusionSample:
    """Decode nothing: zero-copy uint8 views of the tensor members' bytes, the caption bytes as they are."""
    return DiffusionSample(
        **basic_sample_keys(sample),
        latents=torch.frombuffer(sample["latents.pth"], dtype=torch.uint8),
        prompt_embeds=torch.frombuffer(sample["prompt_embeds.pth"], dtype=torch.uint8),
        pooled_prompt_embeds=torch.frombuffer(sample["pooled_prompt_embeds.pth"], dtype=torch.uint8),
        caption=sample.get(CAPTION_MEMBER, b""),
    )


class FloorTaskEncoder(EncodedDiffusionTaskEncoder):
    """The reference TaskEncoder (same loader, same ``batch()``) with :func:`cook_floor` as its cooker."""

    cookers = [Cooker(cook_floor, has_subflavors={"encoding": "preencoded"})]


@stateless
def cook_uncached(sample: dict) -> DiffusionSample:
    """The reference cooker (no copy) with ``read_tensor(cache=False)``: every payload is parsed in full."""
    tensors = {
        field: read_tensor(sample[member], copy=False, fallback=True, cache=False)
        for member, field in (
            ("latents.pth", "latents"),
            ("prompt_embeds.pth", "prompt_embeds"),
            ("pooled_prompt_embeds.pth", "pooled_prompt_embeds"),
        )
    }
    caption = sample.get(CAPTION_MEMBER)
    caption = "" if caption is None else decode_text(caption, sample, CAPTION_MEMBER)
    return DiffusionSample(**basic_sample_keys(sample), **tensors, caption=caption)


class UncachedTaskEncoder(EncodedDiffusionTaskEncoder):
    """The reference TaskEncoder without the layout cache (diagnostic pipeline)."""

    cookers = [Cooker(cook_uncached, has_subflavors={"encoding": "preencoded"})]


class CopyingTaskEncoder(EncodedDiffusionTaskEncoder):
    """The reference TaskEncoder with the copying cooker ``cook_preencoded_diffusion`` (diagnostic
    pipeline): tensors own their memory, so ``batch()``'s stack is a second copy."""

    cookers = [PREENCODED_COOKER]


@stateless
def cook_guide(sample: dict) -> DiffusionSample:
    """The baseline's cooker: members arrive decoded by Energon's default decoder; bytes that did not are
    read with ``torch.load`` (weights-only, torch's default)."""

    def load(value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value
        return torch.load(io.BytesIO(value), map_location="cpu", weights_only=True)

    caption = sample.get(CAPTION_MEMBER, b"")
    caption = caption.decode("utf-8") if isinstance(caption, bytes) else str(caption or "")
    return DiffusionSample(
        **basic_sample_keys(sample),
        latents=load(sample["latents.pth"]),
        prompt_embeds=load(sample["prompt_embeds.pth"]),
        pooled_prompt_embeds=load(sample["pooled_prompt_embeds.pth"]),
        caption=caption,
    )


class GuideTaskEncoderUnsafe(DefaultTaskEncoder):
    """UNSAFE, benchmark-only: the baseline TaskEncoder (the ``guide`` pipeline), with Energon's default
    ``SampleDecoder``.

    That decoder hands ``.pth`` members to webdataset's handler, which unpickles them (it runs code from a
    shard). It is used here only on shards this benchmark has just generated itself, to measure
    the pipeline the reference replaces. Never point it at data you did not make.
    """

    decoder = SampleDecoder(image_decode="pil")
    cookers = [Cooker(cook_guide, has_subflavors={"encoding": "preencoded"})]

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, torch.Tensor]:
        """``torch.stack`` of each tensor field; captions and keys are dropped."""
        return {
            "latents": torch.stack([s.latents for s in samples]),
            "prompt_embeds": torch.stack([s.prompt_embeds for s in samples]),
            "pooled_prompt_embeds": torch.stack([s.pooled_prompt_embeds for s in samples]),
        }


# --- plain webdataset and plain tarfile ------------------------------------------------------------------


def _webdataset_unsafe(shards: list[Path], num_workers: int, batch_size: int) -> Any:
    """UNSAFE, benchmark-only: webdataset's default ``.decode()`` unpickles ``.pth`` members (own shards only)."""
    import webdataset as wds

    dataset = (
        wds.WebDataset(
            [str(s) for s in shards],
            shardshuffle=False,
            nodesplitter=None,
            workersplitter=wds.split_by_worker if num_workers else None,
            empty_check=False,
        )
        .decode()
        .to_tuple(*TENSOR_MEMBERS, CAPTION_MEMBER)
        .batched(batch_size)
        .repeat()
    )
    return dataset


class TarfileTorchLoad(IterableDataset):
    """Plain ``tarfile`` (stream mode) + ``torch.load(weights_only=True)`` + ``torch.stack``, endlessly.

    Shards are split between DataLoader workers round-robin; each worker cycles over its shards.
    """

    def __init__(self, shards: list[Path], batch_size: int) -> None:
        super().__init__()
        self.shards = [str(s) for s in shards]
        self.batch_size = batch_size

    def _samples(self, shards: list[str]) -> Iterator[dict[str, Any]]:
        for shard in shards:
            current: dict[str, Any] = {}
            key = None
            with tarfile.open(shard, mode="r|") as tar:
                for info in tar:
                    if not info.isfile():
                        continue
                    stem, _, member = info.name.partition(".")
                    if stem != key and current:
                        yield current
                        current = {}
                    key = stem
                    handle = tar.extractfile(info)
                    data = handle.read() if handle is not None else b""
                    if member.endswith(".pth"):
                        current[member] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
                    elif member == CAPTION_MEMBER:
                        current[member] = data.decode("utf-8")
            if current:
                yield current

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        shards = self.shards if info is None else self.shards[info.id :: info.num_workers]
        batch: list[dict[str, Any]] = []
        while True:
            for sample in self._samples(shards):
                batch.append(sample)
                if len(batch) == self.batch_size:
                    yield _stack_tar_batch(batch)
                    batch = []


def _stack_tar_batch(samples: list[dict[str, Any]]) -> dict[str, Any]:
    batch: dict[str, Any] = {_FIELDS[m]: torch.stack([s[m] for s in samples]) for m in TENSOR_MEMBERS}
    batch["caption"] = [s.get(CAPTION_MEMBER, "") for s in samples]
    return batch


# --- the registry ----------------------------------------------------------------------------------------


@dataclass
class Pipeline:
    """A pipeline the harness can build: ``build(path, num_workers, batch_size, settings)`` returns an
    endless batch iterator and a function that stops it (its worker processes included)."""

    name: str
    description: str
    build: Callable[[Path, int, int, Mapping[str, Any]], tuple[Iterator[Any], Callable[[], None]]]
    energon: bool = True
    diagnostic: bool = False
    decoded: bool = True
    tags: tuple[str, ...] = field(default_factory=tuple)


def _energon(
    task_encoder: type, stock: bool = False
) -> Callable[..., tuple[Iterator[Any], Callable[[], None]]]:
    def build(
        path: Path, num_workers: int, batch_size: int, settings: Mapping[str, Any]
    ) -> tuple[Iterator[Any], Callable[[], None]]:
        kwargs = {**(ENERGON_STOCK_SETTINGS if stock else {}), **settings}
        loader = get_loader(
            path, task_encoder, batch_size=batch_size, num_workers=num_workers, seed=0, **kwargs
        )
        return loader, loader.close

    return build


def _dataloader(
    dataset: Any, num_workers: int, settings: Mapping[str, Any]
) -> tuple[Iterator[Any], Callable[[], None]]:
    kwargs: dict[str, Any] = {}
    if num_workers:
        kwargs = {"persistent_workers": True, "prefetch_factor": settings.get("prefetch_factor", 2)}
    loader = DataLoader(dataset, batch_size=None, num_workers=num_workers, **kwargs)
    iterator = iter(loader)

    def close() -> None:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    return iterator, close


def _build_webdataset(
    path: Path, num_workers: int, batch_size: int, settings: Mapping[str, Any]
) -> tuple[Iterator[Any], Callable[[], None]]:
    return _dataloader(_webdataset_unsafe(shard_paths(path), num_workers, batch_size), num_workers, settings)


def _build_tarfile(
    path: Path, num_workers: int, batch_size: int, settings: Mapping[str, Any]
) -> tuple[Iterator[Any], Callable[[], None]]:
    return _dataloader(TarfileTorchLoad(shard_paths(path), batch_size), num_workers, settings)


#: Every pipeline, by name, in the order the tables list them.
PIPELINES: dict[str, Pipeline] = {
    p.name: p
    for p in (
        Pipeline(
            "reference",
            "primus_energon.get_loader + EncodedDiffusionTaskEncoder (safe reader, one copy per tensor, stack)",
            _energon(EncodedDiffusionTaskEncoder),
        ),
        Pipeline(
            "floor",
            "same loader and batch(), cooker decodes nothing (zero-copy uint8 views of the member bytes)",
            _energon(FloorTaskEncoder),
            decoded=False,
        ),
        Pipeline(
            "reference_copying",
            "diagnostic: the reference with the copying cooker (cook_preencoded_diffusion): two copies per tensor",
            _energon(CopyingTaskEncoder),
            diagnostic=True,
        ),
        Pipeline(
            "reference_uncached",
            "diagnostic: the reference without read_tensor's layout cache (every payload parsed in full)",
            _energon(UncachedTaskEncoder),
            diagnostic=True,
        ),
        Pipeline(
            "guide",
            "baseline TaskEncoder: Energon's default decoder (unpickles; own shards only), a cooker of the "
            "decoded members, torch.stack batch(), stock loader",
            _energon(GuideTaskEncoderUnsafe, stock=True),
        ),
        Pipeline(
            "webdataset",
            "webdataset.WebDataset(...).decode().to_tuple(...).batched(4) in a DataLoader (unpickles; own shards)",
            _build_webdataset,
            energon=False,
        ),
        Pipeline(
            "tarfile",
            "tarfile stream + torch.load(weights_only=True) + torch.stack, in a DataLoader",
            _build_tarfile,
            energon=False,
        ),
    )
}
