"""A fast reader for one tensor written by ``torch.save`` that never unpickles arbitrary objects.

**The format.** Since torch 1.6, ``torch.save(tensor, f)`` writes a zip archive whose entries are *stored*
(uncompressed) inside one folder, ``archive/`` for a stream (a file's stem for a path)::

    archive/data.pkl         pickle of the tensor: torch._utils._rebuild_tensor_v2(storage, offset, size,
                             stride, requires_grad, OrderedDict()); _rebuild_tensor_v3(..., dtype) for dtypes
                             without a legacy storage class (uint16/32/64, float8, ...)
    archive/byteorder        b"little" or b"big"
    archive/data/0           the bytes of the whole storage, aligned to 64 bytes in the archive
    archive/version          the archive format version, b"3\\n"
    archive/.format_version, .storage_alignment, .data/serialization_id

``storage`` is a persistent id, ``('storage', torch.FloatStorage, '0', 'cpu', numel)``, that names the entry
``data/0`` (for ``torch.storage.UntypedStorage`` numel counts bytes). A view (``x.t()``, ``x[::2]``, a
narrowed slice) is saved as the whole storage plus the view's offset, size and stride.

**The contract.** :func:`read_tensor` returns what ``torch.load(io.BytesIO(data), map_location="cpu",
weights_only=True)`` returns for such a file: same dtype, size, stride, storage offset, storage bytes and
values; the one deliberate difference is ``requires_grad``, always False (data never tracks gradients).
It parses the zip directory itself and interprets ``data.pkl`` with a small allow-list interpreter of the
opcodes that pickle protocols 2 and 3 use for one tensor (``torch.load(weights_only=True)`` reads no
other protocol; torch.save writes 2 unless told otherwise). Every other payload raises
:class:`TensorFileError`: another pickled object, several tensors, a Parameter or tensor subclass, a
sparse, quantized, nested, conjugated or negated-view tensor, a legacy (pre-zip) file, a big-endian file,
anything malformed. ``fallback=True`` retries the refusals that may still be one legitimate plain tensor
(legacy format, Parameter, metadata the interpreter does not know, ...) with ``torch.load(...,
weights_only=True)`` and accepts only a plain dense CPU tensor from it.

**Why it is safe.** Nothing is unpickled: the interpreter builds only ints, bools, strs, tuples and
markers for the few globals on its allow-list, calls nothing, and a global outside it stops the parse.
Every offset and length read from the archive is checked against the payload before it is used, the
view (offset, size, stride) must lie inside the storage and the storage entry must hold exactly the
bytes the pickle declares, so no header can cause an out-of-bounds read. The only allocation that grows
with the payload is the copy of the storage entry (``copy=True``), never larger than the payload, and
the storage is not resizable, so not even torch's ``set_`` can grow it to fit a hostile view. The
fallback is ``weights_only`` loading, nothing else.

**Why it is fast.** The storage is never unpickled: the tensor is set over the storage entry's bytes
(``copy=False``) or one copy of them. Parsed ``data.pkl`` headers are cached, and so are whole payload
layouts: tensors of one dtype and shape differ only in bytes the parse never reads, so a payload whose
other bytes equal an accepted one's is read with a few comparisons (see ``_Layout``).

Where torch.load itself refuses a payload (a corrupt zip record, a version it cannot parse, an integer
tensor that requires grad, ...), so does :func:`read_tensor`: the tests fuzz it against torch.load.
"""

from __future__ import annotations

import functools
import io
import pickletools
import struct
import sys
import warnings
from typing import NamedTuple, NoReturn

import numpy as np
import torch

__all__ = ["TensorFileError", "read_tensor", "clear_layout_cache"]


class TensorFileError(ValueError):
    """A payload that is not one plain tensor written by ``torch.save``, or is malformed or hostile."""


