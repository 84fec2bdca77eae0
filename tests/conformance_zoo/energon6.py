"""TaskEncoders written for Energon 5.x/6.x, in the style of DFM's DiT TaskEncoder (DFM locks Energon 6.0.1):
no ``decoder`` attribute (the dataset decodes members, ``auto_decode``), the crude sample's ``__subflavor__``
read, first-fit sequence packing. They use nothing Energon 7 added, and run on 5.x/6.x only (``__subflavor__``
is gone in 7).

- :class:`DiTStyleTaskEncoder` as DFM wrote it: its packs are shuffled with the global ``random`` nobody
  seeded, and its members are decoded by the release's default decoder (``.pth`` through ``torch.load``
  with ``weights_only`` off): two real findings.
- :class:`SafeDiTStyleTaskEncoder` fixes both: ``decoder = None`` (members stay bytes, read with
  ``weights_only=True``) and packs in a fixed order. It must pass, and so must
  :class:`SafeDecoderDiTStyleTaskEncoder`, whose members ``SafeSampleDecoder`` decodes.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from megatron.energon import Cooker, DefaultTaskEncoder, basic_sample_keys, stateless

from primus_energon.decoding import SafeSampleDecoder

_TENSORS = {
    "latents": "latents.pth",
    "prompt_embeds": "prompt_embeds.pth",
    "pooled": "pooled_prompt_embeds.pth",
}


def _tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    return torch.load(io.BytesIO(value), weights_only=True)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value or "")


def cook_dit(sample: dict) -> dict:
    """Energon 6's crude sample in (members decoded or not), the DiT fields out; the ``__subflavor__``
    (a 5.x/6.x key) is kept beside the basic keys, as DFM's cooker does."""
    return dict(
        **basic_sample_keys(sample),
        subflavor=sample["__subflavor__"],
        **{field: _tensor(sample[member]) for field, member in _TENSORS.items()},
        caption=_text(sample.get("caption.txt")),
    )


class DiTStyleTaskEncoder(DefaultTaskEncoder):
    """DFM's DiT TaskEncoder, reduced: first-fit packing by prompt length, packs shuffled with ``random``."""

    cookers = [Cooker(cook_dit, has_subflavors={"encoding": "preencoded"})]
    capacity = 16

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def _bins(self, samples: list[dict]) -> list[list[dict]]:
        order = sorted(range(len(samples)), key=lambda i: (-samples[i]["prompt_embeds"].shape[0], i))
        bins: list[list[dict]] = []
        room: list[int] = []
        for index in order:
            length = samples[index]["prompt_embeds"].shape[0]
            for slot, left in enumerate(room):
                if length <= left:
                    bins[slot].append(samples[index])
                    room[slot] -= length
                    break
            else:
                bins.append([samples[index]])
                room.append(self.capacity - length)
        return bins

    def select_samples_to_pack(self, samples: list[dict]) -> list[list[dict]]:
        import random

        bins = self._bins(samples)
        random.shuffle(bins)  # DFM's select_samples_to_pack: the global generator, never seeded
        return bins

    @stateless
    def pack_selected_samples(self, samples: list[dict]) -> dict[str, Any]:
        return {
            "__key__": [s["__key__"] for s in samples],
            "prompt_embeds": torch.cat([s["prompt_embeds"] for s in samples]),
            "seq_lens": torch.tensor([s["prompt_embeds"].shape[0] for s in samples]),
            "latents": torch.stack([s["latents"] for s in samples]),
            "pooled": torch.stack([s["pooled"] for s in samples]),
            "caption": [s["caption"] for s in samples],
        }

    @stateless
    def batch(self, samples: list[dict]) -> dict[str, Any]:
        if samples and "seq_lens" in samples[0]:  # packs
            return {"__key__": [key for pack in samples for key in pack["__key__"]], "packs": list(samples)}
        return {
            "__key__": [s["__key__"] for s in samples],
            "__restore_key__": (),
            "latents": torch.stack([s["latents"] for s in samples]),
            "prompt_embeds": torch.stack([s["prompt_embeds"] for s in samples]),
            "pooled": torch.stack([s["pooled"] for s in samples]),
            "caption": [s["caption"] for s in samples],
            "subflavor": [s["subflavor"] for s in samples],
        }


class SafeDiTStyleTaskEncoder(DiTStyleTaskEncoder):
    """The same, with both findings fixed: members stay bytes (``decoder = None``: read undecoded on
    5.x/6.x) and are read with ``weights_only=True``; packs keep the packer's order."""

    decoder = None

    def select_samples_to_pack(self, samples: list[dict]) -> list[list[dict]]:
        return self._bins(samples)


class SafeDecoderDiTStyleTaskEncoder(SafeDiTStyleTaskEncoder):
    """Members decoded by primus-energon's ``SafeSampleDecoder`` (tensors and text, never unpickling),
    declared as the TaskEncoder's ``decoder``: on 5.x/6.x it is put where the dataset's decoder runs."""

    decoder = SafeSampleDecoder()
