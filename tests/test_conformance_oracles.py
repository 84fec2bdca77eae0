"""The data judge's oracles on their own: what became of an image, a tensor or a caption in a field (its form),
and whether a mask marks the padding it sits beside. Every recognised transform has a case that is kept,
every damage a case that is called so, in several forms each; the suite's own variants of a member stay
inside the member's format."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from primus_energon.conformance.core.declarations import parse_transform
from primus_energon.conformance.data.variants import TAIL_WORDS, member_variants
from primus_energon.conformance.oracles.images import image_form
from primus_energon.conformance.oracles.members import declared_outcome, member_form, text_form
from primus_energon.conformance.oracles.tensors import tensor_form
from primus_energon.conformance.oracles.tokens import (
    batch_mask_problems,
    mask_fields,
    mask_problem,
    pad_value,
    pair_problems,
)
from primus_energon.synthetic.payloads import PayloadFactory
from primus_energon.synthetic.schema import (
    ImageSpec,
    JsonSpec,
    NpySpec,
    PickleSpec,
    TensorSpec,
    TextSpec,
    builtin_schema,
)

SCHEMA = builtin_schema("raw", image_format="png", image_size=(24, 32))
FACTORY = PayloadFactory(SCHEMA, 0)
MEAN = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
STD = torch.tensor([0.229, 0.224, 0.225])[:, None, None]


def _png(index: int = 3) -> bytes:
    return FACTORY.image("png", SCHEMA.members["png"], index)[0]


def _pil(index: int = 3) -> Image.Image:
    return Image.open(io.BytesIO(_png(index))).convert("RGB")


def _pixels(index: int = 3) -> np.ndarray:
    return np.asarray(_pil(index))


def _chw(image: Image.Image | np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)


def _cover_crop(image: Image.Image, size: int = 16, resample: int = Image.BILINEAR) -> Image.Image:
    """torchvision's Resize(size) then CenterCrop(size)."""
    w, h = image.size
    ow, oh = (size, int(size * h / w)) if w < h else (int(size * w / h), size)
    image = image.resize((ow, oh), resample)
    top, left = int(round((oh - size) / 2.0)), int(round((ow - size) / 2.0))
    return image.crop((left, top, left + size, top + size))


KEPT_IMAGES = {
    "uint8 CHW": lambda: _chw(_pil()),
    "[0, 1] HWC": lambda: torch.from_numpy(_pixels().copy()).float() / 255,
    "[-1, 1] after a resize and centre crop (diffusers)": lambda: (
        _chw(_cover_crop(_pil())).float() / 127.5 - 1
    ),
    "ImageNet mean and std (bicubic)": lambda: (
        (_chw(_cover_crop(_pil(), 16, Image.BICUBIC)).float() / 255 - MEAN) / STD
    ),
    "torch bilinear antialias keeping the aspect": lambda: (
        F.interpolate(_chw(_pil()).float()[None], size=(12, 16), mode="bilinear", antialias=True)[0] / 127.5
        - 1
    ),
    "an offset crop": lambda: _chw(_pil())[:, 3:19, 7:23].float() / 255,
    "a unit batch axis": lambda: (_chw(_pil()).float() / 255)[None],
    "a PIL image resized by Lanczos": lambda: _pil().resize((21, 16), Image.LANCZOS),
    "bfloat16 in [-1, 1]": lambda: (_chw(_pil()).float() / 127.5 - 1).to(torch.bfloat16),
}


@pytest.mark.parametrize("name", sorted(KEPT_IMAGES))
def test_an_image_pipeline_s_deliberate_transforms_are_kept(name: str) -> None:
    form = image_form(_pixels(), KEPT_IMAGES[name]())
    assert form is not None and form.verdict == "kept", (name, form)