class _Unsupported(TensorFileError):
    """A refusal of a structure that may still be one legitimate plain tensor: the only kind that
    ``read_tensor(..., fallback=True)`` hands to ``torch.load(weights_only=True)``."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason} (read_tensor(..., fallback=True) tries torch.load(weights_only=True))")
        self.reason = reason


# --- the zip archive ---------------------------------------------------------------------------------

_LOCAL_MAGIC = b"PK\x03\x04"
_CENTRAL_MAGIC = b"PK\x01\x02"
_END_MAGIC = b"PK\x05\x06"
_LOCATOR_MAGIC = b"PK\x06\x07"
_END64_MAGIC = b"PK\x06\x06"
_END = struct.Struct("<4sHHHHIIH")  # end of central directory record, 22 bytes
_LOCATOR = struct.Struct("<4sIQI")  # zip64 end of central directory locator, 20 bytes
_END64 = struct.Struct("<4sQHHIIQQQQ")  # zip64 end of central directory record, 56 bytes
# Central directory file header, 46 bytes: magic, flags, method, sizes (stored, raw), lengths of the name,
# extra field and comment, disk number, external attributes, local header offset (the rest is not needed).
_CENTRAL = struct.Struct("<4s4xHH8xIIHHHH2xII")
_LOCAL = struct.Struct("<4s22xHH")  # local file header, 30 bytes: magic, name length, extra field length
_ALLOWED_FLAGS = 0x0808  # bit 3: sizes in a trailing data descriptor; bit 11: UTF-8 names
_DOS_DIRECTORY = 0x10  # an external attribute bit: torch's reader cannot read such an entry
_U16_MAX, _U32_MAX = 0xFFFF, 0xFFFFFFFF  # zip64 markers
# What a legacy torch.save file starts with: the pickled magic number 0x1950A86A20F9469CFC6C, protocol 2.
_LEGACY_MAGIC = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19."


def _show(name: bytes | str) -> str:
    """A short printable form of an untrusted name for an error message."""
    if isinstance(name, bytes):
        name = name.decode("utf-8", "backslashreplace")
    return repr(name if len(name) <= 80 else name[:80] + "...")


class _Archive(NamedTuple):
    view: memoryview
    entries: dict[bytes, tuple[int, int]]  # full name -> (start, size) of its bytes in view
    folder: bytes  # torch's archive folder with its slash, e.g. b"archive/"
    cd_start: int  # where the central directory starts (it and the end records run to the end)
    # Per entry: (central header position, local header position, flags); for the layout cache.
    headers: tuple[tuple[int, int, int], ...]

    def span(self, name: bytes) -> tuple[int, int] | None:
        """``(start, end)`` of ``folder + name``'s bytes, or None if the archive has no such entry."""
        found = self.entries.get(self.folder + name)
        return None if found is None else (found[0], found[0] + found[1])

    def record(self, name: bytes) -> memoryview | None:
        """The bytes of ``folder + name`` (a zero-copy slice), or None if the archive has no such entry."""
        found = self.entries.get(self.folder + name)
        return None if found is None else self.view[found[0] : found[0] + found[1]]


def _directory_bounds(view: memoryview) -> tuple[int, int, int]:
    """``(entry count, central directory start, central directory end)`` from the end records.

    torch.save (miniz) always writes a zip64 end record and locator before the classic end record; when
    they are there torch's reader uses them alone, so this requires both records to agree.
    """
    end = len(view) - _END.size
    if end < 0 or view[end : end + 4] != _END_MAGIC:
        raise TensorFileError("the zip archive does not end with its end record (truncated?)")
    _, disk, cd_disk, count, total, cd_size, cd_start, comment_len = _END.unpack_from(view, end)
    if disk or cd_disk or comment_len:
        raise TensorFileError("the zip end record is malformed")
    locator = end - _LOCATOR.size
    if locator < 0 or view[locator : locator + 4] != _LOCATOR_MAGIC:
        if count != total or _U16_MAX in (count, total) or _U32_MAX in (cd_size, cd_start):
            raise TensorFileError("the zip end record is malformed")
        cd_end = end
    else:
        _, end64_disk, end64, disks = _LOCATOR.unpack_from(view, locator)
        if end64_disk or disks != 1 or end64 + _END64.size != locator:
            raise TensorFileError("the zip64 end locator is malformed")
        magic, record_size, _, _, disk, cd_disk, count64, total64, cd_size64, cd_start64 = _END64.unpack_from(
            view, end64
        )
        if magic != _END64_MAGIC or record_size != _END64.size - 12 or disk or cd_disk or count64 != total64:
            raise TensorFileError("the zip64 end record is malformed")
        for small, large, marker in (
            (count, count64, _U16_MAX),
            (total, total64, _U16_MAX),
            (cd_size, cd_size64, _U32_MAX),
            (cd_start, cd_start64, _U32_MAX),
        ):
            if small not in (large, marker):
                raise TensorFileError("the zip end records disagree")
        total, cd_size, cd_start, cd_end = total64, cd_size64, cd_start64, end64
    if cd_start + cd_size != cd_end:
        raise TensorFileError("the zip central directory is not where the end record says")
    return total, cd_start, cd_end


