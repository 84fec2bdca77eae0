"""Datasets derived from a user's own samples (``derive_dataset``) and member kinds told by content
(``sniff_kind``, the conformance data's member specs): real samples in foreign containers (a JPEG named
``image``, ``.npy`` files named ``*.bytes``, a pickled dict of tensors, JSON holding JSON), derived into
prepared datasets that Energon loads, read back with ``tarfile`` alone."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from primus_energon.conformance.data.workspace import _spec_for, read_crude
from primus_energon.conformance.oracles.expectations import expectations
from primus_energon.formats import sniff_kind
from primus_energon.safepickle import safe_loads
from primus_energon.synthetic import (
    ImageSpec,
    JsonSpec,
    Manifest,
    NpySpec,
    PickleSpec,
    SyntheticError,
    TensorSpec,
    TextSpec,
    derive_dataset,
)
from primus_energon.synthetic.schema import BytesSpec, ListSpec, ObjectSpec, Schema
from tests.helpers import read_members


def _saved(tensor: torch.Tensor, **options: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor, buffer, **options)
    return buffer.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _image(seed: int, fmt: str) -> bytes:
    pixels = (np.random.default_rng(seed).random((8, 12, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def _user_samples(count: int = 3) -> list[dict[str, bytes | str]]:
    """Samples as a user's prepare script writes them, every member in a container of its own."""
    out = []
    for i in range(count):
        g = torch.Generator().manual_seed(i)
        captions = json.dumps({"short": f"photo {i}", "long": f"a long caption of photo {i}"})
        out.append(
            {
                "__key__": f"user{i:03d}",
                "latents.pth": _saved(torch.randn(2, 3, 4, generator=g)),
                "t5.bytes": _npy(np.arange(12, dtype=np.float16).reshape(3, 4) + i),
                "embeds.pickle": pickle.dumps(
                    {"t5": torch.randn(3, 4, generator=g), "clip": torch.randn(4, generator=g)}, protocol=4
                ),
                "image": _image(i, "JPEG"),
                "mask.png": _image(100 + i, "PNG"),
                "thumb.gif": _image(200 + i, "GIF"),
                "json": json.dumps({"captions": captions, "size": {"h": 8, "w": 12}}).encode(),
                "caption.txt": f"caption {i} ünïcode".encode(),
            }
        )
    return out


def _schema(sample: dict) -> Schema:
    members = {m: _spec_for(m, v) for m, v in sample.items() if not m.startswith("__")}
    return Schema(encoding="foreign", members=members)


# --- member kinds by content -----------------------------------------------------------------------------


def test_sniff_kind_tries_specific_signatures_before_generic_ones() -> None:
    tensor = torch.arange(6.0)
    generic_zip = io.BytesIO()
    with zipfile.ZipFile(generic_zip, "w") as archive:
        archive.writestr("readme.txt", "not a tensor")
    assert sniff_kind(_saved(tensor)) == ("tensor", None)
    assert sniff_kind(_saved({"a": tensor})) == ("tensor", None)  # torch.save's zip, whatever it holds
    assert sniff_kind(_saved(tensor, _use_new_zipfile_serialization=False)) == ("tensor", None)
    assert sniff_kind(generic_zip.getvalue()) == ("bytes", None)
    assert sniff_kind(_npy(np.zeros(3))) == ("npy", None)
    assert sniff_kind(pickle.dumps({"a": 1}, protocol=4)) == ("pickle", None)
    assert sniff_kind(_image(0, "JPEG")) == ("image", "jpeg")
    assert sniff_kind(_image(0, "PNG")) == ("image", "png")
    assert sniff_kind(_image(0, "WEBP")) == ("image", "webp")
    assert sniff_kind(_image(0, "GIF")) == ("image", "gif")
    assert sniff_kind(b' {"a": [1, 2]}') == ("json", None)
    assert sniff_kind(json.dumps(json.dumps({"a": 1})).encode()) == ("json", None)
    assert sniff_kind("a caption, ünïcode".encode()) == ("text", None)
    assert sniff_kind(b"\x00\x01\x02garbage") is None
    assert sniff_kind(b"\xff\xfe not utf-8 \xfd") is None


