"""Raw-image TaskEncoders (an image and its caption in, model-ready tensors out) as the communities that train
diffusion models write them, correct ones and broken twins: each broken one is a copy of a correct one with one
realistic bug, named in its docstring. Written only against public APIs (Energon, torch, numpy, Pillow).

torchvision and the Hugging Face tokenizers are not installed here, so the small parts of them these styles use
are re-implemented below in the style of those libraries: ``Resize`` (shorter side), ``CenterCrop``,
``RandomHorizontalFlip``, ``RandomResizedCrop.get_params``, ``ToTensor``, ``Normalize``, and deterministic stand-in
tokenizers with the HF calling conventions (``max_length``, ``padding``, ``truncation``, ``input_ids``,
``attention_mask``; CLIP: BOS/EOS with pad = EOS; T5: EOS only, pad 0).

The data: the built-in ``raw`` format, members ``png`` (an RGB PNG) and ``txt`` (a UTF-8 caption).

The declarations each target is checked with, and for the broken ones the bug and the correct twin, are in
:data:`CORRECT` and :data:`BROKEN` at the bottom.
"""

from __future__ import annotations

import io
import math
import random
import re
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from megatron.energon import (
    Batch,
    Cooker,
    DefaultTaskEncoder,
    WorkerConfig,
    basic_sample_keys,
    edataclass,
    stateless,
)
from PIL import Image

# =================================================================================================================
# torchvision.transforms, the few pieces used here (PIL in, PIL or tensor out, as torchvision does)
# =================================================================================================================


class Compose:
    def __init__(self, transforms: Sequence[Any]):
        self.transforms = list(transforms)

    def __call__(self, img: Any) -> Any:
        for t in self.transforms:
            img = t(img)
        return img


class Resize:
    """``transforms.Resize(size)``: an int resizes the shorter side to ``size`` (the longer one to
    ``int(size * long / short)``); a (h, w) pair resizes to exactly that."""

    def __init__(self, size: int | tuple[int, int], interpolation: int = Image.BILINEAR):
        self.size = size
        self.interpolation = interpolation

    def __call__(self, img: Image.Image) -> Image.Image:
        w, h = img.size
        if isinstance(self.size, int):
            short, long = (w, h) if w <= h else (h, w)
            if short == self.size:
                return img
            new_short, new_long = self.size, int(self.size * long / short)
            new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
        else:
            new_h, new_w = self.size
        return img.resize((new_w, new_h), self.interpolation)


class CenterCrop:
    def __init__(self, size: int | tuple[int, int]):
        self.size = (size, size) if isinstance(size, int) else tuple(size)

    def __call__(self, img: Image.Image) -> Image.Image:
        crop_h, crop_w = self.size
        w, h = img.size
        top = int(round((h - crop_h) / 2.0))
        left = int(round((w - crop_w) / 2.0))
        return img.crop((left, top, left + crop_w, top + crop_h))


class RandomHorizontalFlip:
    """Draws from torch's global generator, as torchvision does (seeded per sample by Energon when the calling
    method is ``@stateless(restore_seeds=True)``)."""

    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, img: Image.Image) -> Image.Image:
        if torch.rand(1) < self.p:
            return img.transpose(Image.FLIP_LEFT_RIGHT)
        return img


class ToTensor:
    """PIL (H, W, C) uint8 -> float CHW in [0, 1]."""

    def __call__(self, pic: Image.Image) -> torch.Tensor:
        img = torch.from_numpy(np.array(pic, np.uint8, copy=True))
        img = img.view(pic.size[1], pic.size[0], len(pic.getbands()))
        return img.permute((2, 0, 1)).contiguous().to(torch.float32).div(255)


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean = mean
        self.std = std

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype, device=tensor.device).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype, device=tensor.device).view(-1, 1, 1)
        return tensor.sub(mean).div(std)


def random_resized_crop_params(
    img: Image.Image, scale: tuple[float, float], ratio: tuple[float, float], rng: Any
) -> tuple[int, int, int, int]:
    """``RandomResizedCrop.get_params``: (top, left, height, width) of a box of a random area share and aspect;
    ``rng`` is anything with ``uniform`` and ``randint`` (a ``random.Random``)."""
    width, height = img.size
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = rng.randint(0, height - h)
            j = rng.randint(0, width - w)
            return i, j, h, w
    # fallback to a central crop
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def load_rgb(data: bytes) -> Image.Image:
    with Image.open(io.BytesIO(bytes(data))) as img:
        return img.convert("RGB")


def sample_rng() -> random.Random:
    """A generator of this sample's own, seeded from Energon's worker seed and the sample's index."""
    config = WorkerConfig.active_worker_config
    return random.Random(f"{config.worker_seed()}/{config.active_worker_sample_index}")


# =================================================================================================================
# Stand-in tokenizers with the Hugging Face calling conventions (no real vocabulary is installed)
# =================================================================================================================


