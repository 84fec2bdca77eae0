"""`preview_dataset`: the first samples exactly as the reference TaskEncoder hands them to ``batch()``.

Replaces ``energon preview``, which raises ``TypeError`` on a CrudeWebdataset (its raw samples are dicts, not dataclasses). The samples go
through Energon's own loading path (``get_val_dataset``: sequential, one pass) with the reference cookers
(`primus_energon.MultiFormatTaskEncoder`, dispatched by ``subflavors.encoding``), no decoder, and tensors read
only through `primus_energon.read_tensor` (which never unpickles). A sample the cooker rejects is shown as an error line with the
reason; a shard that breaks iteration (truncated tar) ends the preview with an error.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..storage import dataset_path

__all__ = ["PreviewItem", "describe_value", "preview_dataset"]


@dataclass
class PreviewItem:
    """One sample (`fields` maps field name to a one-line description) or one rejected sample (`error`)."""

    key: str | None
    shard: str | None
    subflavors: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def describe_value(value: Any, *, max_chars: int = 100) -> str:
    """A one-line description: tensors with dtype, shape, range and mean; images with mode, size and
    pixel range; text quoted (cut at `max_chars`) with its length."""
    import torch

    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        text = f"tensor {dtype} {list(value.shape)}"
        if value.numel():
            v = value.detach()
            if v.is_floating_point():
                f = v.float()
                text += f"  min {float(f.min()):.4g}  max {float(f.max()):.4g}  mean {float(f.mean()):.4g}"
                bad = int((~torch.isfinite(f)).sum())
                if bad:
                    text += f"  ({bad} NaN/Inf)"
            elif v.dtype != torch.bool:
                text += f"  min {int(v.min())}  max {int(v.max())}"
        return text
    if isinstance(value, str):
        shown = value if len(value) <= max_chars else value[:max_chars] + "..."
        return f"{shown!r} ({len(value)} chars)"
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover
        Image = None  # type: ignore[assignment]
    if Image is not None and isinstance(value, Image.Image):
        extrema = value.getextrema()
        if extrema and isinstance(extrema[0], tuple):
            lo = min(e[0] for e in extrema)
            hi = max(e[1] for e in extrema)
        else:
            lo, hi = extrema  # type: ignore[misc]
        return f"PIL image {value.mode} {value.width}x{value.height} (W x H)  pixel range [{lo}, {hi}]"
    if isinstance(value, (bytes, bytearray)):
        return f"bytes, {len(value)} long"
    text = repr(value)
    return text if len(text) <= max_chars else text[:max_chars] + "..."


def _fields(sample: Any) -> dict[str, Any]:
    if isinstance(sample, dict):
        return {k: v for k, v in sample.items() if not k.startswith("__")}
    import dataclasses

    if dataclasses.is_dataclass(sample):
        return {
            f.name: getattr(sample, f.name) for f in dataclasses.fields(sample) if not f.name.startswith("__")
        }
    return {"value": sample}


def _get(sample: Any, name: str) -> Any:
    return sample.get(name) if isinstance(sample, dict) else getattr(sample, name, None)


def preview_dataset(
    path: str | os.PathLike[str], *, n: int = 4, split: str = "train", max_chars: int = 100
) -> tuple[list[PreviewItem], str | None]:
    """The first `n` items of `split` of the dataset at `path` (local or remote) as the reference TaskEncoder
    cooks them.

    Returns (items, stop_error): `stop_error` is set when iteration ended early (e.g. a truncated shard).
    Rejected samples are items with `error` set; they count toward `n`.
    """
    from megatron.energon import get_loader, stateless

    from primus_energon.energon_compat import get_val_dataset, worker_config
    from primus_energon.errors import sample_location
    from primus_energon.task_encoders import MultiFormatTaskEncoder

    rejected: list[PreviewItem] = []

    def on_error(exc: Exception, sample: Any, sources: Any = None) -> None:
        loc = sample_location(sample) if sample is not None else {"key": None, "shard": None}
        shard = loc.get("shard")
        if shard is None and sources:
            shard = getattr(sources[0], "shard_name", None)
        rejected.append(PreviewItem(loc.get("key"), shard, error=f"{type(exc).__name__}: {exc}"))

    class _PreviewTaskEncoder(MultiFormatTaskEncoder):
        """The reference TaskEncoder whose batch() hands back the cooked samples unchanged."""

        @stateless
        def batch(self, samples: list[Any]) -> list[Any]:  # type: ignore[override]
            return list(samples)

    items: list[PreviewItem] = []
    stop: str | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ds = get_val_dataset(
                str(dataset_path(path)),
                split_part=split,
                worker_config=worker_config(rank=0, world_size=1, num_workers=0, error_handler=on_error),
                batch_size=1,
                task_encoder=_PreviewTaskEncoder(),
            )
            for batch in get_loader(ds):
                items.extend(rejected)
                rejected.clear()
                for sample in batch:
                    sources = _get(sample, "__sources__") or ()
                    shard = getattr(sources[0], "shard_name", None) if sources else None
                    items.append(
                        PreviewItem(
                            key=_get(sample, "__key__"),
                            shard=shard,
                            subflavors=dict(_get(sample, "__subflavors__") or {}),
                            fields={
                                k: describe_value(v, max_chars=max_chars) for k, v in _fields(sample).items()
                            },
                        )
                    )
                if len(items) >= n:
                    break
            items.extend(rejected)
        except Exception as exc:  # noqa: BLE001 - a broken shard or dataset ends the preview
            items.extend(rejected)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            stop = f"{type(exc).__name__}: {first}"
    return items[:n], stop


def render_preview(items: list[PreviewItem], stop: str | None) -> str:
    lines = []
    for i, item in enumerate(items):
        head = f"[{i}] key {item.key}  shard {item.shard}"
        if item.error:
            lines.append(f"{head}  REJECTED by the cooker: {item.error}")
            continue
        if item.subflavors:
            head += f"  subflavors {item.subflavors}"
        lines.append(head)
        width = max((len(k) for k in item.fields), default=0)
        for k, v in item.fields.items():
            lines.append(f"    {k:<{width}}  {v}")
    if stop:
        lines.append(
            f"ERROR: loading stopped: {stop}. Run `primus-energon validate DIR` to find the broken shard"
        )
    if not items and not stop:
        lines.append("(no samples)")
    return "\n".join(lines) + "\n"
