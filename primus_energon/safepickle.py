"""A reader for pickled members (``.pickle``, ``.pyd``) that never runs code from the data.

Real datasets pickle plain structures: DFM's FLUX prepare script writes ``pickle.dumps({"prompt_embeds":
tensor, "pooled_prompt_embeds": tensor})``, NeMo's writes a pickled numpy array. :func:`safe_loads` reads
exactly such structures, equal to ``pickle.loads`` on them, and refuses everything else:

* **What it builds**: ``dict``, ``list``, ``tuple``, ``set``, ``frozenset``, ``collections.OrderedDict``,
  ``str``, ``bytes``, ``bytearray``, ``int``, ``float``, ``complex``, ``bool``, ``None``; plain dense
  torch tensors (``requires_grad`` is dropped, as :func:`~primus_energon.tensorfile.read_tensor` does);
  numpy arrays and scalars of non-object dtypes.
* **How**: Python's own unpickler with ``find_class`` restricted to an allow-list (the mechanism the
  :mod:`pickle` documentation recommends under "Restricting Globals"). An allowed global is never the
  real callable where that could run code: torch's ``_load_from_bytes`` (which calls ``torch.load`` with
  ``weights_only`` off) is replaced by a reader of the storage archive with
  ``torch.load(weights_only=True)``, numpy's reconstructors refuse object dtypes, ``_codecs.encode`` only
  encodes text to latin-1 bytes. Every other global (``os.system``, ``builtins.exec``, any class of the
  caller's program) is refused with :class:`UnsafePickleError`, before anything is called. Persistent ids
  and out-of-band buffers are refused too.
* **Then**: the result is walked, and anything outside the list above (an object array, a tensor
  subclass, a ``Parameter``) is refused.
* **Bounded work**: before anything is built, the opcode stream is scanned (:mod:`pickletools`, which
  reads declared lengths against the bytes that are there): a pickle longer than :data:`MAX_BYTES`, with
  more than 8 x :data:`MAX_OBJECTS` opcodes, or whose counted string/bytes opcode declares more bytes than the
  pickle holds is refused before the unpickler allocates it. The walk then visits each object once (shared
  references, ``a = [a, a]`` forty times, cost one visit each, not 2^40), at most :data:`MAX_OBJECTS`
  objects, :data:`MAX_DEPTH` levels and :data:`MAX_BYTES` bytes of text, bytes and array data; a numpy
  array declaring more than :data:`MAX_BYTES` is refused before it is allocated. Past a budget,
  :class:`PickleLimitError` (a :class:`PickleFormatError`) names the budget.

Malformed or truncated bytes raise :class:`PickleFormatError`; both errors are ``ValueError``.
"""

from __future__ import annotations

import collections
import functools
import io
import pickle
import pickletools
import struct
import warnings
from typing import Any

import numpy as np
import torch

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_OBJECTS",
    "PickleFormatError",
    "PickleLimitError",
    "UnsafePickleError",
    "describe_structure",
    "safe_loads",
]

#: deepest nesting of containers accepted (a pickle can nest deeper than Python's recursion allows)
MAX_DEPTH = 64
#: most objects (opcodes of the pickle, distinct objects of the result) accepted
MAX_OBJECTS = 1_000_000
#: most bytes accepted: the pickle's length, and the text, bytes and array data of the result
MAX_BYTES = 4 << 30
_MAX_DEPTH = MAX_DEPTH  # the name older code imported


class UnsafePickleError(ValueError):
    """A pickle that references something :func:`safe_loads` does not build (it could run code)."""


class PickleFormatError(ValueError):
    """Bytes that are not a complete, well-formed pickle."""


