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

Malformed or truncated bytes raise :class:`PickleFormatError`; both errors are ``ValueError``.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import warnings
from typing import Any

import numpy as np
import torch

__all__ = ["UnsafePickleError", "PickleFormatError", "safe_loads", "describe_structure"]

#: deepest nesting walked; a pickle can nest deeper than Python's recursion allows
_MAX_DEPTH = 64


class UnsafePickleError(ValueError):
    """A pickle that references something :func:`safe_loads` does not build (it could run code)."""


class PickleFormatError(ValueError):
    """Bytes that are not a complete, well-formed pickle."""


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


def _reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    """``numpy.core.multiarray._reconstruct`` for plain ndarrays only (the state arrives by BUILD)."""
    if subtype is not np.ndarray:
        raise UnsafePickleError(f"a numpy array of the subclass {getattr(subtype, '__name__', subtype)!r}")
    return np.ndarray.__new__(np.ndarray, shape, _dtype(typecode))


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
    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
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


def _validate(value: Any, depth: int = 0) -> None:
    if depth > _MAX_DEPTH:
        raise UnsafePickleError(f"the structure nests deeper than {_MAX_DEPTH} levels")
    kind = type(value)
    if kind in _LEAF_TYPES:
        return
    if kind in (dict, collections.OrderedDict):
        for key, item in value.items():
            _validate(key, depth + 1)
            _validate(item, depth + 1)
        return
    if kind in (list, tuple, set, frozenset):
        for item in value:
            _validate(item, depth + 1)
        return
    if kind is torch.Tensor:
        if value.layout is not torch.strided or value.is_quantized or value.is_nested:
            raise UnsafePickleError(f"a {value.layout} tensor, not a plain dense one")
        return
    if kind is np.ndarray:
        _checked_dtype(value.dtype, "array")
        return
    if isinstance(value, np.generic) and not isinstance(value, np.object_):
        return
    raise UnsafePickleError(
        f"the structure holds a {kind.__module__}.{kind.__qualname__}, which is not plain data"
    )


def safe_loads(data: bytes | bytearray | memoryview) -> Any:
    """``pickle.loads(data)`` for plain data only (see the module docstring); never runs code from it.

    Raises :class:`UnsafePickleError` for anything that is not plain data and :class:`PickleFormatError`
    for malformed bytes."""
    try:
        value = _RestrictedUnpickler(io.BytesIO(bytes(data))).load()
    except (UnsafePickleError, PickleFormatError):
        raise
    except RecursionError:
        raise UnsafePickleError(f"the structure nests deeper than {_MAX_DEPTH} levels") from None
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
    _validate(value)
    return value


def describe_structure(value: Any, limit: int = 6) -> str:
    """A short description of a safely loaded structure: ``dict(prompt_embeds: tensor float32 [512, 4096],
    ...)``, for messages and reports."""
    if isinstance(value, torch.Tensor):
        return f"tensor {str(value.dtype).removeprefix('torch.')} {list(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"ndarray {value.dtype} {list(value.shape)}"
    if isinstance(value, dict):
        items = [f"{k}: {describe_structure(v, limit)}" for k, v in list(value.items())[:limit]]
        return "dict(" + ", ".join(items) + (", ..." if len(value) > limit else "") + ")"
    if isinstance(value, (list, tuple)):
        items = [describe_structure(v, limit) for v in list(value)[:limit]]
        return f"{type(value).__name__}[" + ", ".join(items) + (", ..." if len(value) > limit else "") + "]"
    return type(value).__name__
