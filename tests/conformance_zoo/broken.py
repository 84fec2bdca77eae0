"""Deliberately broken cookers and TaskEncoders, each with the claim that must catch it.

Every entry of BROKEN_TARGETS names a realistic bug and the conformance claim that must report it: a
defect claim must fail, an advice claim must give advice. tests/test_conformance_zoo.py asserts that it does.
Running some of these executes the suite's benign malicious payload (it only creates a marker file).
"""

from __future__ import annotations

import io
import random
from typing import Any

import numpy as np
import torch
from megatron.energon import (
    Cooker,
    DefaultTaskEncoder,
    SampleDecoder,
    SkipSample,
    basic_sample_keys,
    stateless,
)

from primus_energon import (
    DiffusionSample,
    EncodedDiffusionTaskEncoder,
    batch_preencoded,
    cook_preencoded_diffusion,
    load_tensor,
)
from primus_energon.cookers import PREENCODED_TENSOR_MEMBERS

_MEMBERS = dict(PREENCODED_TENSOR_MEMBERS)


def _good(sample: dict) -> DiffusionSample:
    return cook_preencoded_diffusion(sample)


# 1. Accepted by Energon -------------------------------------------------------------------------


def cook_not_stateless(sample: dict) -> DiffusionSample:
    """Forgot @stateless: Energon fails every sample."""
    return _good(sample)


def cook_not_stateless_old_sample_api(sample: dict) -> DiffusionSample:
    """Two blockers: not @stateless, and written for an older Sample that took ``__subflavor__``; a user who
    adds @stateless meets the second only on the next run unless the report says so."""
    return DiffusionSample(**basic_sample_keys(sample), __subflavor__=None, **vars(_good(sample)))


COOKER_FOR_OTHER_ENCODING = Cooker(cook_preencoded_diffusion, has_subflavors={"encoding": "preencoded_v2"})


class FiltersShortCaptionsTaskEncoder(EncodedDiffusionTaskEncoder):
    """A quality filter in encode_sample that drops clean samples (captions under 40 characters) with
    SkipSample: the epoch is silently incomplete."""

    @stateless
    def encode_sample(self, sample: Any) -> Any:
        if len(sample.caption) < 40:
            raise SkipSample()
        return sample


# 2. Key forwarding --------------------------------------------------------------------------------


@stateless
def cook_drops_restore_key(sample: dict) -> DiffusionSample:
    good = _good(sample)
    return DiffusionSample(
        __key__=sample["__key__"],
        __restore_key__=(),
        latents=good.latents,
        prompt_embeds=good.prompt_embeds,
        pooled_prompt_embeds=good.pooled_prompt_embeds,
        caption=good.caption,
    )


@stateless
def cook_drops_sources(sample: dict) -> dict[str, Any]:
    good = _good(sample)
    return {
        "__key__": sample["__key__"],
        "__restore_key__": sample["__restore_key__"],
        "__subflavors__": sample["__subflavors__"],
        "latents": good.latents,
        "prompt_embeds": good.prompt_embeds,
        "pooled_prompt_embeds": good.pooled_prompt_embeds,
        "caption": good.caption,
    }


# 3. Fidelity --------------------------------------------------------------------------------------


def _replace(sample: dict, **changes: Any) -> DiffusionSample:
    good = _good(sample)
    fields = dict(
        latents=good.latents,
        prompt_embeds=good.prompt_embeds,
        pooled_prompt_embeds=good.pooled_prompt_embeds,
        caption=good.caption,
    )
    fields.update(changes)
    return DiffusionSample(**basic_sample_keys(sample), **fields)


@stateless
def cook_casts_to_float32(sample: dict) -> DiffusionSample:
    """Widens bfloat16 and float16 data to float32: every value kept (a correct target since widening casts
    are recognised; see CORRECT_TARGETS)."""
    good = _good(sample)
    return _replace(sample, latents=good.latents.float(), prompt_embeds=good.prompt_embeds.float())


@stateless
def cook_casts_to_bfloat16(sample: dict) -> DiffusionSample:
    """Narrows every tensor to bfloat16: float32 and float16 values lose mantissa bits."""
    good = _good(sample)
    return _replace(sample, latents=good.latents.bfloat16(), prompt_embeds=good.prompt_embeds.bfloat16())


@stateless
def cook_strips_caption(sample: dict) -> DiffusionSample:
    return _replace(sample, caption=_good(sample).caption.strip())


@stateless
def cook_ascii_caption(sample: dict) -> DiffusionSample:
    return _replace(sample, caption=_good(sample).caption.encode("ascii", "ignore").decode())