def _open_archive(view: memoryview) -> _Archive:
    """Parse the end records and the central directory, checking every offset against the payload."""
    if view[:4] != _LOCAL_MAGIC:
        if view[: len(_LEGACY_MAGIC)] == _LEGACY_MAGIC:
            raise _Unsupported("a legacy (pre-zip) torch.save file")
        raise TensorFileError("not a torch.save zip archive")
    total, cd_start, end = _directory_bounds(view)
    directory = bytes(view[cd_start:end])
    entries: dict[bytes, tuple[int, int]] = {}
    headers: list[tuple[int, int, int]] = []
    header, limit, pos = _CENTRAL.size, len(directory), 0
    for _ in range(total):
        if pos + header > limit:
            raise TensorFileError("the zip central directory is truncated")
        magic, flags, method, size, raw_size, name_len, extra_len, comment_len, disk, attributes, offset = (
            _CENTRAL.unpack_from(directory, pos)
        )
        name = directory[pos + header : pos + header + name_len]
        headers.append((cd_start + pos, offset, flags))
        pos += header + name_len + extra_len + comment_len
        if (
            magic != _CENTRAL_MAGIC
            or pos > limit
            or method
            or flags & ~_ALLOWED_FLAGS
            or size != raw_size
            or disk
            or attributes & _DOS_DIRECTORY
            or offset + _LOCAL.size + size > cd_start
        ):
            if magic != _CENTRAL_MAGIC or pos > limit:
                raise TensorFileError("the zip central directory is malformed")
            if method:
                raise _Unsupported(f"zip entry {_show(name)} is compressed")
            if _U32_MAX in (size, offset) or disk == _U16_MAX:
                raise _Unsupported(f"zip entry {_show(name)} needs zip64 fields (over 4 GiB)")
            raise TensorFileError(f"zip entry {_show(name)} is malformed, encrypted or a directory")
        # torch reads every record of a torch.save archive through its local header, so check them all.
        local_magic, local_name_len, local_extra_len = _LOCAL.unpack_from(view, offset)
        start = offset + _LOCAL.size + local_name_len + local_extra_len
        if (
            local_magic != _LOCAL_MAGIC
            or view[offset + _LOCAL.size : offset + _LOCAL.size + local_name_len] != name
            or start + size > cd_start
        ):
            raise TensorFileError(f"zip entry {_show(name)} has a malformed local header")
        entries[name] = (start, size)
    if pos != limit:
        raise TensorFileError("the zip central directory is malformed")
    if not entries:
        raise TensorFileError("the zip archive is empty")
    first = next(iter(entries))  # torch takes its folder from the first entry ...
    folder = first[: first.find(b"/") + 1]
    for name in entries:  # ... requires every name in it, lists them as str and looks them up ignoring case
        if not folder or not name.startswith(folder) or not name.isascii() and not _is_utf8(name):
            raise TensorFileError(
                f"zip entry {_show(name)} is not in a folder of UTF-8 names like torch.save's"
            )
    if len({name.lower() for name in entries}) != total:
        raise TensorFileError("the zip archive holds an entry name twice")
    return _Archive(view, entries, folder, cd_start, tuple(headers))


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _check_records(archive: _Archive) -> None:
    """Check the small records as ``torch.load`` does: TorchScript marker, version, byte order, alignment, id."""
    if archive.folder + b"constants.pkl" in archive.entries:
        raise _Unsupported("a TorchScript archive")
    version = archive.record(b".data/version")
    if version is None:
        version = archive.record(b"version")
    if version is None:
        raise TensorFileError("the archive has no version record")
    number = bytes(version).rstrip(b"\n")
    if number not in (b"1", b"2", b"3"):
        if number.isdigit() and len(number) < 20 and int(number) > 3:
            raise _Unsupported(f"archive format version {int(number)}, newer than this reader knows")
        raise TensorFileError(f"the archive has an invalid version record {_show(number)}")
    order = archive.record(b"byteorder")
    if order is None:
        raise _Unsupported("no byteorder record (a file from an old torch)")
    if order not in (b"little", b"big"):
        raise TensorFileError(f"unknown byte order {_show(bytes(order))}")
    if order != sys.byteorder.encode():
        raise _Unsupported(f"a {bytes(order).decode()}-endian payload on a {sys.byteorder}-endian host")
    alignment = archive.record(b".storage_alignment")
    if alignment is not None:
        try:
            int(bytes(alignment))
        except ValueError:
            raise TensorFileError(f"invalid .storage_alignment record {_show(bytes(alignment))}") from None
    serialization_id = archive.record(b".data/serialization_id")
    if serialization_id is not None and not _is_utf8(bytes(serialization_id)):
        raise TensorFileError("the .data/serialization_id record is not UTF-8")


# --- data.pkl ----------------------------------------------------------------------------------------


class _Callable(NamedTuple):
    """A global that REDUCE may apply; the interpreter emulates it, it never calls anything."""

    name: str


class _StorageClass(NamedTuple):
    name: str
    dtype: torch.dtype | None  # None: torch.storage.UntypedStorage, whose numel counts bytes


class _Storage(NamedTuple):
    """What BINPERSID yields: the storage entry ``data/<key>`` and the byte count the pickle declares."""

    key: str
    cls: _StorageClass
    nbytes: int


class _Header(NamedTuple):
    """Everything ``_rebuild_tensor_v2``/``_v3`` would get, checked for types but not yet for bounds."""

    key: str
    nbytes: int
    dtype: torch.dtype
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


class _EmptyOrderedDict:
    """``collections.OrderedDict()``: the (always empty) backward hooks of a saved tensor."""


_REBUILD_V2 = _Callable("torch._utils._rebuild_tensor_v2")
_REBUILD_V3 = _Callable("torch._utils._rebuild_tensor_v3")
_ORDERED_DICT = _Callable("collections.OrderedDict")
_NO_HOOKS = _EmptyOrderedDict()

