"""Nested JSON members: generated deterministically with per-sample values, loaded by Energon as written, and
described back by `infer_json_spec`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from primus_energon.conformance.data.workspace import read_crude
from primus_energon.safepickle import safe_loads
from primus_energon.synthetic import (
    JsonSpec,
    JsonStringSpec,
    ListSpec,
    ObjectSpec,
    PickleSpec,
    Schema,
    TensorSpec,
    TextSpec,
    generate_dataset,
    infer_json_spec,
)
from primus_energon.synthetic.schema import MAX_JSON_DEPTH, MAX_JSON_FIELDS, NpySpec

try:
    from . import synthetic_helpers as h
except ImportError:
    import synthetic_helpers as h

T2I = Schema.from_dict(
    {
        "encoding": "t2i",
        "members": {
            "image": {"kind": "image", "format": "jpeg", "size": [16, 24]},
            "json": {
                "kind": "json",
                "fields": {
                    "width": "int",
                    "captions": {
                        "kind": "json_string",
                        "fields": {
                            "short": {"kind": "text"},
                            "long": {"kind": "text"},
                            "tags": {"kind": "list", "of": {"kind": "text"}, "length": 2},
                        },
                    },
                    "source": {
                        "kind": "object",
                        "fields": {"url": {"kind": "text"}, "licence": {"kind": "text"}},
                    },
                    "ids": {"kind": "json_string", "of": {"kind": "list", "of": "int", "length": 3}},
                    "boxes": {
                        "kind": "list",
                        "of": {"kind": "object", "fields": {"x": "float", "y": "float", "label": "text"}},
                        "length": 2,
                    },
                    "scores": {"kind": "list", "of": "float", "length": 3},
                },
            },
            "emb.pickle": {
                "kind": "pickle",
                "leaves": {
                    "meta": {
                        "kind": "object",
                        "fields": {"clip": {"kind": "tensor", "shape": [4]}, "n": "int"},
                    },
                    "t5": {
                        "kind": "list",
                        "of": {"kind": "npy", "shape": [2, 3], "dtype": "float16"},
                        "length": 2,
                    },
                },
            },
        },
    }
)
SAMPLES = 8


@pytest.fixture(scope="module")
def t2i(tmp_path_factory) -> tuple[Path, list[dict]]:
    path = tmp_path_factory.mktemp("json") / "t2i"
    generate_dataset(path, schema=T2I, num_samples=SAMPLES, shard_size=4, seed=11)
    return path, read_crude(path)


def test_energon_loads_nested_json_as_the_schema_describes(t2i):
    _, samples = t2i
    assert len(samples) == SAMPLES
    for sample in samples:
        document = json.loads(sample["json"])
        assert set(document) == {"key", "width", "captions", "source", "ids", "boxes", "scores"}
        assert document["key"] == sample["__key__"] and isinstance(document["width"], int)
        captions = json.loads(document["captions"])
        assert isinstance(document["captions"], str) and set(captions) == {"short", "long", "tags"}
        assert all(isinstance(t, str) and t for t in [captions["short"], captions["long"], *captions["tags"]])
        assert len(captions["tags"]) == 2 and captions["tags"][0] != captions["tags"][1]
        assert set(document["source"]) == {"url", "licence"}
        ids = json.loads(document["ids"])
        assert len(ids) == 3 and all(type(i) is int for i in ids)
        assert [set(box) for box in document["boxes"]] == [{"x", "y", "label"}] * 2
        assert len(document["scores"]) == 3 and all(type(v) is float for v in document["scores"])
        # the generated document is described back as the schema's spec
        assert infer_json_spec(document) == T2I.members["json"]


def test_nested_values_differ_per_sample(t2i):
    _, samples = t2i
    documents = [json.loads(s["json"]) for s in samples]
    for name in ("captions", "ids"):
        assert len({d[name] for d in documents}) == SAMPLES, f"{name}: samples share a value"
    assert len({d["source"]["url"] for d in documents}) == SAMPLES
    assert len({json.dumps(d["boxes"]) for d in documents}) == SAMPLES
    assert len({tuple(d["scores"]) for d in documents}) == SAMPLES
    # long and non-ASCII captions come from the caption machinery, inside json strings too
    longs = [json.loads(d["captions"])["long"] for d in documents]
    assert max(len(t.split()) for t in longs) >= 300 and any(not t.isascii() for t in longs)


def test_nested_pickle_leaves_load_as_dicts_lists_tensors_and_arrays(t2i):
    _, samples = t2i
    value = safe_loads(samples[0]["emb.pickle"])
    assert set(value) == {"meta", "t5"} and set(value["meta"]) == {"clip", "n"}
    assert isinstance(value["meta"]["clip"], torch.Tensor) and tuple(value["meta"]["clip"].shape) == (4,)
    assert isinstance(value["meta"]["n"], int)
    assert [(str(a.dtype), a.shape) for a in value["t5"]] == [("float16", (2, 3))] * 2
    assert (value["t5"][0] != value["t5"][1]).any(), "list items share their values"


def test_same_seed_same_bytes_other_seed_other_values(t2i, tmp_path):
    path, samples = t2i
    generate_dataset(tmp_path / "again", schema=T2I, num_samples=SAMPLES, shard_size=4, seed=11)
    for shard in sorted(path.glob("*.tar")):
        assert shard.read_bytes() == (tmp_path / "again" / shard.name).read_bytes(), f"{shard.name} differs"
    generate_dataset(tmp_path / "other", schema=T2I, num_samples=SAMPLES, shard_size=4, seed=12)
    other = read_crude(tmp_path / "other")
    assert [json.loads(s["json"])["captions"] for s in other] != [
        json.loads(s["json"])["captions"] for s in samples
    ]


def test_energon_yields_exactly_the_manifest(tmp_path):
    manifest = generate_dataset(tmp_path / "ds", schema=T2I, num_samples=6, shard_size=3, seed=2)
    h.assert_yields_manifest(h.load_with_energon(tmp_path / "ds"), manifest)


# -- infer_json_spec ---------------------------------------------------------------------------------------------
def test_infer_json_spec_describes_a_caption_set_document():
    document = {
        "key": "000123",
        "width": 1024,
        "aesthetic": 6.25,
        "watermark": False,
        "exif": None,
        "captions": json.dumps({"short": "a cat", "long": "a cat on a mat", "tags": ["cat", "mat"]}),
        "source": {"url": "https://example.com/1.jpg", "licence": "cc-by", "nsfw": None},
        "ids": " [1, 2, 3] ",
        "boxes": [{"x": 0.5, "label": "cat"}, {"x": 0.25, "label": "mat"}],
        "mixed_numbers": [1, 2.5, 3],
        "empty": [],
        "mixed": [1, "a"],
        "bools": [True, False],
        "nothing": {"a": None},
        "brace": "{not json",
        "quoted": '"a json string, not an object"',
        "empty_doc": "{}",
    }
    assert infer_json_spec(document) == JsonSpec(
        {
            "width": "int",
            "aesthetic": "float",
            "captions": JsonStringSpec(
                {"short": TextSpec(), "long": TextSpec(), "tags": ListSpec(TextSpec(), 2)}
            ),
            "source": ObjectSpec({"url": TextSpec(), "licence": TextSpec()}),
            "ids": JsonStringSpec(of=ListSpec("int", 3)),
            "boxes": ListSpec(ObjectSpec({"x": "float", "label": TextSpec()}), 2),
            "mixed_numbers": ListSpec("float", 3),
            "brace": TextSpec(),
            "quoted": TextSpec(),
        }
    )
    # a valid schema member, whatever the document
    Schema("x", {"m.json": infer_json_spec(document)})


@pytest.mark.parametrize("document", [[1, 2], "text", '{"a": 1}', 3, 2.5, None, True, []])
def test_a_document_that_is_not_an_object_is_opaque_json(document):
    assert infer_json_spec(document) == JsonSpec()


def test_infer_json_spec_is_bounded_in_depth_and_fields():
    deep: object = 1
    for _ in range(MAX_JSON_DEPTH - 1):
        deep = {"n": deep}
    spec = infer_json_spec({"d": deep, "deeper": {"n": deep}})
    assert set(spec.fields) == {"d"}, "a document's fields below level 8 are described"
    Schema("x", {"m.json": spec})
    wide = {f"f{i}": {f"g{j}": j for j in range(9)} for i in range(100)}
    spec = infer_json_spec(wide)

    def count(fields) -> int:
        return sum(1 + (count(v.fields) if isinstance(v, ObjectSpec) else 0) for v in fields.values())

    assert count(spec.fields) == MAX_JSON_FIELDS and list(spec.fields)[:3] == ["f0", "f1", "f2"]
    assert len(spec.fields) == -(-MAX_JSON_FIELDS // 10)  # 26 objects, the last one cut short
    assert len(spec.fields["f25"].fields) == MAX_JSON_FIELDS - 25 * 10 - 1
    nested_string = json.dumps({"a": json.dumps({"b": json.dumps({"c": 1})})})
    assert infer_json_spec({"s": nested_string}) == JsonSpec(
        {"s": JsonStringSpec({"a": JsonStringSpec({"b": JsonStringSpec({"c": "int"})})})}
    )
    assert infer_json_spec({"s": "[" * 100_000}) == JsonSpec({"s": TextSpec()})


def test_infer_json_spec_does_not_change_its_input():
    document = {"a": {"b": [1, 2]}, "key": "k"}
    before = json.dumps(document)
    infer_json_spec(document)
    assert json.dumps(document) == before


def test_an_inferred_spec_generates_documents_like_the_original(tmp_path):
    original = {"captions": json.dumps({"en": "a dog", "de": "ein Hund"}), "meta": {"h": 4, "tags": ["x"]}}
    spec = infer_json_spec(original)
    schema = Schema("inferred", {"json": spec, "t.pth": TensorSpec((2,))})
    generate_dataset(tmp_path / "ds", schema=schema, num_samples=2, shard_size=2)
    for sample in read_crude(tmp_path / "ds"):
        document = json.loads(sample["json"])
        assert set(json.loads(document["captions"])) == {"en", "de"}
        assert set(document["meta"]) == {"h", "tags"} and len(document["meta"]["tags"]) == 1
        assert infer_json_spec(document) == spec


def test_pickle_leaves_may_nest(tmp_path):
    schema = Schema(
        "p",
        {"p.pickle": PickleSpec({"emb": ObjectSpec({"a": NpySpec((2,)), "b": ListSpec("int", 2)})})},
    )
    generate_dataset(tmp_path / "ds", schema=schema, num_samples=2, shard_size=2)
    value = safe_loads(read_crude(tmp_path / "ds")[0]["p.pickle"])
    assert value["emb"]["a"].shape == (2,) and len(value["emb"]["b"]) == 2
