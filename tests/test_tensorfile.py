"""Conformance and fuzz tests of :mod:`primus_energon.tensorfile` against ``torch.load(weights_only=True)``.

The oracle is torch itself: every tensor read_tensor returns must match what torch.load returns for the
same bytes (dtype, size, stride, storage offset, storage bytes, values); every payload it refuses must
raise TensorFileError and nothing else. ``test_broken_bounds_check_is_caught`` shows the bounds tests fail
when the reader's bounds check is taken out.
"""

from __future__ import annotations

import builtins
import collections
import io
import os
import pickle
import pickletools
import shlex
import struct
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primus_energon import tensorfile
from primus_energon.tensorfile import TensorFileError, read_tensor

pytestmark = pytest.mark.filterwarnings(
    "ignore:ComplexHalf support is experimental",
    "ignore:torch.quantize_per_tensor",
    "ignore:TypedStorage is deprecated",
)
CI = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Every dtype torch.save writes (test_every_savable_dtype_is_listed keeps this honest).
DTYPES = [
    getattr(torch, name)
    for name in (
        "float32 float64 float16 bfloat16 complex64 complex128 complex32 bool uint8 int8 int16 int32 int64 "
        "uint16 uint32 uint64 float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu "
        "float4_e2m1fn_x2 bits1x8 bits2x4 bits4x2 bits8 bits16"
    ).split()
    if hasattr(torch, name)
]
# Dtypes whose values torch.equal compares and small non-negative integers convert to exactly.
VALUE_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# --- helpers -------------------------------------------------------------------------------------------


def save(obj: object, **kwargs: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, **kwargs)
    return buffer.getvalue()


def torch_load(data: bytes) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 3"
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as integers of the same width: exact (NaN-safe) value comparison for any dtype."""
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    return tensor.view(_INT_OF_SIZE[tensor.element_size()])


def assert_same(got: torch.Tensor, expected: torch.Tensor) -> None:
    """got is what torch.load returned: same type, dtype, geometry, storage bytes and values."""
    assert type(got) is torch.Tensor and not got.requires_grad
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.stride() == expected.stride()
    assert got.storage_offset() == expected.storage_offset()
    assert bytes(got.untyped_storage()) == bytes(expected.untyped_storage())
    if got.numel() <= 1 << 20:  # an expanded (stride 0) view may claim far more elements than it stores
        assert torch.equal(bits(got), bits(expected))


def address_range(data: bytes | bytearray | memoryview) -> tuple[int, int]:
    start = np.frombuffer(data, dtype=np.uint8).ctypes.data
    return start, start + len(memoryview(data).cast("B"))


def shares_memory(tensor: torch.Tensor, data: bytes | bytearray | memoryview) -> bool:
    start, end = address_range(data)
    return start <= tensor.untyped_storage().data_ptr() < end


def records(payload: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(payload)) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def archive(
    entries: dict[str, bytes], compression: int = zipfile.ZIP_STORED, attributes: dict[str, int] | None = None
) -> bytes:
    """A zip written by Python's zipfile (no zip64 records, no alignment); torch.load reads it."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as out:
        for name, content in entries.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = compression
            info.external_attr = (attributes or {}).get(name, 0)
            out.writestr(info, content)
    return buffer.getvalue()


def replace(payload: bytes, changes: dict[str, bytes | None] | None = None) -> bytes:
    """payload rebuilt by zipfile with records (names relative to archive/) replaced, or dropped if None."""
    entries = records(payload)
    for name, content in (changes or {}).items():
        if content is None:
            del entries["archive/" + name]
        else:
            entries["archive/" + name] = content
    return archive(entries)


class Call:
    """Pickles as ``function(*args)`` (what a __reduce__ returns), to write data.pkl by hand."""

    def __init__(self, function: Callable[..., object], *args: object) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[object, ...]:
        return self.function, self.args


class StorageId:
    """Pickles as the persistent id ``pid``, as torch.save writes a storage."""

    def __init__(self, *pid: object) -> None:
        self.pid = pid


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: object) -> object:
        return obj.pid if isinstance(obj, StorageId) else None


def pickled(obj: object) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=2, fix_imports=False).dump(obj)
    return buffer.getvalue()


def tensor_pickle(
    numel: int,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    *,
    storage: type = torch.FloatStorage,
    requires_grad: bool = False,
    location: str = "cpu",
) -> bytes:
    """data.pkl exactly as torch.save writes it for a float tensor, with any header values."""
    pid = StorageId("storage", storage, "0", location, numel)
    hooks = collections.OrderedDict()
    return pickled(Call(torch._utils._rebuild_tensor_v2, pid, offset, size, stride, requires_grad, hooks))


TWELVE_FLOATS = save(torch.arange(12, dtype=torch.float32))


def with_header(
    numel: int, offset: int, size: tuple[int, ...], stride: tuple[int, ...], location: str = "cpu"
) -> bytes:
    """A payload of 12 float32 in storage 0 under a data.pkl with these header values."""
    return replace(TWELVE_FLOATS, {"data.pkl": tensor_pickle(numel, offset, size, stride, location=location)})


# --- hypothesis strategies -----------------------------------------------------------------------------


