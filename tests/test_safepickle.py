"""primus_energon.safepickle: equal to pickle.loads on plain data (hypothesis, every protocol), refuses
every hostile pickle before it runs anything, and fails cleanly on malformed bytes."""

from __future__ import annotations

import collections
import copyreg
import io
import math
import os
import pickle
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primus_energon.safepickle import (
    MAX_DEPTH,
    PickleFormatError,
    PickleLimitError,
    UnsafePickleError,
    describe_structure,
    safe_loads,
)

_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)
_TORCH_DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
]
_NUMPY_DTYPES = ["float16", "float32", "float64", "int8", "int32", "uint16", "bool", "complex64", "<U3", "S2"]


@st.composite
def tensors(draw: Any) -> torch.Tensor:
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    dtype = draw(st.sampled_from(_TORCH_DTYPES))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    values = torch.randn(shape, generator=generator) * 100
    tensor = values.to(dtype)
    if draw(st.booleans()) and tensor.ndim >= 1 and tensor.shape[0] > 1:
        tensor = tensor[::2]  # a view: the pickle carries the whole storage
    return tensor


@st.composite
def arrays(draw: Any) -> np.ndarray:
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    dtype = np.dtype(draw(st.sampled_from(_NUMPY_DTYPES)))
    raw = draw(
        st.binary(
            min_size=int(np.prod(shape)) * dtype.itemsize, max_size=int(np.prod(shape)) * dtype.itemsize
        )
    )
    array = np.frombuffer(raw, dtype=np.uint8).view(dtype).reshape(shape) if raw else np.zeros(shape, dtype)
    return np.asfortranarray(array) if draw(st.booleans()) else array.copy()


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.complex_numbers(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.builds(np.float32, st.floats(width=32)),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
)
leaves = st.one_of(scalars, tensors(), arrays())
structures = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=8), inner, max_size=4),
        st.builds(collections.OrderedDict, st.dictionaries(st.text(max_size=4), inner, max_size=3)),
        st.frozensets(st.integers(), max_size=3),
        st.builds(bytearray, st.binary(max_size=8)),
    ),
    max_leaves=12,
)


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types; tensors and arrays bitwise (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        flat = (a.contiguous().reshape(-1).view(bits), b.contiguous().reshape(-1).view(bits))
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(*flat)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@_SETTINGS
@given(value=structures, protocol=st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_equal_to_pickle_loads_on_plain_data(value: Any, protocol: int) -> None:
    data = pickle.dumps(value, protocol=protocol)
    assert _same(safe_loads(data), pickle.loads(data))  # noqa: S301 (the test's own data)


def test_the_formats_real_projects_write() -> None:
    """DFM's FLUX text embeddings (a dict of tensors) and NeMo's pickled float16 numpy array."""
    flux = {"prompt_embeds": torch.randn(512, 64), "pooled_prompt_embeds": torch.randn(768)}
    out = safe_loads(pickle.dumps(flux))
    assert _same(out, flux)
    assert (
        describe_structure(out)
        == "dict(prompt_embeds: tensor float32 [512, 64], pooled_prompt_embeds: tensor float32 [768])"
    )
    nemo = np.random.default_rng(0).standard_normal((77, 32)).astype(np.float16)
    assert _same(safe_loads(pickle.dumps(nemo)), nemo)


class _Reduces:
    def __init__(self, function: Any, args: tuple) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple:
        return (self.function, self.args)


class _Custom:
    pass


class _TensorSubclass(torch.Tensor):
    pass


def _hostile(marker: Path) -> dict[str, bytes]:
    code = f"open({str(marker)!r}, 'w').write('ran')"
    objects = np.empty(1, dtype=object)
    objects[0] = _Reduces(exec, (code,))
    storage = io.BytesIO()
    torch.save(_Reduces(exec, (code,)), storage)
    return {
        "os.system": pickle.dumps(_Reduces(os.system, (f"touch {marker}",))),
        "exec": pickle.dumps(_Reduces(exec, (code,))),
        "eval": pickle.dumps(_Reduces(eval, (code,))),
        "subprocess.Popen": pickle.dumps(_Reduces(subprocess.Popen, (["touch", str(marker)],))),
        "getattr": pickle.dumps(_Reduces(getattr, (_Reduces(__import__, ("os",)), "system"))),
        "__import__": pickle.dumps(_Reduces(__import__, ("os",))),
        "nested pickle.loads": pickle.dumps(_Reduces(pickle.loads, (pickle.dumps(_Reduces(exec, (code,))),))),
        "torch.load": pickle.dumps(_Reduces(torch.load, (str(marker),))),
        "bytes(n)": pickle.dumps(_Reduces(bytes, (10**12,))),
        "np.load": pickle.dumps(_Reduces(np.load, (str(marker),))),
        "object array": pickle.dumps(objects),
        "Parameter": pickle.dumps(torch.nn.Parameter(torch.randn(2))),
        "tensor subclass": pickle.dumps(torch.randn(2).as_subclass(_TensorSubclass)),
        "a class of the program": pickle.dumps(_Custom()),
        "copyreg._reconstructor": pickle.dumps(_Reduces(copyreg._reconstructor, (_Custom, object, None))),
        "hostile storage archive": pickle.dumps(
            _Reduces(
                torch._utils._rebuild_tensor_v2,
                (
                    _Reduces(torch.storage._load_from_bytes, (storage.getvalue(),)),
                    0,
                    (1,),
                    (1,),
                    False,
                    collections.OrderedDict(),
                ),
            )
        ),
    }


@pytest.mark.parametrize("name", sorted(_hostile(Path("/nonexistent"))))
def test_hostile_pickles_are_refused_before_anything_runs(name: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    data = _hostile(marker)[name]
    with pytest.raises(UnsafePickleError):
        safe_loads(data)
    assert not marker.exists()


def test_persistent_ids_are_refused() -> None:
    buffer = io.BytesIO()

    class WithPid(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return "external" if isinstance(obj, str) else None

    WithPid(buffer, protocol=2).dump(["text"])
    with pytest.raises(UnsafePickleError, match="persistent ids"):
        safe_loads(buffer.getvalue())


@_SETTINGS
@given(value=structures, protocol=st.integers(2, pickle.HIGHEST_PROTOCOL), data=st.data())
def test_damaged_pickles_fail_cleanly(value: Any, protocol: int, data: Any) -> None:
    """A truncated or bit-flipped pickle either raises one of the two ValueErrors or yields plain data."""
    raw = bytearray(pickle.dumps(value, protocol=protocol))
    if data.draw(st.booleans(), label="truncate"):
        raw = raw[: data.draw(st.integers(0, max(0, len(raw) - 1)), label="length")]
    else:
        for _ in range(data.draw(st.integers(1, 4), label="flips")):
            at = data.draw(st.integers(0, len(raw) - 1), label="at")
            raw[at] = data.draw(st.integers(0, 255), label="byte")
    try:
        out = safe_loads(bytes(raw))
    except (UnsafePickleError, PickleFormatError):
        return
    describe_structure(out)  # what came back is plain data that can be walked


def _shared(levels: int) -> list:
    """``a = [a, a]`` `levels` times: `levels` + 1 lists, 2**levels paths through them."""
    a: list = []
    for _ in range(levels):
        a = [a, a]
    return a


def test_shared_references_are_walked_once() -> None:
    """A pickle of 41 lists whose paths number 2**40 loads at once (a walk per path would take hours), and
    is described in bounded work; the objects budget counts distinct objects, not paths."""
    data = pickle.dumps(_shared(40), protocol=4)
    value = safe_loads(data, max_objects=100)
    assert len(value) == 2 and value[0] is value[1]
    assert describe_structure(value).startswith("list[list[list[list[list[...], list[...]]")
    with pytest.raises(PickleLimitError) as caught:
        safe_loads(data, max_objects=30)
    assert caught.value.limit == "objects" and caught.value.budget == 30


def test_depth_budget_is_a_format_error() -> None:
    deep: list = []
    node = deep
    for _ in range(MAX_DEPTH + 1):
        node.append([])
        node = node[0]
    with pytest.raises(PickleLimitError, match=f"deeper than {MAX_DEPTH} levels") as caught:
        safe_loads(pickle.dumps(deep))
    assert isinstance(caught.value, PickleFormatError) and caught.value.limit == "depth"
    # deeper than Python's recursion limit: built by opcodes, refused without a RecursionError
    raw = b"\x80\x02" + b"]" * 50_000 + b"a" * 49_999 + b"."
    with pytest.raises(PickleLimitError):
        safe_loads(raw)
    safe_loads(pickle.dumps(deep), max_depth=MAX_DEPTH + 2)


def test_declared_lengths_are_checked_before_anything_is_allocated() -> None:
    """A BINBYTES8/BINUNICODE8 declaring a terabyte in a few bytes is refused as malformed (the unpickler
    would allocate the declared size first); so is a numpy array declaring more than the bytes budget."""
    for opcode in (b"\x8e", b"\x8d", b"\x96"):  # BINBYTES8, BINUNICODE8, BYTEARRAY8
        bomb = b"\x80\x05" + opcode + (1 << 40).to_bytes(8, "little") + b"abc."
        with pytest.raises(PickleFormatError, match="1099511627776 bytes"):
            safe_loads(bomb)
    plain = pickle.dumps(np.zeros(4, np.float64), protocol=2)
    huge = plain.replace(b"K\x00\x85", b"J\x00\x00\x00\x40\x85", 1)  # _reconstruct(ndarray, (2**30,), ...)
    assert huge != plain
    with pytest.raises(PickleLimitError, match="numpy array declares shape") as caught:
        safe_loads(huge, max_bytes=1 << 20)
    assert caught.value.limit == "bytes"


def test_bytes_budget() -> None:
    data = pickle.dumps({"a": b"x" * 5000, "b": "y" * 5000})
    assert safe_loads(data, max_bytes=20_000)["a"] == b"x" * 5000
    with pytest.raises(PickleLimitError) as caught:
        safe_loads(data, max_bytes=8000)
    assert caught.value.limit == "bytes"
    with pytest.raises(PickleLimitError, match="the pickle is"):
        safe_loads(data, max_bytes=100)


def test_errors_are_value_errors() -> None:
    assert issubclass(UnsafePickleError, ValueError) and issubclass(PickleFormatError, ValueError)
    with pytest.raises(PickleFormatError):
        safe_loads(b"not a pickle")


def test_the_safe_decoder_reads_plain_pickles_and_refuses_hostile_ones(tmp_path: Path) -> None:
    from primus_energon import SafeSampleDecoder, UnsafeMemberError

    embeds = {"prompt_embeds": torch.randn(4, 8), "pooled_prompt_embeds": torch.randn(8)}
    decoded = SafeSampleDecoder()(
        {"__key__": "k", "pickle": pickle.dumps(embeds), "pyd": pickle.dumps([1, "a"])}
    )
    assert _same(decoded["pickle"], embeds) and decoded["pyd"] == [1, "a"]
    marker = tmp_path / "ran"
    with pytest.raises(Exception) as raised:  # webdataset wraps decoder errors in its DecodingError
        SafeSampleDecoder()({"__key__": "k", "pickle": _hostile(marker)["exec"]})
    chain = [raised.value, raised.value.__cause__, raised.value.__context__]
    assert any(isinstance(e, UnsafeMemberError) and "builtins.exec" in str(e) for e in chain), chain
    assert not marker.exists()


def test_validate_reads_pickled_members_and_reports_hostile_ones(tmp_path: Path) -> None:
    from primus_energon.datasets.checks import check_member

    clean = check_member("pickle", pickle.dumps({"prompt_embeds": torch.randn(3, 4)}))
    assert clean.code is None and clean.kind == "pickle"
    assert clean.detail == {"structure": "dict(prompt_embeds: tensor float32 [3, 4])"}
    nan = check_member(".pickle", pickle.dumps(np.array([1.0, np.nan], np.float16)))
    assert nan.code == "nan-tensor"
    marker = tmp_path / "ran"
    hostile = check_member("pickle", _hostile(marker)["os.system"])
    assert hostile.code == "malicious-pickle" and "posix.system" in hostile.message and not marker.exists()
    assert check_member("pyd", b"\x80\x02garbage").code == "garbage-payload"


def test_validate_on_a_dfm_format_dataset(tmp_path: Path) -> None:
    """DFM's FLUX layout (``pth`` latents, ``pickle`` text embeddings, ``json``): clean samples validate,
    the one whose pickle runs code is reported with its shard, key and member, and nothing runs."""
    import json

    from primus_energon.datasets import validate_path
    from tests.helpers import write_prepared_dataset

    marker = tmp_path / "ran"
    samples = []
    for index in range(6):
        latents = io.BytesIO()
        torch.save(torch.randn(16, 4, 4), latents)
        embeds = {"prompt_embeds": torch.randn(8, 16), "pooled_prompt_embeds": torch.randn(16)}
        members = {
            "pth": latents.getvalue(),
            "pickle": _hostile(marker)["exec"] if index == 3 else pickle.dumps(embeds),
            "json": json.dumps({"caption": f"sample {index}"}).encode(),
        }
        samples.append((f"s{index:03d}", members))
    root = write_prepared_dataset(tmp_path / "dfm", samples, {"encoding": "flux"})
    report = validate_path(root)
    found = [(p.code, p.severity, p.shard, p.key, p.member) for p in report.problems]
    assert ("malicious-pickle", "error", "shard-000000.tar", "s003", "pickle") in found, found
    assert ("pickle-members", "warning", None, None, None) in found and len(found) == 2, found
    assert "builtins.exec" in next(p.message for p in report.problems if p.code == "malicious-pickle")
    assert not marker.exists()