@stateless
def cook_truncates_caption(sample: dict) -> DiffusionSample:
    return _replace(sample, caption=_good(sample).caption[:512])


@stateless
def cook_normalizes_latents(sample: dict) -> DiffusionSample:
    latents = _good(sample).latents
    return _replace(sample, latents=(latents - latents.mean()) / (latents.std() + 1e-6))


@stateless
def cook_grayscale_images(sample: dict) -> dict[str, Any]:
    from primus_energon import cook_raw_images

    out = cook_raw_images(sample)
    return {**out, "images": out["images"].convert("L")}


# 4. Purity ----------------------------------------------------------------------------------------

_CACHE: dict[str, DiffusionSample] = {}


@stateless
def cook_caches_by_key(sample: dict) -> DiffusionSample:
    """Caches by __key__: two datasets of a blend with the same key get one payload."""
    key = sample["__key__"]
    if key not in _CACHE:
        _CACHE[key] = _good(sample)
    cached = _CACHE[key]
    return DiffusionSample(
        **basic_sample_keys(sample),
        latents=cached.latents,
        prompt_embeds=cached.prompt_embeds,
        pooled_prompt_embeds=cached.pooled_prompt_embeds,
        caption=cached.caption,
    )


@stateless
def cook_mutates_input(sample: dict) -> DiffusionSample:
    out = _good(sample)
    sample.pop("caption.txt", None)  # "free memory early"
    return out


@stateless
def cook_reseeds_global_rng(sample: dict) -> DiffusionSample:
    torch.manual_seed(hash(sample["__key__"]) % 2**31)
    np.random.seed(0)
    return _good(sample)


@stateless
def cook_pops_its_members(sample: dict) -> DiffusionSample:
    """Takes its members out of the crude dict as it reads them (a common way to "free memory early").
    Energon hands every cook a dict of its own, so the only fault is advice (input_unchanged)."""
    taken = {member: sample.pop(member) for member in list(PREENCODED_TENSOR_MEMBERS.values())}
    return _good({**sample, **taken})


@stateless
def cook_seeds_torch_constant(sample: dict) -> DiffusionSample:
    """Seeds torch with a constant on every sample ("reproducible augmentation"): after the first cook the
    state it leaves is the state it finds, so only a state planted before each cook shows it."""
    torch.manual_seed(1234)
    return _good(sample)


@stateless
def cook_seeds_numpy_constant(sample: dict) -> DiffusionSample:
    np.random.seed(1234)
    return _good(sample)


@stateless
def cook_seeds_random_constant(sample: dict) -> DiffusionSample:
    random.seed(1234)
    return _good(sample)


@stateless
def cook_draws_from_global_torch(sample: dict) -> DiffusionSample:
    """Draws augmentation noise from the global torch generator without seeding it."""
    out = _good(sample)
    torch.rand(1)  # a coin flip it then ignores: the draw alone moves the training loop's generator
    return out


_BUFFER = torch.zeros(1 << 16)


@stateless
def cook_shared_buffer(sample: dict) -> DiffusionSample:
    """Decodes latents into one preallocated buffer to save allocations: every output aliases it."""
    latents = _good(sample).latents
    view = _BUFFER[: latents.numel()].view(latents.shape)
    view.copy_(latents)
    return _replace(sample, latents=view)


_COUNT = [0]


@stateless
def cook_counts_calls(sample: dict) -> DiffusionSample:
    _COUNT[0] += 1
    return _replace(sample, caption=f"{_good(sample).caption} #{_COUNT[0]}")


# 10. Bad input and security -----------------------------------------------------------------------


def _lenient_tensor(value: Any, shape: tuple[int, ...]) -> torch.Tensor:
    try:
        return torch.load(io.BytesIO(value), map_location="cpu", weights_only=True)
    except Exception:
        return torch.zeros(shape)


@stateless
def cook_zeros_on_bad_input(sample: dict) -> DiffusionSample:
    """Fills in zeros for a missing or unreadable member: silent garbage in training."""
    return DiffusionSample(
        **basic_sample_keys(sample),
        latents=_lenient_tensor(sample.get("latents.pth", b""), (4, 8, 8)),
        prompt_embeds=_lenient_tensor(sample.get("prompt_embeds.pth", b""), (7, 16)),
        pooled_prompt_embeds=_lenient_tensor(sample.get("pooled_prompt_embeds.pth", b""), (16,)),
        caption=bytes(sample.get("caption.txt", b"")).decode("utf-8", "replace"),
    )