@st.composite
def views(draw: st.DrawFn, dtypes: list[torch.dtype]) -> torch.Tensor:
    """A tensor of any listed dtype and shape (0-dim and empty included) under up to three view ops."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(st.lists(st.integers(0, 5), max_size=4))
    numel = int(np.prod(shape))
    if dtype in VALUE_DTYPES:  # values torch.equal can compare (no NaN)
        values = draw(st.lists(st.integers(0, 15), min_size=numel, max_size=numel))
        tensor = torch.tensor(values, dtype=torch.int64).to(dtype).reshape(shape)
    else:  # any bit pattern
        raw = draw(st.binary(min_size=numel * dtype.itemsize, max_size=numel * dtype.itemsize))
        tensor = torch.frombuffer(bytearray(raw) or bytearray(1), dtype=torch.uint8)[: len(raw)]
        tensor = tensor.view(dtype).reshape(shape)
    for _ in range(draw(st.integers(0, 3))):
        ndim = tensor.dim()
        op = draw(st.sampled_from(["transpose", "step", "narrow", "select", "expand", "unsqueeze"]))
        if op == "transpose" and ndim >= 2:
            tensor = tensor.transpose(draw(st.integers(0, ndim - 1)), draw(st.integers(0, ndim - 1)))
        elif op == "step" and ndim:
            dim = draw(st.integers(0, ndim - 1))
            start, step = draw(st.integers(0, 3)), draw(st.integers(1, 3))
            tensor = tensor[(slice(None),) * dim + (slice(start, None, step),)]
        elif op == "narrow" and ndim:
            dim = draw(st.integers(0, ndim - 1))
            start = draw(st.integers(0, tensor.shape[dim]))
            tensor = tensor.narrow(dim, start, draw(st.integers(0, tensor.shape[dim] - start)))
        elif op == "select" and ndim and tensor.shape[0]:
            tensor = tensor[draw(st.integers(0, tensor.shape[0] - 1))]
        elif op == "expand":
            tensor = tensor.unsqueeze(0).expand(draw(st.integers(0, 3)), *tensor.shape)
        elif op == "unsqueeze":
            tensor = tensor.unsqueeze(draw(st.integers(0, ndim)))
    return tensor


def containers(payload: bytes) -> st.SearchStrategy[bytes | bytearray | memoryview]:
    """The payload as bytes, a bytearray, or a memoryview slice at any offset of a larger buffer."""
    embedded = st.integers(0, 70).map(
        lambda pad: memoryview(b"\xee" * pad + payload + b"\xee" * 5)[pad : pad + len(payload)]
    )
    return st.one_of(st.just(payload), st.just(bytearray(payload)), embedded)


# --- equality with torch.load ----------------------------------------------------------------------


@CI
@given(st.data(), views(DTYPES), st.booleans())
def test_matches_torch_load_for_every_dtype_and_view(
    data: st.DataObject, tensor: torch.Tensor, copy: bool
) -> None:
    payload = save(tensor)
    container = data.draw(containers(payload))
    got = read_tensor(container, copy=copy)
    expected = torch_load(payload)
    assert_same(got, expected)
    if tensor.dtype in VALUE_DTYPES:
        assert torch.equal(got, expected) and torch.equal(got, tensor)
    if got.untyped_storage().nbytes():
        assert shares_memory(got, container) is not copy


@CI
@given(views(VALUE_DTYPES).filter(lambda tensor: tensor.untyped_storage().nbytes() > 0))
def test_copy_owns_its_memory_and_view_aliases_the_buffer(tensor: torch.Tensor) -> None:
    payload = bytearray(save(tensor))
    owned, shared = read_tensor(payload, copy=True), read_tensor(payload, copy=False)
    before = bytes(owned.untyped_storage())
    start = shared.untyped_storage().data_ptr() - address_range(payload)[0]
    payload[start] ^= 0xFF  # the storage's first byte
    assert bytes(shared.untyped_storage())[0] == payload[start]  # the view sees the change ...
    assert bytes(owned.untyped_storage()) == before  # ... the copy does not


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (2, 3)], ids=str)
def test_zero_dim_empty_and_plain_tensors(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    tensor = torch.frombuffer(bytearray(range(1, 97)), dtype=torch.uint8)[
        : int(np.prod(shape)) * dtype.itemsize
    ]
    tensor = tensor.view(dtype).reshape(shape)
    payload = save(tensor)
    for copy in (True, False):
        assert_same(read_tensor(payload, copy=copy), torch_load(payload))


def test_every_savable_dtype_is_listed() -> None:
    for dtype in {value for value in vars(torch).values() if isinstance(value, torch.dtype)}:
        try:
            payload = save(torch.zeros(2, dtype=dtype))
        except (KeyError, RuntimeError, NotImplementedError):
            continue  # torch cannot make or save it (sub-byte ints, quantized dtypes)
        assert dtype in DTYPES, f"{dtype} is saved by torch.save but not tested"
        assert_same(read_tensor(payload), torch_load(payload))


def test_allow_list_is_within_torchs_weights_only_allow_list() -> None:
    allowed = torch._weights_only_unpickler._get_allowed_globals()
    for operand in tensorfile._GLOBALS:
        assert operand.decode().replace("\n", ".") in allowed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.complex64])
def test_requires_grad_is_dropped(dtype: torch.dtype) -> None:
    tensor = torch.arange(6, dtype=torch.float32).to(dtype).requires_grad_()
    payload = save(tensor)
    expected = torch_load(payload)
    assert expected.requires_grad
    assert_same(read_tensor(payload), expected.detach())


@pytest.mark.parametrize(
    "payload",
    [
        replace(
            TWELVE_FLOATS,
            {"data.pkl": tensor_pickle(12, 0, (12,), (1,), storage=torch.IntStorage, requires_grad=True)},
        ),
        save(torch.zeros(3, dtype=torch.float8_e5m2).requires_grad_()),  # _rebuild_tensor_v3 cannot do it
    ],
    ids=["int32", "float8"],
)
def test_tensor_that_requires_grad_is_refused_where_torch_load_fails(payload: bytes) -> None:
    with pytest.raises(RuntimeError):
        torch_load(payload)
    with pytest.raises(TensorFileError, match="require gradients, which torch.load refuses"):
        read_tensor(payload)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_pickle_protocol_3_is_read_and_others_are_refused() -> None:
    tensor = torch.arange(6.0).reshape(2, 3).t()
    assert_same(read_tensor(save(tensor, pickle_protocol=3)), tensor)
    for protocol in (0, 1, 4, 5):  # torch.load(weights_only=True) reads none of them
        with pytest.raises(TensorFileError, match="opcode"):
            read_tensor(save(tensor, pickle_protocol=protocol), fallback=True)


def test_payload_saved_to_a_file_is_read(tmp_path: Path) -> None:
    """torch.save to a path names the archive folder after the file, not archive/."""
    torch.save(torch.arange(6.0).reshape(2, 3).t(), tmp_path / "latents.pth")
    payload = (tmp_path / "latents.pth").read_bytes()
    assert b"latents/data.pkl" in payload
    assert_same(read_tensor(payload), torch_load(payload))


def test_zipfile_written_archive_is_read() -> None:
    """The rebuilt archives the tests below use are valid: torch.load and read_tensor agree on them."""
    payload = save(torch.arange(12.0).reshape(3, 4)[1:, ::2])
    rebuilt = replace(payload)
    assert rebuilt != payload
    assert_same(read_tensor(rebuilt), torch_load(rebuilt))


def test_parsed_headers_are_cached_but_every_payload_is_checked() -> None:
    tensor = torch.arange(12, dtype=torch.float32)
    assert_same(read_tensor(save(tensor)), tensor)
    short = replace(save(tensor), {"data/0": bytes(44)})  # same data.pkl (a cache hit), 4 bytes short
    with pytest.raises(TensorFileError, match="storage '0' holds 44 bytes but data.pkl declares 48"):
        read_tensor(short)


def test_read_only_buffer_view_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(read_tensor(TWELVE_FLOATS, copy=False), torch.arange(12, dtype=torch.float32))


def test_non_contiguous_buffer_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        read_tensor(memoryview(TWELVE_FLOATS)[::2])


# --- headers: bounds, sizes, overflow ------------------------------------------------------------------

small = st.integers(0, 14)
edge = st.sampled_from([-(1 << 63), -1, 1 << 31, (1 << 62) + 1, (1 << 63) - 1, 1 << 63, 1 << 64])


@CI
@given(
    offset=st.one_of(small, edge),
    size=st.lists(st.one_of(small, edge), max_size=3),
    stride=st.lists(st.one_of(small, edge), max_size=3),
)
def test_views_beyond_the_storage_are_refused(offset: int, size: list[int], stride: list[int]) -> None:
    """12 floats of storage under any offset, size and stride: a tensor equal to torch.load's, or a
    TensorFileError; with small values exactly when torch.load refuses too (except for a size without
    strides, which torch's set_ takes as contiguous but torch.save never writes)."""
    payload = with_header(12, offset, tuple(size), tuple(stride))
    try:
        got = read_tensor(payload)
    except TensorFileError:
        if all(0 <= value < 15 for value in (offset, *size, *stride)) and (stride or not size):
            with pytest.raises(RuntimeError):
                torch_load(payload)
        return
    assert_same(got, torch_load(payload))


@pytest.mark.parametrize(
    ("offset", "size", "stride", "message"),
    [
        (0, (13,), (1,), "holds 48 bytes but the tensor needs 52"),
        (12, (1,), (1,), "holds 48 bytes but the tensor needs 52"),
        (0, (4, 4), (4, 1), "holds 48 bytes but the tensor needs 64"),
        (0, (1 << 40,), (1,), "the tensor needs 4398046511104"),  # must not allocate 4 TiB
        (0, (1 << 32, 1 << 32), (0, 0), "overflows int64"),
        (0, (3,), (-1,), "negative size"),
        (0, (-3,), (1,), "negative size"),
        (-1, (1,), (1,), "negative storage offset"),
        (0, (1 << 63,), (0,), "integer wider than 64 bits"),
        (0, (2, 3), (1,), "2 sizes but 1 strides"),
    ],
)
def test_bad_headers_are_refused(
    offset: int, size: tuple[int, ...], stride: tuple[int, ...], message: str
) -> None:
    with pytest.raises(TensorFileError, match=message):
        read_tensor(with_header(12, offset, size, stride))


def test_huge_expanded_view_is_a_view_not_an_allocation() -> None:
    got = read_tensor(with_header(12, 11, (1 << 62,), (0,)))
    assert got.shape == (1 << 62,) and got.untyped_storage().nbytes() == 48 and got[-1] == 11


@pytest.mark.parametrize("numel", [11, 13, 0, 1 << 61])
def test_storage_size_must_match_the_declared_numel(numel: int) -> None:
    with pytest.raises(TensorFileError, match=f"holds 48 bytes but data.pkl declares {numel * 4}"):
        read_tensor(with_header(numel, 0, (1,), (1,)))


# --- malformed payloads -----------------------------------------------------------------------------------


@CI
@given(st.binary(max_size=2048), st.sampled_from([b"", b"PK\x03\x04"]))
def test_random_bytes_are_refused(noise: bytes, prefix: bytes) -> None:
    with pytest.raises(TensorFileError):
        read_tensor(prefix + noise, fallback=True)


@pytest.mark.parametrize(
    "tensor", [torch.arange(12.0).reshape(3, 4)[1:, ::2], torch.zeros(0), torch.tensor(7)]
)
def test_every_truncation_is_refused(tensor: torch.Tensor) -> None:
    payload = save(tensor)
    for length in range(len(payload)):
        with pytest.raises(TensorFileError):
            read_tensor(payload[:length])
        with pytest.raises(TensorFileError):
            read_tensor(payload[len(payload) - length :])


@CI
@given(views(DTYPES), st.lists(st.tuples(st.integers(0), st.integers(1, 255)), min_size=1, max_size=3))
def test_byte_flips_give_torch_loads_tensor_or_a_refusal(
    tensor: torch.Tensor, flips: list[tuple[int, int]]
) -> None:
    payload = bytearray(save(tensor))
    for position, mask in flips:
        payload[position % len(payload)] ^= mask
    check_tensor_or_refusal(bytes(payload))


def opcodes(pkl: bytes) -> list[bytes]:
    """pkl cut into its opcodes, each with its argument."""
    starts = [position for _, _, position in pickletools.genops(pkl)]
    return [pkl[start:end] for start, end in zip(starts, [*starts[1:], len(pkl)], strict=True)]


# Opcodes (with arguments) that a single tensor's data.pkl uses, plus a few it never should.
OPCODES = sorted(
    {
        op
        for dtype in (torch.float32, torch.uint16)
        for op in opcodes(records(save(torch.zeros(2, 3, dtype=dtype).t()))["archive/data.pkl"])
    }
    | {
        b"K\x00",
        b"K\x07",
        b"M\x00\x01",
        b"J\xff\xff\xff\xff",
        b"\x8a\x01\xff",
        b"\x8a\x00",
        b"h\x00",
        b"h\x05",
    }
    | {b"j\x01\x00\x00\x00", b"r\x01\x00\x00\x00", b"\x88", b"N", b"}", b"]", b"ctorch\nIntStorage\n"}
)


@CI
@given(st.data(), views([torch.float32, torch.uint16, torch.bool]))
def test_mutated_pickles_give_torch_loads_tensor_or_a_refusal(
    data: st.DataObject, tensor: torch.Tensor
) -> None:
    """data.pkl with opcodes dropped, repeated, moved or inserted: torch.load's tensor or a refusal."""
    payload = save(tensor)
    ops = opcodes(records(payload)["archive/data.pkl"])
    for _ in range(data.draw(st.integers(1, 3))):
        position = data.draw(st.integers(0, len(ops) - 1))
        action = data.draw(st.sampled_from(["drop", "repeat", "move", "insert"]))
        if action == "drop":
            del ops[position]
        elif action == "repeat":
            ops.insert(position, ops[position])
        elif action == "move":
            ops.insert(data.draw(st.integers(0, len(ops) - 1)), ops.pop(position))
        else:
            ops.insert(position, data.draw(st.sampled_from(OPCODES)))
        if not ops:
            break
    check_tensor_or_refusal(replace(payload, {"data.pkl": b"".join(ops)}))


def check_tensor_or_refusal(payload: bytes) -> None:
    """read_tensor gives torch.load's tensor for these bytes or raises TensorFileError; nothing else."""
    try:
        got = read_tensor(payload)
    except TensorFileError:
        return
    assert_same(got, torch_load(payload))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"data/0": None}, "refers to storage '0', which the archive lacks"),
        ({"data.pkl": None}, "no data.pkl"),
        ({"version": None}, "no version record"),
        ({"version": b"0\n"}, "invalid version record"),
        ({"version": b"x\n"}, "invalid version record"),
        ({"byteorder": b"middle"}, "unknown byte order"),
        ({".storage_alignment": b"sixty-four"}, "invalid .storage_alignment"),
        ({".data/serialization_id": b"\xff\xfe"}, "serialization_id record is not UTF-8"),
        ({"data.pkl": tensor_pickle(12, 0, (12,), (1,)) + b"."}, "does not end with exactly one object"),
        ({"data.pkl": tensor_pickle(12, 0, (12,), (1,))[:-1]}, "truncated or malformed"),
        ({"data.pkl": b"\x80\x02(K\x01."}, "does not end with exactly one object"),
        ({"data.pkl": b"\x80\x02K\x01\x85."}, "holds a tuple, not a tensor"),
        ({"data.pkl": b"\x80\x02X\xff\xff\x00\x00abc."}, "truncated or malformed"),
        ({"data.pkl": b"\x80\x02X\x01\x00\x00\x00\xff."}, "truncated or malformed"),  # not UTF-8
        ({"data.pkl": b"\x80\x02ctorch\nFloatStorage."}, "truncated or malformed"),  # no second newline
    ],
)
def test_malformed_records_are_refused(changes: dict[str, bytes | None], message: str) -> None:
    payload = replace(TWELVE_FLOATS, changes)
    with pytest.raises(TensorFileError, match=message):
        read_tensor(payload, fallback=True)