DAMAGED_IMAGES = {
    "normalised twice": (
        lambda: ((_chw(_cover_crop(_pil())).float() / 255 - 0.5) / 0.5 - 0.5) / 0.5,
        "normalised twice",
    ),
    "ImageNet twice": (lambda: ((_chw(_pil()).float() / 255 - MEAN) / STD - MEAN) / STD, "normalised twice"),
    "divided by 255 twice": (lambda: _chw(_pil()).float() / 255 / 255, "scaled twice"),
    "uint8 arithmetic that wraps": (lambda: (_chw(_cover_crop(_pil())) - 128) / 128, "values wrap around"),
    "grey, three channels": (lambda: _chw(_pil().convert("L").convert("RGB")).float() / 255, "colour lost"),
    "grey, one channel": (
        lambda: torch.from_numpy(np.array(_pil().convert("L")))[None].float(),
        "colour lost",
    ),
    "transposed at its own size": (
        lambda: torch.from_numpy(_pixels().copy()).permute(2, 1, 0).float() / 255,
        "transposed",
    ),
    "transposed after a square crop": (
        lambda: torch.from_numpy(np.array(_cover_crop(_pil()))).permute(2, 1, 0).float() / 255,
        "transposed",
    ),
    "resized along the colour axis": (
        lambda: F.interpolate(
            torch.from_numpy(_pixels().copy()).float()[None], size=(16, 21), mode="bilinear", antialias=True
        )[0],
        "resized along the colour axis",
    ),
}


@pytest.mark.parametrize("name", sorted(DAMAGED_IMAGES))
def test_damage_to_an_image_is_named(name: str) -> None:
    make, cause = DAMAGED_IMAGES[name]
    form = image_form(_pixels(), make())
    assert form is not None and form.verdict == "corrupted" and form.cause == cause, (name, form)


def test_a_flip_is_a_change_to_declare_and_declared_it_is_the_declared_draw() -> None:
    flipped = (_chw(_cover_crop(_pil())).float() / 127.5 - 1).flip(-1)
    form = image_form(_pixels(), flipped)
    assert form.verdict == "undeclared" and form.declaration == "flip axis=-1 rate=RATE"
    hwc = torch.from_numpy(_pixels()[:, ::-1].copy())
    assert image_form(_pixels(), hwc).declaration == "flip axis=-2 rate=RATE"  # HWC: the width is axis -2
    declared = parse_transform("pixel_values: flip axis=-1 rate=0.5")
    assert image_form(_pixels(), flipped, declared=declared).verdict == "declared"
    spec = SCHEMA.members["png"]
    assert declared_outcome(declared, spec, _pixels(), flipped) == "applied"
    assert declared_outcome(declared, spec, _pixels(), flipped.flip(-1)) == "kept"
    assert declared_outcome(declared, spec, _pixels(), flipped.flip(-2)) is None  # upside down: neither


def test_what_the_suite_does_not_know_is_advice_with_the_declaration_to_write() -> None:
    custom = image_form(_pixels(), (_chw(_pil()).float() / 255 - 0.3) / 0.4)
    assert custom.verdict == "unrecognised" and custom.declaration == "normalize mean=[0.3] std=[0.4]"
    declared = parse_transform("pixel_values: normalize mean=0.3 std=0.4")
    assert (
        image_form(_pixels(), (_chw(_pil()).float() / 255 - 0.3) / 0.4, declared=declared).verdict
        == "declared"
    )
    stretched = image_form(_pixels(), _chw(_pil().resize((16, 16), Image.BILINEAR)))
    assert stretched.verdict == "unrecognised" and stretched.declaration.startswith("resize")
    assert "channels reordered" in image_form(_pixels(), _chw(_pil())[[2, 1, 0]]).how
    noise = image_form(_pixels(), torch.rand(3, 16, 16, generator=torch.Generator().manual_seed(0)))
    assert noise.verdict == "unrecognised"


def test_tensor_forms() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, 6, generator=g)
    assert tensor_form(x, x.double()).verdict == "kept"  # widened
    lossy = tensor_form(x, x.half())
    assert lossy.verdict == "undeclared" and lossy.declaration == "cast dtype=float16"
    assert tensor_form(x, x.half(), declared=parse_transform("f: cast dtype=float16")).verdict == "declared"
    assert tensor_form(x, x.flip(-1)).declaration == "flip axis=-1 rate=RATE"
    assert tensor_form(x, x[None]).verdict == "kept"  # a unit axis
    assert tensor_form(x, x.permute(1, 2, 0)).verdict == "kept"  # a layout: the shape says so
    assert tensor_form(x, x.transpose(1, 2)).cause == "transposed"  # square: the shape says nothing
    patches = x.reshape(4, 3, 2, 3, 2).permute(1, 3, 0, 2, 4).reshape(9, 16)  # a patchify
    assert tensor_form(x, patches).cause == "rearranged"
    assert tensor_form(x, F.pad(patches, (0, 0, 0, 7))).cause == "rearranged"  # ... padded to a length
    assert tensor_form(x, x * 0.18215).cause == "scaled"
    assert tensor_form(x, F.pad(x, (0, 0, 0, 0, 0, 3))).how.startswith("padded to 7 along axis 0")