@stateless
def cook_error_without_key(sample: dict) -> DiffusionSample:
    try:
        return _good(sample)
    except Exception:
        raise ValueError("bad sample") from None


@stateless
def cook_skips_bad_samples(sample: dict) -> DiffusionSample:
    try:
        return _good(sample)
    except Exception:
        raise SkipSample() from None


@stateless
def cook_unsafe_torch_load(sample: dict) -> DiffusionSample:
    """The common baseline cooker on Energon's old default: torch.load with weights_only=False."""
    tensors = {
        field: torch.load(io.BytesIO(sample[member]), map_location="cpu", weights_only=False)
        for field, member in _MEMBERS.items()
    }
    return DiffusionSample(
        **basic_sample_keys(sample), **tensors, caption=sample["caption.txt"].decode("utf-8")
    )


@stateless
def cook_accepts_decoded(sample: dict) -> DiffusionSample:
    tensors = {
        f: v if isinstance((v := sample[m]), torch.Tensor) else load_tensor(v, sample, m)
        for f, m in _MEMBERS.items()
    }
    caption = sample.get("caption.txt", "")
    return DiffusionSample(
        **basic_sample_keys(sample),
        **tensors,
        caption=caption if isinstance(caption, str) else caption.decode(),
    )


class DefaultDecoderTaskEncoder(DefaultTaskEncoder):
    """The common baseline TaskEncoder: Energon's default SampleDecoder unpickles .pth members before cooking."""

    decoder = SampleDecoder(image_decode="pil")
    cookers = [Cooker(cook_accepts_decoded, has_subflavors={"encoding": "preencoded"})]

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        return batch_preencoded(samples)


# 11. Batch contract -------------------------------------------------------------------------------


class _Base(DefaultTaskEncoder):
    decoder = None
    cookers = [Cooker(cook_preencoded_diffusion, has_subflavors={"encoding": "preencoded"})]


class ConcatBatchTaskEncoder(_Base):
    """torch.cat instead of torch.stack: no batch dimension."""

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        return {"latents": torch.cat([s.latents for s in samples]), "__key__": [s.__key__ for s in samples]}


class ReversedBatchTaskEncoder(_Base):
    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        return batch_preencoded(list(reversed(samples)))


class ReversesOneFieldTaskEncoder(_Base):
    """Stacks the pooled embeddings in reverse: every payload is in the batch, next to another sample's."""

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        out = batch_preencoded(samples)
        out["pooled_prompt_embeds"] = torch.stack([s.pooled_prompt_embeds for s in reversed(samples)])
        return out


class RepeatsFirstTaskEncoder(_Base):
    """Fills the last row with the first sample again (an off-by-one in a hand-written collate)."""

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        kept = [samples[0], *samples[:-1]] if len(samples) > 1 else samples
        out = batch_preencoded(kept)
        out["__key__"] = [s.__key__ for s in samples]
        return out


class DropsLastTaskEncoder(_Base):
    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        kept = samples[:-1] if len(samples) > 1 else samples
        out = batch_preencoded(kept)
        out["__key__"] = [s.__key__ for s in samples]  # claims all of them
        return out


class BareStackTaskEncoder(_Base):
    """The common baseline batch(): torch.stack's bare size-mismatch error names no sample."""

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        return {f: torch.stack([getattr(s, f) for s in samples]) for f in _MEMBERS}


class PadsSilentlyTaskEncoder(_Base):
    """Zero-pads every field to the largest shape in the batch instead of raising."""

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        out: dict[str, Any] = {"__key__": [s.__key__ for s in samples]}
        for field in _MEMBERS:
            values = [getattr(s, field) for s in samples]
            shape = [max(v.shape[d] for v in values) for d in range(values[0].ndim)]
            padded = torch.zeros([len(values), *shape], dtype=values[0].dtype)
            for row, value in enumerate(values):
                padded[(row, *(slice(0, n) for n in value.shape))] = value
            out[field] = padded
        return out


# Random augmentation without restore_seeds: resumes with different noise. ---------------------------


class UnseededAugmentationTaskEncoder(_Base):
    @stateless
    def encode_sample(self, sample: DiffusionSample) -> DiffusionSample:
        sample.latents = sample.latents + random.random()
        return sample

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        return batch_preencoded(samples)


class InPlaceEncodeTaskEncoder(EncodedDiffusionTaskEncoder):
    """Scales the latents in place in encode_sample: the reference cooker's tensors are views of Energon's
    member bytes, so this rewrites the shard data it was handed (harmless with a copying cooker)."""

    @stateless
    def encode_sample(self, sample: DiffusionSample) -> DiffusionSample:
        sample.latents.mul_(0.18215)
        return sample