# The legacy typed storage classes torch.save names in _rebuild_tensor_v2 (quantized ones excluded).
_TYPED_STORAGES = {
    "DoubleStorage": torch.float64,
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "ComplexDoubleStorage": torch.complex128,
    "ComplexFloatStorage": torch.complex64,
}
# Dtypes without a typed storage class, which torch.save writes with _rebuild_tensor_v3 (if this torch has them).
_V3_ONLY_DTYPES = (
    "uint16 uint32 uint64 complex32 float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz "
    "float8_e8m0fnu float4_e2m1fn_x2 bits1x8 bits2x4 bits4x2 bits8 bits16"
).split()
# The allow-list, keyed by the operand of the GLOBAL opcode: b"module\nname".
_GLOBALS: dict[bytes, object] = {
    b"torch._utils\n_rebuild_tensor_v2": _REBUILD_V2,
    b"torch._utils\n_rebuild_tensor_v3": _REBUILD_V3,
    b"collections\nOrderedDict": _ORDERED_DICT,
    b"torch.storage\nUntypedStorage": _StorageClass("torch.storage.UntypedStorage", None),
    **{
        f"torch\n{name}".encode(): _StorageClass(f"torch.{name}", dtype)
        for name, dtype in _TYPED_STORAGES.items()
    },
    **{f"torch\n{str(dtype)[6:]}".encode(): dtype for dtype in _TYPED_STORAGES.values()},
    **{f"torch\n{name}".encode(): getattr(torch, name) for name in _V3_ONLY_DTYPES if hasattr(torch, name)},
}
_UINT16, _INT32, _UINT32 = (struct.Struct(form) for form in ("<H", "<i", "<I"))
_MAX_PICKLE = 1 << 14  # one tensor pickles to a few hundred bytes; this also bounds the cache
_INT64_MAX = (1 << 63) - 1


def _describe(value: object) -> str:
    """What a pickled value is, for an error message (never its full repr: it may be huge)."""
    if isinstance(value, (_Callable, _StorageClass)):
        return value.name
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, _Storage):
        return "a storage"
    if isinstance(value, _Header):
        return "a tensor"
    if value is _NO_HOOKS:
        return "an OrderedDict"
    kind = type(value).__name__
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _refuse_global(operand: bytes) -> NoReturn:
    """Raise for a GLOBAL outside the allow-list: torch's own names may still be one tensor (a Parameter,
    say), anything else is not a tensor at all."""
    module, _, name = operand.decode("utf-8", "backslashreplace").partition("\n")
    shown = f"{module}.{name}"
    shown = shown if len(shown) <= 100 else shown[:100] + "..."
    if module == "torch" or module.startswith("torch."):
        raise _Unsupported(f"data.pkl uses {shown}, which a plain tensor does not need")
    raise TensorFileError(f"data.pkl references {shown}, not a tensor")


def _rebuild(function: _Callable, args: object) -> _Header:
    """Check the arguments of ``_rebuild_tensor_v2``/``_v3`` and return them as a header."""
    v3 = function is _REBUILD_V3
    if type(args) is not tuple or len(args) != (7 if v3 else 6):
        raise TensorFileError(f"data.pkl calls {function.name} with the wrong arguments")
    storage, offset, size, stride, requires_grad, hooks = args[:6]
    if type(storage) is not _Storage or (storage.cls.dtype is None) != v3:
        raise TensorFileError(f"data.pkl calls {function.name} on {_describe(storage)}")
    dtype = args[6] if v3 else storage.cls.dtype
    if (
        not isinstance(dtype, torch.dtype)
        or type(offset) is not int
        or type(size) is not tuple
        or type(stride) is not tuple
        or type(requires_grad) is not bool
        or hooks is not _NO_HOOKS
    ):
        raise TensorFileError(f"data.pkl calls {function.name} with the wrong arguments")
    if requires_grad and (v3 or not (dtype.is_floating_point or dtype.is_complex)):  # as torch.load fails
        raise TensorFileError(
            f"data.pkl asks a {dtype} tensor to require gradients, which torch.load refuses"
        )
    return _Header(storage.key, storage.nbytes, dtype, offset, size, stride)


def _storage(pid: object) -> _Storage:
    """Check a persistent id, ``('storage', storage class, key, location, numel)``; the location is ignored
    (``map_location="cpu"``)."""
    if (
        type(pid) is not tuple
        or len(pid) != 5
        or pid[0] != "storage"
        or type(pid[1]) is not _StorageClass
        or type(pid[2]) is not str
        or type(pid[3]) is not str
        or type(pid[4]) is not int
        or pid[4] < 0
    ):
        raise TensorFileError("data.pkl has a malformed storage reference")
    cls = pid[1]
    return _Storage(pid[2], cls, pid[4] * (cls.dtype.itemsize if cls.dtype else 1))