def renamed(extra: str, to: bytes) -> bytes:
    """TWELVE_FLOATS with one more entry, named ``extra`` and then renamed to ``to`` in its bytes."""
    return archive({**records(TWELVE_FLOATS), extra: b"1"}).replace(extra.encode(), to)


def flagged(flags: int) -> bytes:
    """TWELVE_FLOATS rebuilt by zipfile, with these general purpose flags set in every central directory header."""
    payload = bytearray(archive(records(TWELVE_FLOATS)))
    position = payload.find(b"PK\x01\x02")
    while position >= 0:
        payload[position + 8] |= flags
        position = payload.find(b"PK\x01\x02", position + 1)
    return bytes(payload)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (renamed("archive/data/X", b"archive/data/0"), "holds an entry name twice"),
        (renamed("archive/zzzz/0", b"archive/DATA/0"), "holds an entry name twice"),  # torch ignores case
        (renamed("archive/zz", b"archive/\xff\xfe"), "not in a folder of UTF-8 names"),
        (archive({**records(TWELVE_FLOATS), "other/x": b""}), "not in a folder"),
        (archive({"data.pkl": b""}), "not in a folder"),
        (archive(records(TWELVE_FLOATS), attributes={"archive/data/0": 0x10}), "or a directory"),
        (flagged(0x01), "encrypted"),
        (TWELVE_FLOATS + b"\0", "does not end with its end record"),
        (b"\0" + TWELVE_FLOATS, "not a torch.save zip archive"),
        (archive({}), "not a torch.save zip archive"),
    ],
    ids=["twice", "twice ignoring case", "not UTF-8", "outside", "no folder", "directory", "encrypted"]
    + ["trailing", "leading", "empty"],
)
def test_malformed_zip_structures_are_refused(payload: bytes, message: str) -> None:
    with pytest.raises(TensorFileError, match=message):
        read_tensor(payload, fallback=True)