class InPlaceBatchTaskEncoder(_Base):
    """Centres each sample's latents in place before stacking: the samples it was given change."""

    @stateless
    def batch(self, samples: list[DiffusionSample]) -> dict[str, Any]:
        for sample in samples:
            sample.latents.sub_(sample.latents.mean())
        return batch_preencoded(samples)


# Claims added with the claim split --------------------------------------------------------------


@stateless
def cook_wrong_key(sample: dict) -> DiffusionSample:
    """Strips the shard prefix from the key: the sample now claims to be another one."""
    good = _good(sample)
    good.__key__ = sample["__key__"].rsplit("_", 1)[-1]
    return good


@stateless
def cook_passes_non_tensors_through(sample: dict) -> DiffusionSample:
    """Loads safely but never checks that a .pth held a tensor (a saved dict passes as latents): not a
    defect, since the dict fails loudly at the first torch.stack (a correct target, see correct.py)."""
    tensors = {
        field: torch.load(io.BytesIO(sample[member]), map_location="cpu", weights_only=True)
        for field, member in _MEMBERS.items()
    }
    return DiffusionSample(
        **basic_sample_keys(sample), **tensors, caption=bytes(sample.get("caption.txt", b"")).decode("utf-8")
    )


@stateless
def cook_replaces_bad_utf8(sample: dict) -> DiffusionSample:
    """Decodes captions with errors="replace": bad bytes become U+FFFD in the training caption."""
    tensors = {field: load_tensor(sample[member], sample, member) for field, member in _MEMBERS.items()}
    caption = bytes(sample.get("caption.txt", b"")).decode("utf-8", errors="replace")
    return DiffusionSample(**basic_sample_keys(sample), **tensors, caption=caption)


@stateless
def cook_zeros_on_decode_error(sample: dict) -> DiffusionSample:
    """Raises for a missing member, but fills in zeros when the bytes do not decode."""
    for member in _MEMBERS.values():
        if member not in sample:
            raise KeyError(member)
    return cook_zeros_on_bad_input(sample)


@stateless
def cook_default_torch_load(sample: dict) -> DiffusionSample:
    """torch.load without weights_only: safe while torch's default (True since 2.6) holds, unsafe under
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1."""
    tensors = {
        field: torch.load(io.BytesIO(sample[member]), map_location="cpu")
        for field, member in _MEMBERS.items()
    }
    return DiffusionSample(
        **basic_sample_keys(sample), **tensors, caption=bytes(sample.get("caption.txt", b"")).decode("utf-8")
    )


@stateless
def cook_unpickles_npy_sidecars(sample: dict) -> DiffusionSample:
    """Loads every .npy sidecar with allow_pickle=True (e.g. for ragged metadata)."""
    for name, value in sample.items():
        if name.endswith(".npy"):
            np.load(io.BytesIO(value), allow_pickle=True)
    return _good(sample)


_UNCONDITIONAL = torch.zeros(16)


@stateless
def cook_shared_constant_field(sample: dict) -> dict[str, Any]:
    """Attaches one module-level tensor to every sample: nothing is corrupted, but a write into one
    sample's field would change every other's."""
    good = _good(sample)
    return {
        **basic_sample_keys(sample),
        "latents": good.latents,
        "prompt_embeds": good.prompt_embeds,
        "pooled_prompt_embeds": good.pooled_prompt_embeds,
        "caption": good.caption,
        "unconditional": _UNCONDITIONAL,
    }


@stateless
def cook_drops_caption(sample: dict) -> dict[str, Any]:
    """Keeps the tensors, drops the (optional) caption: advice, not a defect."""
    good = _good(sample)
    return {**basic_sample_keys(sample), **{f: getattr(good, f) for f in _MEMBERS}}


_EXAMPLES = str(__import__("pathlib").Path(__file__).parents[2] / "synthetic" / "examples")
_DECLARED = __import__("tests.conformance_zoo.transforms", fromlist=["DECLARATIONS"]).DECLARATIONS