@pytest.mark.parametrize(
    ("member", "data", "expected"),
    [
        ("t5.bytes", _npy(np.zeros((3, 4), np.float16)), NpySpec((3, 4), "float16")),
        ("latents.pth", _npy(np.zeros(5, np.float32)), NpySpec((5,), "float32")),  # content wins
        ("image", _image(1, "JPEG"), ImageSpec((8, 12), format="jpeg")),
        ("frame.jpg", _image(1, "PNG"), ImageSpec((8, 12), format="png")),  # the bytes' format
        ("anim", _image(1, "GIF"), ImageSpec((8, 12), format="gif")),
        ("latents.bin", _saved(torch.zeros(2, 3)), TensorSpec((2, 3), "float32")),
        ("caption.txt", b'{"looks": "like json"}', TextSpec()),  # a caption stays text
        ("meta", b'{"a": "b"}', JsonSpec({"a": TextSpec()})),
        ("notes", b"plain words", TextSpec()),
        ("image.jpg", b"\xff\xd8\xff" + b"\x00garbage" * 8, BytesSpec(67)),  # a signature, no image
        ("blob", b"\x00\x01\x02\x03", BytesSpec(4)),
    ],
)
def test_member_specs_come_from_name_and_content(member: str, data: bytes, expected: object) -> None:
    assert _spec_for(member, data) == expected


def test_a_pickled_dict_of_tensors_is_described_leaf_by_leaf() -> None:
    spec = _spec_for("embeds.pickle", pickle.dumps({"t5": torch.zeros(3, 4), "clip": torch.zeros(4)}))
    assert isinstance(spec, PickleSpec)
    assert spec.leaves == {"t5": TensorSpec((3, 4), "float32"), "clip": TensorSpec((4,), "float32")}


def test_pickled_lists_and_nested_dicts_of_tensors_are_opened() -> None:
    """Every container is opened through the safe reader: a pickled list of tensors of one shape, a dict
    nesting dicts and lists; a list of tensors of different shapes has no one item spec and stays bytes."""
    listed = _spec_for("embeds.pickle", pickle.dumps([torch.zeros(1, 7, 4), torch.ones(1, 7, 4)]))
    assert listed == PickleSpec({"value": ListSpec(TensorSpec((1, 7, 4), "float32"), 2)}, structure="value")
    nested = _spec_for(
        "embeds.pickle", pickle.dumps({"t5": {"hidden": torch.zeros(3)}, "views": [torch.ones(2)] * 3})
    )
    assert nested.leaves == {
        "t5": ObjectSpec({"hidden": TensorSpec((3,), "float32")}),
        "views": ListSpec(TensorSpec((2,), "float32"), 3),
    }
    mixed = pickle.dumps([torch.zeros(1, 7, 4), torch.zeros(3)])
    assert _spec_for("embeds.pickle", mixed) == BytesSpec(len(mixed))
    what = [
        e.what
        for e in expectations(
            "embeds.pickle", listed, pickle.dumps([torch.zeros(1, 7, 4)] * 2), required=True
        )
    ]
    assert what == ["member 'embeds.pickle' leaf '[0]'", "member 'embeds.pickle' leaf '[1]'"]


# --- derived datasets ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def derived(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest, list[dict]]:
    samples = _user_samples(3)
    out = tmp_path_factory.mktemp("derive") / "ds"
    return out, _derive_eight(out, samples), samples


def _derive_eight(out: Path, samples: list[dict]) -> Manifest:
    """8 samples in shards of 3, derived from ``samples`` with the user's subflavors."""
    return derive_dataset(
        out,
        samples,
        schema=_schema(samples[0]),
        subflavors={"encoding": "foreign", "source": "mine"},
        num_samples=8,
        shard_size=3,
        key_prefix="der",
        source="/data/mine",
    )


def test_a_derived_dataset_copies_the_users_samples_rekeyed_and_resharded(
    derived: tuple[Path, Manifest, list[dict]],
) -> None:
    out, manifest, samples = derived
    stored = read_members(out)
    assert sorted(stored) == [f"der_{i:06d}" for i in range(8)]
    assert sorted(p.name for p in out.glob("*.tar")) == [f"shard-{s:06d}.tar" for s in range(3)]
    assert manifest.options["derived"]["source_keys"] == {
        f"der_{i:06d}": f"user{i % 3:03d}" for i in range(8)
    }
    assert manifest.options["derived"]["from"] == "/data/mine"
    for i in range(3):  # the first copy of each user sample: every member byte for byte
        assert stored[f"der_{i:06d}"] == {m: v for m, v in samples[i].items() if m != "__key__"}
    # Energon reads it, with the user's subflavors
    crude = read_crude(out)
    assert [c["__key__"] for c in crude] == [f"der_{i:06d}" for i in range(8)]
    assert crude[0]["__subflavors__"] == {"encoding": "foreign", "source": "mine"}