# --- hostile pickles -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pkl", "message"),
    [
        (pickled(Call(os.system, "true")), r"references (posix|nt)\.system, not a tensor"),
        (pickled(Call(builtins.eval, "1")), r"references builtins\.eval, not a tensor"),
        (pickled(Call(subprocess.Popen, ["true"])), r"references subprocess\.Popen, not a tensor"),
        (b"\x80\x02c__builtin__\neval\nX\x01\x00\x00\x001\x85R.", r"references __builtin__\.eval"),
        (tensor_pickle(12, 0, ("a",), (1,)), "size and stride are not tuples of ints"),
        (tensor_pickle(12, 0, (True,), (1,)), "size and stride are not tuples of ints"),
        (b"\x80\x02ctorch\nFloatStorage\n)R.", "calls torch.FloatStorage; only tensor rebuilds"),
        (b"\x80\x02ccollections\nOrderedDict\nK\x01\x85R.", "builds a non-empty OrderedDict"),
        (b"\x80\x02ctorch\nfloat32\n)R.", "calls torch.float32"),
        (
            pickled(Call(torch._utils._rebuild_tensor_v2, 1, 2, 3)),
            "_rebuild_tensor_v2 with the wrong arguments",
        ),
        (pickled((StorageId("storage", torch.FloatStorage, "0", "cpu", 12),) * 2), "several storages"),
        (pickled(StorageId("storage", os.system, "0", "cpu", 12)), r"references (posix|nt)\.system"),
        (pickled(StorageId("module", torch.FloatStorage, "0", "cpu", 12)), "malformed storage reference"),
        (pickled(StorageId("storage", torch.FloatStorage, "0", "cpu", -1)), "malformed storage reference"),
        (b"\x80\x02h\x05.", "truncated or malformed"),  # BINGET of an unset memo slot
        (b"\x80\x02(q\x00.", "memoizes from an empty stack"),  # BINPUT below a MARK
        (b"\x80\x02K\x01(R.", "calls something from an empty stack"),
        (b"\x80\x02\x8a\x09" + bytes(9) + b".", "wider than 64 bits"),
    ],
)
def test_hostile_pickles_are_refused_without_fallback(pkl: bytes, message: str) -> None:
    payload = replace(TWELVE_FLOATS, {"data.pkl": pkl})
    for fallback in (False, True):
        with pytest.raises(TensorFileError, match=message) as caught:
            read_tensor(payload, fallback=fallback)
        assert type(caught.value) is TensorFileError  # a plain refusal: torch.load never saw it