@functools.lru_cache(maxsize=64)
def _parse_pickle(pkl: bytes) -> _Header:
    """Interpret ``data.pkl`` with an allow-list of opcodes and globals; return the one tensor it describes.

    Handles the opcodes pickle protocols 2-3 use for one tensor (named as in :mod:`pickletools`), mirrors
    pickle's own rules where they matter (a MARK fences off the stack below it) and is stricter elsewhere
    (nothing may follow STOP, the stack must then hold exactly the tensor). Results are cached: tensors of
    one shape and dtype pickle to the same bytes, so a dataset parses only a few distinct ``data.pkl``.
    """
    if len(pkl) > _MAX_PICKLE:
        raise _Unsupported(f"data.pkl is {len(pkl)} bytes, far more than one tensor needs")
    stack: list[object] = []
    push = stack.append
    marks: list[int] = []
    memo: dict[int, object] = {}
    fence = 0  # len(stack) at the innermost MARK: nothing below it may be popped
    storage_seen = False
    pos = 0
    try:
        while True:  # opcodes roughly by how often torch.save uses them
            op = pkl[pos]
            pos += 1
            if op == 0x71:  # BINPUT
                if len(stack) <= fence:
                    raise TensorFileError("data.pkl memoizes from an empty stack")
                memo[pkl[pos]] = stack[-1]
                pos += 1
            elif op == 0x4B:  # BININT1
                push(pkl[pos])
                pos += 1
            elif op == 0x58:  # BINUNICODE
                length = _UINT32.unpack_from(pkl, pos)[0]
                pos += 4
                if pos + length > len(pkl):
                    raise IndexError
                push(pkl[pos : pos + length].decode("utf-8"))
                pos += length
            elif op == 0x63:  # GLOBAL
                end = pkl.index(b"\n", pkl.index(b"\n", pos) + 1)
                found = _GLOBALS.get(pkl[pos:end])
                if found is None:
                    _refuse_global(pkl[pos:end])
                push(found)
                pos = end + 1
            elif op == 0x28:  # MARK
                marks.append(len(stack))
                fence = len(stack)
            elif op == 0x74:  # TUPLE
                start = marks.pop()
                fence = marks[-1] if marks else 0
                items = tuple(stack[start:])
                del stack[start:]
                push(items)
            elif op == 0x52:  # REDUCE
                if len(stack) - 2 < fence:
                    raise TensorFileError("data.pkl calls something from an empty stack")
                args = stack.pop()
                function = stack.pop()
                if function is _ORDERED_DICT:
                    if args != ():
                        raise TensorFileError("data.pkl builds a non-empty OrderedDict")
                    push(_NO_HOOKS)
                elif function is _REBUILD_V2 or function is _REBUILD_V3:
                    push(_rebuild(function, args))
                else:
                    raise TensorFileError(
                        f"data.pkl calls {_describe(function)}; only tensor rebuilds and OrderedDict() are allowed"
                    )
            elif 0x85 <= op <= 0x87:  # TUPLE1, TUPLE2, TUPLE3
                count = op - 0x84
                if len(stack) - count < fence:
                    raise TensorFileError("data.pkl builds a tuple from an empty stack")
                items = tuple(stack[-count:])
                del stack[-count:]
                push(items)
            elif op == 0x29:  # EMPTY_TUPLE
                push(())
            elif op == 0x51:  # BINPERSID
                if len(stack) <= fence:
                    raise TensorFileError("data.pkl has a persistent id on an empty stack")
                if storage_seen:
                    raise TensorFileError("data.pkl references several storages, so it is not one tensor")
                storage_seen = True
                push(_storage(stack.pop()))
            elif op == 0x88 or op == 0x89:  # NEWTRUE, NEWFALSE
                push(op == 0x88)
            elif op == 0x80:  # PROTO
                pos += 1
            elif op == 0x2E:  # STOP
                break
            elif op == 0x72:  # LONG_BINPUT
                if len(stack) <= fence:
                    raise TensorFileError("data.pkl memoizes from an empty stack")
                memo[_UINT32.unpack_from(pkl, pos)[0]] = stack[-1]
                pos += 4
            elif op == 0x68:  # BINGET
                push(memo[pkl[pos]])
                pos += 1
            elif op == 0x6A:  # LONG_BINGET
                push(memo[_UINT32.unpack_from(pkl, pos)[0]])
                pos += 4
            elif op == 0x4D:  # BININT2
                push(_UINT16.unpack_from(pkl, pos)[0])
                pos += 2
            elif op == 0x4A:  # BININT
                push(_INT32.unpack_from(pkl, pos)[0])
                pos += 4
            elif op == 0x8A:  # LONG1
                length = pkl[pos]
                if length > 8:
                    raise TensorFileError("data.pkl holds an integer wider than 64 bits")
                if pos + 1 + length > len(pkl):
                    raise IndexError
                push(int.from_bytes(pkl[pos + 1 : pos + 1 + length], "little", signed=True))
                pos += 1 + length
            else:
                info = pickletools.code2op.get(chr(op))
                shown = info.name if info else f"0x{op:02x}"
                raise _Unsupported(
                    f"data.pkl uses the pickle opcode {shown}, which a plain tensor does not need"
                )
    except (IndexError, KeyError, ValueError, struct.error) as error:
        if isinstance(error, TensorFileError):
            raise
        raise TensorFileError("data.pkl is truncated or malformed") from None
    if len(stack) != 1 or marks or pos != len(pkl):
        raise TensorFileError("data.pkl is malformed: it does not end with exactly one object")
    if type(stack[0]) is not _Header:
        raise TensorFileError(f"data.pkl holds {_describe(stack[0])}, not a tensor")
    return stack[0]


