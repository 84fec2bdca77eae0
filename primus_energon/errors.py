"""Errors a user can hit while cooking, batching or loading, each naming *where* it happened.

Every sample-level error carries the sample key, the shard and the dataset it came from, so a message
reads like ``sample 'ds_000012' (shard 'shard-000003.tar' of dataset '/data/laion'): ...`` and can be
acted on without a debugger. All of them subclass :class:`ValueError`, the type Energon's error
handlers expect for bad data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "SampleError",
    "MissingMemberError",
    "PayloadDecodeError",
    "CaptionDecodeError",
    "BatchError",
    "BatchShapeError",
    "EmptyDataloaderError",
    "sample_location",
]


def _first_source(sample: Any) -> Any:
    sources = _get(sample, "__sources__")
    if sources:
        return sources[0]
    return None


def _get(sample: Any, name: str) -> Any:
    if isinstance(sample, Mapping):
        return sample.get(name)
    return getattr(sample, name, None)


def sample_location(sample: Any) -> dict[str, str | None]:
    """Where a crude or cooked sample came from: ``{"key", "shard", "dataset"}`` (values may be None)."""
    key = _get(sample, "__key__")
    source = _first_source(sample)
    shard = getattr(source, "shard_name", None) if source is not None else None
    if shard is None:
        shard = _get(sample, "__shard__")
    dataset = getattr(source, "dataset_path", None) if source is not None else None
    return {
        "key": None if key is None else str(key),
        "shard": None if shard is None else str(shard),
        "dataset": None if dataset is None else str(dataset),
    }


def _describe(location: Mapping[str, str | None]) -> str:
    text = f"sample {location.get('key')!r}"
    where = []
    if location.get("shard"):
        where.append(f"shard {location['shard']!r}")
    if location.get("dataset"):
        where.append(f"dataset {location['dataset']!r}")
    if where:
        text += " (" + " of ".join(where) + ")"
    return text


class SampleError(ValueError):
    """A sample could not be cooked. ``key``, ``shard``, ``dataset`` and ``member`` say where."""

    def __init__(
        self, problem: str, sample: Any = None, *, member: str | None = None, hint: str = ""
    ) -> None:
        # With sample=None, `problem` is the whole message: that is how torch's DataLoader re-creates an
        # exception raised in a worker process (exc_type(message)), which keeps the type but not the fields.
        location = (
            sample_location(sample) if sample is not None else {"key": None, "shard": None, "dataset": None}
        )
        self.key = location["key"]
        self.shard = location["shard"]
        self.dataset = location["dataset"]
        self.member = member
        self.problem = problem
        message = f"{_describe(location)}: {problem}" if sample is not None else problem
        if hint:
            message += f". {hint}"
        super().__init__(message)


class MissingMemberError(SampleError):
    """A required member (for example ``latents.pth``) is absent from the sample."""


class PayloadDecodeError(SampleError):
    """A member's bytes are not what its name promises (not a tensor file, not an image, ...)."""


class CaptionDecodeError(SampleError):
    """A caption member is not valid UTF-8 text."""


class BatchError(ValueError):
    """Samples could not be combined into one batch."""


class BatchShapeError(BatchError):
    """The samples of a batch have different shapes or dtypes for one field, so they cannot be stacked."""

    def __init__(self, field: str, groups: Mapping[tuple[Any, ...], Sequence[str]]) -> None:
        self.field = field
        self.groups = {signature: list(keys) for signature, keys in groups.items()}
        parts = []
        for (shape, dtype), keys in self.groups.items():
            shown = ", ".join(repr(k) for k in keys[:4]) + (
                f" and {len(keys) - 4} more" if len(keys) > 4 else ""
            )
            parts.append(f"shape {list(shape)} {dtype} for {shown}")
        super().__init__(
            f"cannot stack field {field!r}: the samples of this batch differ: "
            + "; ".join(parts)
            + ". Resize the data to one shape, or group samples of equal shape into batches "
            "(TaskEncoder.batch_group_criterion)"
        )


class EmptyDataloaderError(RuntimeError):
    """A wrapped dataloader produced no items in a whole pass, so cycling over it would spin forever."""
