"""Schemas: a custom format is one YAML/JSON file away; bad schemas and options say what to change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from primus_energon.synthetic import (
    ImageSpec,
    JsonSpec,
    JsonStringSpec,
    ListSpec,
    ObjectSpec,
    PickleSpec,
    Schema,
    SyntheticError,
    TensorSpec,
    TextSpec,
    builtin_schema,
    generate_dataset,
    load_schema,
)
from primus_energon.synthetic.preparation import assign_splits

try:
    from . import synthetic_helpers as h
except ImportError:
    import synthetic_helpers as h

CUSTOM_V2 = {
    "encoding": "custom_v2",
    "subflavors": {"source": "synthetic"},
    "members": {
        "vae_output.pth": {"kind": "tensor", "shape": [16, 8, 8], "dtype": "bfloat16", "bucketed": True},
        "text_embed.pth": {"shape": [7, 32]},
        "clip_embed.pth": {"shape": [24], "dtype": "float16"},
        "caption.txt": {},
        "meta.json": {},
        "thumb.png": {"size": [12, 20]},
        "blob.bin": {"size": 40},
    },
}


@pytest.fixture(scope="session")
def custom_ds(tmp_path_factory):
    schema_file = tmp_path_factory.mktemp("schema") / "custom_v2.yaml"
    schema_file.write_text(yaml.safe_dump(CUSTOM_V2, sort_keys=False))
    return h.cached_dataset(
        tmp_path_factory, "custom_v2", schema=schema_file, num_samples=12, shard_size=4, seed=2
    )


def test_a_schema_file_makes_a_custom_dataset_energon_loads(custom_ds):
    path, m = custom_ds
    assert m.encoding == "custom_v2" and m.subflavors == {"source": "synthetic", "encoding": "custom_v2"}
    loaded = h.load_with_energon(path)
    h.assert_yields_manifest(loaded, m)
    assert loaded.samples[0]["__subflavors__"] == {"source": "synthetic", "encoding": "custom_v2"}
    first = loaded.samples[0]
    assert tuple(h.tensor_of(first["vae_output.pth"]).shape) == (16, 8, 8)
    assert str(h.tensor_of(first["clip_embed.pth"]).dtype) == "torch.float16"
    meta = json.loads(first["meta.json"])
    assert meta["key"] == first["__key__"] and meta["source"] == "synthetic"
    assert first["thumb.png"][:4] == b"\x89PNG" and len(first["blob.bin"]) == 40
    record = m.sample(first["__key__"]).members
    assert (record["thumb.png"].kind, record["thumb.png"].shape) == ("image", (12, 20, 3))
    assert (record["blob.bin"].kind, record["meta.json"].kind, record["caption.txt"].kind) == (
        "bytes",
        "json",
        "text",
    )


def test_json_and_yaml_schema_files_are_the_same_schema(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(CUSTOM_V2))
    (tmp_path / "s.yml").write_text(yaml.safe_dump(CUSTOM_V2))
    a, b = load_schema(tmp_path / "s.json"), load_schema(tmp_path / "s.yml")
    assert a == b
    assert a.members["text_embed.pth"] == TensorSpec((7, 32), "float32")
    assert a.members["thumb.png"] == ImageSpec((12, 20), "png")
    assert Schema.from_dict(a.to_dict()) == a


def test_builtin_encodings_are_schemas_and_round_trip():
    for schema in (builtin_schema("preencoded"), builtin_schema("raw", image_format="png")):
        assert isinstance(schema, Schema)
        assert Schema.from_dict(schema.to_dict()) == schema
    assert builtin_schema("raw").members["txt"] == TextSpec()


def test_schema_object_and_overrides(tmp_path):
    schema = Schema(
        "custom_v2", {"vae_output.pth": TensorSpec((2, 4, 4)), "caption.txt": TextSpec(long_every=0)}
    )
    m = generate_dataset(
        tmp_path / "ds",
        schema=schema,
        num_samples=4,
        shard_size=2,
        dtype="bfloat16",
        shapes={"vae_output": (3, 4)},
    )
    assert {s.members["vae_output.pth"].shape for s in m} == {(3, 4)}
    assert {s.members["vae_output.pth"].dtype for s in m} == {"bfloat16"}
    assert m.schema.members["vae_output.pth"] == TensorSpec((3, 4), "bfloat16")


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"members": {"a.pth": {"shape": [1]}}}, "needs 'encoding'"),
        ({"encoding": "x", "members": {}}, "at least one member"),
        ({"encoding": "x", "members": {"a.pth": {}}}, "member 'a.pth': a tensor member needs 'shape'"),
        (
            {"encoding": "x", "members": {"a.pth": {"shape": [0, 2]}}},
            "shape must be a list of positive integers",
        ),
        (
            {"encoding": "x", "members": {"a.pth": {"shape": [2], "dtype": "f32"}}},
            "dtype 'f32' is not one of",
        ),
        (
            {"encoding": "x", "members": {"a.pth": {"shape": [2], "colour": 1}}},
            r"unknown field\(s\) \['colour'\]",
        ),
        ({"encoding": "x", "members": {"a/b.pth": {"shape": [2]}}}, "letters, digits"),
        ({"encoding": "x", "members": {"a": {"kind": "video"}}}, "kind 'video' is not one of"),
        ({"encoding": "x y", "members": {"a.txt": {}}}, "encoding must be"),
        ({"encoding": "x", "members": {"a.txt": {}}, "subflavors": {"encoding": "y"}}, "put the encoding in"),
        ({"encoding": "x", "members": {"a.txt": {}}, "extra": 1}, "unknown top-level field"),
        ({"encoding": "x", "members": {"a.pth": {"shape": [4], "bucketed": True}}}, "needs at least 2 dims"),
    ],
)
def test_bad_schema_files_name_the_problem(doc, message, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SyntheticError, match=message) as info:
        load_schema(path)
    assert "bad.yaml" in str(info.value), "the error does not name the schema file"


def test_unreadable_schema_files(tmp_path):
    with pytest.raises(SyntheticError, match="does not exist"):
        load_schema(tmp_path / "missing.yaml")
    (tmp_path / "broken.json").write_text("{nope")
    with pytest.raises(SyntheticError, match="is not valid json"):
        load_schema(tmp_path / "broken.json")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_samples=0), "num_samples must be an integer >= 1"),
        (dict(shard_size=0), "shard_size must be an integer >= 1"),
        (dict(seed=-1), "seed must be an integer >= 0"),
        (dict(workers=0), "workers must be an integer >= 1"),
        (dict(encoding="video"), "encoding 'video' is not built in"),
        (dict(dtype="int8"), "dtype 'int8' is not supported"),
        (dict(shapes={"latent": (1, 2)}), "'latent', which is not a member"),
        (dict(shapes={"caption": (1, 2)}), "which is a text member, not a tensor"),
        (dict(shapes={"latents": (0, 2)}), "positive integers"),
        (dict(image_format="png"), "image_format applies to the raw encoding"),
        (dict(encoding="raw", image_format="gif"), "image_format 'gif' is not supported"),
        (dict(encoding="raw", image_size=(8,)), "image_size must be"),
        (
            dict(schema=builtin_schema("raw"), encoding="preencoded"),
            "does not match the schema's encoding 'raw'",
        ),
        (dict(split=(0, 0, 0)), "positive sum"),
        (dict(split=(1, 1, 1), num_samples=4, shard_size=2), "needs at least 3 shards"),
    ],
)
def test_bad_options_say_what_to_change(kwargs, message, tmp_path):
    with pytest.raises(SyntheticError, match=message):
        generate_dataset(tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()


@settings(max_examples=200, deadline=None)
@given(
    num_shards=st.integers(1, 60),
    ratios=st.tuples(*[st.sampled_from([0.0, 0.05, 0.1, 0.2, 0.5, 1.0, 3.0])] * 3).filter(
        lambda r: sum(r) > 0
    ),
)
def test_split_assignment_is_contiguous_complete_and_fair(num_shards, ratios):
    wanted = sum(1 for r in ratios if r > 0)
    if wanted > num_shards:
        with pytest.raises(SyntheticError, match="needs at least"):
            assign_splits(num_shards, ratios)
        return
    splits = assign_splits(num_shards, ratios)
    assert len(splits) == num_shards
    order = [s for i, s in enumerate(splits) if i == 0 or splits[i - 1] != s]
    assert order == [n for n, r in zip(("train", "val", "test"), ratios, strict=True) if r > 0], (
        "splits are not contiguous"
    )
    for name, r in zip(("train", "val", "test"), ratios, strict=True):
        share = num_shards * r / sum(ratios)
        assert abs(splits.count(name) - share) < 2, (
            f"{name}: {splits.count(name)} shards for a share of {share:.2f}"
        )


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    dtype=st.sampled_from(["float32", "bfloat16", "float16", "float64", "int64", "uint8", "bool"]),
    seed=st.integers(0, 2**32),
)
def test_any_tensor_spec_generates_its_dtype_and_shape(shape, dtype, seed, tmp_path_factory):
    schema = Schema("prop", {"t.pth": TensorSpec(tuple(shape), dtype), "n.txt": TextSpec()})
    out = tmp_path_factory.mktemp("prop") / "ds"
    m = generate_dataset(out, schema=schema, num_samples=2, shard_size=2, seed=seed)
    for name, data in h.tar_members(Path(out) / m.shards[0].name):
        if name.endswith(".pth"):
            t = h.tensor_of(data)
            assert (str(t.dtype), tuple(t.shape)) == (f"torch.{dtype}", tuple(shape))


# -- nested JSON fields ------------------------------------------------------------------------------------------
T2I_YAML = """\
encoding: t2i
members:
  image: {kind: image, format: jpeg, size: [16, 24]}
  json:
    kind: json
    fields:
      width: int
      captions: {kind: json_string, fields: {short: {kind: text}, long: {kind: text}, tags: {kind: list, of: {kind: text}, length: 2}}}
      source: {kind: object, fields: {url: {kind: text}, licence: {kind: text}}}