@pytest.mark.parametrize(
    ("member", "observed", "cause"),
    [
        (torch.arange(226 * 4.0).reshape(226, 4), lambda m: F.pad(m, (0, 0, 0, 128 - 226)), "cut"),
        (torch.arange(512 * 4.0).reshape(1, 512, 4), lambda m: m[0, :128], "cut"),  # through a unit axis
        (torch.arange(24.0).reshape(4, 6) + 1, lambda m: torch.zeros_like(m), "filled"),
        (torch.arange(24.0).reshape(4, 6) + 1, lambda m: torch.full_like(m, float("nan")), "filled"),
        (torch.arange(24.0).reshape(4, 6) + 1, lambda m: torch.full((2, 3), 7.0), "filled"),
        (torch.arange(1.0, 25.0).bfloat16(), lambda m: m.view(torch.float16), "bytes reinterpreted"),
    ],
)
def test_tensor_damage_is_named_in_every_form(member, observed, cause) -> None:
    form = tensor_form(member, observed(member))
    assert form is not None and form.defect and form.cause == cause, form


def test_text_forms() -> None:
    assert text_form("a red fox", "a red fox").verdict == "kept"
    assert text_form("a red fox", "a photo of a red fox, 8k").verdict == "kept"  # a template
    assert text_form("a red fox", torch.tensor([1, 100, 2, 0])).cause == "tokenised"
    assert text_form("a red fox", "").declaration == 'dropout rate=RATE to=""'
    assert text_form(" a red fox ", "a red fox").verdict == "corrupted"  # stripped
    tokenised = parse_transform("input_ids: tokenize max_length=77")
    assert member_form(TextSpec(), "a red fox", torch.tensor([1, 5, 2]), tokenised).verdict == "declared"


def test_a_mask_must_mark_exactly_the_padding() -> None:
    ids = torch.tensor([1, 7, 8, 2, 0, 0, 0])
    assert mask_problem(ids, torch.tensor([1, 1, 1, 1, 0, 0, 0]), 0) is None
    assert "all 7 positions" in mask_problem(ids, torch.ones(7, dtype=torch.long), 0)
    assert mask_problem(ids, torch.tensor([1, 1, 0, 0, 0, 0, 0]), 0) is not None
    clip = torch.tensor([49406, 5, 6, 49407, 49407, 49407])  # pads with its end-of-text id
    assert mask_problem(clip, torch.tensor([1, 1, 1, 1, 0, 0]), 49407) is None
    assert mask_problem(clip, torch.tensor([1, 1, 1, 0, 0, 0]), 49407) is None
    left = torch.tensor([0, 0, 0, 1, 7, 2])
    assert mask_problem(left, torch.tensor([0, 0, 0, 1, 1, 1]), 0) is None
    assert pad_value([ids, torch.tensor([1, 9, 2, 0, 0, 0, 0])]) == 0


def test_a_batch_mask_in_another_order_names_the_row_it_describes() -> None:
    ids = torch.tensor([[1, 5, 2, 0, 0], [1, 5, 6, 7, 2]])
    good = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert batch_mask_problems(ids, good) == []
    problems = batch_mask_problems(ids, good.flip(0))
    assert [(row, source) for row, _, source in problems] == [(0, 1), (1, 0)]
    embeds = torch.zeros(2, 5, 3)
    embeds[0, :3], embeds[1, :5] = 1.0, 2.0
    assert batch_mask_problems(embeds, good) == []  # rows of zeros are the padding of embeddings
    assert batch_mask_problems(embeds, torch.ones(2, 5))


