"""The mutants: small, realistic defects put into a copy of a reference target's source.

Each :class:`Mutant` is one source-level edit (or a few) of one file of the reference targets
(``primus_energon/cookers.py``, ``task_encoders.py``, ``batching.py``, ``dataloader.py``, ``payloads.py``) or
of the zoo's correct packing TaskEncoder (``tests/conformance_zoo/packing.py``, because no reference
TaskEncoder packs) and of the zoo's correct raw-image pipeline (``tests/conformance_zoo/raw_pipeline.py``: resize,
crop, normalise, tokenise with a mask, which no reference TaskEncoder does). An edit replaces a snippet that must occur exactly once in the file, and the mutated file
must still parse, so a mutant never silently applies to nothing. Each mutant names the target it is checked
as (one of :data:`TARGETS`) and the claims that are *meant* to kill it: the claims whose documented defect it
is. A kill by another claim counts as a kill, but not as a kill by the intended claim.

The real files are never modified: :func:`mutated_source` returns the new text, and the session writes it
into a temporary copy of the package imported under another name (:data:`MUTANT_PACKAGE`).
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Edit",
    "Mutant",
    "MutationError",
    "MUTANTS",
    "TARGETS",
    "MUTANT_PACKAGE",
    "MUTANT_PACKING_MODULE",
    "MUTANT_RAW_PIPELINE_MODULE",
    "ZOO_SUBJECTS",
    "REPO_ROOT",
    "mutated_source",
    "mutant_diff",
    "operators",
    "select",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The name the mutated copy of ``primus_energon`` (library modules only) is imported under.
MUTANT_PACKAGE = "primus_energon_mutant"
#: The name the mutated copy of the zoo's packing module is imported under.
MUTANT_PACKING_MODULE = "primus_energon_mutant_packing"
#: The name the mutated copy of the zoo's raw-image pipeline is imported under.
MUTANT_RAW_PIPELINE_MODULE = "primus_energon_mutant_raw_pipeline"

#: target label -> (pytest option, module, attribute). Every mutant is checked as one of these.
TARGETS: dict[str, tuple[str, str, str]] = {
    "PREENCODED_COOKER": ("--cooker", MUTANT_PACKAGE, "PREENCODED_COOKER"),
    "RAW_COOKER": ("--cooker", MUTANT_PACKAGE, "RAW_COOKER"),
    "EncodedDiffusionTaskEncoder": ("--task-encoder", MUTANT_PACKAGE, "EncodedDiffusionTaskEncoder"),
    "MultiFormatTaskEncoder": ("--task-encoder", MUTANT_PACKAGE, "MultiFormatTaskEncoder"),
    "MegatronDataloaderWrapper": ("--wrapper", MUTANT_PACKAGE, "MegatronDataloaderWrapper"),
    "FirstFitPackingTaskEncoder": ("--task-encoder", MUTANT_PACKING_MODULE, "FirstFitPackingTaskEncoder"),
    "RawPipelineTaskEncoder": ("--task-encoder", MUTANT_RAW_PIPELINE_MODULE, "RawPipelineTaskEncoder"),
}


class MutationError(ValueError):
    """A mutant that cannot be applied: its snippet is missing or ambiguous, or the result does not parse."""


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` (which must occur exactly once) with ``new``."""

    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    """One defect: ``edits`` applied to ``file`` (relative to the repository root)."""

    id: str
    operator: str
    description: str
    file: str
    edits: tuple[Edit, ...]
    target: str
    #: the claims whose documented defect this is (a kill by one of them is a kill "as meant")
    meant: tuple[str, ...]
    #: why the mutant is in the set, when it is not obvious (e.g. a known blind spot)
    note: str = ""

    @property
    def module_name(self) -> str:
        return TARGETS[self.target][1]


def mutated_source(mutant: Mutant, original: str | None = None) -> str:
    """The text of ``mutant.file`` with the mutant's edits applied. Raises :class:`MutationError` when an
    edit's snippet does not occur exactly once, or when the result is not valid Python."""
    text = original if original is not None else (REPO_ROOT / mutant.file).read_text(encoding="utf-8")
    for edit in mutant.edits:
        count = text.count(edit.old)
        if count != 1:
            raise MutationError(
                f"mutant {mutant.id}: the snippet {edit.old[:60]!r} occurs {count} times in {mutant.file} "
                "(expected once); update the mutant to the current source"
            )
        text = text.replace(edit.old, edit.new)
    try:
        ast.parse(text, filename=mutant.file)
    except SyntaxError as error:
        raise MutationError(
            f"mutant {mutant.id}: the mutated {mutant.file} does not parse: {error}"
        ) from None
    return text


def mutant_diff(mutant: Mutant) -> str:
    """The unified diff of the mutant against the real file."""
    original = (REPO_ROOT / mutant.file).read_text(encoding="utf-8")
    mutated = mutated_source(mutant, original)
    return "".join(
        difflib.unified_diff(
            original.splitlines(keepends=True),
            mutated.splitlines(keepends=True),
            fromfile=f"a/{mutant.file}",
            tofile=f"b/{mutant.file}",
            n=1,
        )
    )


# --- snippets of the reference sources the mutants attach to -----------------------------------------------

COOKERS = "primus_energon/cookers.py"
PAYLOADS = "primus_energon/payloads.py"
TASK_ENCODERS = "primus_energon/task_encoders.py"
BATCHING = "primus_energon/batching.py"
DATALOADER = "primus_energon/dataloader.py"
RESUME = "primus_energon/resume.py"
PACKING = "tests/conformance_zoo/packing.py"
RAW_PIPELINE = "tests/conformance_zoo/raw_pipeline.py"

#: imports the cooker mutants need, added after the cookers' Energon import
_COOKER_IMPORTS = Edit(
    "from megatron.energon import basic_sample_keys, stateless\n",
    "from megatron.energon import basic_sample_keys, stateless\n"
    "import os, random, zlib\nimport numpy\nimport torch\nfrom megatron.energon import SkipSample\n",
)
_PREENCODED_RETURN = "    return DiffusionSample(**basic_sample_keys(sample), **tensors, caption=caption)\n"
_RAW_RETURN = '        "txt": text,\n    }\n'
_RAW_KEYS = '        **basic_sample_keys(sample),\n        "images"'
_MODULE_STATE = "def _members_present("


def _before_preencoded_return(*lines: str) -> Edit:
    """Insert ``lines`` (one indentation level) just before ``_cook_preencoded`` returns."""
    return Edit(_PREENCODED_RETURN, "".join(f"    {line}\n" for line in lines) + _PREENCODED_RETURN)


#: the end of the reference EncodedDiffusionTaskEncoder.batch(), where a mutant adds a stage of its own
_REFERENCE_BATCH_END = "        _check_batch_types(samples, DiffusionSample, type(self).__name__)\n        return batch_preencoded(samples)\n"