class BatchEncoding(dict):
    """A dict with attribute access, as ``transformers.BatchEncoding``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class _StandInTokenizer:
    bos_token_id: int | None = None
    eos_token_id: int = 1
    pad_token_id: int = 0
    model_max_length: int = 512

    def _tokenize(self, text: str) -> list[int]:
        raise NotImplementedError

    def _with_specials(self, ids: list[int]) -> list[int]:
        head = [] if self.bos_token_id is None else [self.bos_token_id]
        return head + ids + [self.eos_token_id]

    def _truncate(self, ids: list[int], max_length: int) -> list[int]:
        specials = (self.bos_token_id is not None) + 1
        return ids[: max(0, max_length - specials)]

    def __call__(
        self,
        text: str | list[str],
        max_length: int | None = None,
        padding: bool | str = False,
        truncation: bool = False,
        return_tensors: str | None = None,
        add_special_tokens: bool = True,
    ) -> BatchEncoding:
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        rows = []
        for t in texts:
            ids = self._tokenize(t)
            if truncation:
                ids = self._truncate(ids, max_length or self.model_max_length)
            rows.append(self._with_specials(ids) if add_special_tokens else ids)
        out = self.pad(
            {"input_ids": rows}, padding=padding, max_length=max_length, return_tensors=return_tensors
        )
        if single and return_tensors is None:
            out = BatchEncoding({k: v[0] for k, v in out.items()})
        return out

    def pad(
        self,
        encoded_inputs: dict[str, Any],
        padding: bool | str = True,
        max_length: int | None = None,
        return_tensors: str | None = None,
    ) -> BatchEncoding:
        rows = [list(map(int, r)) for r in encoded_inputs["input_ids"]]
        if padding in (True, "longest"):
            target = max((len(r) for r in rows), default=0)
        elif padding == "max_length":
            target = max_length or self.model_max_length
        else:
            target = None
        ids, masks = [], []
        for r in rows:
            n = len(r) if target is None else max(0, target - len(r))
            pad = [] if target is None else [self.pad_token_id] * n
            ids.append(r + pad)
            masks.append([1] * len(r) + [0] * len(pad))
        if return_tensors == "pt":
            return BatchEncoding(
                input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(masks, dtype=torch.long),
            )
        return BatchEncoding(input_ids=ids, attention_mask=masks)


class ClipTokenizerStandIn(_StandInTokenizer):
    """CLIP's BPE as far as the shape of its output goes: lower-cased, whitespace-collapsed text split like CLIP's
    pattern, each word cut into pieces of at most 4 bytes mapped into the BPE id range; ``<|startoftext|>`` 49406,
    ``<|endoftext|>`` 49407, which is also the pad token (openai/clip-vit-large-patch14)."""

    bos_token_id = 49406
    eos_token_id = 49407
    pad_token_id = 49407
    model_max_length = 77
    _pattern = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d|[\w]+|[^\s\w]+", re.UNICODE)

    def _tokenize(self, text: str) -> list[int]:
        text = " ".join(text.lower().split())
        ids = []
        for word in self._pattern.findall(text):
            data = word.encode("utf-8")
            for i in range(0, len(data), 4):
                piece = data[i : i + 4] + (b"</w>" if i + 4 >= len(data) else b"")
                ids.append(256 + zlib.crc32(piece) % (49406 - 256))
        return ids


class T5TokenizerStandIn(_StandInTokenizer):
    """A sentencepiece-unigram stand-in (t5-v1_1): words get a ``▁`` prefix and are cut into pieces of up to 5
    characters; characters outside the Latin blocks are ``<unk>`` (2), as T5's vocabulary has none; no BOS,
    ``</s>`` = 1, ``<pad>`` = 0."""

    bos_token_id = None
    eos_token_id = 1
    pad_token_id = 0
    unk_token_id = 2
    model_max_length = 512

    def _tokenize(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            word = "\u2581" + word
            for i in range(0, len(word), 5):
                piece = word[i : i + 5]
                if any(ord(c) > 0x24F and c != "\u2581" for c in piece):
                    ids.append(self.unk_token_id)
                else:
                    ids.append(3 + zlib.crc32(piece.encode("utf-8")) % 32000)
        return ids


class WordHashTokenizer:
    """The whitespace tokenizer of a small in-house text encoder: a hashed vocabulary of 4096 words, 0 pad,
    1 unknown (unused), no specials; pads to ``max_length`` and returns a mask."""

    vocab_size = 4096
    pad_id = 0

    def __call__(self, text: str, max_length: int = 32) -> tuple[list[int], list[int]]:
        ids = [2 + zlib.crc32(w.encode("utf-8")) % (self.vocab_size - 2) for w in text.split()][:max_length]
        mask = [1] * len(ids) + [0] * (max_length - len(ids))
        return ids + [self.pad_id] * (max_length - len(ids)), mask


CLIP_TOKENIZER = ClipTokenizerStandIn()
T5_TOKENIZER = T5TokenizerStandIn()


def _text(value: Any) -> str:
    return bytes(value).decode("utf-8") if isinstance(value, (bytes, bytearray, memoryview)) else value


# =================================================================================================================
# 1. diffusers examples/text_to_image/train_text_to_image.py
# =================================================================================================================


@stateless
def cook_diffusers(sample: dict) -> dict:
    # the "image" and "text" columns of the HF dataset
    return {**basic_sample_keys(sample), "image": load_rgb(sample["png"]), "text": _text(sample["txt"])}


class DiffusersTextToImageTaskEncoder(DefaultTaskEncoder):
    """``train_text_to_image.py`` with ``--resolution 16 --center_crop --random_flip``: Resize (bilinear, shorter
    side), CenterCrop, RandomHorizontalFlip, ToTensor, Normalize([0.5], [0.5]); the caption tokenised CLIP-style
    to 77 ids (padding="max_length", truncation), ids only. The flip is drawn under Energon's per-sample seed."""

    decoder = None
    cookers = [Cooker(cook_diffusers, has_subflavors={"encoding": "raw"})]
    resolution = 16

    def __init__(self):
        super().__init__()
        self.tokenizer = CLIP_TOKENIZER
        self.train_transforms = Compose(
            [
                Resize(self.resolution, interpolation=Image.BILINEAR),
                CenterCrop(self.resolution),
                RandomHorizontalFlip(),
                ToTensor(),
                Normalize([0.5], [0.5]),
            ]
        )

    def tokenize_captions(self, caption: str) -> torch.Tensor:
        inputs = self.tokenizer(
            caption,
            max_length=self.tokenizer.model_max_length,
            padding="max_length",
            truncation=True,
            return_tensors="pt",
        )
        return inputs.input_ids[0]

    @stateless(restore_seeds=True)
    def encode_sample(self, sample: dict) -> dict:
        return {
            **basic_sample_keys(sample),
            "pixel_values": self.train_transforms(sample["image"]),
            "input_ids": self.tokenize_captions(sample["text"]),
        }

    def batch(self, examples: list[dict]) -> dict:
        pixel_values = torch.stack([example["pixel_values"] for example in examples])
        pixel_values = pixel_values.to(memory_format=torch.contiguous_format).float()
        input_ids = torch.stack([example["input_ids"] for example in examples])
        return {"pixel_values": pixel_values, "input_ids": input_ids}