"""


def test_the_documented_nested_json_schema_reads_as_nested_specs(tmp_path):
    path = tmp_path / "t2i.yaml"
    path.write_text(T2I_YAML)
    schema = load_schema(path)
    assert schema.members["json"] == JsonSpec(
        {
            "width": "int",
            "captions": JsonStringSpec(
                {"short": TextSpec(), "long": TextSpec(), "tags": ListSpec(TextSpec(), 2)}
            ),
            "source": ObjectSpec({"url": TextSpec(), "licence": TextSpec()}),
        }
    )
    assert "```yaml\n" + T2I_YAML in (h.REPO / "docs" / "schemas.md").read_text(), (
        "docs/schemas.md does not show the nested JSON example"
    )


NESTED_MEMBERS = {
    "meta.json": {
        "kind": "json",
        "fields": {
            "width": "int",
            "score": "float",
            "caption": "text",
            "captions": {
                "kind": "json_string",
                "fields": {"short": {"kind": "text", "max_words": 6}, "n": "int"},
            },
            "ids": {"kind": "json_string", "of": {"kind": "list", "of": "int", "length": 3}},
            "source": {
                "kind": "object",
                "fields": {"url": "text", "size": {"kind": "object", "fields": {"h": "int"}}},
            },
            "tags": {"kind": "list", "of": "text", "length": 2, "field": "labels"},
            "scores": {"kind": "list", "of": "float", "length": 4},
            "boxes": {
                "kind": "list",
                "of": {
                    "kind": "object",
                    "fields": {"x": "float", "label": {"kind": "text", "field": "name"}},
                },
                "length": 2,
            },
            "grid": {"kind": "list", "of": {"kind": "list", "of": "int", "length": 2}, "length": 2},
        },
    },
    "p.pickle": {
        "kind": "pickle",
        "leaves": {
            "meta": {"kind": "object", "fields": {"emb": {"kind": "tensor", "shape": [2, 3]}, "n": "int"}},
            "embs": {"kind": "list", "of": {"kind": "npy", "shape": [4], "dtype": "float16"}, "length": 2},
            "doc": {"kind": "json_string", "fields": {"a": "text"}},
        },
    },
}


def test_nested_specs_round_trip_exactly_through_dicts_yaml_and_json(tmp_path):
    schema = Schema.from_dict({"encoding": "nested", "members": NESTED_MEMBERS})
    assert Schema.from_dict(schema.to_dict()) == schema
    for suffix, dump in (("yaml", lambda d: yaml.safe_dump(d, sort_keys=False)), ("json", json.dumps)):
        path = tmp_path / f"s.{suffix}"
        path.write_text(dump(schema.to_dict()))
        assert load_schema(path) == schema, f"the {suffix} file does not read back as the same schema"
    fields = schema.members["meta.json"].fields
    assert fields["tags"] == ListSpec(TextSpec(), 2, field="labels")
    assert fields["ids"] == JsonStringSpec(of=ListSpec("int", 3))
    assert fields["ids"].to_dict() == {
        "kind": "json_string",
        "of": {"kind": "list", "of": "int", "length": 3},
    }
    assert fields["grid"].to_dict() == {
        "kind": "list",
        "of": {"kind": "list", "of": "int", "length": 2},
        "length": 2,
    }
    leaves = schema.members["p.pickle"].leaves
    assert leaves["meta"] == ObjectSpec({"emb": TensorSpec((2, 3)), "n": "int"})
    # the schema crosses process boundaries through its dict form
    import pickle

    assert pickle.loads(pickle.dumps(schema)) == schema  # noqa: S301 - our own bytes


def test_nested_specs_built_in_python_are_validated():
    Schema("x", {"m.json": JsonSpec({"o": ObjectSpec({"l": ListSpec("float", 3)})})})
    with pytest.raises(
        SyntheticError, match=r"member 'm.json': field 'o.t' must be int, float, text or an object"
    ):
        Schema("x", {"m.json": JsonSpec({"o": ObjectSpec({"t": TensorSpec((2,))})})})
    with pytest.raises(SyntheticError, match=r"member 'p.pickle': leaf 'o.l': a list needs length"):
        Schema("x", {"p.pickle": PickleSpec({"o": ObjectSpec({"l": ListSpec("int", 0)})})})
    deep: object = "int"
    for _ in range(7):
        deep = ObjectSpec({"n": deep})
    Schema("x", {"m.json": JsonSpec({"d": deep})})  # 8 levels: the limit
    with pytest.raises(SyntheticError, match=r"field 'd\.n(\.n){7}' nests 9 levels deep; at most 8"):
        Schema("x", {"m.json": JsonSpec({"d": ObjectSpec({"n": deep})})})


def _json_fields(fields: dict) -> dict:
    return {"encoding": "x", "members": {"m.json": {"kind": "json", "fields": fields}}}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            _json_fields({"a": "bool"}),
            r"field 'a' must be int, float, text or an object, list or json_string spec",
        ),
        (
            _json_fields({"a": {"kind": "tensor", "shape": [2]}}),
            r"field 'a' must be int, float, text or an object, list or json_string spec",
        ),
        (_json_fields({"o": {"kind": "object"}}), r"field 'o': an object needs fields, e.g. \{kind: object"),
        (
            _json_fields({"o": {"kind": "object", "fields": [1]}}),
            r"field 'o': fields must map names to value specs",
        ),
        (
            _json_fields({"o": {"kind": "object", "fields": {"u": "text"}, "field": "src"}}),
            r"field 'o': unknown field\(s\) \['field'\] for kind object; allowed: fields; field: names the output "
            "field of one value, so put it on the leaves",
        ),
        (
            _json_fields({"l": {"kind": "list", "of": "int"}}),
            r"field 'l': a list needs length, .* e.g. \{kind: list",
        ),
        (_json_fields({"l": {"kind": "list", "of": "int", "length": -1}}), r"field 'l': a list needs length"),
        (
            _json_fields({"l": {"kind": "list", "length": 2}}),
            r"field 'l': a list needs of, the spec of its items",
        ),
        (
            _json_fields({"l": {"kind": "list", "of": "str", "length": 2}}),
            r"field 'l': of must be int, float, text",
        ),
        (
            _json_fields({"l": {"kind": "list", "of": {"kind": "text", "field": "t"}, "length": 2}}),
            r"field 'l': of: a list item has no output field of its own .* put field: on the list",
        ),
        (
            _json_fields(
                {
                    "l": {
                        "kind": "list",
                        "of": {"kind": "object", "fields": {"a": "int"}},
                        "length": 2,
                        "field": "t",
                    }
                }
            ),
            r"field 'l': field: names the output field of one value; a list of object items is checked item by item",
        ),
        (
            _json_fields(
                {"l": {"kind": "list", "of": {"kind": "object", "fields": {"a": "bool"}}, "length": 2}}
            ),
            r"field 'l\[\].a' must be int, float, text",
        ),
        (
            _json_fields({"c": {"kind": "json_string"}}),
            r"field 'c': a json_string needs either fields .* or of",
        ),
        (
            _json_fields({"c": {"kind": "json_string", "fields": {"a": "int"}, "of": "int"}}),
            r"field 'c': a json_string needs either fields",
        ),
        (
            _json_fields({"c": {"kind": "json_string", "of": {"kind": "object", "fields": {"a": "int"}}}}),
            r"field 'c': for a json_string holding an object write fields: \{\.\.\.\}",
        ),
        (
            _json_fields(
                {"c": {"kind": "json_string", "fields": {"s": {"kind": "object", "fields": {"x": None}}}}}
            ),
            r"field 'c.s.x' must be int, float, text",
        ),
        (
            {
                "encoding": "x",
                "members": {
                    "p.pickle": {
                        "kind": "pickle",
                        "leaves": {
                            "d": {"kind": "json_string", "fields": {"t": {"kind": "tensor", "shape": [1]}}}
                        },
                    }
                },
            },
            r"leaf 'd.t' must be int, float, text or an object, list or json_string spec",
        ),
        (
            {
                "encoding": "x",
                "members": {
                    "p.pickle": {
                        "kind": "pickle",
                        "leaves": {"o": {"kind": "object", "fields": {"i": {"kind": "image"}}}},
                    }
                },
            },
            r"leaf 'o.i' must be int, float, text or a tensor, npy, text, object, list or json_string spec",
        ),
    ],
)
def test_bad_nested_json_fields_say_where_and_what_to_write(doc, message, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SyntheticError, match=message) as info:
        load_schema(path)
    assert "bad.yaml" in str(info.value), "the error does not name the schema file"
