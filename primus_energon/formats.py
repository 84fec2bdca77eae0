"""The data formats, in one place: member kinds, the built-in formats, the size presets, and how Energon
names members. Import-light (no torch, no Energon): the cookers, validate, the generator, the conformance
suite and the benchmarks all read it.

**Member names.** A tar entry ``<key>.<member>`` is split by Energon at the first dot of its base name
(``megatron/energon/flavors/webdataset/config.py``): ``s_000001.latents.pth`` is sample ``s_000001``,
member ``latents.pth``; NeMo's ``000001..pth`` is sample ``000001``, member ``.pth`` (a leading dot
included). The crude sample dict Energon hands a cooker is keyed by exactly these member names.

**Kinds.** What a member holds, from its last extension (:func:`member_kind`): ``tensor`` (``torch.save``),
``text`` (UTF-8), ``json``, ``image`` (encoded with Pillow), ``npy``, ``pickle`` (a pickled structure,
read with :func:`primus_energon.safepickle.safe_loads`) or ``bytes`` (anything else, e.g. raw tensor bytes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "MEMBER_NAME",
    "split_member_name",
    "member_extension",
    "member_stem",
    "KINDS",
    "EXTENSION_KINDS",
    "IMAGE_EXTENSIONS",
    "member_kind",
    "sniff_kind",
    "SIZES",
    "SIZE_DTYPES",
    "PREENCODED_TENSOR_MEMBERS",
    "PREENCODED_CAPTION_MEMBER",
    "RAW_IMAGE_MEMBERS",
    "RAW_TEXT_MEMBER",
    "BUILTIN_ENCODINGS",
    "REQUIRED_KINDS",
    "is_required_member",
]

#: Energon's split of a tar entry name into (key, member): the key ends at the first dot of the base name.
MEMBER_NAME = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def split_member_name(name: str) -> tuple[str, str] | None:
    """``"s_01.latents.pth"`` -> ``("s_01", "latents.pth")``, ``"000001..pth"`` -> ``("000001", ".pth")``;
    None for a name Energon does not read as a sample member (no dot in the base name)."""
    match = MEMBER_NAME.match(name)
    return (match.group(1), match.group(2)) if match else None


def member_extension(member: str) -> str:
    """``"latents.pth"`` -> ``"pth"``, ``".pickle"`` -> ``"pickle"``, ``"jpg"`` -> ``"jpg"``."""
    return member.rsplit(".", 1)[-1].lower()


def member_stem(member: str) -> str:
    """``"latents.pth"`` -> ``"latents"``; ``"jpg"`` -> ``"jpg"``; ``".pth"`` -> ``""``."""
    return member.split(".", 1)[0]


KINDS: tuple[str, ...] = ("tensor", "text", "json", "image", "npy", "pickle", "bytes")
IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"})
#: extension -> kind (webdataset's handler names; anything else is ``bytes``)
EXTENSION_KINDS: Mapping[str, str] = MappingProxyType(
    {
        "pth": "tensor",
        "pt": "tensor",
        "txt": "text",
        "text": "text",
        "json": "json",
        "jsn": "json",
        "npy": "npy",
        "pickle": "pickle",
        "pkl": "pickle",
        "pyd": "pickle",
        **{extension: "image" for extension in IMAGE_EXTENSIONS},
    }
)


def member_kind(member: str) -> str:
    """The kind of ``member`` from its last extension; ``images`` (the member name of raw images written without an extension) is an image."""
    if member.lower() == "images":
        return "image"
    return EXTENSION_KINDS.get(member_extension(member), "bytes")


#: ``torch.save``'s legacy (pre-zip) files start with a pickled magic number (protocol 2, a LONG1 of 10 bytes)
_LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."
#: how many leading bytes :func:`sniff_kind` reads (enough for every signature it knows)
SNIFF_BYTES = 512


def sniff_kind(data: bytes | bytearray | memoryview) -> tuple[str, str | None] | None:
    """What a member's bytes look like, from their first :data:`SNIFF_BYTES` bytes alone: ``(kind,
    detail)`` with ``kind`` one of :data:`KINDS` and ``detail`` the image format (``jpeg``, ``png``,
    ``webp``, ``gif``) or None; None when no signature matches.

    Specific signatures are tried before generic ones: ``.npy``; ``torch.save``'s zip (a zip whose first
    entry is ``<archive>/data.pkl``) before any other zip (``bytes``); the legacy ``torch.save`` file
    before any other pickle; images; a JSON object, array or string; UTF-8 text. A signature is a guess:
    a caller confirms it by decoding the member (and treats a member that fails to decode as opaque
    bytes). Nothing here decodes or unpickles anything."""
    head = bytes(data[:SNIFF_BYTES])
    if head.startswith(b"\x93NUMPY"):
        return "npy", None
    if head.startswith(b"PK\x03\x04"):
        name_length = int.from_bytes(head[26:28], "little")
        first_entry = head[30 : 30 + name_length]
        return ("tensor" if first_entry.endswith(b"data.pkl") else "bytes"), None
    if head.startswith(_LEGACY_TORCH_MAGIC):
        return "tensor", None
    if len(head) > 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle", None
    if head.startswith(b"\xff\xd8\xff"):
        return "image", "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image", "png"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image", "gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image", "webp"
    try:
        text = bytes(data).decode("utf-8") if len(data) <= 1 << 20 else head.decode("utf-8", "ignore")
    except UnicodeDecodeError:
        return None
    if "\x00" in text:
        return None
    if text.lstrip()[:1] in ("{", "[", '"'):
        return "json", None
    printable = sum(ch.isprintable() or ch in "\n\r\t" for ch in text[:SNIFF_BYTES])
    if text and printable >= 0.9 * min(len(text), SNIFF_BYTES):
        return "text", None
    return None


#: Tensor shapes of the preencoded format by size: ``tiny`` for checks and tests, ``small`` and ``flux``
#: for benchmarks (FLUX-sized: 16-channel latents of a 512x512 image, T5 [512, 4096], CLIP [768]),
#: ``guide`` a 256x256 image's preencoded sizes (64-channel VAE latents, T5-XXL prompt and CLIP pooled embeddings).
SIZES: Mapping[str, Mapping[str, tuple[int, ...]]] = MappingProxyType(
    {
        "tiny": {"latents": (4, 8, 8), "prompt_embeds": (7, 16), "pooled_prompt_embeds": (16,)},
        "small": {"latents": (16, 32, 32), "prompt_embeds": (77, 256), "pooled_prompt_embeds": (768,)},
        "guide": {"latents": (64, 32, 32), "prompt_embeds": (77, 4096), "pooled_prompt_embeds": (768,)},
        "flux": {"latents": (16, 64, 64), "prompt_embeds": (512, 4096), "pooled_prompt_embeds": (768,)},
    }
)
#: The dtype each size is written in.
SIZE_DTYPES: Mapping[str, str] = MappingProxyType(
    {"tiny": "float32", "small": "float32", "guide": "float32", "flux": "bfloat16"}
)

#: The preencoded format: DiffusionSample field -> tar member it is read from (all required).
PREENCODED_TENSOR_MEMBERS: Mapping[str, str] = MappingProxyType(
    {
        "latents": "latents.pth",
        "prompt_embeds": "prompt_embeds.pth",
        "pooled_prompt_embeds": "pooled_prompt_embeds.pth",
    }
)
#: The optional caption member of a preencoded sample.
PREENCODED_CAPTION_MEMBER = "caption.txt"
#: The raw format: members that may hold the image, in the order they are looked up.
RAW_IMAGE_MEMBERS: tuple[str, ...] = ("images", "jpg", "jpeg", "png", "webp")
#: The caption member of a raw sample.
RAW_TEXT_MEMBER = "txt"
#: The formats a dataset.yaml ``subflavors: {encoding: ...}`` names and the reference cookers read.
BUILTIN_ENCODINGS: tuple[str, ...] = ("preencoded", "raw")

#: The kinds of member that carry the training data of a built-in format: its tensors and images,
#: and in the raw format the caption too (the only conditioning there: the text encoder reads it). A
#: caption next to precomputed embeddings (preencoded) is provenance, optional.
REQUIRED_KINDS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "preencoded": frozenset({"tensor", "image", "npy"}),
        "raw": frozenset({"tensor", "image", "npy", "text"}),
    }
)


def is_required_member(
    member: str,
    *,
    encoding: str | None,
    kind: str,
    listed_required: tuple[str, ...] | frozenset[str] = (),
    names_field: bool = False,
) -> bool:
    """The one definition of required data, used by every check and tool: a member whose loss (in a
    cooked sample, a pack or a batch) is lost training data rather than a dropped sidecar. Required are
    the members a schema lists under ``required:``, a member whose output field the schema names
    (``field:``), the tensor and image members of the built-in formats and the raw format's caption
    (``kind`` as :func:`member_kind` or the schema says, with raw tensor bytes as ``tensor``; see
    :data:`REQUIRED_KINDS`). Everything else, a caption next to precomputed embeddings included, is
    optional unless a schema says otherwise."""
    if names_field or member in listed_required:
        return True
    return kind in REQUIRED_KINDS.get(encoding or "", frozenset())