# =================================================================================================================
# 2. ImageNet normalisation (a CLIP/ViT-conditioned or classifier-guided pipeline), caption kept as text
# =================================================================================================================


@stateless
def cook_pil(sample: dict) -> dict:
    image = Image.open(io.BytesIO(sample["png"])).convert("RGB")
    return {**basic_sample_keys(sample), "image": image, "caption": sample["txt"].decode("utf-8")}


class ImageNetNormTaskEncoder(DefaultTaskEncoder):
    """The cooker decodes to a PIL image and a str; encode_sample resizes (bicubic, shorter side) and centre-crops
    to 16, converts to a float tensor and normalises with the ImageNet mean and std."""

    decoder = None
    cookers = [Cooker(cook_pil, has_subflavors={"encoding": "raw"})]
    image_size = 16

    @stateless
    def encode_sample(self, sample: dict) -> dict:
        image = CenterCrop(self.image_size)(Resize(self.image_size, Image.BICUBIC)(sample["image"]))
        x = torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1).float().div(255.0)
        mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
        return {**basic_sample_keys(sample), "image": (x - mean) / std, "caption": sample["caption"]}

    def batch(self, samples: list[dict]) -> dict:
        return {
            "__key__": [s["__key__"] for s in samples],
            "image": torch.stack([s["image"] for s in samples]),
            "caption": [s["caption"] for s in samples],
        }


# =================================================================================================================
# 3. Aspect-ratio buckets (SDXL / kohya style)
# =================================================================================================================

#: (height, width)
BUCKETS = [(16, 16), (12, 20), (20, 12), (12, 16), (16, 12)]


def closest_bucket(height: int, width: int) -> tuple[int, int]:
    aspect = math.log(height / width)
    return min(BUCKETS, key=lambda b: abs(math.log(b[0] / b[1]) - aspect))


def resize_to_bucket(image: Image.Image, bucket: tuple[int, int]) -> Image.Image:
    bh, bw = bucket
    w, h = image.size
    scale = max(bh / h, bw / w)  # cover the bucket, then crop the overhang
    rw, rh = max(bw, round(w * scale)), max(bh, round(h * scale))
    image = image.resize((rw, rh), Image.LANCZOS)
    left, top = (rw - bw) // 2, (rh - bh) // 2
    return image.crop((left, top, left + bw, top + bh))


@stateless
def cook_bucketed(sample: dict) -> dict:
    image = load_rgb(sample["png"])
    bucket = closest_bucket(image.height, image.width)
    image = resize_to_bucket(image, bucket)
    pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)  # uint8 CHW
    pixel_values = (pixels - 127.5) / 127.5
    return {
        **basic_sample_keys(sample),
        "pixel_values": pixel_values,
        "original_size": (image.height, image.width),
        "caption": _text(sample["txt"]),
    }


class AspectBucketTaskEncoder(DefaultTaskEncoder):
    """Each image goes to the bucket closest to its aspect ratio, is resized to cover it and centre-cropped,
    scaled to [-1, 1]; batches are grouped by bucket (batch_group_criterion), and batch() refuses a mixed one."""

    decoder = None
    cookers = [Cooker(cook_bucketed, has_subflavors={"encoding": "raw"})]

    def batch_group_criterion(self, sample: dict) -> tuple[Any, int | None]:
        return tuple(sample["pixel_values"].shape[-2:]), None

    @stateless
    def batch(self, samples: list[dict]) -> dict:
        shapes = {tuple(s["pixel_values"].shape) for s in samples}
        if len(shapes) > 1:
            raise ValueError(f"batch mixes aspect buckets {sorted(shapes)}: group batches by bucket")
        return {
            "pixel_values": torch.stack([s["pixel_values"] for s in samples]),
            "captions": [s["caption"] for s in samples],
            "__key__": [s["__key__"] for s in samples],
            "__restore_key__": (),
        }