def test_repeats_hold_the_same_values_rolled_in_the_same_container(
    derived: tuple[Path, Manifest, list[dict]],
) -> None:
    out, manifest, samples = derived
    stored = read_members(out)
    first, repeat = samples[1], stored["der_000004"]  # user001's first repeat: rolled by 1
    for member in ("latents.pth", "t5.bytes", "embeds.pickle", "image", "mask.png", "thumb.gif"):
        assert repeat[member] != first[member], member
        assert sniff_kind(repeat[member]) == sniff_kind(first[member]), member
    original = torch.load(io.BytesIO(first["latents.pth"]), weights_only=True)
    rolled = torch.load(io.BytesIO(repeat["latents.pth"]), weights_only=True)
    assert rolled.dtype == original.dtype and rolled.shape == original.shape
    assert torch.equal(rolled.flatten(), original.flatten().roll(1))
    array = np.load(io.BytesIO(repeat["t5.bytes"]), allow_pickle=False)
    assert array.dtype == np.float16 and array.shape == (3, 4)
    embeds = safe_loads(repeat["embeds.pickle"])
    assert set(embeds) == {"t5", "clip"} and embeds["t5"].shape == (3, 4)
    with Image.open(io.BytesIO(repeat["mask.png"])) as image:  # lossless: exactly the pixels rolled
        pixels = np.asarray(image)
    with Image.open(io.BytesIO(first["mask.png"])) as image:
        assert np.array_equal(pixels, np.roll(np.asarray(image), 1, axis=1))
    # text and JSON are copied as they are
    assert repeat["caption.txt"] == first["caption.txt"] and repeat["json"] == first["json"]
    assert any(
        e.startswith("der_000004.latents.pth: values rolled by 1")
        for e in manifest.options["derived"]["edits"]
    )


def test_derivation_is_deterministic(tmp_path: Path, derived: tuple[Path, Manifest, list[dict]]) -> None:
    out, _, samples = derived
    again = tmp_path / "again"
    _derive_eight(again, samples)
    for shard in sorted(out.glob("*.tar")):
        assert (again / shard.name).read_bytes() == shard.read_bytes(), shard.name
    # the same manifest, but for where a malicious-pickle fault's payload would write its marker
    first, second = (json.loads((d / "manifest.json").read_text()) for d in (out, again))
    assert first.pop("marker_path") != second.pop("marker_path") and first == second


def test_faults_are_edits_of_real_members(tmp_path: Path) -> None:
    samples = _user_samples(12)  # no repeats: each fault edits a member exactly as the user stored it
    manifest = derive_dataset(
        tmp_path / "faults",
        samples,
        schema=_schema(samples[0]),
        num_samples=12,
        shard_size=12,
        faults={"wrong-shape": 1, "nan-tensor": 1, "missing-member": 1, "non-utf8-caption": 1},
    )
    stored = read_members(tmp_path / "faults")
    by_kind = {f.kind: f for f in manifest.faults}
    assert set(by_kind) == {"wrong-shape", "nan-tensor", "missing-member", "non-utf8-caption"}
    source = manifest.options["derived"]["source_keys"]

    def original(fault: object, member: str) -> bytes:
        user = source[fault.key]  # type: ignore[attr-defined]
        return next(s for s in samples if s["__key__"] == user)[member]

    shape = by_kind["wrong-shape"]
    real = torch.load(io.BytesIO(original(shape, "latents.pth")), weights_only=True)
    wrong = torch.load(io.BytesIO(stored[shape.key]["latents.pth"]), weights_only=True)
    assert shape.member == "latents.pth" and shape.detail == {"expected": [2, 3, 4], "actual": [3, 3, 4]}
    assert wrong.dtype == real.dtype and torch.equal(wrong[:2], real) and torch.equal(wrong[2], real[0])
    nan = by_kind["nan-tensor"]
    tensor = torch.load(io.BytesIO(stored[nan.key][nan.member]), weights_only=True).flatten()
    assert sorted(torch.nonzero(tensor.isnan()).flatten().tolist()) == nan.detail["nan_indices"]
    missing = by_kind["missing-member"]
    assert missing.member not in stored[missing.key]
    caption = by_kind["non-utf8-caption"]
    with pytest.raises(UnicodeDecodeError):
        stored[caption.key]["caption.txt"].decode("utf-8")
    damaged = {f.key for f in manifest.faults}
    assert len(damaged) == 4 and all(len(stored[k]) >= 7 for k in stored)