class PickleLimitError(PickleFormatError):
    """A pickle past one of :func:`safe_loads`' budgets; `limit` is ``"objects"``, ``"depth"`` or
    ``"bytes"``, `budget` the budget that was exceeded."""

    def __init__(self, message: str, *, limit: str, budget: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.budget = budget


def _load_storage(data: bytes) -> Any:
    """``torch.storage._load_from_bytes`` without its ``torch.load(weights_only=False)``: the bytes are a
    ``torch.save`` archive of one storage, read with torch's restricted unpickler."""
    if not isinstance(data, (bytes, bytearray)):
        raise UnsafePickleError("a tensor storage that is not bytes")
    try:
        with warnings.catch_warnings():  # torch warns about old protocols it reads fine
            warnings.simplefilter("ignore", UserWarning)
            storage = torch.load(io.BytesIO(bytes(data)), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise UnsafePickleError(f"a tensor storage whose archive is not plain data: {error}") from None
    except Exception as error:  # torch raises many kinds for a corrupt archive
        raise PickleFormatError(
            f"a tensor storage archive is malformed: {type(error).__name__}: {error}"
        ) from None
    if not isinstance(storage, (torch.UntypedStorage, torch.TypedStorage)):
        raise UnsafePickleError(f"a tensor storage archive that holds a {type(storage).__name__}")
    return storage


def _rebuild_tensor(
    storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any, *rest: Any
) -> torch.Tensor:
    """``torch._utils._rebuild_tensor_v2`` for a storage this module loaded; torch checks the view."""
    if not isinstance(storage, (torch.UntypedStorage, torch.TypedStorage)):
        raise UnsafePickleError(f"a tensor rebuilt on a {type(storage).__name__}, not a storage")
    if not (isinstance(offset, int) and isinstance(size, tuple) and isinstance(stride, tuple)):
        raise PickleFormatError("a tensor rebuilt with a malformed offset, size or stride")
    if hooks not in (None,) and not (isinstance(hooks, collections.OrderedDict) and not hooks):
        raise UnsafePickleError("a tensor with backward hooks")
    if len(rest) > 1 or (rest and rest[0] not in (None, {}) and not isinstance(rest[0], dict)):
        raise PickleFormatError("a tensor rebuilt with unexpected arguments")
    try:
        tensor = torch._utils._rebuild_tensor_v2(
            storage, offset, size, stride, False, collections.OrderedDict()
        )
    except (RuntimeError, ValueError, TypeError) as error:
        raise PickleFormatError(f"a tensor view that does not fit its storage: {error}") from None
    return tensor


def _checked_dtype(dtype: np.dtype, where: str) -> np.dtype:
    if dtype.hasobject:
        raise UnsafePickleError(
            f"a numpy {where} of dtype {dtype} (object dtypes are built by unpickling code)"
        )
    return dtype


def _dtype(*args: Any) -> np.dtype:
    """``numpy.dtype(...)`` as pickles call it (``numpy.dtype("f4", False, True)``), no object dtypes."""
    try:
        dtype = np.dtype(*args)
    except (TypeError, ValueError) as error:
        raise PickleFormatError(f"a malformed numpy dtype: {error}") from None
    return _checked_dtype(dtype, "dtype")


def _reconstruct(subtype: Any, shape: Any, typecode: Any, *, max_bytes: int = MAX_BYTES) -> np.ndarray:
    """``numpy.core.multiarray._reconstruct`` for plain ndarrays only (the state arrives by BUILD)."""
    if subtype is not np.ndarray:
        raise UnsafePickleError(f"a numpy array of the subclass {getattr(subtype, '__name__', subtype)!r}")
    dtype = _dtype(typecode)
    _check_array_bytes(shape, dtype, max_bytes)
    return np.ndarray.__new__(np.ndarray, shape, dtype)


def _check_array_bytes(shape: Any, dtype: np.dtype, max_bytes: int) -> None:
    """Refuse a declared array shape whose bytes exceed `max_bytes`, before it is allocated."""
    dims = (shape,) if isinstance(shape, int) else shape
    if not isinstance(dims, tuple) or not all(isinstance(d, int) and d >= 0 for d in dims):
        raise PickleFormatError(f"a numpy array with a malformed shape {str(shape)[:80]}")
    nbytes = dtype.itemsize
    for d in dims:
        nbytes *= d
    if nbytes > max_bytes:
        raise PickleLimitError(
            f"a numpy array declares shape {list(dims)[:8]} of {dtype} ({nbytes} bytes), more than the "
            f"{max_bytes}-byte budget",
            limit="bytes",
            budget=max_bytes,
        )


def _scalar(dtype: Any, data: Any = None) -> Any:
    """``numpy.core.multiarray.scalar`` for non-object dtypes."""
    if not isinstance(dtype, np.dtype):
        raise PickleFormatError("a numpy scalar without a dtype")
    _checked_dtype(dtype, "scalar")
    if not isinstance(data, (bytes, bytearray)) or len(data) != dtype.itemsize:
        raise PickleFormatError(f"a numpy {dtype} scalar whose data is not {dtype.itemsize} bytes")
    return np.frombuffer(bytes(data), dtype=dtype)[0]


def _frombuffer(buffer: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    """``numpy.core.numeric._frombuffer`` (protocol 5 pickles) for non-object dtypes."""
    if not isinstance(dtype, np.dtype):
        raise PickleFormatError("a numpy buffer without a dtype")
    _checked_dtype(dtype, "array")
    try:
        array = np.frombuffer(memoryview(buffer), dtype=dtype).reshape(shape, order=order).copy(order="K")
    except (TypeError, ValueError) as error:
        raise PickleFormatError(f"a numpy buffer that does not fit its shape: {error}") from None
    return array


def _encode(text: Any, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode``, which protocol 2 uses for ``bytes`` (``encode(text, "latin1")``)."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8", "ascii"):
        raise UnsafePickleError(f"_codecs.encode used with {type(text).__name__} and {encoding!r}")
    return text.encode(encoding)


def _bytes_like(kind: type) -> Any:
    """``bytes(...)``/``bytearray(...)`` as protocols 0-2 call them (from text and an encoding, or a list of
    ints), but never ``bytes(n)``: a huge n is an allocation the data could ask for."""

    def build(*args: Any) -> Any:
        if args and isinstance(args[0], int):
            raise UnsafePickleError(f"{kind.__name__}(n) allocates n bytes; a pickle of data never needs it")
        try:
            return kind(*args)
        except (TypeError, ValueError, LookupError) as error:
            raise PickleFormatError(f"a malformed {kind.__name__}: {error}") from None

    return build


def _torch_size(*args: Any) -> tuple:
    """``torch.Size(...)`` as a plain tuple of ints."""
    return tuple(torch.Size(*args))


_NUMPY_CORE = ("numpy.core.multiarray", "numpy._core.multiarray")
_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    **{(module, "set"): set for module in ("builtins", "__builtin__")},
    **{(module, "frozenset"): frozenset for module in ("builtins", "__builtin__")},
    **{(module, "complex"): complex for module in ("builtins", "__builtin__")},
    **{(module, "bytes"): _bytes_like(bytes) for module in ("builtins", "__builtin__")},
    **{(module, "bytearray"): _bytes_like(bytearray) for module in ("builtins", "__builtin__")},
    ("_codecs", "encode"): _encode,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch.storage", "_load_from_bytes"): _load_storage,
    ("torch", "Size"): _torch_size,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _dtype,
    **{(module, "_reconstruct"): _reconstruct for module in _NUMPY_CORE},
    **{(module, "scalar"): _scalar for module in _NUMPY_CORE},
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
}


class _RestrictedUnpickler(pickle.Unpickler):
    max_bytes = MAX_BYTES

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is _reconstruct:
            return functools.partial(_reconstruct, max_bytes=self.max_bytes)
        if allowed is None:
            shown = f"{module}.{name}"
            raise UnsafePickleError(
                f"the pickle references {shown[:120]}, which is not plain data (containers, numbers, text, "
                "tensors, numpy arrays); it is not loaded"
            )
        return allowed

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("the pickle uses persistent ids (an external reference), which are refused")


_LEAF_TYPES = (str, bytes, bytearray, int, float, complex, bool, type(None))


def _validate(
    value: Any, *, max_depth: int = MAX_DEPTH, max_objects: int = MAX_OBJECTS, max_bytes: int = MAX_BYTES
) -> None:
    """Walk `value` once per distinct object (iteratively, so no recursion limit), refusing what is not
    plain data and stopping past the depth, object and byte budgets."""
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(value, 0)]
    objects = 0
    nbytes = 0
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind in (bool, int, float, complex, type(None)):
            continue
        ident = id(item)
        if ident in seen:
            continue
        seen.add(ident)
        objects += 1
        if objects > max_objects:
            raise PickleLimitError(
                f"the structure holds more than {max_objects} objects", limit="objects", budget=max_objects
            )
        if kind in (str, bytes, bytearray):
            nbytes += len(item)
        elif kind in (dict, collections.OrderedDict, list, tuple, set, frozenset):
            if depth >= max_depth:
                raise PickleLimitError(
                    f"the structure nests deeper than {max_depth} levels", limit="depth", budget=max_depth
                )
            if kind in (dict, collections.OrderedDict):
                for key, child in item.items():
                    stack.append((key, depth + 1))
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
            if len(stack) > max_objects:
                raise PickleLimitError(
                    f"the structure holds more than {max_objects} objects",
                    limit="objects",
                    budget=max_objects,
                )
        elif kind is torch.Tensor:
            if item.layout is not torch.strided or item.is_quantized or item.is_nested:
                raise UnsafePickleError(f"a {item.layout} tensor, not a plain dense one")
            nbytes += item.untyped_storage().nbytes()
        elif kind is np.ndarray:
            _checked_dtype(item.dtype, "array")
            nbytes += item.nbytes
        elif isinstance(item, np.generic) and not isinstance(item, np.object_):
            continue
        else:
            raise UnsafePickleError(
                f"the structure holds a {kind.__module__}.{kind.__qualname__}, which is not plain data"
            )
        if nbytes > max_bytes:
            raise PickleLimitError(
                f"the structure holds more than {max_bytes} bytes of data", limit="bytes", budget=max_bytes
            )


#: opcodes allowed per object of the objects budget (a container costs a few: build, memoize, append)
_OPCODES_PER_OBJECT = 8


def _prescan(data: bytes, max_objects: int) -> None:
    """Walk the opcode stream without building anything: every declared length is read against the
    bytes that are there (pickletools reads them from a BytesIO, which never allocates more than it
    holds), and the opcode count is bounded, so the unpickler later allocates nothing the bytes do not
    hold."""
    count = 0
    most = _OPCODES_PER_OBJECT * max_objects
    try:
        for _opcode, _arg, _pos in pickletools.genops(data):
            count += 1
            if count > most:
                raise PickleLimitError(
                    f"the pickle has more than {most} opcodes ({_OPCODES_PER_OBJECT} per object of the "
                    f"{max_objects}-object budget)",
                    limit="objects",
                    budget=max_objects,
                )
    except PickleLimitError:
        raise
    except Exception as error:  # noqa: BLE001 - genops raises ValueError and others for bad bytes
        raise PickleFormatError(f"not a well-formed pickle: {type(error).__name__}: {error}") from None


def safe_loads(
    data: bytes | bytearray | memoryview,
    *,
    max_objects: int = MAX_OBJECTS,
    max_depth: int = MAX_DEPTH,
    max_bytes: int = MAX_BYTES,
) -> Any:
    """``pickle.loads(data)`` for plain data only (see the module docstring); never runs code from it.

    Raises :class:`UnsafePickleError` for anything that is not plain data, :class:`PickleFormatError`
    for malformed bytes and :class:`PickleLimitError` (a PickleFormatError) past a budget: more than
    `max_objects` opcodes or objects, `max_depth` levels of nesting, `max_bytes` bytes of pickle or of data.
    Work and memory are bounded by these budgets and the length of `data`."""
    size = memoryview(data).nbytes
    if size > max_bytes:
        raise PickleLimitError(
            f"the pickle is {size} bytes, more than the {max_bytes}-byte budget",
            limit="bytes",
            budget=max_bytes,
        )
    raw = bytes(data)
    _prescan(raw, max_objects)
    try:
        unpickler = _RestrictedUnpickler(io.BytesIO(raw))
        unpickler.max_bytes = max_bytes
        value = unpickler.load()
    except (UnsafePickleError, PickleFormatError):
        raise
    except RecursionError:
        raise PickleLimitError(
            f"the structure nests deeper than {max_depth} levels", limit="depth", budget=max_depth
        ) from None
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        MemoryError,
        OverflowError,
        struct.error,
    ) as error:
        raise PickleFormatError(f"not a well-formed pickle: {type(error).__name__}: {error}") from None
    _validate(value, max_depth=max_depth, max_objects=max_objects, max_bytes=max_bytes)
    return value