# --- the view --------------------------------------------------------------------------------------


def _check_view(header: _Header, storage_bytes: int) -> None:
    """Require sizes and strides to be non-negative ints and the view to lie inside the storage, with the
    limits torch's ``set_`` enforces (a tensor with no elements may have any offset). The interpreter
    reads no integer wider than int64."""
    size, stride, offset = header.size, header.stride, header.offset
    if len(size) != len(stride):
        raise TensorFileError(f"the tensor has {len(size)} sizes but {len(stride)} strides")
    if offset < 0:
        raise TensorFileError(f"the tensor has a negative storage offset {offset}")
    numel = 1
    last = offset  # the element index of the view's last element
    for length, step in zip(size, stride, strict=True):
        if type(length) is not int or type(step) is not int:
            raise TensorFileError("the tensor's size and stride are not tuples of ints")
        if length < 0 or step < 0:
            raise TensorFileError(f"the tensor has a negative size {size} or stride {stride}")
        numel *= length
        if numel > _INT64_MAX:
            raise TensorFileError(f"the tensor's size {size} overflows int64")
        last += (length - 1) * step
    if numel and (last + 1) * header.dtype.itemsize > storage_bytes:
        raise TensorFileError(
            f"storage {_show(header.key)} holds {storage_bytes} bytes "
            f"but the tensor needs {(last + 1) * header.dtype.itemsize}"
        )


# --- the layout cache --------------------------------------------------------------------------------
#
# Tensors of one dtype and shape saved by one torch version are the same archive with other storage bytes:
# the zip headers, names, offsets, data.pkl and the small records are equal byte for byte, and only the
# storage, the random serialization id and the CRC-32 fields of those two records differ. The full parse
# reads none of those bytes (it does not check CRCs, as torch.load does not) except the serialization id,
# which it only requires to be UTF-8. So once the parse has accepted a payload, another payload of the same length that
# equals it everywhere else, and whose serialization id is UTF-8, would be accepted with the same header:
# a match may skip the parse. That holds only if the bytes that may vary are disjoint from every byte the
# parse reads, which :func:`_layout_of` checks before it remembers a layout (torch.save's layout always
# passes; a crafted archive whose records overlap is simply never cached).


class _Layout(NamedTuple):
    """A payload layout the full parse accepted: the bytes a match must equal, and the tensor it holds."""

    constant: tuple[tuple[int, int, bytes], ...]  # (start, end, bytes) outside the varying ranges
    serialization_id: tuple[int, int] | None  # varying, but must be UTF-8
    storage: tuple[int, int]  # (start, end) of the storage entry's bytes
    header: _Header
    flat: bool  # the tensor is the whole storage, contiguous from offset 0: torch.frombuffer builds it


_LAYOUTS: dict[int, list[_Layout]] = {}  # payload length -> layouts of that length
# Bounds, so that no dataset, however hostile, makes the cache big or slow (helper review of this module):
# at most 1024 layouts, later ones are not kept (the cache never evicts: a dataset of more distinct tensor
# layouts reads the rest with the full parse); at most 8 of one payload length, since a lookup compares a
# payload with every layout of its length; each at most 16 KiB of archive besides its storage (torch.save
# writes about 1.5 KiB; a crafted archive with long extra fields is not kept) and at most 64 dimensions (a
# header of thousands of dimensions, legal when one size is 0, would hold far more in Python ints than
# its bytes). So the cache holds at most about 20 MiB, and a miss costs at most 8 comparisons.
_MAX_LAYOUTS = 1024
_MAX_LAYOUTS_PER_LENGTH = 8
_MAX_LAYOUT_BYTES = 16 << 10
_MAX_LAYOUT_DIMS = 64
_layout_count = 0
_CRC_AT_CENTRAL, _CRC_AT_LOCAL = 16, 14  # offsets of the CRC-32 field in the two zip header kinds
_DESCRIPTOR_MAGIC = b"PK\x07\x08"