# =================================================================================================================
# 4. RandomResizedCrop, box drawn from Energon's per-sample seed
# =================================================================================================================


def _random_resized_crop(image: Image.Image, size: int, rng: Any) -> Image.Image:
    i, j, h, w = random_resized_crop_params(image, scale=(0.5, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), rng=rng)
    return image.crop((j, i, j + w, i + h)).resize((size, size), Image.BILINEAR)


@stateless
def cook_random_resized_crop(sample: dict) -> dict:
    image = _random_resized_crop(load_rgb(sample["png"]), 16, sample_rng())
    return {
        **basic_sample_keys(sample),
        "pixel_values": ToTensor()(image) * 2.0 - 1.0,
        "caption": _text(sample["txt"]),
    }


class RandomResizedCropTaskEncoder(DefaultTaskEncoder):
    """RandomResizedCrop(16, scale=(0.5, 1.0), ratio=(3/4, 4/3)) with the box drawn from a generator seeded by
    Energon's worker seed and sample index; [-1, 1]; caption as text."""

    decoder = None
    cookers = [Cooker(cook_random_resized_crop, has_subflavors={"encoding": "raw"})]

    def batch(self, samples: list[dict]) -> dict:
        return {
            "__key__": [s["__key__"] for s in samples],
            "pixel_values": torch.stack([s["pixel_values"] for s in samples]),
            "caption": [s["caption"] for s in samples],
        }


# =================================================================================================================
# 5. CLIP tokenizer, the diffusers DreamBooth way: ids unpadded per sample, padded to 77 in the collate function
# =================================================================================================================

_dreambooth_transforms = Compose(
    [Resize(16, Image.BILINEAR), CenterCrop(16), ToTensor(), Normalize([0.5], [0.5])]
)


@stateless
def cook_dreambooth(sample: dict) -> dict:
    instance_image = load_rgb(sample["png"])
    prompt = _text(sample["txt"])
    return {
        **basic_sample_keys(sample),
        "instance_images": _dreambooth_transforms(instance_image),
        "instance_prompt_ids": CLIP_TOKENIZER(
            prompt, truncation=True, padding="do_not_pad", max_length=CLIP_TOKENIZER.model_max_length
        ).input_ids,
    }


class ClipTokenizerTaskEncoder(DefaultTaskEncoder):
    """DreamBooth-style: resize+centre-crop to 16, [-1, 1]; CLIP ids (BOS/EOS, truncated to 77) per sample, padded
    to max_length 77 with the pad id = EOS in batch() by ``tokenizer.pad``, which also gives the attention mask."""

    decoder = None
    cookers = [Cooker(cook_dreambooth, has_subflavors={"encoding": "raw"})]

    def __init__(self):
        super().__init__()
        self.tokenizer = CLIP_TOKENIZER

    def batch(self, examples: list[dict]) -> dict:
        input_ids = [example["instance_prompt_ids"] for example in examples]
        pixel_values = torch.stack([example["instance_images"] for example in examples])
        pixel_values = pixel_values.to(memory_format=torch.contiguous_format).float()
        padded = self.tokenizer.pad(
            {"input_ids": input_ids},
            padding="max_length",
            max_length=self.tokenizer.model_max_length,
            return_tensors="pt",
        )
        return {
            "input_ids": padded.input_ids,
            "attention_mask": padded.attention_mask,
            "pixel_values": pixel_values,
            "__restore_key__": (),
        }


# =================================================================================================================
# 6. T5 tokenizer, padded to the longest caption of the batch in batch()
# =================================================================================================================


@stateless
def cook_t5(sample: dict) -> dict:
    image = CenterCrop(16)(Resize(16, Image.BICUBIC)(load_rgb(sample["png"])))
    return {
        **basic_sample_keys(sample),
        "image": torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1),  # uint8, scaled on the GPU
        "caption": _text(sample["txt"]),
    }


class T5TokenizerTaskEncoder(DefaultTaskEncoder):
    """T5-style ids (EOS, no BOS, truncated to 64) made in encode_sample; batch() pads them with 0 to the longest
    caption of the batch and builds the attention mask from the lengths. Images uint8, 16x16."""

    decoder = None
    cookers = [Cooker(cook_t5, has_subflavors={"encoding": "raw"})]
    max_length = 64

    def __init__(self):
        super().__init__()
        self.tokenizer = T5_TOKENIZER

    @stateless
    def encode_sample(self, sample: dict) -> dict:
        ids = self.tokenizer(sample["caption"], max_length=self.max_length, truncation=True).input_ids
        return {**basic_sample_keys(sample), "image": sample["image"], "input_ids": torch.tensor(ids)}

    @stateless
    def batch(self, samples: list[dict]) -> dict:
        lengths = [len(s["input_ids"]) for s in samples]
        longest = max(lengths)
        input_ids = torch.full((len(samples), longest), self.tokenizer.pad_token_id, dtype=torch.long)
        for row, s in enumerate(samples):
            input_ids[row, : len(s["input_ids"])] = s["input_ids"]
        attention_mask = (torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]).long()
        return {
            "__key__": [s["__key__"] for s in samples],
            "__restore_key__": (),
            "images": torch.stack([s["image"] for s in samples]),
            "input_ids": input_ids,
            "attention_mask": attention_mask,
        }