def _after_reference_batch(stage: str, *lines: str, restore_seeds: bool = False) -> Edit:
    """Add ``stage(self, sample)`` with the body ``lines`` to the reference EncodedDiffusionTaskEncoder."""
    decorator = "@stateless(restore_seeds=True)" if restore_seeds else "@stateless"
    body = "".join(f"        {line}\n" for line in lines)
    return Edit(
        _REFERENCE_BATCH_END,
        f"{_REFERENCE_BATCH_END}\n    {decorator}\n    def {stage}(self, sample):\n{body}",
    )


def _module_state(code: str) -> Edit:
    return Edit(_MODULE_STATE, f"{code}\n\n\n{_MODULE_STATE}")


def _raw_extra_field(expression: str) -> Edit:
    """An extra output field of the raw cooker (fidelity checks only the fields that hold members)."""
    return Edit(_RAW_RETURN, f'        "txt": text,\n        "aug": {expression},\n    }}\n')


_FLIP = 'tensors["latents"] = tensors["latents"].flip(-1)'
_PRE, _RAW, _ENC, _MULTI, _WRAP, _PACK = (
    "PREENCODED_COOKER",
    "RAW_COOKER",
    "EncodedDiffusionTaskEncoder",
    "MultiFormatTaskEncoder",
    "MegatronDataloaderWrapper",
    "FirstFitPackingTaskEncoder",
)
_BAD_INPUT = (
    "bad_input/missing_member",
    "bad_input/corrupt_payload",
    "bad_input/wrong_type",
    "bad_input/not_utf8",
)


def _rng_mutants() -> list[Mutant]:
    """Global RNG use by a cooker whose output stays the same: torch, numpy and random separately, each
    reseeded with a constant, reseeded per key, and drawn from unseeded."""
    out = []
    libraries = {
        "torch": ("torch.manual_seed({})", "torch.rand(())"),
        "numpy": ("numpy.random.seed({})", "numpy.random.random()"),
        "random": ("random.seed({})", "random.random()"),
    }
    for library, (reseed, draw) in libraries.items():
        for how, line in (
            ("reseed_constant", reseed.format("1234")),
            ("reseed_per_key", reseed.format('zlib.crc32(sample["__key__"].encode())')),
            ("draw_unseeded", draw),
        ):
            out.append(
                Mutant(
                    f"rng_{library}_{how}",
                    f"global_rng_{how}",
                    f"the preencoded cooker calls {line} on the global {library} RNG (its output is unchanged)",
                    COOKERS,
                    (_COOKER_IMPORTS, _before_preencoded_return(line)),
                    _PRE,
                    ("purity/global_rng",),
                )
            )
    return out


#: the zoo modules mutated besides the library: repository path -> the module name its copy is imported under
ZOO_SUBJECTS: dict[str, str] = {
    PACKING: MUTANT_PACKING_MODULE,
    RAW_PIPELINE: MUTANT_RAW_PIPELINE_MODULE,
}


def _raw(
    id_: str, operator: str, description: str, edits: tuple[Edit, ...], meant: tuple[str, ...]
) -> Mutant:
    return Mutant(id_, operator, description, RAW_PIPELINE, edits, "RawPipelineTaskEncoder", meant)


_RAW_TO_PIXELS = "    pixels = pixels.float() / 255.0\n    return pixels * 2.0 - 1.0\n"
_RAW_IMPORTS = Edit("import io\n", "import io\nimport random\n\nimport torch.nn.functional as F\n")