class Marker:
    """A pickled object whose __reduce__ creates a marker file when it is unpickled."""

    def __init__(self, how: str, path: Path) -> None:
        self.how, self.path = how, str(path)

    def __reduce__(self) -> tuple[object, ...]:
        if self.how == "open":
            return builtins.open, (self.path, "w")
        if self.how == "system":
            return os.system, (f"touch {shlex.quote(self.path)}",)
        if self.how == "run":
            return subprocess.run, (["touch", self.path],)
        return builtins.exec, (f"open({self.path!r}, 'w')",)


MARKERS = ["open", "system", "run", "exec"]
WRAPS: dict[str, Callable[[Marker], object]] = {
    "alone": lambda marker: marker,
    "in a list": lambda marker: [marker, torch.zeros(2)],
    "in a dict": lambda marker: {"pooled": marker, "latents": torch.zeros(2)},
}
# Unpickles each file named on the command line for real, up to the first torch global (which it refuses so as
# not to import torch): the part of each payload before that runs, as it would under a full torch.load.
UNPICKLE = """
import pickle, sys
class Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.startswith("torch"):
            raise LookupError(module)
        return super().find_class(module, name)
for path in sys.argv[1:]:
    try:
        Unpickler(open(path, "rb")).load()
    except LookupError:
        pass
"""


