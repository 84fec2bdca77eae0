"""Readers of ``.npy`` and JSON members that check what a header or the nesting declares before they work.

* `read_npy`: the array of a ``.npy`` file, read in place (a view of the bytes). The header is parsed and
  its shape and dtype are checked against the bytes that follow it before anything is allocated (``np.load``
  allocates the declared shape first: a 100-byte file declaring ``(10**11, 1000)`` asks for 800 TB).
  Object dtypes are refused (they are unpickled). Equal to ``np.load(BytesIO(data), allow_pickle=False)``
  on well-formed files: dtype, shape, memory order and values.
* `json_depth` / `loads_json`: JSON nesting is measured by a linear scan (no recursion) and at most
  `MAX_JSON_DEPTH` levels are parsed (Python's parser recurses once per level and raises RecursionError
  near 1000).

Everything malformed raises ValueError (`JsonDepthError` for too deep a document).
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

import numpy as np

__all__ = ["MAX_JSON_DEPTH", "JsonDepthError", "json_depth", "loads_json", "read_npy"]

#: deepest JSON nesting read (Python's parser recurses once per level, and stops near 1000)
MAX_JSON_DEPTH = 256


class JsonDepthError(ValueError):
    """A JSON document nested deeper than `MAX_JSON_DEPTH`."""


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(data: bytes) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text `data` (strings skipped), in linear time and
    without recursion; for malformed text an estimate that the parser then rejects."""
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int64)
    return int(np.cumsum(steps).max())


def loads_json(data: bytes | str) -> Any:
    """``json.loads(data)`` for documents nested at most `MAX_JSON_DEPTH` levels (else `JsonDepthError`)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise JsonDepthError(
            f"the JSON document nests {depth} levels deep, more than the {MAX_JSON_DEPTH}-level budget"
        )
    return json.loads(data)


def read_npy(data: bytes | memoryview) -> Any:
    """The array of a ``.npy`` member, read in place: the header is parsed, its shape and dtype checked
    against the bytes that follow it before anything is allocated. Raises ValueError (``allow_pickle`` in
    the text for object dtypes) for anything else."""
    view = memoryview(data).cast("B")
    stream = io.BytesIO(view[: 65536 + 16])  # the header: at most numpy's 10000-byte default limit, + magic
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise ValueError(f"unsupported .npy version {version}")
    if dtype.hasobject:
        raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
    count = 1
    for d in shape:
        count *= d
    need = count * dtype.itemsize
    offset = stream.tell()
    have = len(view) - offset
    if have < need:
        raise ValueError(
            f"the header declares shape {list(shape)[:8]} of {dtype} ({need} bytes), but {have} bytes follow it"
        )
    if dtype.itemsize == 0:
        return np.zeros(shape, dtype=dtype)
    flat = np.frombuffer(view, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)
