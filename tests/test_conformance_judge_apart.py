"""The judge apart from the judged: a target's output is read as plain data (oracles.plain) without running
its methods, and a patch of the suite's code in the target's process is found (seal)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from primus_energon.conformance.core import claims as claims_module
from primus_energon.conformance.engine import seal
from primus_energon.conformance.oracles import plain as plain_module
from primus_energon.conformance.oracles.compare import same
from primus_energon.conformance.oracles.fields import fields, leaves
from primus_energon.conformance.oracles.plain import MAX_DEPTH, Opaque, Record, plain, type_name


class _Trap:
    """Every method a judge could call on a value raises."""

    def _boom(self, *args: object, **kwargs: object) -> bool:
        raise AssertionError("the judge ran the target's method")

    __eq__ = __ne__ = __lt__ = __iter__ = __len__ = __getitem__ = __str__ = __repr__ = _boom
    __hash__ = None  # type: ignore[assignment]
    items = keys = values = __deepcopy__ = __reduce_ex__ = __bool__ = _boom


class TrapStr(_Trap, str):
    __hash__ = str.__hash__  # type: ignore[assignment]


class TrapInt(_Trap, int):
    __hash__ = int.__hash__  # type: ignore[assignment]


class TrapFloat(_Trap, float):
    pass


class TrapBytes(_Trap, bytes):
    pass


class TrapDict(_Trap, dict):
    pass


class TrapList(_Trap, list):
    pass


class TrapTuple(_Trap, tuple):
    pass


class TrapArray(np.ndarray):
    def __array_finalize__(self, obj: object) -> None:  # views of it stay traps
        pass

    def __eq__(self, other: object) -> bool:  # type: ignore[override]
        raise AssertionError("the judge ran the target's method")


class TrapTensor(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        raise AssertionError(f"the judge ran the target's __torch_function__ ({func})")


@dataclasses.dataclass
class Sample:
    caption: str
    latents: torch.Tensor
    extra: dict


def test_every_built_in_subclass_becomes_its_exact_base_type_without_running_its_methods() -> None:
    value = {
        TrapStr("caption"): TrapStr("a dog"),
        "count": TrapInt(7),
        "scale": TrapFloat(0.5),
        "raw": TrapBytes(b"\x00\x01"),
        "nested": TrapDict({"k": TrapList([TrapTuple((TrapInt(1), TrapStr("x")))])}),
        "array": np.arange(6, dtype=np.float32).reshape(2, 3).view(TrapArray),
        "tensor": torch.arange(4.0).as_subclass(TrapTensor),
    }
    out = plain(TrapDict(value))
    assert type(out) is dict and set(map(type, out)) == {str}
    assert type(out["caption"]) is str and out["caption"] == "a dog"
    assert type(out["count"]) is int and out["count"] == 7
    assert type(out["scale"]) is float and out["scale"] == 0.5
    assert type(out["raw"]) is bytes and out["raw"] == b"\x00\x01"
    inner = out["nested"]["k"]
    assert type(inner) is list and type(inner[0]) is tuple and inner[0] == (1, "x")
    assert type(inner[0][0]) is int and type(inner[0][1]) is str
    assert type(out["array"]) is np.ndarray and out["array"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert type(out["tensor"]) is torch.Tensor and out["tensor"].tolist() == [0, 1, 2, 3]


def test_a_lying_caption_is_compared_as_the_text_it_holds() -> None:
    class AlwaysEqual(str):
        def __eq__(self, other: object) -> bool:
            return True

        def __ne__(self, other: object) -> bool:
            return False

        __hash__ = str.__hash__

    lying = AlwaysEqual("a cat")
    assert lying == "a dog"  # what the target's own == says
    assert plain(lying) != "a dog" and not same(plain(lying), "a dog")


def test_records_keep_their_fields_and_class_name_and_copies_are_taken() -> None:
    latents = torch.zeros(2, 2)
    sample = Sample(TrapStr("hello"), latents, {"size": TrapInt(3)})
    out = plain(sample)
    assert isinstance(out, Record) and type_name(out) == "Sample"
    assert fields(out) == {"caption": "hello", "latents": out["latents"], "extra": {"size": 3}}
    assert [path for path, _ in leaves(out)] == ["caption", "latents", "extra.size"]
    latents.fill_(1)  # a buffer the target reuses on its next call
    assert out["latents"].sum() == 0

    class Plainish:
        def __init__(self) -> None:
            self.image = torch.ones(1)
            self._private = 1
            self.method = print

        @property
        def caption(self) -> str:
            return TrapStr("a property")

        @property
        def broken(self) -> str:
            raise RuntimeError("no field")

    record = plain(Plainish())
    assert (
        isinstance(record, Record) and set(record) == {"image", "caption"} and type_name(record) == "Plainish"
    )
    assert type(record["caption"]) is str and record["caption"] == "a property"


def test_standard_library_values_are_kept_and_nothing_explodes() -> None:
    import datetime
    import pathlib

    when, where = datetime.date(2026, 12, 7), pathlib.PurePosixPath("/data/shard-000.tar")
    assert plain({"when": when, "where": where}) == {"when": when, "where": where}


def test_images_functions_and_nesting_past_the_budget() -> None:
    image = Image.new("RGB", (4, 2), (10, 20, 30))
    copied = plain(image)
    assert isinstance(copied, Image.Image) and copied is not image and copied.tobytes() == image.tobytes()
    assert plain(print) == Opaque("builtin_function_or_method")
    deep: list = []
    current = deep
    for _ in range(MAX_DEPTH + 5):
        current.append([])
        current = current[0]
    flattened = plain(deep)
    for _ in range(MAX_DEPTH + 1):
        flattened = flattened[0]
    assert isinstance(flattened, Opaque)
    assert len(plain(list(range(plain_module.MAX_NODES + 10)))) == plain_module.MAX_NODES + 10
    assert isinstance(plain(list(range(plain_module.MAX_NODES + 10)))[-1], Opaque)


def test_the_seal_names_a_patched_function_method_and_code_and_is_intact_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sealed = seal.take()
    assert len(sealed) > 100 and sealed.broken() == []
    with monkeypatch.context() as patch:
        patch.setattr(claims_module.ClaimCheck, "problem", lambda self, message, *, sample=None: None)
        assert sealed.broken() == ["primus_energon.conformance.core.claims.ClaimCheck.problem"]
    with monkeypatch.context() as patch:
        patch.setattr(plain_module, "plain", lambda value: value)
        assert sealed.broken() == ["primus_energon.conformance.oracles.plain.plain"]
    original = plain_module.type_name.__code__
    try:
        plain_module.type_name.__code__ = (lambda value: "forged").__code__
        assert sealed.broken() == ["primus_energon.conformance.oracles.plain.type_name"]
    finally:
        plain_module.type_name.__code__ = original
    assert sealed.broken() == []