def _key_text(key: Any) -> str:
    """A dict key for a description: text and numbers as they are (long text cut), anything else
    described, never ``str()`` of a structure (which could be exponentially long)."""
    if isinstance(key, str):
        return key if len(key) <= 80 else key[:80] + "..."
    if isinstance(key, (int, float, bool, type(None))) and not (
        isinstance(key, int) and key.bit_length() > 256
    ):
        return str(key)
    return describe_structure(key, 3, depth=1)


def describe_structure(value: Any, limit: int = 6, *, depth: int = 4) -> str:
    """A short description of a safely loaded structure: ``dict(prompt_embeds: tensor float32 [512, 4096],
    ...)``, for messages and reports. At most `limit` items per container and `depth` levels are shown
    (deeper containers as ``list[...]``), so the work is bounded whatever the structure shares."""
    if isinstance(value, torch.Tensor):
        return f"tensor {str(value.dtype).removeprefix('torch.')} {list(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"ndarray {value.dtype} {list(value.shape)}"
    if isinstance(value, dict):
        if depth <= 0:
            return "dict(...)"
        items = [
            f"{_key_text(k)}: {describe_structure(v, limit, depth=depth - 1)}"
            for k, v in list(value.items())[:limit]
        ]
        return "dict(" + ", ".join(items) + (", ..." if len(value) > limit else "") + ")"
    if isinstance(value, (list, tuple)):
        if depth <= 0:
            return f"{type(value).__name__}[...]"
        items = [describe_structure(v, limit, depth=depth - 1) for v in list(value)[:limit]]
        return f"{type(value).__name__}[" + ", ".join(items) + (", ..." if len(value) > limit else "") + "]"
    return type(value).__name__
