"""A safe replacement for Energon's ``SampleDecoder``, for TaskEncoders that want decoded members.

Energon's default decoder hands ``.pth`` members to ``torch.load`` with ``weights_only`` off and ``.pickle``/
``.pyd`` members to ``pickle.loads``, so a shard can run code. :class:`SafeSampleDecoder` decodes the same
member kinds without ever unpickling objects: tensors through :func:`~primus_energon.tensorfile.read_tensor`
(one plain tensor, else refused), text as strict UTF-8, JSON, integers, ``.npy`` without pickles, images with Pillow,
and pickle members through :func:`~primus_energon.safepickle.safe_loads`: plain structures of containers,
numbers, text, tensors and numpy arrays load, anything else is refused before it runs. Anything else stays
bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import webdataset

from .boundedread import loads_json, read_npy
from .energon_compat import SampleDecoderBase
from .safepickle import UnsafePickleError, safe_loads
from .tensorfile import read_tensor

__all__ = ["SafeSampleDecoder", "UnsafeMemberError"]


class UnsafeMemberError(ValueError):
    """A member that decodes only by unpickling something other than plain data (it could run code)."""


def _tensor(data: bytes) -> torch.Tensor:
    return read_tensor(data, copy=True, fallback=True)


def _pickle(data: bytes) -> Any:
    try:
        return safe_loads(data)
    except UnsafePickleError as error:
        raise UnsafeMemberError(f"pickle member refused: {error}") from None


_HANDLERS: dict[str, Callable[[bytes], Any]] = {
    "pth": _tensor,
    "pt": _tensor,
    "txt": lambda data: data.decode("utf-8"),
    "text": lambda data: data.decode("utf-8"),
    "json": loads_json,
    "jsn": loads_json,
    "cls": int,
    "cls2": int,
    "class": int,
    "count": int,
    "index": int,
    "inx": int,
    "id": int,
    "npy": lambda data: read_npy(data).copy(order="K"),  # np.load's result, its size checked first
    "pickle": _pickle,
    "pyd": _pickle,
}


def _safe_basic_handler(key: str, data: bytes) -> Any:
    extension = key.rsplit(".", 1)[-1].lower()
    handler = _HANDLERS.get(extension)
    return None if handler is None else handler(data)


class SafeSampleDecoder(SampleDecoderBase):
    """``SampleDecoder`` that never unpickles: tensors, text, JSON, ints, ``.npy``, images.

    ``image_decode`` takes webdataset's image specs (``"pil"``, ``"torchrgb"``, ``"rgb8"``, ...). On
    Energon 7.x it is a ``SampleDecoder`` (set it as a TaskEncoder's ``decoder``); on 5.x/6.x, which decode
    in the dataset, a TaskEncoder declaring it as its ``decoder`` has its datasets read through it by
    :func:`primus_energon.energon_compat.get_train_dataset` (so by :func:`primus_energon.get_loader`).
    """

    def __init__(self, *, image_decode: str = "pil") -> None:
        # Deliberately not SampleDecoder.__init__ (7.x): it installs webdataset's default post-handlers, whose
        # `.pth` and `.pickle` entries unpickle arbitrary objects. Our handlers replace them (post=[]).
        self._config = dict(image_decode=image_decode, safe=True)
        self._decoder = webdataset.autodecode.Decoder(
            [_safe_basic_handler, webdataset.autodecode.imagehandler(image_decode)], post=[]
        )