def _layout_of(archive: _Archive, header: _Header, storage: tuple[int, int]) -> _Layout | None:
    """The layout of a payload the parse has just accepted, or None if the bytes that may vary between
    payloads of its layout are not provably disjoint from the bytes the parse reads."""
    view = archive.view
    serial = archive.span(b".data/serialization_id")
    varying = [storage] + ([serial] if serial else [])  # bytes the parse does not read (or re-checks)
    read = [(0, 4)]  # bytes the parse reads, and the unread header fields around them: the leading magic ...
    central_crcs = []
    for central, local, flags in archive.headers:
        name_len, extra_len = _LOCAL.unpack_from(view, local)[1:]
        start = local + _LOCAL.size + name_len + extra_len
        name = bytes(view[local + _LOCAL.size : local + _LOCAL.size + name_len])
        data = (start, start + archive.entries[name][1])
        if data != storage and data != serial:  # ... a record equal in every payload of the layout ...
            read += [(local, start), data]
            continue
        # ... and, for the storage and the serialization id, whose CRC-32s differ too, the header around them
        crc = local + _CRC_AT_LOCAL
        read += [(local, crc), (crc + 4, start)]
        varying.append((crc, crc + 4))
        central_crcs.append(central + _CRC_AT_CENTRAL)
        if flags & 0x8:  # a data descriptor follows the bytes: [signature], CRC-32, sizes
            after = data[1]
            crc = after + 4 if view[after : after + 4] == _DESCRIPTOR_MAGIC else after
            varying.append((crc, crc + 4))
    cursor = archive.cd_start
    for crc in sorted(central_crcs):  # ... the central directory and end records around their CRC-32s
        read.append((cursor, crc))
        varying.append((crc, crc + 4))
        cursor = crc + 4
    read.append((cursor, len(view)))
    if (
        len(view) - (storage[1] - storage[0]) > _MAX_LAYOUT_BYTES
        or len(header.size) > _MAX_LAYOUT_DIMS
        or not _disjoint(varying, read, len(view))
    ):
        return None
    constant, cursor = [], 0
    for a, b in sorted(varying):
        if a > cursor:
            constant.append((cursor, a, bytes(view[cursor:a])))
        cursor = max(cursor, b)
    if cursor < len(view):
        constant.append((cursor, len(view), bytes(view[cursor:])))
    numel = 1
    for length in header.size:
        numel *= length
    flat = header.offset == 0 and header.stride == _contiguous_strides(header.size)
    if flat and storage[1] - storage[0] == numel * header.dtype.itemsize > 0:
        try:  # torch.frombuffer covers the common dtypes; the rare ones it refuses go through set_
            flat = _frombuffer(view[storage[0] : storage[1]], header.dtype).numel() == numel
        except (RuntimeError, TypeError, ValueError):
            flat = False
    else:
        flat = False
    return _Layout(tuple(constant), serial, storage, header, flat)


def _disjoint(varying: list[tuple[int, int]], read: list[tuple[int, int]], length: int) -> bool:
    """Whether every varying range lies inside the payload and overlaps no range the parse reads."""
    return all(b <= length and not any(a < d and c < b for c, d in read) for a, b in varying)


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    """The strides torch gives a contiguous tensor of ``size``."""
    strides, step = [], 1
    for length in reversed(size):
        strides.append(step)
        step *= max(length, 1)
    return tuple(reversed(strides))


def _match(data: bytes | bytearray | memoryview, view: memoryview) -> _Layout | None:
    """The remembered layout ``data`` matches, if any (see the comment above :class:`_Layout`)."""
    layouts = _LAYOUTS.get(len(view))
    if layouts is None:
        return None
    if type(data) is bytes or type(data) is bytearray:  # their slices compare with memcmp
        for layout in layouts:
            for start, end, expected in layout.constant:
                if data[start:end] != expected:
                    break
            else:
                return _checked(layout, data)
        return None
    for layout in layouts:  # a memoryview compares item by item, so its slices are copied out first
        for start, end, expected in layout.constant:
            if view[start:end].tobytes() != expected:
                break
        else:
            return _checked(layout, view)
    return None


def _checked(layout: _Layout, source: bytes | bytearray | memoryview) -> _Layout | None:
    """``layout`` if the serialization id in ``source`` (which matched it) is UTF-8, as the parse requires."""
    if layout.serialization_id is not None:
        start, end = layout.serialization_id
        if not _is_utf8(bytes(source[start:end])):
            return None  # the full parse refuses it, with its own message
    return layout


def _remember(view: memoryview, layout: _Layout) -> None:
    global _layout_count
    same_length = _LAYOUTS.setdefault(len(view), [])
    if _layout_count < _MAX_LAYOUTS and len(same_length) < _MAX_LAYOUTS_PER_LENGTH:
        same_length.append(layout)
        _layout_count += 1


def clear_layout_cache() -> None:
    """Forget every remembered payload layout (:func:`read_tensor` relearns them as it reads)."""
    global _layout_count
    _LAYOUTS.clear()
    _layout_count = 0


# --- the tensor --------------------------------------------------------------------------------------

_readonly_warning_pending = True