@pytest.mark.parametrize("how", MARKERS)
@pytest.mark.parametrize("wrap", WRAPS)
def test_pickled_code_never_runs(tmp_path: Path, how: str, wrap: str) -> None:
    marker = tmp_path / "marker"
    payload = save(WRAPS[wrap](Marker(how, marker)))
    for fallback in (False, True):
        with pytest.raises(TensorFileError):
            read_tensor(payload, fallback=fallback)
    assert not marker.exists()


def test_marker_payloads_are_live(tmp_path: Path) -> None:
    """Unpickling the same data.pkl for real creates every marker, so the test above can fail."""
    markers = []
    for how in MARKERS:
        for wrap, make in WRAPS.items():
            markers.append(tmp_path / f"{how} {wrap}.marker")
            pkl = records(save(make(Marker(how, markers[-1]))))["archive/data.pkl"]
            (tmp_path / f"{how} {wrap}.pkl").write_bytes(pkl)
    pickles = sorted(str(path) for path in tmp_path.glob("*.pkl"))
    subprocess.run([sys.executable, "-c", UNPICKLE, *pickles], check=True, capture_output=True)
    assert all(marker.exists() for marker in markers)


# --- refusals and the fallback -------------------------------------------------------------------------

TENSOR = torch.arange(12.0).reshape(3, 4)


def nested() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype
        return torch.nested.nested_tensor([TENSOR, TENSOR[:1]])


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (save(TENSOR, _use_new_zipfile_serialization=False), "legacy"),
        (save(torch.nn.Parameter(TENSOR)), "_rebuild_parameter"),
        (save(TENSOR.to(torch.complex64).conj()), "EMPTY_DICT"),  # the conjugate bit is pickled as metadata
        (replace(save(TENSOR), {"byteorder": None}), "no byteorder record"),
        (replace(save(TENSOR), {"version": b"7\n"}), "version 7"),
        (archive(records(save(TENSOR)), zipfile.ZIP_DEFLATED), "compressed"),
        (
            with_header(12, 0, (3, 4), (4, 1), location="cuda:0" + " " * 20000),
            "far more than one tensor needs",
        ),
    ],
    ids=["legacy", "parameter", "conjugate", "no byteorder", "newer version", "deflated", "huge data.pkl"],
)
def test_fallback_reads_what_the_fast_path_refuses(payload: bytes, message: str) -> None:
    with pytest.raises(TensorFileError, match=message):
        read_tensor(payload)
    expected = torch_load(payload)
    got = read_tensor(payload, fallback=True)
    assert type(got) is torch.Tensor and not got.requires_grad and got.is_conj() == expected.is_conj()
    assert torch.equal(got, expected.detach())


def test_big_endian_payload_is_refused_and_read_by_the_fallback() -> None:
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    swapped = tensor.untyped_storage()
    swapped = torch.frombuffer(bytearray(bytes(swapped)), dtype=torch.uint8).view(-1, 4).flip(-1)
    payload = replace(save(tensor), {"byteorder": b"big", "data/0": swapped.numpy().tobytes()})
    with pytest.raises(TensorFileError, match="big-endian payload"):
        read_tensor(payload)
    assert_same(read_tensor(payload, fallback=True), tensor)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"latents": TENSOR}, "holds a dict"),
        ([TENSOR], "holds a list"),
        ((TENSOR,), "holds a tuple"),
        ((TENSOR, TENSOR + 1), "several storages"),
        (3, "holds an int"),
        ("text", "holds a str"),
        (TENSOR.to_sparse(), "holds a sparse_coo tensor, not a plain dense tensor"),
        (nested(), "nested"),
    ],
    ids=["dict", "list", "tuple", "two tensors", "int", "str", "sparse", "nested"],
)
def test_other_objects_are_refused_also_with_fallback(obj: object, message: str) -> None:
    payload = save(obj)
    for fallback in (False, True):
        with pytest.raises(TensorFileError, match=message if fallback else None):
            read_tensor(payload, fallback=fallback)