def _raw_pipeline_mutants() -> list[Mutant]:
    """Defects of a raw-image pipeline's stages (tests/conformance_zoo/raw_pipeline.py): normalisation,
    layout, resize, colour, a flip, the caption's tokens and mask, state kept between samples."""
    return [
        _raw(
            "raw_normalised_twice",
            "raw_normalise",
            "encode_sample normalises the image to [-1, 1] twice",
            (
                Edit(
                    _RAW_TO_PIXELS,
                    "    pixels = pixels.float() / 255.0\n    pixels = pixels * 2.0 - 1.0\n    return pixels * 2.0 - 1.0\n",
                ),
            ),
            ("fidelity/images",),
        ),
        _raw(
            "raw_scaled_twice",
            "raw_normalise",
            "the image is divided by 255 twice",
            (Edit(_RAW_TO_PIXELS, "    pixels = pixels.float() / 255.0 / 255.0\n    return pixels\n"),),
            ("fidelity/images",),
        ),
        _raw(
            "raw_uint8_wraps",
            "raw_uint8",
            "(x - 128) / 128 computed on the uint8 tensor, which wraps around",
            (Edit(_RAW_TO_PIXELS, "    return (pixels - 128) / 128\n"),),
            ("fidelity/images",),
        ),
        _raw(
            "raw_transposed",
            "raw_layout",
            "permute(2, 1, 0): height and width swapped",
            (Edit(".permute(2, 0, 1)\n", ".permute(2, 1, 0)\n"),),
            ("fidelity/images",),
        ),
        _raw(
            "raw_resize_over_channels",
            "raw_layout",
            "the image resized with F.interpolate on its HWC tensor (the colour axis taken for a spatial one)",
            (
                _RAW_IMPORTS,
                Edit(
                    '        pixels = to_pixels(resize_and_crop(sample["image"]))\n',
                    '        hwc = torch.from_numpy(np.asarray(sample["image"]).copy()).float()[None]\n'
                    '        pixels = F.interpolate(hwc, size=(SIZE, SIZE), mode="bilinear", antialias=True)[0] / 127.5 - 1\n',
                ),
            ),
            ("fidelity/images",),
        ),
        _raw(
            "raw_grey",
            "raw_colour",
            "the image converted to grey (and back to three channels) before resizing",
            (
                Edit(
                    '        image = image.convert("RGB")\n',
                    '        image = image.convert("L").convert("RGB")\n',
                ),
            ),
            ("fidelity/images",),
        ),
        _raw(
            "raw_always_flipped",
            "raw_flip",
            "every image flipped horizontally, no declaration",
            (
                Edit(
                    _RAW_TO_PIXELS,
                    "    pixels = pixels.float() / 255.0\n    return (pixels * 2.0 - 1.0).flip(-1)\n",
                ),
            ),
            ("fidelity/images",),
        ),
        _raw(
            "raw_image_constant",
            "raw_lost",
            "the image replaced by zeros of its shape",
            (Edit(_RAW_TO_PIXELS, "    return torch.zeros(pixels.shape)\n"),),
            ("fidelity/images",),
        ),
        _raw(
            "raw_crop_global_random",
            "raw_random",
            "the crop's offset drawn from the unseeded global random",
            (
                _RAW_IMPORTS,
                Edit(
                    "    left, top = (w - SIZE) // 2, (h - SIZE) // 2\n",
                    "    left, top = random.randint(0, w - SIZE), random.randint(0, h - SIZE)\n",
                ),
            ),
            ("purity/order", "purity/global_rng", "determinism/fresh_processes", "resume/checkpoint"),
        ),
        _raw(
            "raw_one_token",
            "raw_tokens",
            "every caption cut to one token",
            (Edit("[: MAX_TOKENS - 2]", "[:0]"),),
            ("fidelity/text",),
        ),
        _raw(
            "raw_caption_ignored",
            "raw_tokens",
            "the caption tokenised as an empty prompt",
            (
                Edit(
                    '        input_ids, attention_mask = tokenize(sample["caption"])\n',
                    '        input_ids, attention_mask = tokenize("")\n',
                ),
            ),
            ("fidelity/text",),
        ),
        _raw(
            "raw_previous_caption",
            "raw_state",
            "encode_sample tokenises the caption of the sample before (kept on the TaskEncoder)",
            (
                Edit(
                    '        input_ids, attention_mask = tokenize(sample["caption"])\n',
                    '        previous = getattr(self, "_previous", sample["caption"])\n'
                    '        self._previous = sample["caption"]\n'
                    "        input_ids, attention_mask = tokenize(previous)\n",
                ),
            ),
            ("purity/order", "purity/independent_outputs"),
        ),
        _raw(
            "raw_mask_of_ones",
            "raw_mask",
            "the attention mask is all ones over the padding",
            (
                Edit(
                    "    mask = [1] * length + [0] * (MAX_TOKENS - length)\n", "    mask = [1] * MAX_TOKENS\n"
                ),
            ),
            ("fidelity/masks", "batch/masks"),
        ),
        _raw(
            "raw_mask_off_by_two",
            "raw_mask",
            "the attention mask leaves out the last two tokens",
            (
                Edit(
                    "    mask = [1] * length + [0] * (MAX_TOKENS - length)\n",
                    "    mask = [1] * (length - 2) + [0] * (MAX_TOKENS - length + 2)\n",
                ),
            ),
            ("fidelity/masks", "batch/masks"),
        ),
        _raw(
            "raw_masks_reordered",
            "raw_mask",
            "batch() stacks the masks of the samples in reverse order",
            (
                Edit(
                    '            "attention_mask": torch.stack([s["attention_mask"] for s in samples]),\n',
                    '            "attention_mask": torch.stack([s["attention_mask"] for s in samples[::-1]]),\n',
                ),
            ),
            ("batch/masks", "batch/delivered", "batch/rows"),
        ),
        _raw(
            "raw_token_buffer",
            "raw_state",
            "the ids are written into one buffer held by the TaskEncoder and returned without a copy",
            (
                Edit(
                    '        input_ids, attention_mask = tokenize(sample["caption"])\n',
                    '        input_ids, attention_mask = tokenize(sample["caption"])\n'
                    '        if not hasattr(self, "_ids"):\n'
                    "            self._ids = torch.zeros(MAX_TOKENS, dtype=input_ids.dtype)\n"
                    "        self._ids.copy_(input_ids)\n"
                    "        input_ids = self._ids\n",
                ),
            ),
            ("purity/independent_outputs", "purity/shared_memory", "batch/rows", "batch/delivered"),
        ),
    ]