# =================================================================================================================
# 7. uint8 for the GPU: decoded and cropped on the CPU, normalised in the training step
# =================================================================================================================


@stateless
def cook_uint8(sample: dict) -> dict:
    with Image.open(io.BytesIO(sample["png"])) as img:
        img = img.convert("RGB")
    w, h = img.size
    scale = 16 / min(w, h)
    img = img.resize((max(16, round(w * scale)), max(16, round(h * scale))), Image.BILINEAR)
    left, top = (img.width - 16) // 2, (img.height - 16) // 2
    img = img.crop((left, top, left + 16, top + 16))
    pixels = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).reshape(16, 16, 3).permute(2, 0, 1)
    return {
        **basic_sample_keys(sample),
        "pixels": pixels.contiguous(),
        "prompt": sample["txt"].decode("utf-8"),
    }


class Uint8ForGpuTaskEncoder(DefaultTaskEncoder):
    """uint8 CHW 16x16 (resized and cropped by PIL on uint8), not normalised: the training step does
    ``pixels.float() / 127.5 - 1`` on the GPU; the prompt stays text (encoded on the GPU too)."""

    decoder = None
    cookers = [Cooker(cook_uint8, has_subflavors={"encoding": "raw"})]

    @stateless
    def batch(self, samples: list[dict]) -> dict:
        return {
            "pixels": torch.stack([s["pixels"] for s in samples]),
            "prompt": [s["prompt"] for s in samples],
            "__restore_key__": (),
        }


# =================================================================================================================
# 8. Full-size image, [0, 1], a seeded horizontal flip (declared)
# =================================================================================================================


@stateless
def cook_flip(sample: dict) -> dict:
    arr = np.asarray(load_rgb(sample["png"]))  # H, W, C
    if sample_rng().random() < 0.5:
        arr = arr[:, ::-1]  # horizontal
    image = torch.from_numpy(arr.copy()).permute(2, 0, 1).float() / 255.0
    return {**basic_sample_keys(sample), "image": image, "caption": _text(sample["txt"])}


class DeclaredFlipTaskEncoder(DefaultTaskEncoder):
    """No resize: the whole image as float CHW in [0, 1], flipped horizontally for half of the samples (drawn
    from Energon's per-sample seed; declared ``image: flip axis=-1 rate=0.5``); caption as text."""

    decoder = None
    cookers = [Cooker(cook_flip, has_subflavors={"encoding": "raw"})]

    def batch(self, samples: list[dict]) -> dict:
        return {
            "image": torch.stack([s["image"] for s in samples]),
            "caption": [s["caption"] for s in samples],
        }


# =================================================================================================================
# 9. Resize with torch.nn.functional.interpolate, an in-house hashed-word tokenizer
# =================================================================================================================


@stateless
def cook_torch_resize(sample: dict) -> dict:
    hwc = torch.from_numpy(np.asarray(load_rgb(sample["png"])).copy())
    x = hwc.permute(2, 0, 1).float() / 255.0
    x = F.interpolate(x[None], size=(16, 21), mode="bilinear", antialias=True, align_corners=False)[0]
    return {**basic_sample_keys(sample), "pixel_values": x * 2.0 - 1.0, "caption": _text(sample["txt"])}


class TorchResizeTaskEncoder(DefaultTaskEncoder):
    """Decoded to a float tensor and resized to 16x21 with ``F.interpolate`` (bilinear, antialias), [-1, 1];
    the caption tokenised by a hashed-word tokenizer, padded to 32 with a mask."""

    decoder = None
    cookers = [Cooker(cook_torch_resize, has_subflavors={"encoding": "raw"})]
    max_tokens = 32

    def __init__(self):
        super().__init__()
        self.tokenizer = WordHashTokenizer()

    @stateless
    def encode_sample(self, sample: dict) -> dict:
        ids, mask = self.tokenizer(sample["caption"], max_length=self.max_tokens)
        return {
            **basic_sample_keys(sample),
            "pixel_values": sample["pixel_values"],
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "attention_mask": torch.tensor(mask, dtype=torch.bool),
        }

    def batch(self, samples: list[dict]) -> dict:
        return {
            key: torch.stack([s[key] for s in samples])
            for key in ("pixel_values", "input_ids", "attention_mask")
        }


# =================================================================================================================
# 10. SD3-style: two tokenizers (CLIP padded to 77, T5 padded to max_length with a mask), an Energon Batch
#     dataclass
# =================================================================================================================


@edataclass
class TextToImageBatch(Batch):
    pixel_values: torch.Tensor
    clip_input_ids: torch.Tensor
    t5_input_ids: torch.Tensor
    t5_attention_mask: torch.Tensor


@stateless
def cook_sd3(sample: dict) -> dict:
    # decoded here, not by Energon's SampleDecoder: that one unpickles .pth/.pickle members of a shard
    image = CenterCrop(16)(Resize(16, Image.BILINEAR)(load_rgb(sample["png"])))
    return {**basic_sample_keys(sample), "image": image, "prompt": _text(sample["txt"])}