class Subclass(torch.Tensor):
    """A tensor subclass: torch.save pickles its class, which weights_only loading refuses."""


def test_quantized_tensor_and_subclass_are_refused_also_with_fallback() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantization is deprecated
        quantized = torch.quantize_per_tensor(TENSOR, 0.5, 0, torch.qint8)
    for obj in (quantized, TENSOR.as_subclass(Subclass)):
        payload = save(obj)
        for fallback in (False, True):
            with pytest.raises(TensorFileError):
                read_tensor(payload, fallback=fallback)


# --- the tests can fail --------------------------------------------------------------------------------


def test_broken_bounds_check_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without its bounds check the reader hands hostile views to torch, which raises RuntimeError: the
    bounds tests, which accept only TensorFileError, fail."""
    monkeypatch.setattr(tensorfile, "_check_view", lambda header, storage_bytes: None)
    with pytest.raises(RuntimeError):
        test_views_beyond_the_storage_are_refused()
    with pytest.raises(RuntimeError, match="resize storage that is not resizable"):
        test_bad_headers_are_refused(0, (13,), (1,), "holds 48 bytes but the tensor needs 52")


def test_broken_record_check_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that lets a non-UTF-8 serialization id through returns a tensor where torch.load fails:
    the flip property fails."""
    payload = replace(TWELVE_FLOATS, {".data/serialization_id": b"\xff\xfe"})
    check_tensor_or_refusal(payload)
    monkeypatch.setattr(tensorfile, "_is_utf8", lambda raw: True)
    with pytest.raises(UnicodeDecodeError):
        check_tensor_or_refusal(payload)


# --- the layout cache ----------------------------------------------------------------------------------


def outcome(payload: bytes | bytearray | memoryview, **kwargs: bool) -> tuple[object, ...]:
    """What read_tensor does with payload: the tensor's full description, or the error's type and message."""
    try:
        got = read_tensor(payload, **kwargs)
    except TensorFileError as error:
        return type(error).__name__, str(error)
    return got.dtype, got.shape, got.stride(), got.storage_offset(), bytes(got.untyped_storage())


def with_flag_bit_3(payload: bytes) -> bytes:
    """payload (a zipfile-written archive without data descriptors) with the 'sizes in a data descriptor'
    flag set on every entry: the reader accepts it, but each 'descriptor CRC' it would skip is then the
    next record's header, which the parse reads."""
    edited = bytearray(payload)
    with zipfile.ZipFile(io.BytesIO(payload)) as archive:
        infos = archive.infolist()
        start = archive.start_dir
    for info in infos:
        edited[info.header_offset + 6] |= 0x08  # the local header's flags
    position = start
    for _ in infos:
        edited[position + 8] |= 0x08  # the central header's flags
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", edited, position + 28)
        position += 46 + name_len + extra_len + comment_len
    return bytes(edited)


@pytest.fixture(autouse=False)
def empty_cache() -> Iterator[None]:
    tensorfile.clear_layout_cache()
    yield
    tensorfile.clear_layout_cache()


@CI
@given(
    st.data(),
    views(DTYPES),
    st.lists(st.tuples(st.integers(0), st.integers(1, 255)), min_size=1, max_size=3),
    st.booleans(),
)
def test_a_remembered_layout_reads_exactly_what_the_parse_reads(
    data: st.DataObject, tensor: torch.Tensor, flips: list[tuple[int, int]], copy: bool
) -> None:
    """With a payload's layout remembered, another payload of that layout with any bytes flipped, held in
    bytes, a bytearray or a memoryview, gives what the full parse gives: the same tensor (storage bytes
    included) or the same refusal."""
    tensorfile.clear_layout_cache()
    read_tensor(save(tensor))
    assert tensorfile._layout_count == 1, "torch.save's layout was not remembered"
    payload = bytearray(save(tensor))  # another serialization id, CRCs equal or not
    for position, mask in flips:
        payload[position % len(payload)] ^= mask
    container = data.draw(containers(bytes(payload)))
    assert outcome(container, copy=copy) == outcome(container, copy=copy, cache=False)