MUTANTS: tuple[Mutant, ...] = (
    # -- fields -----------------------------------------------------------------------------------------------
    Mutant(
        "field_drop_caption",
        "drop_field",
        "the preencoded cooker drops the caption (the sample gets the default '')",
        COOKERS,
        (Edit("**tensors, caption=caption)", "**tensors)"),),
        _PRE,
        ("fidelity/text", "fidelity/payloads"),
    ),
    Mutant(
        "field_drop_txt",
        "drop_field",
        "the raw cooker drops the caption field",
        COOKERS,
        (Edit('        "txt": text,\n', ""),),
        _RAW,
        ("fidelity/text",),
    ),
    Mutant(
        "field_rename_txt",
        "rename_field",
        "the raw cooker returns the caption as 'caption' instead of 'txt'",
        COOKERS,
        (Edit('        "txt": text,\n', '        "caption": text,\n'),),
        _RAW,
        ("fidelity/text",),
    ),
    Mutant(
        "field_swap_tensors",
        "swap_fields",
        "the preencoded cooker swaps latents and prompt_embeds",
        COOKERS,
        (
            _before_preencoded_return(
                'tensors["latents"], tensors["prompt_embeds"] = tensors["prompt_embeds"], tensors["latents"]'
            ),
        ),
        _PRE,
        ("fidelity/tensors",),
    ),
    Mutant(
        "field_swap_batch",
        "swap_fields",
        "batch() stacks pooled_prompt_embeds under prompt_embeds and the reverse",
        TASK_ENCODERS,
        (
            Edit(
                '        "prompt_embeds": stack_field(samples, "prompt_embeds"),\n'
                '        "pooled_prompt_embeds": stack_field(samples, "pooled_prompt_embeds"),\n',
                '        "prompt_embeds": stack_field(samples, "pooled_prompt_embeds"),\n'
                '        "pooled_prompt_embeds": stack_field(samples, "prompt_embeds"),\n',
            ),
        ),
        _ENC,
        ("batch/rows",),
    ),
    # -- tensors ----------------------------------------------------------------------------------------------
    Mutant(
        "tensor_transpose",
        "transpose_tensor",
        "the preencoded cooker transposes the latents' spatial dimensions (square: the shape stays)",
        COOKERS,
        (_before_preencoded_return('tensors["latents"] = tensors["latents"].transpose(-1, -2)'),),
        _PRE,
        ("fidelity/tensors",),
    ),
    Mutant(
        "tensor_reshape",
        "transpose_tensor",
        "the preencoded cooker flattens the latents' spatial dimensions",
        COOKERS,
        (_before_preencoded_return('tensors["latents"] = tensors["latents"].flatten(1)'),),
        _PRE,
        ("fidelity/tensors",),
    ),
    Mutant(
        "tensor_cast_float",
        "cast_tensor",
        "the preencoded cooker casts every tensor to float32 (float32 data is unchanged)",
        COOKERS,
        (_before_preencoded_return("tensors = {k: v.float() for k, v in tensors.items()}"),),
        _PRE,
        ("fidelity/dtypes", "fidelity/payloads"),
    ),
    Mutant(
        "tensor_cast_half",
        "cast_tensor",
        "the preencoded cooker casts the prompt embeddings to float16",
        COOKERS,
        (_before_preencoded_return('tensors["prompt_embeds"] = tensors["prompt_embeds"].half()'),),
        _PRE,
        ("fidelity/tensors",),
    ),
    Mutant(
        "tensor_truncate",
        "truncate_tensor",
        "the preencoded cooker drops the last token of the prompt embeddings",
        COOKERS,
        (_before_preencoded_return('tensors["prompt_embeds"] = tensors["prompt_embeds"][:-1]'),),
        _PRE,
        ("fidelity/tensors",),
    ),
    Mutant(
        "tensor_zero",
        "zero_tensor",
        "the preencoded cooker zeroes the pooled embedding",
        COOKERS,
        (_before_preencoded_return('tensors["pooled_prompt_embeds"] = tensors["pooled_prompt_embeds"] * 0'),),
        _PRE,
        ("fidelity/tensors",),
    ),
    Mutant(
        "encode_batch_reorders_captions",
        "later_stage",
        "an encode_batch reverses the captions and keys of each batch and leaves the tensors in place",
        TASK_ENCODERS,
        (
            Edit(
                "        _check_batch_types(samples, DiffusionSample, type(self).__name__)\n        return batch_preencoded(samples)\n",
                "        _check_batch_types(samples, DiffusionSample, type(self).__name__)\n        return batch_preencoded(samples)\n"
                "\n    @stateless\n    def encode_batch(self, batch):\n"
                '        return {**batch, "caption": batch["caption"][::-1], "__key__": batch["__key__"][::-1]}\n',
            ),
        ),
        _ENC,
        ("batch/delivered",),
    ),
    Mutant(
        "preencode_casts_half",
        "first_stage",
        "a preencode_sample casts the latents to float16 (Energon runs it as the first encode stage)",
        TASK_ENCODERS,
        (
            _after_reference_batch(
                "preencode_sample", "sample.latents = sample.latents.half()", "return sample"
            ),
        ),
        _ENC,
        ("fidelity/tensors",),  # the first encode stage is fidelity's to judge
    ),
    Mutant(
        "encode_sample_truncates_prompts",
        "first_stage",
        "an encode_sample drops the last token of the prompt embeddings",
        TASK_ENCODERS,
        (
            _after_reference_batch(
                "encode_sample", "sample.prompt_embeds = sample.prompt_embeds[:-1].clone()", "return sample"
            ),
        ),
        _ENC,
        ("fidelity/tensors",),  # the first encode stage is fidelity's to judge
    ),
    Mutant(
        "encode_sample_cfg_undeclared",
        "undeclared_transform",
        "an encode_sample drops 10 % of the captions (CFG) from Energon's per-sample seed, with no declaration",
        TASK_ENCODERS,
        (
            _after_reference_batch(
                "encode_sample",
                "import random",
                "if random.random() < 0.1:",
                '    sample.caption = ""',
                "return sample",
                restore_seeds=True,
            ),
        ),
        _ENC,
        ("fidelity/text",),  # the first encode stage is fidelity's to judge
    ),
    Mutant(
        "postencode_casts_half",
        "later_stage",
        "a postencode_sample casts the latents to float16",
        TASK_ENCODERS,
        (
            Edit(
                "        _check_batch_types(samples, DiffusionSample, type(self).__name__)\n        return batch_preencoded(samples)\n",
                "        _check_batch_types(samples, DiffusionSample, type(self).__name__)\n        return batch_preencoded(samples)\n"
                "\n    @stateless\n    def postencode_sample(self, sample):\n"
                "        sample.latents = sample.latents.half()\n        return sample\n",
            ),
        ),
        _ENC,
        ("batch/delivered",),
    ),
    Mutant(
        "batch_cast_half",
        "cast_tensor",
        "stack_field casts every stacked batch tensor to float16",
        BATCHING,
        (Edit("        return torch.stack(values)\n", "        return torch.stack(values).half()\n"),),
        _ENC,
        ("batch/rows",),
    ),
    # -- captions ---------------------------------------------------------------------------------------------
    Mutant(
        "caption_strip",
        "strip_caption",
        "the preencoded cooker strips the caption's surrounding white space",
        COOKERS,
        (
            Edit(
                "decode_text(caption, sample, PREENCODED_CAPTION_MEMBER)",
                "decode_text(caption, sample, PREENCODED_CAPTION_MEMBER).strip()",
            ),
        ),
        _PRE,
        ("fidelity/text", "fidelity/payloads"),
    ),
    Mutant(
        "caption_truncate",
        "truncate_caption",
        "the preencoded cooker truncates captions to 77 characters",
        COOKERS,
        (
            Edit(
                "decode_text(caption, sample, PREENCODED_CAPTION_MEMBER)",
                "decode_text(caption, sample, PREENCODED_CAPTION_MEMBER)[:77]",
            ),
        ),
        _PRE,
        ("fidelity/text", "fidelity/payloads"),
    ),
    Mutant(
        "caption_ascii",
        "reencode_caption",
        "the raw cooker drops the caption's non-ASCII characters",
        COOKERS,
        (
            Edit(
                'text = decode_text(_require(sample, RAW_TEXT_MEMBER, "the caption"), sample, RAW_TEXT_MEMBER)',
                'text = decode_text(_require(sample, RAW_TEXT_MEMBER, "the caption"), sample, RAW_TEXT_MEMBER)'
                '.encode("ascii", "ignore").decode("ascii")',
            ),
        ),
        _RAW,
        ("fidelity/text",),
    ),
    Mutant(
        "caption_latin1",
        "reencode_caption",
        "captions are decoded as Latin-1 (never fails; non-ASCII text becomes mojibake)",
        PAYLOADS,
        (Edit('            return data.decode("utf-8")\n', '            return data.decode("latin-1")\n'),),
        _PRE,
        ("fidelity/text", "fidelity/payloads", "bad_input/not_utf8"),
    ),
    Mutant(
        "caption_replace_errors",
        "reencode_caption",
        "captions are decoded with errors='replace' (invalid UTF-8 becomes U+FFFD)",
        PAYLOADS,
        (
            Edit(
                '            return data.decode("utf-8")\n',
                '            return data.decode("utf-8", errors="replace")\n',
            ),
        ),
        _PRE,
        ("bad_input/not_utf8",),
    ),
    # -- state: caches and counters ---------------------------------------------------------------------------
    Mutant(
        "cache_by_key",
        "cache_by_key",
        "the preencoded cooker caches its output by __key__ (two datasets of a blend share keys)",
        COOKERS,
        (
            _module_state("_CACHE: dict = {}"),
            Edit(
                "    return _cook_preencoded(sample, copy=True)\n",
                '    key = sample["__key__"]\n'
                "    if key not in _CACHE:\n"
                "        _CACHE[key] = _cook_preencoded(sample, copy=True)\n"
                "    return _CACHE[key]\n",
            ),
        ),
        _PRE,
        ("purity/shared_key",),
    ),
    Mutant(
        "count_calls_flip",
        "count_calls",
        "the preencoded cooker counts its calls and flips the latents of every other sample",
        COOKERS,
        (
            _COOKER_IMPORTS,
            _module_state("_CALLS = [0]"),
            _before_preencoded_return("_CALLS[0] += 1", "if _CALLS[0] % 2:", f"    {_FLIP}"),
        ),
        _PRE,
        ("purity/order", "resume/checkpoint", "fidelity/tensors"),
    ),
    Mutant(
        "count_calls_field",
        "count_calls",
        "the raw cooker counts its calls and returns the count (as a step for an augmentation schedule)",
        COOKERS,
        (_module_state("_CALLS = [0]"), _raw_extra_field("_CALLS.append(0) or len(_CALLS)")),
        _RAW,
        ("purity/order", "resume/checkpoint"),
    ),
    Mutant(
        "reused_output_buffer",
        "reuse_buffer",
        "the preencoded cooker copies the latents into one module-level buffer it returns for every sample",
        COOKERS,
        (
            _module_state("_BUFFER: list = []"),
            _before_preencoded_return(
                'if not _BUFFER or _BUFFER[0].shape != tensors["latents"].shape:',
                '    _BUFFER[:] = [tensors["latents"].clone()]',
                '_BUFFER[0].copy_(tensors["latents"])',
                'tensors["latents"] = _BUFFER[0]',
            ),
        ),
        _PRE,
        ("purity/independent_outputs",),
    ),
    Mutant(
        "mutates_input",
        "mutate_input",
        "the preencoded cooker pops the caption member from the crude sample dict it was given",
        COOKERS,
        (_before_preencoded_return("sample.pop(PREENCODED_CAPTION_MEMBER, None)"),),
        _PRE,
        ("purity/input_unchanged",),
    ),
    # -- randomness -------------------------------------------------------------------------------------------
    *_rng_mutants(),
    *_raw_pipeline_mutants(),
    Mutant(
        "rng_unseeded_augment",
        "unseeded_augmentation",
        "the preencoded cooker flips the latents when the OS's randomness says so",
        COOKERS,
        (
            _COOKER_IMPORTS,
            _before_preencoded_return("if random.SystemRandom().random() < 0.5:", f"    {_FLIP}"),
        ),
        _PRE,
        ("determinism/fresh_processes", "purity/order", "fidelity/tensors"),
    ),
    Mutant(
        "rng_unseeded_field",
        "unseeded_augmentation",
        "the raw cooker returns an augmentation seed drawn from the OS's randomness",
        COOKERS,
        (_COOKER_IMPORTS, _raw_extra_field("random.SystemRandom().getrandbits(32)")),
        _RAW,
        ("determinism/fresh_processes", "purity/order"),
    ),
    Mutant(
        "hash_seeded_field",
        "hash_seeded_augmentation",
        "the raw cooker derives an augmentation flag from hash(__key__) (differs with PYTHONHASHSEED)",
        COOKERS,
        (_raw_extra_field('hash(sample["__key__"]) % 2'),),
        _RAW,
        ("determinism/fresh_processes",),
    ),
    Mutant(
        "pid_seeded_field",
        "hash_seeded_augmentation",
        "the raw cooker derives an augmentation seed from the process id",
        COOKERS,
        (_COOKER_IMPORTS, _raw_extra_field("os.getpid()")),
        _RAW,
        ("determinism/fresh_processes",),
    ),
    # -- bad input: exceptions swallowed, defaults --------------------------------------------------------------
    Mutant(
        "missing_member_default",
        "swallow_exception",
        "a missing required member of a preencoded sample becomes a zero tensor",
        COOKERS,
        (
            _COOKER_IMPORTS,
            Edit(
                "    if value is None:\n        raise",
                "    if value is None:\n        return torch.zeros(1)\n        raise",
            ),
        ),
        _PRE,
        ("bad_input/missing_member",),
    ),
    Mutant(
        "corrupt_payload_default",
        "swallow_exception",
        "a tensor member that does not read becomes an empty tensor",
        PAYLOADS,
        (
            Edit(
                "    except TensorFileError as error:\n",
                "    except TensorFileError as error:\n        return torch.zeros(0)\n",
            ),
        ),
        _PRE,
        ("bad_input/corrupt_payload", "bad_input/wrong_type"),
    ),
    Mutant(
        "not_utf8_default",
        "swallow_exception",
        "a caption that is not UTF-8 becomes ''",
        PAYLOADS,
        (
            Edit(
                "        except UnicodeDecodeError as error:\n",
                "        except UnicodeDecodeError as error:\n            return ''\n",
            ),
        ),
        _PRE,
        ("bad_input/not_utf8",),
    ),
    Mutant(
        "any_error_default",
        "swallow_exception",
        "the preencoded cooker returns a zero sample for any error",
        COOKERS,
        (
            _COOKER_IMPORTS,
            Edit(
                "    return _cook_preencoded(sample, copy=True)\n",
                "    try:\n"
                "        return _cook_preencoded(sample, copy=True)\n"
                "    except Exception:\n"
                "        return DiffusionSample(**basic_sample_keys(sample), latents=torch.zeros(4, 8, 8),\n"
                "            prompt_embeds=torch.zeros(7, 16), pooled_prompt_embeds=torch.zeros(16))\n",
            ),
        ),
        _PRE,
        _BAD_INPUT,
    ),
    Mutant(
        "any_error_skip",
        "swallow_exception",
        "the preencoded cooker turns any error into SkipSample (nothing logged, nothing counted)",
        COOKERS,
        (
            _COOKER_IMPORTS,
            Edit(
                "    return _cook_preencoded(sample, copy=True)\n",
                "    try:\n"
                "        return _cook_preencoded(sample, copy=True)\n"
                "    except Exception:\n"
                "        raise SkipSample()\n",
            ),
        ),
        _PRE,
        _BAD_INPUT,
    ),
    Mutant(
        "wrong_type_coerced",
        "coerce_input",
        "a tensor member holding a dict yields the dict's first tensor",
        PAYLOADS,
        (
            Edit(
                "        return read_tensor(value, copy=copy, fallback=True)\n",
                "        try:\n"
                "            return read_tensor(value, copy=copy, fallback=True)\n"
                "        except TensorFileError:\n"
                "            loaded = torch.load(io.BytesIO(bytes(value)), weights_only=True)\n"
                "            if isinstance(loaded, dict):\n"
                "                return next(v for v in loaded.values() if isinstance(v, torch.Tensor))\n"
                "            raise\n",
            ),
        ),
        _PRE,
        ("bad_input/wrong_type",),
    ),
    Mutant(
        "filter_clean_samples",
        "filter_samples",
        "the preencoded cooker skips every clean sample whose key hashes to 0 mod 5 (SkipSample)",
        COOKERS,
        (
            _COOKER_IMPORTS,
            _before_preencoded_return(
                'if zlib.crc32(sample["__key__"].encode()) % 5 == 0:', "    raise SkipSample()"
            ),
        ),
        _PRE,
        # accepted/loads: "the cooker returns a sample for each clean input"; complete_epoch: the same after it
        ("accepted/loads", "accepted/complete_epoch"),
    ),
    # -- security ----------------------------------------------------------------------------------------------
    Mutant(
        "unsafe_torch_load",
        "unsafe_reader",
        "tensor members are read with torch.load(weights_only=False)",
        PAYLOADS,
        (
            Edit(
                "        return read_tensor(value, copy=copy, fallback=True)\n",
                "        return torch.load(io.BytesIO(bytes(value)), weights_only=False)\n",
            ),
        ),
        _PRE,
        ("bad_input/code_execution",),
    ),
    Mutant(
        "unsafe_torch_load_default",
        "unsafe_reader",
        "tensor members are read with torch.load() leaving weights_only unset (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD "
        "turns it off)",
        PAYLOADS,
        (
            Edit(
                "        return read_tensor(value, copy=copy, fallback=True)\n",
                "        return torch.load(io.BytesIO(bytes(value)))\n",
            ),
        ),
        _PRE,
        ("bad_input/code_execution",),
    ),
    Mutant(
        "unsafe_default_decoder",
        "unsafe_reader",
        "the TaskEncoders' decoder is Energon's SampleDecoder (torch.load with weights_only off)",
        TASK_ENCODERS,
        (
            Edit(
                '        """Always None: members reach the cookers as bytes."""\n        return None\n',
                '        """Always None: members reach the cookers as bytes."""\n'
                "        from megatron.energon import SampleDecoder\n\n"
                '        return SampleDecoder(image_decode="pil")\n',
            ),
        ),
        _ENC,
        ("bad_input/code_execution",),
    ),
    # -- Energon contract: @stateless, dispatch ----------------------------------------------------------------
    Mutant(
        "stateless_removed_cooker",
        "remove_stateless",
        "cook_preencoded_diffusion loses its @stateless",
        COOKERS,
        (Edit("@stateless\ndef cook_preencoded_diffusion(", "def cook_preencoded_diffusion("),),
        _PRE,
        ("accepted/stateless",),
    ),
    Mutant(
        "stateless_removed_batch",
        "remove_stateless",
        "EncodedDiffusionTaskEncoder.batch() loses its @stateless (restore_sample refuses its batches)",
        TASK_ENCODERS,
        (
            Edit(
                "    @stateless\n    def batch(self, samples: list[DiffusionSample])",
                "    def batch(self, samples: list[DiffusionSample])",
            ),
        ),
        _ENC,
        ("resume/restore_sample",),
    ),
    Mutant(
        "cooker_order_swapped",
        "cooker_order",
        "MultiFormatTaskEncoder lists its cookers in the other order",
        TASK_ENCODERS,
        (
            Edit(
                "    cookers = [PREENCODED_ZERO_COPY_COOKER, RAW_COOKER]\n",
                "    cookers = [RAW_COOKER, PREENCODED_ZERO_COPY_COOKER]\n",
            ),
        ),
        _MULTI,
        ("dispatch/first_match",),
    ),
    Mutant(
        "catch_all_cooker_first",
        "cooker_order",
        "MultiFormatTaskEncoder puts a raw cooker without has_subflavors first: it takes every dataset",
        TASK_ENCODERS,
        (
            Edit(
                "    cookers = [PREENCODED_ZERO_COPY_COOKER, RAW_COOKER]\n",
                "    cookers = [Cooker(cook_raw_images), PREENCODED_ZERO_COPY_COOKER]\n",
            ),
        ),
        _MULTI,
        ("dispatch/shadowed", "accepted/loads", "accepted/complete_epoch", "fidelity/cooks"),
    ),
    Mutant(
        "has_subflavors_catch_all",
        "has_subflavors",
        "MultiFormatTaskEncoder's raw cooker has no has_subflavors: data of no known encoding goes to it",
        TASK_ENCODERS,
        (
            Edit(
                "    cookers = [PREENCODED_ZERO_COPY_COOKER, RAW_COOKER]\n",
                "    cookers = [PREENCODED_ZERO_COPY_COOKER, Cooker(cook_raw_images)]\n",
            ),
        ),
        _MULTI,
        ("dispatch/no_match",),
    ),
    Mutant(
        "has_subflavors_wrong_key",
        "has_subflavors",
        "MultiFormatTaskEncoder's preencoded cooker asks for the subflavor 'format' instead of 'encoding'",
        TASK_ENCODERS,
        (
            Edit(
                "    cookers = [PREENCODED_ZERO_COPY_COOKER, RAW_COOKER]\n",
                '    cookers = [Cooker(cook_preencoded_diffusion_zero_copy, has_subflavors={"format": "preencoded"}), '
                "RAW_COOKER]\n",
            ),
        ),
        _MULTI,
        ("accepted/matches", "dispatch/first_match"),
    ),
    # -- batch() ---------------------------------------------------------------------------------------------
    Mutant(
        "batch_drop_last",
        "batch_drop",
        "batch() drops the last sample of every batch of two or more",
        TASK_ENCODERS,
        (
            Edit(
                '    return {\n        "latents": stack_field',
                '    samples = samples[:-1] if len(samples) > 1 else samples\n    return {\n        "latents": stack_field',
            ),
        ),
        _ENC,
        ("batch/rows",),
    ),
    Mutant(
        "batch_repeat_first",
        "batch_repeat",
        "batch() appends a copy of the first sample",
        TASK_ENCODERS,
        (
            Edit(
                '    return {\n        "latents": stack_field',
                '    samples = [*samples, samples[0]]\n    return {\n        "latents": stack_field',
            ),
        ),
        _ENC,
        ("batch/rows",),
    ),
    Mutant(
        "batch_reverse",
        "batch_reorder",
        "batch() reverses the order of its samples (every field alike, keys too: advice, nothing is mixed up)",
        TASK_ENCODERS,
        (
            Edit(
                '    return {\n        "latents": stack_field',
                '    samples = samples[::-1]\n    return {\n        "latents": stack_field',
            ),
        ),
        _ENC,
        ("batch/order",),
    ),
    Mutant(
        "batch_misaligned_caption",
        "batch_reorder",
        "batch() lists the captions in reverse order (rows and captions no longer match)",
        TASK_ENCODERS,
        (Edit('"caption": [s.caption for s in samples],', '"caption": [s.caption for s in samples][::-1],'),),
        _ENC,
        ("batch/rows",),
    ),
    Mutant(
        "batch_first_caption",
        "first_sample_metadata",
        "batch() gives every row the first sample's caption",
        TASK_ENCODERS,
        (
            Edit(
                '"caption": [s.caption for s in samples],', '"caption": [samples[0].caption] * len(samples),'
            ),
        ),
        _ENC,
        ("batch/rows",),
    ),
    Mutant(
        "batch_first_key",
        "first_sample_metadata",
        "batch() gives every row the first sample's __key__",
        TASK_ENCODERS,
        (
            Edit(
                '"__key__": sample_keys(samples),\n        "__restore_key__": (),\n    }\n\n\ndef batch_raw',
                '"__key__": sample_keys(samples[:1]) * len(samples),\n        "__restore_key__": (),\n    }\n\n\ndef batch_raw',
            ),
        ),
        _ENC,
        ("batch/rows",),
    ),
    Mutant(
        "batch_pads_mismatched",
        "pad_mismatched",
        "stack_field zero-pads tensors of different shapes (flattened) into one batch instead of raising",
        BATCHING,
        (
            Edit(
                "    groups: dict[tuple[Any, ...], list[str]] = {}\n",
                "    size = max(v.numel() for v in values)\n"
                "    return torch.stack([torch.nn.functional.pad(v.flatten(), (0, size - v.numel())) for v in values])\n"
                "    groups: dict[tuple[Any, ...], list[str]] = {}\n",
            ),
        ),
        _ENC,
        ("batch/mismatched_shapes",),
    ),
    Mutant(
        "batch_no_group_criterion",
        "mixed_formats",
        "MultiFormatTaskEncoder loses batch_group_criterion: a blend's mixed batches reach batch(), which refuses them",
        TASK_ENCODERS,
        (
            Edit(
                "    def batch_group_criterion(self, sample: Any)",
                "    def _batch_group_criterion(self, sample: Any)",
            ),
        ),
        _MULTI,
        ("batch/mixed_formats_batched",),
    ),
    Mutant(
        "batch_mixed_keeps_first_format",
        "mixed_formats",
        "MultiFormatTaskEncoder loses batch_group_criterion and batch() keeps only the samples of the first "
        "sample's format",
        TASK_ENCODERS,
        (
            Edit(
                "    def batch_group_criterion(self, sample: Any)",
                "    def _batch_group_criterion(self, sample: Any)",
            ),
            Edit(
                "    def batch(self, samples: list[Any]) -> dict[str, Any]:\n        if isinstance(samples[0], DiffusionSample):",
                "    def batch(self, samples: list[Any]) -> dict[str, Any]:\n"
                "        samples = [s for s in samples if type(s) is type(samples[0])]\n"
                "        if isinstance(samples[0], DiffusionSample):",
            ),
        ),
        _MULTI,
        ("batch/mixed_formats",),
    ),
    Mutant(
        "blend_skips_a_source",
        "filter_samples",
        "encode_sample skips half the samples of the blend's second dataset (after the blend)",
        TASK_ENCODERS,
        (
            Edit(
                "    cookers = [PREENCODED_ZERO_COPY_COOKER]\n",
                "    cookers = [PREENCODED_ZERO_COPY_COOKER]\n\n"
                "    @stateless\n"
                "    def encode_sample(self, sample):\n"
                "        import zlib\n"
                "        from megatron.energon import SkipSample\n\n"
                '        if "blend1" in str(sample.__key__) and zlib.crc32(str(sample.__key__).encode()) % 2:\n'
                "            raise SkipSample()\n"
                "        return sample\n",
            ),
        ),
        _ENC,
        ("blend/ratios",),
    ),
    # -- keys ------------------------------------------------------------------------------------------------
    Mutant(
        "key_rewritten",
        "rewrite_key",
        "the raw cooker appends a suffix to __key__",
        COOKERS,
        (
            Edit(
                _RAW_KEYS,
                '        **basic_sample_keys(sample),\n        "__key__": sample["__key__"] + "_",\n        "images"',
            ),
        ),
        _RAW,
        ("keys/key",),
    ),
    Mutant(
        "key_only",
        "drop_field",
        "the raw cooker keeps __key__ but not __restore_key__, __subflavors__ or __sources__",
        COOKERS,
        (Edit(_RAW_KEYS, '        "__key__": sample["__key__"],\n        "images"'),),
        _RAW,
        ("keys/basic_keys", "blend/subflavors"),
    ),
    # -- packing (the zoo's correct first-fit packer) ----------------------------------------------------------
    Mutant(
        "pack_drop_last_group",
        "pack_drop",
        "select_samples_to_pack leaves the last group of every buffer out",
        PACKING,
        (
            Edit(
                "                room.append(self.capacity - length)\n        return bins\n",
                "                room.append(self.capacity - length)\n        return bins[:-1] if len(bins) > 1 else bins\n",
            ),
        ),
        _PACK,
        ("packing/exactly_once",),
    ),
    Mutant(
        "pack_repeat_sample",
        "pack_repeat",
        "select_samples_to_pack puts the first sample into the first group twice",
        PACKING,
        (
            Edit(
                "                room.append(self.capacity - length)\n        return bins\n",
                "                room.append(self.capacity - length)\n        return [bins[0] + bins[0][:1], *bins[1:]]\n",
            ),
        ),
        _PACK,
        ("packing/exactly_once",),
    ),
    Mutant(
        "pack_first_caption",
        "first_sample_metadata",
        "pack_selected_samples gives every sample of a pack the first sample's caption",
        PACKING,
        (
            Edit(
                '            "caption": [s.caption for s in samples],\n        }\n\n    @stateless\n    def batch',
                '            "caption": [samples[0].caption] * len(samples),\n        }\n\n    @stateless\n    def batch',
            ),
        ),
        _PACK,
        ("packing/payload",),
    ),
    Mutant(
        "pack_first_latents",
        "first_sample_metadata",
        "pack_selected_samples stacks the first sample's latents for every sample of a pack",
        PACKING,
        (
            Edit(
                '            "latents": torch.stack([s.latents for s in samples]),\n        ',
                '            "latents": torch.stack([samples[0].latents for s in samples]),\n        ',
            ),
        ),
        _PACK,
        ("packing/payload",),
    ),
    Mutant(
        "pack_truncate_prompts",
        "truncate_tensor",
        "pack_selected_samples drops the last token of the concatenated prompts",
        PACKING,
        (
            Edit(
                '            "prompt_embeds": torch.cat([s.prompt_embeds for s in samples]),\n',
                '            "prompt_embeds": torch.cat([s.prompt_embeds for s in samples])[:-1],\n',
            ),
        ),
        _PACK,
        ("packing/payload",),
    ),
    Mutant(
        "pack_batch_drops_pack",
        "batch_drop",
        "batch() of packs drops the last pack of every batch of two or more",
        PACKING,
        (
            Edit(
                '"packs": list(samples)}',
                '"packs": list(samples)[:-1] if len(samples) > 1 else list(samples)}',
            ),
        ),
        _PACK,
        ("packing/batch_rows",),
    ),
    Mutant(
        "pack_unseeded_order",
        "unseeded_augmentation",
        "select_samples_to_pack shuffles its groups with the OS's randomness",
        PACKING,
        (
            Edit(
                "                room.append(self.capacity - length)\n        return bins\n",
                "                room.append(self.capacity - length)\n        import random\n\n        random.SystemRandom().shuffle(bins)\n        return bins\n",
            ),
        ),
        _PACK,
        ("packing/determinism",),
    ),
    Mutant(
        "pack_hash_order",
        "hash_seeded_augmentation",
        "select_samples_to_pack orders its groups by hash() of their first key (a PYTHONHASHSEED per process)",
        PACKING,
        (
            Edit(
                "                room.append(self.capacity - length)\n        return bins\n",
                "                room.append(self.capacity - length)\n        return sorted(bins, key=lambda b: hash(b[0].__key__))\n",
            ),
        ),
        _PACK,
        ("determinism/fresh_processes",),
    ),
    Mutant(
        "pack_counts_buffers",
        "count_calls",
        "select_samples_to_pack reverses the groups of every other buffer, counted on the instance",
        PACKING,
        (
            Edit(
                "                room.append(self.capacity - length)\n        return bins\n",
                "                room.append(self.capacity - length)\n        self._buffers = getattr(self, '_buffers', 0) + 1\n        return bins[::-1] if self._buffers % 2 else bins\n",
            ),
        ),
        _PACK,
        ("packing/resume",),
    ),
    # -- the dataloader wrapper ---------------------------------------------------------------------------------
    Mutant(
        "wrapper_restore_ignored",
        "wrong_restore",
        "restore_state() does not restore (the wrapped loader starts from its initial state)",
        DATALOADER,
        (Edit("                restore(copy.deepcopy(inner))\n", "                pass\n"),),
        _WRAP,
        ("wrapper/resume",),
    ),
    Mutant(
        "wrapper_restore_initial",
        "wrong_restore",
        "restore_state() restores the initial state (None) instead of the saved one",
        DATALOADER,
        (Edit("                restore(copy.deepcopy(inner))\n", "                restore(None)\n"),),
        _WRAP,
        ("wrapper/resume",),
    ),
    Mutant(
        "wrapper_save_none",
        "wrong_restore",
        "save_state() returns None (every restore goes back to the start)",
        DATALOADER,
        (
            Edit(
                "            return None\n        return pack_state(loader_record(self._dataloader), save())\n",
                "            return None\n        return None\n",
            ),
        ),
        _WRAP,
        ("wrapper/resume",),
    ),
    Mutant(
        "wrapper_restore_consumes_state",
        "wrong_restore",
        "restore_state() hands the caller's state object to the loader (Energon consumes parts of it)",
        DATALOADER,
        (Edit("                restore(copy.deepcopy(inner))\n", "                restore(inner)\n"),),
        _WRAP,
        ("wrapper/restore_twice",),
    ),
    Mutant(
        "wrapper_keeps_running_pass",
        "wrong_restore",
        "restore_state() keeps the running pass (the restore reaches only the next pass)",
        DATALOADER,
        (
            Edit(
                "        self._close_iterator()\n        if restore is None:\n",
                "        if restore is None:\n",
            ),
        ),
        _WRAP,
        ("wrapper/restore_after_batches",),
    ),
    Mutant(
        "wrapper_restore_unchecked",
        "resume_record",
        "restore_state() restores without comparing the saved configuration record (Energon's silent restore)",
        DATALOADER,
        (Edit("            self._check_record(record, allow)\n", "            pass\n"),),
        _WRAP,
        ("restart/world_size",),
    ),
    Mutant(
        "resume_record_ignores_world_size",
        "resume_record",
        "the record comparison leaves out the data-parallel world size",
        RESUME,
        (Edit("    if s_world != c_world:\n", "    if False:\n"),),
        _WRAP,
        ("restart/world_size",),
    ),
    Mutant(
        "resume_record_ignores_shards",
        "resume_record",
        "the record comparison leaves out the shard table (a dataset that grew in place is accepted)",
        RESUME,
        (Edit('        if old["digest"] != new["digest"]:\n', "        if False:\n"),),
        _WRAP,
        ("restart/shards",),
    ),
    Mutant(
        "wrapper_not_cyclic",
        "wrapper_iteration",
        "the wrapper stops after one pass (StopIteration)",
        DATALOADER,
        (Edit("        passes += 1\n", "        return\n"),),
        _WRAP,
        ("wrapper/cyclic",),
    ),
    Mutant(
        "wrapper_spins_on_empty",
        "wrapper_iteration",
        "the wrapper never checks that a pass produced anything (an empty loader spins forever)",
        DATALOADER,
        (
            Edit(
                "        if not produced:\n            raise EmptyDataloaderError(_empty_message(iterable, passes))\n",
                "",
            ),
        ),
        _WRAP,
        ("wrapper/empty", "wrapper/exhausted"),
    ),
    Mutant(
        "wrapper_alias_silent",
        "wrapper_alias",
        "the deprecated alias EnergonDataloader no longer warns",
        DATALOADER,
        (
            Edit(
                '        warnings.warn(\n            "EnergonDataloader is deprecated',
                '        (lambda *a, **k: None)(\n            "EnergonDataloader is deprecated',
            ),
        ),
        _WRAP,
        ("wrapper/deprecated_alias",),
    ),
)


def operators() -> list[str]:
    """The operator names, in the order their first mutant appears."""
    return list(dict.fromkeys(m.operator for m in MUTANTS))


def select(
    operators_wanted: list[str] | None = None, mutants_wanted: list[str] | None = None
) -> list[Mutant]:
    """The mutants of the given operators and/or ids (all when neither is given). Raises ``ValueError``
    naming an unknown operator or id."""
    known_ops, known_ids = set(operators()), {m.id for m in MUTANTS}
    unknown = [o for o in operators_wanted or [] if o not in known_ops]
    unknown += [i for i in mutants_wanted or [] if i not in known_ids]
    if unknown:
        raise ValueError(
            f"unknown operator or mutant: {', '.join(unknown)} (see `python -m benchmarks.mutation --list`)"
        )
    if not operators_wanted and not mutants_wanted:
        return list(MUTANTS)
    return [m for m in MUTANTS if m.operator in (operators_wanted or []) or m.id in (mutants_wanted or [])]