class Sd3TwoTokenizersTaskEncoder(DefaultTaskEncoder):
    """SD3 / PixArt-style conditioning: CLIP ids padded to 77 (no mask, the pooled output is used) and T5 ids
    padded to max_length 64 with a mask; resize+centre-crop to 16, [-1, 1]; batches are an Energon ``Batch``
    dataclass."""

    decoder = None
    cookers = [Cooker(cook_sd3, has_subflavors={"encoding": "raw"})]
    t5_max_length = 64

    def __init__(self):
        super().__init__()
        self.clip = CLIP_TOKENIZER
        self.t5 = T5_TOKENIZER
        self.transforms = Compose([ToTensor(), Normalize([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])])

    @stateless
    def encode_sample(self, sample: dict) -> dict:
        clip = self.clip(
            sample["prompt"], max_length=77, padding="max_length", truncation=True, return_tensors="pt"
        )
        t5 = self.t5(
            sample["prompt"],
            max_length=self.t5_max_length,
            padding="max_length",
            truncation=True,
            return_tensors="pt",
        )
        return {
            **basic_sample_keys(sample),
            "pixel_values": self.transforms(sample["image"]),
            "clip_input_ids": clip.input_ids[0],
            "t5_input_ids": t5.input_ids[0],
            "t5_attention_mask": t5.attention_mask[0],
        }

    @stateless
    def batch(self, samples: list[dict]) -> TextToImageBatch:
        return TextToImageBatch(
            __key__=[s["__key__"] for s in samples],
            __restore_key__=(),
            pixel_values=torch.stack([s["pixel_values"] for s in samples]),
            clip_input_ids=torch.stack([s["clip_input_ids"] for s in samples]),
            t5_input_ids=torch.stack([s["t5_input_ids"] for s in samples]),
            t5_attention_mask=torch.stack([s["t5_attention_mask"] for s in samples]),
        )


# =================================================================================================================
# Broken twins
# =================================================================================================================


class NormalisedTwiceTaskEncoder(ClipTokenizerTaskEncoder):
    """Twin of ClipTokenizerTaskEncoder. Bug: Normalize([0.5], [0.5]) applied twice: the cooker's transforms
    already normalise, and an encode_sample copied from the diffusers script normalises again ([-3, 1])."""

    @stateless
    def encode_sample(self, sample: dict) -> dict:
        return {**sample, "instance_images": Normalize([0.5], [0.5])(sample["instance_images"])}


@stateless
def cook_bucketed_uint8_wrap(sample: dict) -> dict:
    image = load_rgb(sample["png"])
    bucket = closest_bucket(image.height, image.width)
    image = resize_to_bucket(image, bucket)
    pixels = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)  # uint8 CHW
    pixel_values = (pixels - 128) / 128
    return {
        **basic_sample_keys(sample),
        "pixel_values": pixel_values,
        "original_size": (image.height, image.width),
        "caption": _text(sample["txt"]),
    }


class Uint8WrapTaskEncoder(AspectBucketTaskEncoder):
    """Twin of AspectBucketTaskEncoder. Bug: ``(pixels - 128) / 128`` on the uint8 tensor: ``pixels - 128`` is
    uint8 arithmetic and wraps around (dark pixels become bright) before the division makes it float."""

    cookers = [Cooker(cook_bucketed_uint8_wrap, has_subflavors={"encoding": "raw"})]


@stateless
def cook_resize_over_channels(sample: dict) -> dict:
    hwc = torch.from_numpy(np.asarray(load_rgb(sample["png"])).copy())
    x = hwc.float() / 255.0
    x = F.interpolate(x[None], size=(16, 21), mode="bilinear", antialias=True, align_corners=False)[0]
    return {**basic_sample_keys(sample), "pixel_values": x * 2.0 - 1.0, "caption": _text(sample["txt"])}


class ResizeOverChannelsTaskEncoder(TorchResizeTaskEncoder):
    """Twin of TorchResizeTaskEncoder. Bug: the HWC tensor is interpolated as if it were CHW (the permute
    forgotten): the rows become channels, and the width and the colour axis are resized to 16 and 21."""

    cookers = [Cooker(cook_resize_over_channels, has_subflavors={"encoding": "raw"})]


@stateless
def cook_uint8_grey(sample: dict) -> dict:
    with Image.open(io.BytesIO(sample["png"])) as img:
        img = img.convert("L")
    w, h = img.size
    scale = 16 / min(w, h)
    img = img.resize((max(16, round(w * scale)), max(16, round(h * scale))), Image.BILINEAR)
    left, top = (img.width - 16) // 2, (img.height - 16) // 2
    img = img.crop((left, top, left + 16, top + 16))
    grey = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).reshape(16, 16)
    pixels = grey[None].expand(3, 16, 16)  # the model wants 3 channels
    return {
        **basic_sample_keys(sample),
        "pixels": pixels.contiguous(),
        "prompt": sample["txt"].decode("utf-8"),
    }


class GreyscaleTaskEncoder(Uint8ForGpuTaskEncoder):
    """Twin of Uint8ForGpuTaskEncoder. Bug: colour lost: decoded with ``.convert("L")`` (copied from a mask
    loader) and the grey channel repeated three times to fit the model's input."""

    cookers = [Cooker(cook_uint8_grey, has_subflavors={"encoding": "raw"})]


class PreviousCaptionTaskEncoder(T5TokenizerTaskEncoder):
    """Twin of T5TokenizerTaskEncoder. Bug: the prompt kept on ``self`` for a preview callback is updated after
    it is tokenised, so each sample gets the previous sample's caption (off by one; the first gets "")."""

    last_prompt = ""

    @stateless
    def encode_sample(self, sample: dict) -> dict:
        ids = self.tokenizer(self.last_prompt, max_length=self.max_length, truncation=True).input_ids
        self.last_prompt = sample["caption"]
        return {**basic_sample_keys(sample), "image": sample["image"], "input_ids": torch.tensor(ids)}