#: name -> (kind, spec, options, the claim that must catch it, the verdict it must give: "fail" for a
#: defect, "advice" for an opinion that never fails the run)
BROKEN_TARGETS: dict[str, tuple[str, str, dict, str, str]] = {
    # raw-image pipelines (tests/conformance_zoo/raw_styles.py): one realistic bug each in a correct style
    "raw: Normalize([0.5], [0.5]) applied twice": (
        "task_encoder",
        "raw_styles:NormalisedTwiceTaskEncoder",
        {},
        "fidelity/images",
        "fail",
    ),
    "raw: (x - 128) / 128 on uint8 wraps around": (
        "task_encoder",
        "raw_styles:Uint8WrapTaskEncoder",
        {},
        "fidelity/images",
        "fail",
    ),
    "raw: interpolate on an HWC tensor resizes the colour axis": (
        "task_encoder",
        "raw_styles:ResizeOverChannelsTaskEncoder",
        {},
        "fidelity/images",
        "fail",
    ),
    "raw: colour lost to a grey conversion": (
        "task_encoder",
        "raw_styles:GreyscaleTaskEncoder",
        {},
        "fidelity/images",
        "fail",
    ),
    "raw: height and width swapped by a permute": (
        "task_encoder",
        "raw_styles:TransposedImageTaskEncoder",
        {},
        "fidelity/images",
        "fail",
    ),
    "raw: the previous sample's caption tokenised": (
        "task_encoder",
        "raw_styles:PreviousCaptionTaskEncoder",
        {},
        "purity/order",
        "fail",
    ),
    "raw: every caption cut to one token": (
        "task_encoder",
        "raw_styles:OneTokenTaskEncoder",
        {},
        "fidelity/text",
        "fail",
    ),
    "raw: a batch mask of ones over padding": (
        "task_encoder",
        "raw_styles:MaskOfOnesTaskEncoder",
        {},
        "batch/masks",
        "fail",
    ),
    "raw: batch masks built in another order than the ids": (
        "task_encoder",
        "raw_styles:SwappedMaskOrderTaskEncoder",
        {},
        "batch/masks",
        "fail",
    ),
    "raw: each sample's mask all ones over padding": (
        "task_encoder",
        "raw_styles:Sd3MaskOfOnesTaskEncoder",
        {},
        "fidelity/masks",
        "fail",
    ),
    "raw: crop offsets from the unseeded global random": (
        "task_encoder",
        "raw_styles:GlobalRandomCropTaskEncoder",
        {},
        "purity/order",
        "fail",
    ),
    "raw: one token buffer reused for every sample": (
        "task_encoder",
        "raw_styles:ReusedTokenBufferTaskEncoder",
        {},
        "purity/independent_outputs",
        "fail",
    ),
    "raw: outputs cached by __key__ on the TaskEncoder": (
        "task_encoder",
        "raw_styles:KeyCacheTaskEncoder",
        {},
        "purity/shared_key",
        "fail",
    ),
    "raw: a declared horizontal flip done vertically": (
        "task_encoder",
        "raw_styles:VerticalFlipTaskEncoder",
        {"transforms": ["image: flip axis=-1 rate=0.5"]},
        "transforms/observed",
        "fail",
    ),
    "raw: a random resized crop, undeclared": (
        "task_encoder",
        "raw_styles:RandomResizedCropTaskEncoder",
        {},
        "fidelity/transformed",
        "advice",
    ),
    "cook function without @stateless": (
        "cooker",
        "cook_not_stateless",
        {"encoding": "preencoded"},
        "accepted/stateless",
        "fail",
    ),
    "cooker for an encoding the data does not have": (
        "cooker",
        "COOKER_FOR_OTHER_ENCODING",
        {"encoding": "preencoded"},
        "accepted/matches",
        "fail",
    ),
    "encode_sample filters clean samples with SkipSample": (
        "task_encoder",
        "FiltersShortCaptionsTaskEncoder",
        {},
        "accepted/complete_epoch",
        "fail",
    ),
    "a wrong __key__": ("cooker", "cook_wrong_key", {"encoding": "preencoded"}, "keys/key", "fail"),
    "drops __restore_key__": (
        "cooker",
        "cook_drops_restore_key",
        {"encoding": "preencoded"},
        "keys/basic_keys",
        "advice",
    ),
    "drops __sources__": (
        "cooker",
        "cook_drops_sources",
        {"encoding": "preencoded"},
        "keys/basic_keys",
        "advice",
    ),
    "casts to bfloat16": (
        "cooker",
        "cook_casts_to_bfloat16",
        {"encoding": "preencoded"},
        "fidelity/dtypes",
        "fail",
    ),
    "strips the caption": (
        "cooker",
        "cook_strips_caption",
        {"encoding": "preencoded"},
        "fidelity/text",
        "fail",
    ),
    "drops non-ASCII": ("cooker", "cook_ascii_caption", {"encoding": "preencoded"}, "fidelity/text", "fail"),
    "truncates long captions": (
        "cooker",
        "cook_truncates_caption",
        {"encoding": "preencoded"},
        "fidelity/text",
        "fail",
    ),
    "normalizes latents": (
        "cooker",
        "cook_normalizes_latents",
        {"encoding": "preencoded"},
        "fidelity/tensors",
        "fail",
    ),
    "grayscale images": ("cooker", "cook_grayscale_images", {"encoding": "raw"}, "fidelity/images", "fail"),
    "caches by __key__": (
        "cooker",
        "cook_caches_by_key",
        {"encoding": "preencoded"},
        "purity/shared_key",
        "fail",
    ),
    "mutates its input": (
        "cooker",
        "cook_mutates_input",
        {"encoding": "preencoded"},
        "purity/input_unchanged",
        "advice",
    ),
    "reseeds the global RNG": (
        "cooker",
        "cook_reseeds_global_rng",
        {"encoding": "preencoded"},
        "purity/global_rng",
        "fail",
    ),
    "pops the members it reads": (
        "cooker",
        "cook_pops_its_members",
        {"encoding": "preencoded"},
        "purity/input_unchanged",
        "advice",
    ),
    "seeds torch with a constant": (
        "cooker",
        "cook_seeds_torch_constant",
        {"encoding": "preencoded"},
        "purity/global_rng",
        "fail",
    ),
    "seeds numpy with a constant": (
        "cooker",
        "cook_seeds_numpy_constant",
        {"encoding": "preencoded"},
        "purity/global_rng",
        "fail",
    ),
    "seeds random with a constant": (
        "cooker",
        "cook_seeds_random_constant",
        {"encoding": "preencoded"},
        "purity/global_rng",
        "fail",
    ),
    "draws from the global torch generator": (
        "cooker",
        "cook_draws_from_global_torch",
        {"encoding": "preencoded"},
        "purity/global_rng",
        "fail",
    ),
    "outputs share one buffer": (
        "cooker",
        "cook_shared_buffer",
        {"encoding": "preencoded"},
        "purity/independent_outputs",
        "fail",
    ),
    "a constant tensor shared by every sample": (
        "cooker",
        "cook_shared_constant_field",
        {"encoding": "preencoded"},
        "purity/shared_memory",
        "advice",
    ),
    "depends on call count": (
        "cooker",
        "cook_counts_calls",
        {"encoding": "preencoded"},
        "purity/order",
        "fail",
    ),
    "zeros for bad input": (
        "cooker",
        "cook_zeros_on_bad_input",
        {"encoding": "preencoded"},
        "bad_input/missing_member",
        "fail",
    ),
    "zeros for undecodable bytes": (
        "cooker",
        "cook_zeros_on_decode_error",
        {"encoding": "preencoded"},
        "bad_input/corrupt_payload",
        "fail",
    ),
    "batch() leaves the captions out": (
        "task_encoder",
        "BareStackTaskEncoder",
        {},
        "batch/unmatched",
        "advice",
    ),
    "packs leave the captions out": (
        "task_encoder",
        "styles:EmbeddingsOnlyPackingTaskEncoder",
        {},
        "packing/unmatched",
        "advice",
    ),
    "replaces bad UTF-8": (
        "cooker",
        "cook_replaces_bad_utf8",
        {"encoding": "preencoded"},
        "bad_input/not_utf8",
        "fail",
    ),
    "error without the key": (
        "cooker",
        "cook_error_without_key",
        {"encoding": "preencoded"},
        "bad_input/names_sample",
        "advice",
    ),
    "skips bad samples silently": (
        "cooker",
        "cook_skips_bad_samples",
        {"encoding": "preencoded"},
        "bad_input/missing_member",
        "fail",
    ),
    "torch.load weights_only=False": (
        "cooker",
        "cook_unsafe_torch_load",
        {"encoding": "preencoded"},
        "bad_input/code_execution",
        "fail",
    ),
    "torch.load without weights_only": (
        "cooker",
        "cook_default_torch_load",
        {"encoding": "preencoded"},
        "bad_input/code_execution",
        "fail",
    ),
    "np.load(allow_pickle=True) on sidecars": (
        "cooker",
        "cook_unpickles_npy_sidecars",
        {"encoding": "preencoded"},
        "bad_input/code_execution",
        "fail",
    ),
    "Energon's default decoder": (
        "task_encoder",
        "DefaultDecoderTaskEncoder",
        {},
        "bad_input/code_execution",
        "fail",
    ),
    "torch.cat batch": ("task_encoder", "ConcatBatchTaskEncoder", {}, "batch/rows", "fail"),
    "reversed batch": ("task_encoder", "ReversedBatchTaskEncoder", {}, "batch/order", "advice"),
    "packed batch() keeps metadata[0] of each pack": (
        "task_encoder",
        "styles:KeepsFirstMetadataTaskEncoder",
        {},
        "packing/batch_rows",
        "fail",
    ),
    "turns a dict member into torch.zeros": (
        "cooker",
        "styles:cook_zeros_for_dicts",
        {"encoding": "preencoded"},
        "bad_input/wrong_type",
        "fail",
    ),
    "batch() silently drops samples it cannot stack": (
        "task_encoder",
        "styles:DropsOddSamplesInBatchTaskEncoder",
        {},
        "bad_input/wrong_type",
        "fail",
    ),
    "reverses one field only": ("task_encoder", "ReversesOneFieldTaskEncoder", {}, "batch/rows", "fail"),
    "repeats a sample in place of another": (
        "task_encoder",
        "RepeatsFirstTaskEncoder",
        {},
        "batch/rows",
        "fail",
    ),
    "drops a sample": ("task_encoder", "DropsLastTaskEncoder", {}, "batch/rows", "fail"),
    "bare torch.stack error": (
        "task_encoder",
        "BareStackTaskEncoder",
        {},
        "batch/error_names_samples",
        "advice",
    ),
    "pads mismatched shapes silently": (
        "task_encoder",
        "PadsSilentlyTaskEncoder",
        {},
        "batch/mismatched_shapes",
        "fail",
    ),
    "scales zero-copy latents in place": (
        "task_encoder",
        "InPlaceEncodeTaskEncoder",
        {},
        "batch/inputs_unchanged",
        "advice",
    ),
    "normalizes samples in place in batch()": (
        "task_encoder",
        "InPlaceBatchTaskEncoder",
        {},
        "batch/inputs_unchanged",
        "advice",
    ),
    "unseeded augmentation": (
        "task_encoder",
        "UnseededAugmentationTaskEncoder",
        {},
        "resume/checkpoint",
        "fail",
    ),
    "drops the caption": (
        "cooker",
        "cook_drops_caption",
        {"encoding": "preencoded"},
        "fidelity/unmatched",
        "advice",
    ),
    "bf16 bytes read as float16": (
        "cooker",
        "formats:cook_mlperf_as_float16",
        {"schema": _EXAMPLES + "/mlperf_numpy.yaml"},
        "fidelity/tensors",
        "fail",
    ),
    "zero default for a missing pickled embedding": (
        "cooker",
        "formats:cook_dfm_zero_pooled",
        {"schema": _EXAMPLES + "/dfm_flux.yaml"},
        "bad_input/missing_member",
        "fail",
    ),
    "pickle.loads on a pickled member": (
        "cooker",
        "formats:cook_dfm_unpickles",
        {"schema": _EXAMPLES + "/dfm_flux.yaml"},
        "bad_input/code_execution",
        "fail",
    ),
    "a T5 context cut by a negative pad (F.pad to fewer rows than stored)": (
        "task_encoder",
        "formats:DfmContextCutTaskEncoder",
        {"schema": _EXAMPLES + "/dfm_flux.yaml"},
        "fidelity/tensors",
        "fail",
    ),
    "a pickled CLIP embedding replaced by zeros": (
        "cooker",
        "formats:cook_dfm_zero_pooled_always",
        {"schema": _EXAMPLES + "/dfm_flux.yaml"},
        "fidelity/tensors",
        "fail",
    ),
    "NeMo's control image taken from the image member": (
        "cooker",
        "formats:cook_nemo_raw_hint_from_image",
        {"schema": _EXAMPLES + "/nemo_raw.yaml"},
        "fidelity/images",
        "fail",
    ),
    "zero default for a missing embedding made in encode_sample": (
        "task_encoder",
        "formats:ZeroPooledInEncodeTaskEncoder",
        {"schema": _EXAMPLES + "/dfm_flux.yaml"},
        "bad_input/missing_member",
        "fail",
    ),
    "wrapper that stops at the end of an epoch": (
        "wrapper",
        "wrappers:NoCycleWrapper",
        {},
        "wrapper/cyclic",
        "fail",
    ),
    "wrapper that spins on an empty loader": (
        "wrapper",
        "wrappers:SpinningWrapper",
        {},
        "wrapper/empty",
        "fail",
    ),
    "wrapper that spins on an exhausted generator": (
        "wrapper",
        "wrappers:SpinningWrapper",
        {},
        "wrapper/exhausted",
        "fail",
    ),
    "wrapper that saves no state": ("wrapper", "wrappers:StatelessWrapper", {}, "wrapper/resume", "fail"),
    "wrapper that hands its state object to Energon": (
        "wrapper",
        "wrappers:RestoresTheStateItselfWrapper",
        {},
        "wrapper/restore_twice",
        "fail",
    ),
    "wrapper that keeps the running pass over a restore": (
        "wrapper",
        "wrappers:KeepsThePassWrapper",
        {},
        "wrapper/restore_after_batches",
        "fail",
    ),
    "wrapper module with an alias that does not warn": (
        "wrapper",
        "wrappers:RenamedWrapper",
        {},
        "wrapper/deprecated_alias",
        "advice",
    ),
    "packer that leaves the last pack of each buffer out": (
        "task_encoder",
        "packing:DropsLastPackTaskEncoder",
        {},
        "packing/exactly_once",
        "fail",
    ),
    "packs without the fields batch() reads": (
        "task_encoder",
        "packing:PackWithoutItsBatchFieldsTaskEncoder",
        {},
        "packing/loads",
        "fail",
    ),
    "batch() of packs that keeps only the first pack": (
        "task_encoder",
        "packing:KeepsFirstPackTaskEncoder",
        {},
        "packing/batch_rows",
        "fail",
    ),
    "packer that repeats a sample": (
        "task_encoder",
        "packing:RepeatsASampleTaskEncoder",
        {},
        "packing/exactly_once",
        "fail",
    ),
    "packer that shuffles with the OS's randomness": (
        "task_encoder",
        "packing:ShufflesPacksTaskEncoder",
        {},
        "packing/determinism",
        "fail",
    ),
    "packer with a counter on the instance": (
        "task_encoder",
        "packing:CountsBuffersTaskEncoder",
        {},
        "packing/resume",
        "fail",
    ),
    "pack that keeps only the first prompt": (
        "task_encoder",
        "packing:FirstPromptOnlyTaskEncoder",
        {},
        "packing/payload",
        "fail",
    ),
    "two formats, batch() stacks what samples[0] has (crashes on a mixed batch)": (
        "task_encoder",
        "formats:FirstSampleDecidesTaskEncoder",
        {},
        "batch/mixed_formats_batched",
        "fail",
    ),
    "two formats, batch() keeps only the fields samples[0] has (loses them)": (
        "task_encoder",
        "formats:FirstSampleListsTaskEncoder",
        {},
        "batch/mixed_formats",
        "fail",
    ),
    "encode_batch sorts the captions and keys but not the tensors": (
        "task_encoder",
        "stages_broken:SortsTextInEncodeBatchTaskEncoder",
        {},
        "batch/delivered",
        "fail",
    ),
    "postencode_sample casts the latents and embeddings to float16": (
        "task_encoder",
        "stages_broken:HalfPrecisionPostencodeTaskEncoder",
        {},
        "batch/delivered",
        "fail",
    ),
    "preencode_sample casts the latents to float16": (
        "task_encoder",
        "stages_broken:HalfPrecisionPreencodeTaskEncoder",
        {},
        "fidelity/tensors",
        "fail",
    ),
    "encode_sample zeroes the latents (no declaration says so)": (
        "task_encoder",
        "transforms:ZerosLatentsTaskEncoder",
        {},
        "fidelity/tensors",
        "fail",
    ),
    **{
        description: (
            "task_encoder",
            f"transforms:{name}",
            {"transforms": [_DECLARED[name]]},
            claim_id,
            "fail",
        )
        for description, name, claim_id in (
            ("CFG dropout declared at 10 %, dropping half", "DropsHalfTaskEncoder", "transforms/rate"),
            (
                "CFG dropout seeded from the sample's key",
                "PerKeySeedDropoutTaskEncoder",
                "transforms/redrawn",
            ),
            (
                "CFG dropout from an unseeded global generator",
                "UnseededDropoutTaskEncoder",
                "transforms/deterministic",
            ),
            (
                "CFG dropout zeroing the pooled embedding too",
                "DropsEmbeddingsTooTaskEncoder",
                "transforms/only_declared",
            ),
            (
                "declared to truncate to 4 tokens, keeps 5",
                "TruncatesToFiveTaskEncoder",
                "transforms/observed",
            ),
        )
    },
}


@stateless
def cook_fails_on_bfloat16(sample: dict) -> DiffusionSample:
    """Works on the float32 data it was written for; raises on bfloat16 latents (loses those samples)."""
    good = _good(sample)
    if good.latents.dtype == torch.bfloat16:
        raise NotImplementedError("bfloat16 latents are not supported")
    return good