def test_masks_are_paired_with_what_they_may_describe_and_loss_masks_are_not_judged() -> None:
    output = {
        "input_ids": torch.zeros(2, 5, dtype=torch.long),
        "attention_mask": torch.ones(2, 5),
        "loss_mask": torch.ones(2, 5),
        "pos_ids": torch.zeros(2, 5, 3, dtype=torch.long),
    }
    pairs = {p.mask: p.targets for p in mask_fields(output)}
    assert set(pairs) == {"attention_mask"} and set(pairs["attention_mask"]) == {"input_ids", "pos_ids"}
    ids = torch.tensor([[1, 5, 2, 0, 0], [1, 5, 6, 7, 2]])
    rows = torch.tensor([[[1, 1, 1]] * 3 + [[0, 0, 0]] * 2, [[1, 1, 1]] * 5])
    present = {"attention_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]), "ids": ids, "rows": rows}
    (pair,) = mask_fields({"attention_mask": present["attention_mask"], "ids": ids, "rows": rows})
    assert pair_problems(present, pair) == []


def test_every_variant_of_a_member_stays_inside_its_format() -> None:
    png = _png()
    variants = dict(member_variants("png", SCHEMA.members["png"], png, [_png(4)]))
    assert set(variants) == {"swap", "edit"}
    edited = Image.open(io.BytesIO(variants["edit"]))
    assert edited.format == "PNG" and edited.size == (32, 24)
    assert np.array_equal(np.asarray(edited.convert("RGB")), 255 - _pixels())
    text = dict(member_variants("txt", TextSpec(), b"a red fox", [b"a blue cat"]))
    assert text == {"swap": b"a blue cat", "edit": b"b red fox", "tail": ("a red fox" + TAIL_WORDS).encode()}
    buffer = io.BytesIO()
    torch.save(torch.ones(2, 3, dtype=torch.bfloat16), buffer)
    (label, data), *_ = member_variants("latents.pth", TensorSpec((2, 3), "bfloat16"), buffer.getvalue(), [])
    loaded = torch.load(io.BytesIO(data), weights_only=True)
    assert (
        label == "edit"
        and loaded.dtype == torch.bfloat16
        and torch.equal(loaded, torch.full((2, 3), 2.0).bfloat16())
    )
    array = io.BytesIO()
    np.save(array, np.zeros(4, np.float16))
    (_, npy), *_ = member_variants("t5.bytes", NpySpec((4,), "float16"), array.getvalue(), [])
    assert np.load(io.BytesIO(npy)).dtype == np.float16
    pickled = pickle.dumps({"embeds": torch.zeros(3), "caption": "x"})
    (_, edited_pickle), *_ = member_variants(
        "embeds.pickle",
        PickleSpec({"embeds": TensorSpec((3,), "float32"), "caption": TextSpec()}),
        pickled,
        [],
    )
    from primus_energon.safepickle import safe_loads

    value = safe_loads(edited_pickle)
    assert torch.equal(value["embeds"], torch.ones(3)) and value["caption"] == "a"
    (_, edited_json), *_ = member_variants(
        "meta.json", JsonSpec(), json.dumps({"w": 3, "tag": "ok"}).encode(), []
    )
    assert json.loads(edited_json) == {"w": 4, "tag": "ak"}


def test_an_image_spec_of_another_size_is_still_an_image_variant() -> None:
    spec = ImageSpec((16, 16), "png")
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (10, 20, 30)).save(buffer, format="PNG")
    (_, edited), *_ = member_variants("png", spec, buffer.getvalue(), [])
    assert np.asarray(Image.open(io.BytesIO(edited)))[0, 0].tolist() == [245, 235, 225]


def test_a_declared_flip_is_read_through_a_unit_axis() -> None:
    """Latents [C, H, W] delivered as [C, 1, H, W] (a one-frame video): the declared flip is still the draw
    it is, not "no member reaches the field"."""
    declared = parse_transform("latents: flip axis=-1 rate=0.5")
    spec, x = (
        TensorSpec((4, 6, 6), "float32"),
        torch.randn(4, 6, 6, generator=torch.Generator().manual_seed(2)),
    )
    assert declared_outcome(declared, spec, x, x.flip(-1)[:, None]) == "applied"
    assert declared_outcome(declared, spec, x, x[:, None]) == "kept"
    assert declared_outcome(declared, spec, x, x.flip(-2)[:, None]) is None