@stateless
def cook_dreambooth_one_token(sample: dict) -> dict:
    instance_image = load_rgb(sample["png"])
    prompt = _text(sample["txt"])
    return {
        **basic_sample_keys(sample),
        "instance_images": _dreambooth_transforms(instance_image),
        "instance_prompt_ids": CLIP_TOKENIZER(
            prompt, truncation=True, padding="do_not_pad", max_length=CLIP_TOKENIZER.model_max_length
        ).input_ids[:1],  # "the first row": but a str gives flat ids, so this keeps the BOS only
    }


class OneTokenTaskEncoder(ClipTokenizerTaskEncoder):
    """Twin of ClipTokenizerTaskEncoder. Bug: ``input_ids[:1]`` meant to take the first row of a batch, but a
    single str gives flat ids: every caption is cut to one token (BOS), then padded to 77."""

    cookers = [Cooker(cook_dreambooth_one_token, has_subflavors={"encoding": "raw"})]


class MaskOfOnesTaskEncoder(ClipTokenizerTaskEncoder):
    """Twin of ClipTokenizerTaskEncoder. Bug: the attention mask is all ones although the ids are padded to 77
    (written for a text encoder that "ignores the mask anyway")."""

    def batch(self, examples: list[dict]) -> dict:
        input_ids = [example["instance_prompt_ids"] for example in examples]
        pixel_values = torch.stack([example["instance_images"] for example in examples])
        pixel_values = pixel_values.to(memory_format=torch.contiguous_format).float()
        padded = self.tokenizer.pad(
            {"input_ids": input_ids},
            padding="max_length",
            max_length=self.tokenizer.model_max_length,
            return_tensors="pt",
        )
        return {
            "input_ids": padded.input_ids,
            "attention_mask": torch.ones_like(padded.input_ids),
            "pixel_values": pixel_values,
            "__restore_key__": (),
        }


@stateless
def cook_random_resized_crop_global(sample: dict) -> dict:
    image = _random_resized_crop(load_rgb(sample["png"]), 16, random)
    return {
        **basic_sample_keys(sample),
        "pixel_values": ToTensor()(image) * 2.0 - 1.0,
        "caption": _text(sample["txt"]),
    }


class GlobalRandomCropTaskEncoder(RandomResizedCropTaskEncoder):
    """Twin of RandomResizedCropTaskEncoder. Bug: the crop box is drawn from the global ``random`` module,
    never seeded from Energon's seed: not reproducible, not restorable on resume."""

    cookers = [Cooker(cook_random_resized_crop_global, has_subflavors={"encoding": "raw"})]


class SwappedMaskOrderTaskEncoder(T5TokenizerTaskEncoder):
    """Twin of T5TokenizerTaskEncoder (field report). Bug: batch() takes the lengths for the masks sorted longest
    first (copied from a packing collate), while the ids stay in sample order: rows get other rows' masks."""

    @stateless
    def batch(self, samples: list[dict]) -> dict:
        lengths = sorted((len(s["input_ids"]) for s in samples), reverse=True)
        longest = max(lengths)
        input_ids = torch.full((len(samples), longest), self.tokenizer.pad_token_id, dtype=torch.long)
        for row, s in enumerate(samples):
            input_ids[row, : len(s["input_ids"])] = s["input_ids"]
        attention_mask = (torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]).long()
        return {
            "__key__": [s["__key__"] for s in samples],
            "__restore_key__": (),
            "images": torch.stack([s["image"] for s in samples]),
            "input_ids": input_ids,
            "attention_mask": attention_mask,
        }


class ReusedTokenBufferTaskEncoder(TorchResizeTaskEncoder):
    """Twin of TorchResizeTaskEncoder (field report). Bug: the ids are written into one buffer held on ``self``
    (to "avoid allocations") and returned without a copy: every sample's input_ids alias the same tensor, so a
    batch holds the last sample's ids in every row."""

    def __init__(self):
        super().__init__()
        self._ids = torch.zeros(self.max_tokens, dtype=torch.long)

    @stateless
    def encode_sample(self, sample: dict) -> dict:
        ids, mask = self.tokenizer(sample["caption"], max_length=self.max_tokens)
        self._ids[:] = torch.tensor(ids, dtype=torch.long)
        return {
            **basic_sample_keys(sample),
            "pixel_values": sample["pixel_values"],
            "input_ids": self._ids,
            "attention_mask": torch.tensor(mask, dtype=torch.bool),
        }


class KeyCacheTaskEncoder(ImageNetNormTaskEncoder):
    """Twin of ImageNetNormTaskEncoder (field report). Bug: encoded outputs cached on ``self`` in a dict keyed by
    ``__key__`` (to skip the resize on later epochs): two datasets of a blend with equal keys share entries, so a
    sample gets another dataset's image and caption."""

    def __init__(self):
        super().__init__()
        self._cache: dict[str, dict] = {}

    @stateless
    def encode_sample(self, sample: dict) -> dict:
        key = sample["__key__"]
        if key not in self._cache:
            self._cache[key] = super().encode_sample(sample)
        return self._cache[key]


