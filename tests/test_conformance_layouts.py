"""Data found by value in the layouts real pipelines use (false alarms found on real third-party data
paths): a frame member inside a stacked video, values with unit axes added (``[S, 1, D]`` packed
sequences, an image as a one-frame video), a padded needle that starts with zero rows, payloads of one
value throughout (masks of ones) that cannot be told apart; and when a TaskEncoder says how it is built
to run (``packing_buffer_size``)."""

from __future__ import annotations

import io

import numpy as np
import torch
from megatron.energon import DefaultTaskEncoder
from PIL import Image

from primus_energon.conformance.engine.target import resolve_target
from primus_energon.conformance.oracles.expectations import STACKED, expectations, locate
from primus_energon.conformance.oracles.payloads import Haystack, Payload, trace
from primus_energon.conformance.properties._packing import packing_configured
from primus_energon.synthetic import ImageSpec, TensorSpec


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _saved(tensor: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()


def test_a_frame_member_is_found_as_one_slice_of_a_stacked_video() -> None:
    frames = [(np.random.default_rng(i).random((6, 8, 3)) * 255).astype(np.uint8) for i in range(4)]
    video_uint8 = torch.stack([torch.from_numpy(f).permute(2, 0, 1) for f in frames])  # [T, C, H, W]
    video_float = video_uint8.float() / 255  # as torchvision's to_tensor gives
    spec = ImageSpec((6, 8), format="png")
    (third,) = expectations("frame_002.png", spec, _png(frames[2]), required=False)
    for video in (video_uint8, video_float, video_uint8.permute(1, 0, 2, 3)):  # [C, T, H, W] too
        assert locate(third, {"video": video, "caption": "a clip"}) == ("video", STACKED)
    assert locate(third, {"video": video_uint8[[0, 1, 3]]}) == (None, "")  # the frame dropped: not found
    (latent,) = expectations(
        "latents_1.pth", TensorSpec((2, 3)), _saved(torch.arange(6.0).reshape(2, 3)), required=False
    )
    stacked = torch.stack([torch.zeros(2, 3), torch.arange(6.0).reshape(2, 3)])
    assert locate(latent, {"views": stacked}) == ("views", STACKED)


def test_values_with_unit_axes_added_are_a_layout_not_a_loss() -> None:
    image = torch.randn(3, 4, 5)
    (place,) = Haystack({"video": image.unsqueeze(1)}).find(Payload("image", image))  # [C, 1, H, W]
    assert place.path == "video" and place.how == "index 0 of axis 1"  # a stack of one
    (place,) = Haystack({"video": image.unsqueeze(1).unsqueeze(0)}).find(Payload("image", image))
    assert place.path == "video" and place.how == "the whole tensor (unit axes left out)"
    # a packed sequence [S, 1, D] (concatenated along S, a unit axis after it)
    a, b = torch.randn(5, 4), torch.randn(7, 4)
    packed = {"context": torch.cat([a, b]).unsqueeze(1)}
    result = trace([{"__key__": "a", "context": a}, {"__key__": "b", "context": b}], packed)
    assert result.lost() == []
    assert [p.how for p in result.samples[1].places["context"]] == [
        "axis 0 [5:12] of 12 (unit axes left out)"
    ]


def test_a_padded_needle_that_starts_with_zero_rows_is_found_among_many_zeros() -> None:
    needles = []
    for i in range(3):
        rows = torch.zeros(80, 4)  # left padding: 80 zero rows first, more zero rows than the search budget
        rows[60 + i :] = torch.randn(20 - i, 4, generator=torch.Generator().manual_seed(i))
        needles.append(rows)
    haystack = Haystack({"context": torch.cat(needles)})
    for i, needle in enumerate(needles):
        places = [p for p in haystack.find(Payload("context", needle)) if p.how.startswith("axis 0")]
        assert any(p.how == f"axis 0 [{80 * i}:{80 * (i + 1)}] of 240" for p in places), (i, places)


def test_payloads_of_one_value_throughout_are_never_called_lost() -> None:
    """Masks of ones padded into a batch (5, 6 and 7 ones in rows of 7): another sample's equal mask may
    be this one's, so no sample's mask is called lost; a distinct payload missing still is."""
    masks = [torch.ones(n, dtype=torch.bfloat16) for n in (5, 6, 7)]
    padded = torch.zeros(3, 7, dtype=torch.bfloat16)
    for row, mask in enumerate(masks):
        padded[row, : len(mask)] = mask
    samples = [{"__key__": f"s{i}", "mask": m, "x": torch.randn(8)} for i, m in enumerate(masks)]
    batch = {"mask": padded, "x": torch.stack([s["x"] for s in samples[:2]] + [torch.zeros(8)])}
    lost = trace(samples, batch).lost()
    assert [(key, path) for key, path, _ in lost] == [("s2", "x")]


class _Packer(DefaultTaskEncoder):
    def select_samples_to_pack(self, samples):  # noqa: ANN001, ANN201
        return [samples]

    def pack_selected_samples(self, samples):  # noqa: ANN001, ANN201
        return samples


def test_a_task_encoder_says_whether_it_is_built_to_pack() -> None:
    target = resolve_target("primus_energon:EncodedDiffusionTaskEncoder", kind="task_encoder")
    plain = DefaultTaskEncoder()
    assert packing_configured(target, plain) is False  # no packing methods of its own
    packer = _Packer()
    assert packing_configured(target, packer) is None  # packs, and does not say with what buffer
    packer.packing_buffer_size = None  # built as training builds it without packing (DFM's default)
    assert packing_configured(target, packer) is False
    packer.packing_buffer_size = 8
    assert packing_configured(target, packer) is True
    configured = resolve_target(
        "primus_energon:EncodedDiffusionTaskEncoder", kind="task_encoder", packing_buffer_size=4
    )
    packer.packing_buffer_size = None
    assert packing_configured(configured, packer) is True  # --conformance-packing-buffer-size says so
