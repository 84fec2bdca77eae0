"""Correct cookers and TaskEncoders in different styles; the conformance suite must pass all of them."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from megatron.energon import Cooker, DefaultTaskEncoder, Sample, basic_sample_keys, stateless
from megatron.energon.edataclass import edataclass

from primus_energon import EncodedDiffusionTaskEncoder, batch_preencoded, decode_text, load_tensor
from primus_energon.decoding import SafeSampleDecoder
from primus_energon.errors import MissingMemberError, PayloadDecodeError

MEMBERS = {
    "latents": "latents.pth",
    "prompt_embeds": "prompt_embeds.pth",
    "pooled_prompt_embeds": "pooled_prompt_embeds.pth",
}


def _bytes_tensor(sample: dict, member: str) -> torch.Tensor:
    if member not in sample:
        raise ValueError(f"sample {sample['__key__']!r}: missing member {member!r}")
    value = sample[member]
    if not isinstance(value, bytes):
        raise TypeError(f"sample {sample['__key__']!r}: member {member!r} is a {type(value).__name__}")
    try:
        tensor = torch.load(io.BytesIO(value), map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(
            f"sample {sample['__key__']!r}: member {member!r} is not a tensor file: {error}"
        ) from None
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"sample {sample['__key__']!r}: member {member!r} is not a tensor")
    return tensor


@stateless
def cook_dict_output(sample: dict) -> dict[str, Any]:
    """Dict output, bytes input, its own strict loading."""
    caption = sample.get("caption.txt", b"")
    if not isinstance(caption, bytes):
        raise TypeError(f"sample {sample['__key__']!r}: caption is a {type(caption).__name__}")
    try:
        text = caption.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"sample {sample['__key__']!r}: caption is not UTF-8") from error
    return {
        **basic_sample_keys(sample),
        **{f: _bytes_tensor(sample, m) for f, m in MEMBERS.items()},
        "caption": text,
    }


@edataclass
class Latents(Sample):
    latents: torch.Tensor
    prompt_embeds: torch.Tensor
    pooled_prompt_embeds: torch.Tensor
    caption: str = ""


@stateless
def _cook_dataclass(sample: dict) -> Latents:
    tensors = {
        f: load_tensor(sample.get(m), sample, m) if m in sample else _missing(sample, m)
        for f, m in MEMBERS.items()
    }
    caption = sample.get("caption.txt")
    return Latents(
        **basic_sample_keys(sample),
        **tensors,
        caption="" if caption is None else decode_text(caption, sample, "caption.txt"),
    )


def _missing(sample: dict, member: str) -> Any:
    raise MissingMemberError(f"missing member {member!r}", sample, member=member)


#: A Cooker object (dataclass output) with has_subflavors.
DATACLASS_COOKER = Cooker(_cook_dataclass, has_subflavors={"encoding": "preencoded"})


@stateless
def cook_decoded_input(sample: dict) -> dict[str, Any]:
    """Expects members already decoded (tensors, str) by a safe decoder; run with input_form='decoded'."""
    out = dict(basic_sample_keys(sample))
    for field, member in MEMBERS.items():
        value = sample.get(member)
        if not isinstance(value, torch.Tensor):
            raise PayloadDecodeError(
                f"member {member!r} is a {type(value).__name__}, expected a decoded tensor",
                sample,
                member=member,
            )
        out[field] = value
    caption = sample.get("caption.txt", "")
    if not isinstance(caption, str):
        raise PayloadDecodeError("caption.txt is not decoded text", sample, member="caption.txt")
    out["caption"] = caption
    return out


@edataclass
class Augmented(Sample):
    latents: torch.Tensor
    prompt_embeds: torch.Tensor
    pooled_prompt_embeds: torch.Tensor
    caption: str
    noise: torch.Tensor


class BoundMethodTaskEncoder(DefaultTaskEncoder):
    """A bound-method cooker registered in __init__, and random augmentation that resumes exactly
    (@stateless(restore_seeds=True) seeds the RNG from the worker seed and sample index)."""

    decoder = None

    def __init__(self) -> None:
        super().__init__()
        self.cookers = [Cooker(self.cook, has_subflavors={"encoding": "preencoded"})]

    @stateless(restore_seeds=True)
    def cook(self, sample: dict) -> Latents:
        return _cook_dataclass(sample)

    @stateless(restore_seeds=True)
    def encode_sample(self, sample: Latents) -> Augmented:
        return Augmented.derive_from(
            sample,
            latents=sample.latents,
            prompt_embeds=sample.prompt_embeds,
            pooled_prompt_embeds=sample.pooled_prompt_embeds,
            caption=sample.caption,
            noise=torch.rand(4),
        )

    @stateless
    def batch(self, samples: list[Augmented]) -> dict[str, Any]:
        out = batch_preencoded(samples)
        out["noise"] = torch.stack([s.noise for s in samples])
        return out


class SafeDecoderTaskEncoder(DefaultTaskEncoder):
    """Decoded-input cooker behind primus_energon's SafeSampleDecoder; Energon's default batching."""

    decoder = SafeSampleDecoder()
    cookers = [Cooker(cook_decoded_input, has_subflavors={"encoding": "preencoded"})]

    @stateless
    def batch(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        return batch_preencoded([_as_sample(s) for s in samples])


def _as_sample(sample: dict[str, Any]) -> Latents:
    return Latents(
        **{k: sample[k] for k in ("__key__", "__restore_key__", "__subflavors__", "__sources__")},
        latents=sample["latents"],
        prompt_embeds=sample["prompt_embeds"],
        pooled_prompt_embeds=sample["pooled_prompt_embeds"],
        caption=sample["caption"],
    )


def _plain_tensor(value: Any) -> torch.Tensor:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected tensor bytes, got {type(value).__name__}")
    tensor = torch.load(io.BytesIO(bytes(value)), map_location="cpu", weights_only=True)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(tensor).__name__}")
    return tensor


@stateless
def cook_plain_errors(sample: dict) -> dict[str, Any]:
    """Ordinary third-party style: plain KeyError/TypeError/UnicodeDecodeError that do not repeat the
    sample key (Energon's handler logs key and shard for every exception)."""
    caption = sample.get("caption.txt", b"")
    return {
        **basic_sample_keys(sample),
        **{field: _plain_tensor(sample[member]) for field, member in MEMBERS.items()},
        "caption": bytes(caption).decode("utf-8"),
    }


class PlainStackTaskEncoder(DefaultTaskEncoder):
    """The common baseline style: a bare torch.stack into a dict without __key__ or __restore_key__."""

    decoder = None
    cookers = [Cooker(cook_plain_errors, has_subflavors={"encoding": "preencoded"})]

    def batch(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            **{field: torch.stack([s[field] for s in samples]) for field in MEMBERS},
            "caption": [s["caption"] for s in samples],
        }


@stateless
def cook_tensor_images(sample: dict) -> dict[str, Any]:
    """Expects images already decoded to float CHW tensors (webdataset's "torchrgb"): refuses anything else,
    so it passes only when the suite feeds it through the TaskEncoder's own decoder."""
    image = next((sample[m] for m in ("png", "jpg", "jpeg", "webp") if m in sample), None)
    if not isinstance(image, torch.Tensor) or image.ndim != 3 or image.shape[0] != 3:
        raise TypeError(f"expected a decoded CHW image tensor, got {type(image).__name__}")
    text = sample["txt"]
    if not isinstance(text, str):
        raise TypeError(f"expected decoded text, got {type(text).__name__}")
    return {**basic_sample_keys(sample), "images": image, "txt": text}


class TorchRgbImagesTaskEncoder(DefaultTaskEncoder):
    """Its own (safe) decoder turns images into tensors, not PIL images; batch() stacks them."""

    decoder = SafeSampleDecoder(image_decode="torchrgb")
    cookers = [Cooker(cook_tensor_images, has_subflavors={"encoding": "raw"})]

    @stateless
    def batch(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "__key__": [s["__key__"] for s in samples],
            "images": torch.stack([s["images"] for s in samples]),
            "txt": [s["txt"] for s in samples],
        }


@stateless
def cook_renamed_fields(sample: dict) -> dict[str, Any]:
    """Its own field names: the suite finds each member by value."""
    cooked = cook_plain_errors(sample)
    return {
        **basic_sample_keys(sample),
        "z": cooked["latents"],
        "text_states": cooked["prompt_embeds"],
        "text_pooled": cooked["pooled_prompt_embeds"],
        "prompt": cooked["caption"],
    }


class FiltersNonFiniteTaskEncoder(EncodedDiffusionTaskEncoder):
    """Drops samples whose tensors hold NaN or Inf with SkipSample in encode_sample, as NeMo and DFM do:
    filtering, counted by the suite, not a failure."""

    @stateless
    def encode_sample(self, sample: Any) -> Any:
        from megatron.energon import SkipSample

        for tensor in (sample.latents, sample.prompt_embeds, sample.pooled_prompt_embeds):
            if not torch.isfinite(tensor).all():
                raise SkipSample()
        return sample


_EXAMPLES = Path(__file__).parents[2] / "synthetic" / "examples"

#: name -> (kind, spec, options for check_cooker/check_task_encoder)
CORRECT_TARGETS: dict[str, tuple[str, str, dict]] = {
    # raw-image pipelines in their communities' styles (tests/conformance_zoo/raw_styles.py)
    **{
        f"raw style: {name}": (
            "task_encoder",
            f"tests.conformance_zoo.raw_styles:{name}",
            {"transforms": declarations} if declarations else {},
        )
        for name, declarations in __import__(
            "tests.conformance_zoo.raw_styles", fromlist=["CORRECT"]
        ).CORRECT.items()
    },
    "widens bfloat16 and float16 data to float32 (every value kept)": (
        "cooker",
        "tests.conformance_zoo.broken:cook_casts_to_float32",
        {"encoding": "preencoded"},
    ),
    "a T5 context padded to a fixed length with a mask (F.pad, as Megatron-Bridge's WAN pads)": (
        "task_encoder",
        "tests.conformance_zoo.formats:DfmContextPaddedTaskEncoder",
        {"schema": str(_EXAMPLES / "dfm_flux.yaml")},
    ),
    "NeMo's float16 embedding widened to float32 (every value kept)": (
        "cooker",
        "tests.conformance_zoo.formats:cook_nemo_as_float32",
        {"schema": str(_EXAMPLES / "nemo.yaml")},
    ),
    "CFG caption dropout, declared": (
        "task_encoder",
        "tests.conformance_zoo.transforms:CfgDropoutTaskEncoder",
        {"transforms": ['caption: dropout rate=0.1 to=""']},
    ),
    "a seeded flip of the latents, declared": (
        "task_encoder",
        "tests.conformance_zoo.transforms:FlipTaskEncoder",
        {"transforms": ["latents: flip axis=-1 rate=0.5"]},
    ),
    "pass-through cooker trusting weights_only=True": (
        "cooker",
        "tests.conformance_zoo.styles:cook_trusting_weights_only",
        {"encoding": "preencoded"},
    ),
    "cooker that loads safely and passes a non-tensor on (torch.stack fails on it)": (
        "cooker",
        "tests.conformance_zoo.broken:cook_passes_non_tensors_through",
        {"encoding": "preencoded"},
    ),
    "packer that leaves captions out of its packs": (
        "task_encoder",
        "tests.conformance_zoo.styles:EmbeddingsOnlyPackingTaskEncoder",
        {},
    ),
    "THD packed TaskEncoder (concatenated sequence, cu_seqlens)": (
        "task_encoder",
        "tests.conformance_zoo.styles:ThdPackingTaskEncoder",
        {},
    ),
    "packs with lists of per-sample metadata dicts": (
        "task_encoder",
        "tests.conformance_zoo.styles:MetadataListPackingTaskEncoder",
        {},
    ),
    "batch of lists of per-sample dicts": (
        "task_encoder",
        "tests.conformance_zoo.styles:PerSampleDictsTaskEncoder",
        {},
    ),
    "dict-output cooker": (
        "cooker",
        "tests.conformance_zoo.correct:cook_dict_output",
        {"encoding": "preencoded"},
    ),
    "dataclass Cooker": ("cooker", "tests.conformance_zoo.correct:DATACLASS_COOKER", {}),
    "decoded-input cooker": (
        "cooker",
        "tests.conformance_zoo.correct:cook_decoded_input",
        {"encoding": "preencoded", "input_form": "decoded"},
    ),
    "bound-method TaskEncoder": ("task_encoder", "tests.conformance_zoo.correct:BoundMethodTaskEncoder", {}),
    "safe-decoder TaskEncoder": ("task_encoder", "tests.conformance_zoo.correct:SafeDecoderTaskEncoder", {}),
    "plain-errors cooker": (
        "cooker",
        "tests.conformance_zoo.correct:cook_plain_errors",
        {"encoding": "preencoded"},
    ),
    "own-decoder (torchrgb images) TaskEncoder": (
        "task_encoder",
        "tests.conformance_zoo.correct:TorchRgbImagesTaskEncoder",
        {},
    ),
    "DFM FLUX layout (pickled embeddings, json caption)": (
        "cooker",
        "tests.conformance_zoo.formats:cook_dfm_flux",
        {"schema": str(_EXAMPLES / "dfm_flux.yaml")},
    ),
    "NeMo layout (leading-dot members, pickled numpy)": (
        "cooker",
        "tests.conformance_zoo.formats:cook_nemo",
        {"schema": str(_EXAMPLES / "nemo.yaml")},
    ),
    "Primus MLPerf numpy layout (raw bfloat16 bytes)": (
        "cooker",
        "tests.conformance_zoo.formats:cook_mlperf_numpy",
        {"schema": str(_EXAMPLES / "mlperf_numpy.yaml")},
    ),
    "NeMo raw layout (png control image cooked into hint)": (
        "cooker",
        "tests.conformance_zoo.formats:cook_nemo_raw_images",
        {"schema": str(_EXAMPLES / "nemo_raw.yaml")},
    ),
    "DFM-style TaskEncoder (members passed on, decoded in encode_sample)": (
        "task_encoder",
        "tests.conformance_zoo.formats:DfmStyleTaskEncoder",
        {"schema": str(_EXAMPLES / "dfm_flux.yaml")},
    ),
    "plain wrapper class": ("wrapper", "tests.conformance_zoo.wrappers:PlainWrapper", {}),
    "NaN/Inf filter with SkipSample": (
        "task_encoder",
        "tests.conformance_zoo.correct:FiltersNonFiniteTaskEncoder",
        {},
    ),
    "first-fit decreasing packer": (
        "task_encoder",
        "tests.conformance_zoo.packing:FirstFitPackingTaskEncoder",
        {},
    ),
    "packer whose batch() pads packs with a mask": (
        "task_encoder",
        "tests.conformance_zoo.packing:PadsPacksTaskEncoder",
        {},
    ),
    "two formats, every field from every sample": (
        "task_encoder",
        "tests.conformance_zoo.formats:EverySampleTaskEncoder",
        {},
    ),
    "two formats, grouped into batches by format": (
        "task_encoder",
        "tests.conformance_zoo.formats:GroupsByFormatTaskEncoder",
        {},
    ),
    "renamed output fields": (
        "cooker",
        "tests.conformance_zoo.correct:cook_renamed_fields",
        {"encoding": "preencoded"},
    ),
    "bare-stack dict-batch TaskEncoder": (
        "task_encoder",
        "tests.conformance_zoo.correct:PlainStackTaskEncoder",
        {},
    ),
    "two formats, its own decoder and THD packing together": (
        "task_encoder",
        "tests.conformance_zoo.realistic:PackedTwoFormatTaskEncoder",
        {},
    ),
    "encode_batch that sorts whole rows by caption length": (
        "task_encoder",
        "tests.conformance_zoo.stages_broken:SortsWholeRowsInEncodeBatchTaskEncoder",
        {},
    ),
    "postencode_sample that clones its tensors": (
        "task_encoder",
        "tests.conformance_zoo.stages_broken:ClonesInPostencodeTaskEncoder",
        {},
    ),
}

#: The correct targets of the size real projects write (several formats, packing, a decoder of their own),
#: by CORRECT_TARGETS name, with what makes them so: the speed benchmark holds each of them to the limits.
REAL_SIZED: dict[str, str] = {
    "two formats, its own decoder and THD packing together": "two formats, own decoder, packing",
    "two formats, every field from every sample": "two formats",
    "two formats, grouped into batches by format": "two formats, grouped batches",
    "first-fit decreasing packer": "packing",
    "THD packed TaskEncoder (concatenated sequence, cu_seqlens)": "packing (THD)",
    "own-decoder (torchrgb images) TaskEncoder": "own decoder",
    "DFM-style TaskEncoder (members passed on, decoded in encode_sample)": "own decoding, custom schema",
}
assert set(REAL_SIZED) <= set(CORRECT_TARGETS)
