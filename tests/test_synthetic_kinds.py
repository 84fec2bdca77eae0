"""The generator writes every member kind real projects use (pickled structures, npy, raw tensor bytes,
JSON with declared fields, member names with a leading dot): each loads through Energon, round-trips
through the safe readers, is byte-identical for any number of workers, and validates clean."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from primus_energon import safe_loads
from primus_energon.conformance.data.workspace import read_crude
from primus_energon.datasets import validate_path
from primus_energon.energon_compat import key_in_shard
from primus_energon.synthetic import SyntheticError, generate_dataset, load_schema
from primus_energon.synthetic.payloads import PayloadFactory
from primus_energon.synthetic.schema import BytesSpec, JsonSpec, NpySpec, PickleSpec, Schema, TensorSpec

EXAMPLES = Path(__file__).parents[1] / "synthetic" / "examples"


@pytest.mark.parametrize("name", ["dfm_flux", "nemo", "mlperf_numpy"])
def test_each_example_format_loads_round_trips_and_validates(name: str, tmp_path: Path) -> None:
    schema = load_schema(EXAMPLES / f"{name}.yaml")
    assert Schema.from_dict(schema.to_dict()) == schema
    manifest = generate_dataset(tmp_path / name, schema=schema, num_samples=6, shard_size=3, seed=5)
    crude = {key_in_shard(s["__key__"]): s for s in read_crude(tmp_path / name)}
    assert set(crude) == set(manifest.keys())
    factory = PayloadFactory(schema, 5)
    for index, record in enumerate(manifest.samples):
        sample = crude[record.key]
        assert sorted(m for m in sample if not m.startswith("__")) == sorted(schema.members)
        for member, spec in schema.members.items():
            data = sample[member]
            if isinstance(spec, PickleSpec):
                expected = factory.structure(member, spec, index)
                got = safe_loads(data)
                assert _same(got, expected), (member, got, expected)
                assert _same(pickle.loads(data), expected)  # noqa: S301 (the test's own data)
            elif isinstance(spec, NpySpec):
                assert np.array_equal(
                    np.load(io.BytesIO(data), allow_pickle=False), factory.array(member, spec, index)
                )
            elif isinstance(spec, BytesSpec):
                dtype = getattr(torch, spec.dtype)
                decoded = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(spec.shape)
                assert torch.equal(decoded, factory.tensor(member, TensorSpec(spec.shape, spec.dtype), index))
            elif isinstance(spec, JsonSpec):
                document = json.loads(data)
                assert set(document) == {"key", *spec.fields} and document["key"] == record.key
            elif isinstance(spec, TensorSpec):
                tensor = torch.load(io.BytesIO(data), weights_only=True)
                assert tensor.dtype == getattr(torch, spec.dtype) and tuple(tensor.shape) == spec.shape
    report = validate_path(tmp_path / name)
    errors = [p for p in report.problems if p.severity == "error"]
    assert errors == [], errors
    pickled = any(isinstance(s, PickleSpec) for s in schema.members.values())
    assert any(p.code == "pickle-members" for p in report.problems) == pickled


def test_generation_is_byte_identical_for_any_number_of_workers(tmp_path: Path) -> None:
    schema = load_schema(EXAMPLES / "dfm_flux.yaml")
    one = generate_dataset(tmp_path / "one", schema=schema, num_samples=8, shard_size=2, seed=1)
    two = generate_dataset(tmp_path / "two", schema=schema, num_samples=8, shard_size=2, seed=1, workers=2)
    assert [s.members for s in one.samples] == [s.members for s in two.samples]
    for shard in sorted((tmp_path / "one").glob("*.tar")):
        assert shard.read_bytes() == (tmp_path / "two" / shard.name).read_bytes()


def test_leading_dot_members_are_stored_as_energon_reads_them(tmp_path: Path) -> None:
    import tarfile

    generate_dataset(
        tmp_path / "nemo", schema=load_schema(EXAMPLES / "nemo.yaml"), num_samples=2, shard_size=2
    )
    with tarfile.open(next((tmp_path / "nemo").glob("*.tar"))) as tar:
        names = tar.getnames()
    assert any(n.endswith("..pth") for n in names) and any(n.endswith("..pickle") for n in names)


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ({"p.pickle": {"kind": "pickle"}}, "needs leaves"),
        ({"p.pickle": {"kind": "pickle", "leaves": {"a": {"kind": "image"}}}}, "must be int, float, text or"),
        ({"a.npy": {"kind": "npy", "shape": [2], "dtype": "bfloat16"}}, "numpy has no bfloat16"),
        ({"t.bytes": {"kind": "bytes", "dtype": "bfloat16"}}, "need a dtype"),
        ({"..pth": {"kind": "tensor", "shape": [2]}}, "starting with a letter"),
        ({"x.pth": {"kind": "tensor", "shape": [2], "field": ""}}, "field must be"),
    ],
)
def test_schema_errors_say_what_is_wrong(members: dict, message: str) -> None:
    with pytest.raises(SyntheticError, match=message):
        Schema.from_dict({"encoding": "x", "members": members})


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b