def test_a_remembered_layout_skips_the_parse(empty_cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = save(torch.randn(4, 5)), save(torch.randn(4, 5))
    other_shape = save(torch.randn(5, 4))  # the same length, another data.pkl
    assert len(first) == len(other_shape)
    read_tensor(first)
    monkeypatch.setattr(tensorfile, "_open_archive", lambda view: pytest.fail("the payload was parsed"))
    for copy in (True, False):
        assert_same(read_tensor(second, copy=copy), torch_load(second))
        assert shares_memory(read_tensor(second, copy=copy), second) is not copy
    with pytest.raises(pytest.fail.Exception, match="was parsed"):
        read_tensor(other_shape)


def test_cache_false_neither_uses_nor_fills_the_cache(empty_cache: None) -> None:
    read_tensor(TWELVE_FLOATS, cache=False)
    assert tensorfile._layout_count == 0 and not tensorfile._LAYOUTS


def test_the_cache_is_bounded(empty_cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensorfile, "_MAX_LAYOUTS", 2)
    payloads = [save(torch.zeros(n)) for n in (1, 2, 3)]
    for payload in payloads:
        assert_same(read_tensor(payload), torch_load(payload))
    assert tensorfile._layout_count == 2
    assert sum(len(layouts) for layouts in tensorfile._LAYOUTS.values()) == 2
    assert_same(read_tensor(payloads[2]), torch_load(payloads[2]))  # still read, by the full parse


def test_layouts_with_much_more_than_torch_saves_overhead_are_not_kept(
    empty_cache: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    overhead = len(TWELVE_FLOATS) - 48  # the archive minus its storage
    monkeypatch.setattr(tensorfile, "_MAX_LAYOUT_BYTES", overhead - 1)
    assert_same(read_tensor(TWELVE_FLOATS), torch_load(TWELVE_FLOATS))
    assert tensorfile._layout_count == 0
    monkeypatch.setattr(tensorfile, "_MAX_LAYOUT_BYTES", overhead)
    read_tensor(TWELVE_FLOATS)
    assert tensorfile._layout_count == 1


def test_at_most_a_few_layouts_of_one_length_are_kept(
    empty_cache: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup compares a payload with every layout of its length, so that number is bounded."""
    monkeypatch.setattr(tensorfile, "_MAX_LAYOUTS_PER_LENGTH", 2)
    payloads = [save(torch.zeros(shape)) for shape in ((4, 5), (5, 4), (2, 10), (10, 2))]
    assert len({len(payload) for payload in payloads}) == 1
    for payload in payloads:
        assert_same(read_tensor(payload), torch_load(payload))
    assert [len(layouts) for layouts in tensorfile._LAYOUTS.values()] == [2]


def test_headers_of_many_dimensions_are_read_but_not_kept(empty_cache: None) -> None:
    """A header of thousands of dimensions (legal when a size is 0) would hold far more memory than its bytes."""
    many = save(torch.zeros([0] + [1] * 99))
    assert_same(read_tensor(many), torch_load(many))
    assert tensorfile._layout_count == 0
    assert_same(read_tensor(save(torch.zeros([1] * 64))), torch_load(save(torch.zeros([1] * 64))))
    assert tensorfile._layout_count == 1


def test_a_bad_serialization_id_is_refused_also_with_the_layout_remembered(empty_cache: None) -> None:
    read_tensor(TWELVE_FLOATS)
    payload = bytearray(save(torch.arange(12, dtype=torch.float32)))
    with zipfile.ZipFile(io.BytesIO(bytes(payload))) as archive:
        local = archive.getinfo("archive/.data/serialization_id").header_offset
    name_len, extra_len = struct.unpack_from("<HH", payload, local + 26)
    start = local + 30 + name_len + extra_len  # the serialization id's first byte
    payload[start : start + 2] = b"\xff\xfe"
    with pytest.raises(TensorFileError, match="serialization_id record is not UTF-8"):
        read_tensor(bytes(payload))


def test_an_archive_with_overlapping_varying_bytes_is_never_cached(empty_cache: None) -> None:
    payload = with_flag_bit_3(replace(TWELVE_FLOATS))
    assert_same(read_tensor(payload), torch_load(payload))
    assert tensorfile._layout_count == 0


def test_broken_overlap_check_is_caught(empty_cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache that remembered a layout whose varying bytes overlap bytes the parse reads would accept a
    payload the parse refuses: the equality property fails."""
    payload = with_flag_bit_3(replace(TWELVE_FLOATS))
    # The storage entry's 'descriptor CRC' is the next local header's magic, which the parse checks.
    with zipfile.ZipFile(io.BytesIO(payload)) as archive:
        names = [info.filename for info in archive.infolist()]
        after_storage = archive.infolist()[names.index("archive/data/0") + 1].header_offset
    broken = bytearray(payload)
    broken[after_storage : after_storage + 4] = b"XXXX"
    read_tensor(payload)
    assert outcome(bytes(broken)) == outcome(bytes(broken), cache=False)
    assert "malformed local header" in outcome(bytes(broken))[1]
    monkeypatch.setattr(tensorfile, "_disjoint", lambda varying, read, length: True)
    tensorfile.clear_layout_cache()
    read_tensor(payload)
    assert outcome(bytes(broken)) != outcome(bytes(broken), cache=False)


def test_broken_match_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache that matched payloads by length alone would read flipped headers the parse refuses: the
    equality property fails."""
    monkeypatch.setattr(
        tensorfile, "_match", lambda data, view: next(iter(tensorfile._LAYOUTS.get(len(view), [])), None)
    )
    with pytest.raises(AssertionError):
        test_a_remembered_layout_reads_exactly_what_the_parse_reads()
    tensorfile.clear_layout_cache()