def _frombuffer(buffer: memoryview, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor of ``dtype`` over ``buffer`` without a copy (it keeps the buffer's owner alive)."""
    global _readonly_warning_pending
    if buffer.readonly and _readonly_warning_pending:
        # torch warns once per process that the buffer is read-only; the caller's contract (do not write to
        # the tensor) already covers it. Later calls never warn, so only the first pays for catch_warnings.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning)
            shared = torch.frombuffer(buffer, dtype=dtype)
        _readonly_warning_pending = False
        return shared
    return torch.frombuffer(buffer, dtype=dtype)


def _tensor(
    view: memoryview, header: _Header, storage: tuple[int, int], flat: bool, copy: bool
) -> torch.Tensor:
    """The tensor ``header`` describes over the storage bytes ``view[storage[0]:storage[1]]``."""
    buffer = view[storage[0] : storage[1]]
    if flat and not copy:
        return _frombuffer(buffer, header.dtype).view(header.size)
    # Like torch.load's, the storage is not resizable: set_ could otherwise grow it to fit any view.
    if copy or not buffer:
        raw = torch.from_numpy(np.frombuffer(buffer, dtype=np.uint8).copy())
    else:
        raw = _frombuffer(buffer, torch.uint8)
    tensor = torch.empty(0, dtype=header.dtype)
    return tensor.set_(raw.untyped_storage(), header.offset, header.size, header.stride)


def _read_fast(data: bytes | bytearray | memoryview, copy: bool, cache: bool) -> torch.Tensor:
    view = memoryview(data).cast("B")
    if cache:
        layout = _match(data, view)
        if layout is not None:
            return _tensor(view, layout.header, layout.storage, layout.flat, copy)
    archive = _open_archive(view)
    _check_records(archive)
    pkl = archive.record(b"data.pkl")
    if pkl is None:
        raise TensorFileError("the archive has no data.pkl")
    header = _parse_pickle(bytes(pkl))
    storage = archive.span(b"data/" + header.key.encode())
    if storage is None:
        raise TensorFileError(f"data.pkl refers to storage {_show(header.key)}, which the archive lacks")
    if storage[1] - storage[0] != header.nbytes:
        raise TensorFileError(
            f"storage {_show(header.key)} holds {storage[1] - storage[0]} bytes but data.pkl declares {header.nbytes}"
        )
    _check_view(header, header.nbytes)
    room = _layout_count < _MAX_LAYOUTS and len(_LAYOUTS.get(len(view), ())) < _MAX_LAYOUTS_PER_LENGTH
    layout = _layout_of(archive, header, storage) if cache and room else None
    if layout is not None:
        _remember(view, layout)
    return _tensor(view, header, storage, layout is not None and layout.flat, copy)


def _load_with_torch(data: bytes | bytearray | memoryview, refusal: _Unsupported) -> torch.Tensor:
    """``torch.load(weights_only=True)``, accepting only a plain dense CPU tensor (a Parameter is detached)."""
    try:
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - whatever torch raises, the payload is refused
        text = str(error).split("WeightsUnpickler error:", 1)[-1]  # skip torch's advice to load unsafely
        why = next((line.strip() for line in text.splitlines() if line.strip()), "")
        raise TensorFileError(
            f"{refusal.reason}, and torch.load(weights_only=True) refused it too: {type(error).__name__}: {why[:200]}"
        ) from error
    if type(loaded) is torch.nn.Parameter:
        loaded = loaded.detach()
    if type(loaded) is not torch.Tensor:
        raise TensorFileError(f"the payload holds {_describe(loaded)}, not a tensor")
    kind = "nested" if loaded.is_nested else "quantized" if loaded.is_quantized else str(loaded.layout)[6:]
    if kind != "strided":
        raise TensorFileError(f"the payload holds a {kind} tensor, not a plain dense tensor")
    return loaded.detach() if loaded.requires_grad else loaded


def read_tensor(
    data: bytes | bytearray | memoryview, *, copy: bool = True, fallback: bool = False, cache: bool = True
) -> torch.Tensor:
    """The tensor that ``torch.save`` wrote into ``data``, read without unpickling anything.

    Returns what ``torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)`` returns (dtype,
    size, stride, storage offset, the whole saved storage, values), except that ``requires_grad`` is False.

    ``copy=True`` copies the storage bytes once into memory the tensor owns. ``copy=False`` returns a view
    of ``data`` itself, with no copy: the tensor keeps ``data`` alive, but ``data`` must not be modified
    while the tensor is in use and the tensor must not be written to (for ``bytes`` that would change an
    immutable object). Its alignment is that of the entry inside ``data`` (torch.save aligns entries to 64
    bytes within the archive).

    ``fallback=True`` hands the refusals that may still be one plain tensor (legacy format, Parameter,
    conjugate/negative bit, big-endian, zip64, compressed entries, ...) to ``torch.load(...,
    weights_only=True)`` and returns its result if that is a plain dense CPU tensor (a Parameter is
    detached); the copy/view choice then does not apply. Malformed or hostile payloads are never retried.

    ``cache=True`` remembers the layout of each payload it accepts (up to 1024 layouts per process) and
    reads later payloads that equal one byte for byte outside their storage, CRC-32 and serialization-id
    bytes without parsing them again: the same result, about three times faster for small tensors (the
    parse reads none of those bytes; see the comment above ``_Layout``). ``cache=False`` always parses.

    Raises :class:`TensorFileError` (a ValueError) for anything else, with a one-line reason; TypeError if
    ``data`` is not a contiguous buffer.
    """
    try:
        return _read_fast(data, copy, cache)
    except _Unsupported as refusal:
        if not fallback:
            raise
        return _load_with_torch(data, refusal)