class TransposedImageTaskEncoder(ImageNetNormTaskEncoder):
    """Twin of ImageNetNormTaskEncoder. Bug: ``permute(2, 1, 0)`` instead of ``permute(2, 0, 1)``: height and
    width swapped (the 16x16 crop keeps the shape, the picture is transposed)."""

    @stateless
    def encode_sample(self, sample: dict) -> dict:
        image = CenterCrop(self.image_size)(Resize(self.image_size, Image.BICUBIC)(sample["image"]))
        x = torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 1, 0).float().div(255.0)
        mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
        return {**basic_sample_keys(sample), "image": (x - mean) / std, "caption": sample["caption"]}


@stateless
def cook_flip_vertical(sample: dict) -> dict:
    arr = np.asarray(load_rgb(sample["png"]))  # H, W, C
    if sample_rng().random() < 0.5:
        arr = arr[::-1]  # "horizontal"
    image = torch.from_numpy(arr.copy()).permute(2, 0, 1).float() / 255.0
    return {**basic_sample_keys(sample), "image": image, "caption": _text(sample["txt"])}


class VerticalFlipTaskEncoder(DeclaredFlipTaskEncoder):
    """Twin of DeclaredFlipTaskEncoder. Bug: the HWC array is flipped on axis 0 (``arr[::-1]``), upside down,
    where the declared horizontal flip is axis 1 of HWC (the last axis of CHW)."""

    cookers = [Cooker(cook_flip_vertical, has_subflavors={"encoding": "raw"})]


class Sd3MaskOfOnesTaskEncoder(Sd3TwoTokenizersTaskEncoder):
    """Twin of Sd3TwoTokenizersTaskEncoder. Bug: each sample's T5 mask is all ones (``torch.ones_like`` of the
    ids, written for a text encoder "that ignores padding anyway") although the ids are padded to 64."""

    @stateless
    def encode_sample(self, sample: dict) -> dict:
        out = super().encode_sample(sample)
        return {**out, "t5_attention_mask": torch.ones_like(out["t5_input_ids"])}


#: name -> (declarations the target is checked with, one line each; [] for none)
CORRECT = {
    "DiffusersTextToImageTaskEncoder": ["pixel_values: flip axis=-1 rate=0.5"],
    "ImageNetNormTaskEncoder": [],
    "AspectBucketTaskEncoder": [],
    "RandomResizedCropTaskEncoder": [],
    "ClipTokenizerTaskEncoder": [],
    "T5TokenizerTaskEncoder": [],
    "Uint8ForGpuTaskEncoder": [],
    "DeclaredFlipTaskEncoder": ["image: flip axis=-1 rate=0.5"],
    "TorchResizeTaskEncoder": [],
    "Sd3TwoTokenizersTaskEncoder": [],
}

#: name -> (declarations, the bug in one line, the correct twin's name)
BROKEN = {
    "NormalisedTwiceTaskEncoder": ([], "Normalize([0.5],[0.5]) applied twice", "ClipTokenizerTaskEncoder"),
    "Uint8WrapTaskEncoder": ([], "(x - 128) / 128 on a uint8 tensor wraps around", "AspectBucketTaskEncoder"),
    "ResizeOverChannelsTaskEncoder": (
        [],
        "F.interpolate on an HWC tensor: resizes the width and the colour axis",
        "TorchResizeTaskEncoder",
    ),
    "GreyscaleTaskEncoder": (
        [],
        "colour lost: .convert('L') repeated to 3 channels",
        "Uint8ForGpuTaskEncoder",
    ),
    "PreviousCaptionTaskEncoder": (
        [],
        "the previous sample's caption tokenised (state on self, off by one)",
        "T5TokenizerTaskEncoder",
    ),
    "OneTokenTaskEncoder": (
        [],
        "every caption cut to one token (ids[:1]), padded to 77",
        "ClipTokenizerTaskEncoder",
    ),
    "MaskOfOnesTaskEncoder": (
        [],
        "attention mask all ones although the ids are padded",
        "ClipTokenizerTaskEncoder",
    ),
    "GlobalRandomCropTaskEncoder": (
        [],
        "crop box drawn from the unseeded global random module",
        "RandomResizedCropTaskEncoder",
    ),
    "SwappedMaskOrderTaskEncoder": (
        [],
        "masks built from lengths sorted longest first, ids in sample order",
        "T5TokenizerTaskEncoder",
    ),
    "ReusedTokenBufferTaskEncoder": (
        [],
        "every sample's input_ids alias one buffer on self",
        "TorchResizeTaskEncoder",
    ),
    "KeyCacheTaskEncoder": (
        [],
        "outputs cached on self by __key__ (blends share keys)",
        "ImageNetNormTaskEncoder",
    ),
    "TransposedImageTaskEncoder": (
        [],
        "permute(2, 1, 0): height and width swapped",
        "ImageNetNormTaskEncoder",
    ),
    "VerticalFlipTaskEncoder": (
        ["image: flip axis=-1 rate=0.5"],
        "declared horizontal flip done vertically (HWC axis 0)",
        "DeclaredFlipTaskEncoder",
    ),
    "Sd3MaskOfOnesTaskEncoder": (
        [],
        "each sample's T5 mask all ones although its ids are padded",
        "Sd3TwoTokenizersTaskEncoder",
    ),
}
