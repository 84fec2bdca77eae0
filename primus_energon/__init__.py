"""primus-energon: reference cookers, TaskEncoders and loaders for diffusion training on Megatron-Energon.

Everything public is importable from here::

    from primus_energon import EncodedDiffusionTaskEncoder, get_loader

    loader = get_loader("/data/laion_preencoded", EncodedDiffusionTaskEncoder, batch_size=8, num_workers=4)
    batch = next(loader)            # {"latents": [8, C, H, W], "prompt_embeds": ..., ...}
    state = loader.save_state()     # checkpoint with the model; restore_state(state) to resume

Importing the package loads nothing heavy: each name loads its module (and torch, Energon) on first use.

Dataset tools (finalize, validate, info, preview; also the ``primus-energon`` command) live in
:mod:`primus_energon.datasets`.
"""

from __future__ import annotations

from importlib import metadata as _metadata
from typing import TYPE_CHECKING

from ._lazy import lazy_exports

try:  # the installed distribution's version (pyproject.toml), as --version and the reports show it
    __version__ = _metadata.version("primus-energon")
except _metadata.PackageNotFoundError:  # an uninstalled source tree
    __version__ = "0+unknown"

__all__ = [
    "DiffusionSample",
    "cook_preencoded_diffusion",
    "cook_preencoded_diffusion_zero_copy",
    "cook_raw_images",
    "PREENCODED_TENSOR_MEMBERS",
    "PREENCODED_CAPTION_MEMBER",
    "RAW_IMAGE_MEMBERS",
    "RAW_TEXT_MEMBER",
    "SafeDecodingTaskEncoder",
    "EncodedDiffusionTaskEncoder",
    "RawDiffusionTaskEncoder",
    "MultiFormatTaskEncoder",
    "PREENCODED_COOKER",
    "PREENCODED_ZERO_COPY_COOKER",
    "RAW_COOKER",
    "REFERENCE_COOKERS",
    "batch_preencoded",
    "batch_raw",
    "stack_field",
    "sample_keys",
    "MegatronDataloaderWrapper",
    "EnergonDataloader",
    "cyclic_iter",
    "get_loader",
    "resolve_rank",
    "ResumeMismatchError",
    "ResumeUncheckedWarning",
    "ResumeChangeWarning",
    "load_tensor",
    "read_tensor",
    "TensorFileError",
    "safe_loads",
    "UnsafePickleError",
    "PickleFormatError",
    "SafeSampleDecoder",
    "UnsafeMemberError",
    "decode_text",
    "load_image",
    "SampleError",
    "MissingMemberError",
    "PayloadDecodeError",
    "CaptionDecodeError",
    "BatchError",
    "BatchShapeError",
    "EmptyDataloaderError",
    "__version__",
]

#: The public names of each submodule; its module is imported on first use (see :mod:`primus_energon._lazy`).
_EXPORTS = {
    "batching": ("sample_keys", "stack_field"),
    "cookers": (
        "PREENCODED_CAPTION_MEMBER",
        "PREENCODED_TENSOR_MEMBERS",
        "RAW_IMAGE_MEMBERS",
        "RAW_TEXT_MEMBER",
        "cook_preencoded_diffusion",
        "cook_preencoded_diffusion_zero_copy",
        "cook_raw_images",
    ),
    "dataloader": ("EnergonDataloader", "MegatronDataloaderWrapper", "cyclic_iter"),
    "decoding": ("SafeSampleDecoder", "UnsafeMemberError"),
    "errors": (
        "BatchError",
        "BatchShapeError",
        "CaptionDecodeError",
        "EmptyDataloaderError",
        "MissingMemberError",
        "PayloadDecodeError",
        "SampleError",
    ),
    "loader": ("get_loader", "resolve_rank"),
    "payloads": ("decode_text", "load_image", "load_tensor"),
    "resume": ("ResumeChangeWarning", "ResumeMismatchError", "ResumeUncheckedWarning"),
    "safepickle": ("PickleFormatError", "UnsafePickleError", "safe_loads"),
    "sample": ("DiffusionSample",),
    "task_encoders": (
        "PREENCODED_COOKER",
        "PREENCODED_ZERO_COPY_COOKER",
        "RAW_COOKER",
        "REFERENCE_COOKERS",
        "EncodedDiffusionTaskEncoder",
        "MultiFormatTaskEncoder",
        "RawDiffusionTaskEncoder",
        "SafeDecodingTaskEncoder",
        "batch_preencoded",
        "batch_raw",
    ),
    "tensorfile": ("TensorFileError", "read_tensor"),
}

if TYPE_CHECKING:
    from .batching import sample_keys, stack_field
    from .cookers import (
        PREENCODED_CAPTION_MEMBER,
        PREENCODED_TENSOR_MEMBERS,
        RAW_IMAGE_MEMBERS,
        RAW_TEXT_MEMBER,
        cook_preencoded_diffusion,
        cook_preencoded_diffusion_zero_copy,
        cook_raw_images,
    )
    from .dataloader import EnergonDataloader, MegatronDataloaderWrapper, cyclic_iter
    from .decoding import SafeSampleDecoder, UnsafeMemberError
    from .errors import (
        BatchError,
        BatchShapeError,
        CaptionDecodeError,
        EmptyDataloaderError,
        MissingMemberError,
        PayloadDecodeError,
        SampleError,
    )
    from .loader import get_loader, resolve_rank
    from .payloads import decode_text, load_image, load_tensor
    from .resume import ResumeChangeWarning, ResumeMismatchError, ResumeUncheckedWarning
    from .safepickle import PickleFormatError, UnsafePickleError, safe_loads
    from .sample import DiffusionSample
    from .task_encoders import (
        PREENCODED_COOKER,
        PREENCODED_ZERO_COPY_COOKER,
        RAW_COOKER,
        REFERENCE_COOKERS,
        EncodedDiffusionTaskEncoder,
        MultiFormatTaskEncoder,
        RawDiffusionTaskEncoder,
        SafeDecodingTaskEncoder,
        batch_preencoded,
        batch_raw,
    )
    from .tensorfile import TensorFileError, read_tensor

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