def test_a_dtype_variant_casts_every_floating_point_tensor(tmp_path: Path) -> None:
    samples = _user_samples(1)
    derive_dataset(
        tmp_path / "bf16", samples, schema=_schema(samples[0]), num_samples=2, shard_size=2, dtype="bfloat16"
    )
    stored = read_members(tmp_path / "bf16")["d_000000"]
    assert torch.load(io.BytesIO(stored["latents.pth"]), weights_only=True).dtype == torch.bfloat16
    assert {v.dtype for v in safe_loads(stored["embeds.pickle"]).values()} == {torch.bfloat16}
    # numpy has no bfloat16: the .npy member stays as it was; images and text are untouched
    assert stored["t5.bytes"] == samples[0]["t5.bytes"] and stored["image"] == samples[0]["image"]


def test_bad_requests_say_what_to_do(tmp_path: Path) -> None:
    samples = _user_samples(2)
    schema = _schema(samples[0])
    with pytest.raises(SyntheticError, match="no samples to derive"):
        derive_dataset(tmp_path / "a", [], schema=schema)
    partial = [{k: v for k, v in samples[0].items() if k != "image"}]
    with pytest.raises(SyntheticError, match=r"source sample 'user000' lacks member\(s\) \['image'\]"):
        derive_dataset(tmp_path / "b", partial, schema=schema)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "keep.txt").write_text("mine")
    with pytest.raises(SyntheticError, match="not empty"):
        derive_dataset(tmp_path / "c", samples, schema=schema)
    assert (tmp_path / "c" / "keep.txt").read_text() == "mine"


_SIGNATURES = [
    b"",
    b"\x93NUMPY",
    b"PK\x03\x04",
    b"\x80\x04",
    b"\xff\xd8\xff",
    b"\x89PNG\r\n\x1a\n",
    b"GIF89a",
]
_SIGNATURES += [b"RIFF\x00\x00\x00\x00WEBP", b"{", b'"', b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(
        ["latents.pth", "t5.bytes", "image", "meta.json", "caption.txt", "x.pickle", "blob"]
    ),
    signature=st.sampled_from(_SIGNATURES),
    tail=st.binary(max_size=512),
)
def test_hostile_member_bytes_are_described_never_raised(name: str, signature: bytes, tail: bytes) -> None:
    """A signature followed by anything: the guess is confirmed by decoding, or the member is opaque bytes;
    nothing raises, and nothing is unpickled (safe readers only)."""
    data = signature + tail
    kind = sniff_kind(data)
    assert kind is None or kind[0] in ("npy", "tensor", "bytes", "pickle", "image", "json", "text")
    spec = _spec_for(name, data)
    assert spec.kind in ("tensor", "npy", "pickle", "image", "json", "text", "bytes")


def test_a_wider_dtype_variant_holds_values_the_narrower_dtype_cannot(tmp_path: Path) -> None:
    """Widened, the user's float16 values would come back unchanged from a reader that narrows them again:
    the float32 variant moves them a little, so that such a reader is seen to lose something."""
    samples = _user_samples(1)
    derive_dataset(
        tmp_path / "f32", samples, schema=_schema(samples[0]), num_samples=1, shard_size=1, dtype="float32"
    )
    stored = read_members(tmp_path / "f32")["d_000000"]
    original = np.load(io.BytesIO(samples[0]["t5.bytes"]), allow_pickle=False)
    widened = np.load(io.BytesIO(stored["t5.bytes"]), allow_pickle=False)
    assert widened.dtype == np.float32 and widened.shape == original.shape
    nonzero = original != 0
    assert not np.array_equal(widened.astype(np.float16)[nonzero], widened[nonzero])  # narrowing loses
    assert np.allclose(widened, original.astype(np.float32), rtol=2**-10)  # yet they are the user's values
    again = tmp_path / "again"
    derive_dataset(again, samples, schema=_schema(samples[0]), num_samples=1, shard_size=1, dtype="float32")
    assert read_members(again)["d_000000"]["t5.bytes"] == stored["t5.bytes"]  # deterministic
