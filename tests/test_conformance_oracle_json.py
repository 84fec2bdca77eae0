"""The fidelity oracle on nested JSON (and nested pickle leaves): one expectation per leaf, found under the
leaf's own name, by value, or inside a structure the output passes on whole; unmatched JSON stays advice."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from primus_energon.conformance.oracles.expectations import (
    MISSING,
    NESTED,
    decode_member,
    difference,
    expectations,
    holds,
    is_required,
    locate,
)
from primus_energon.synthetic import Schema
from primus_energon.synthetic.payloads import PayloadFactory, pickle_bytes

SCHEMA = Schema.from_dict(
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
                        "of": {"kind": "object", "fields": {"x": "float", "label": "text"}},
                        "length": 2,
                    },
                    "alt": {"kind": "text", "field": "alt_text"},
                },
            },
        },
    }
)
SPEC = SCHEMA.members["json"]


@pytest.fixture(scope="module")
def member() -> tuple[bytes, dict]:
    data = PayloadFactory(SCHEMA, seed=5).payload("json", SPEC, 3, "k3").data
    return bytes(data), json.loads(data)


def _expected(data: bytes) -> dict:
    return {e.leaf: e for e in expectations("json", SPEC, data, required=False)}


def test_one_expectation_per_leaf_with_a_dotted_path_and_the_last_part_as_name(member):
    data, document = member
    found = _expected(data)
    assert list(found) == [
        "width",
        "captions.short",
        "captions.long",
        "captions.tags",
        "source.url",
        "source.licence",
        "ids",
        "boxes[0].x",
        "boxes[0].label",
        "boxes[1].x",
        "boxes[1].label",
        "alt",
    ]
    assert [found[p].names for p in ("captions.long", "source.url", "boxes[1].label", "ids", "alt")] == [
        ["long"],
        ["url"],
        ["label"],
        [],  # the document a json string holds has no name of its own: the string's name holds the string
        ["alt_text"],
    ]
    assert found["alt"].explicit and not found["captions.long"].explicit
    captions = json.loads(document["captions"])
    assert found["captions.long"].value == captions["long"]  # read by parsing the string
    assert found["captions.tags"].value == captions["tags"]  # a list of text is one leaf, the whole list
    assert found["ids"].value == json.loads(document["ids"])
    assert found["boxes[1].x"].value == document["boxes"][1]["x"]
    assert decode_member(SPEC, data) == document


def test_a_cooked_field_named_like_the_leaf_holds_it(member):
    data, document = member
    long = json.loads(document["captions"])["long"]
    expected = _expected(data)["captions.long"]
    assert locate(expected, {"long": long, "image": np.zeros((2, 2, 3), np.uint8)}) == ("long", "by name")
    assert difference(expected, long) is None
    assert locate(expected, {"caption": long}) == ("caption", "by value")
    assert "text differs" in difference(expected, long + " ")


def test_a_missing_leaf_gives_no_match(member):
    data, document = member
    found = _expected(data)
    assert locate(found["captions.long"], {"short": json.loads(document["captions"])["short"]}) == (None, "")
    assert locate(found["alt"], {"alt": document["alt"]}) == (None, ""), "field: names the only place"
    broken = json.dumps({**document, "captions": "{not json"}).encode()
    again = _expected(broken)
    assert again["captions.long"].value is MISSING and locate(again["captions.long"], {"other": "y"}) == (
        None,
        "",
    )
    assert not holds({"other": "y"}, "json", SPEC, data)


def test_a_structure_passed_on_whole_holds_its_leaves(member):
    data, document = member
    found = _expected(data)
    parsed = json.loads(document["captions"])
    cooked = {"source": copy.deepcopy(document["source"]), "captions": document["captions"]}
    for path in ("source.url", "source.licence", "captions.long", "captions.tags"):
        assert locate(found[path], cooked) == (
            {"source": "source"}.get(path.split(".")[0], "captions"),
            NESTED,
        )
    assert locate(found["captions.long"], {"caps": parsed}) == ("caps", NESTED)  # the string parsed
    assert locate(found["ids"], {"ids": document["ids"]}) == ("ids", NESTED)  # the string kept as text
    assert locate(found["ids"], {"token_ids": json.loads(document["ids"])}) == ("token_ids", "by value")
    assert locate(found["boxes[0].x"], {"objects": document["boxes"]}) == ("objects", NESTED)
    # a changed structure holds none of its leaves: no partial credit for the untouched ones
    changed = copy.deepcopy(document["source"])
    changed["licence"] += "!"
    assert locate(found["source.licence"], {"source": changed}) == (None, "")
    assert locate(found["boxes[0].x"], {"objects": [*document["boxes"], {}]}) == (None, "")


def test_unmatched_json_leaves_stay_advice():
    assert not is_required(SCHEMA, "json", SPEC), "an unmatched JSON leaf would be called lost data"
    listed = Schema(SCHEMA.encoding, SCHEMA.members, required=("json",))
    assert is_required(listed, "json", SPEC)


def test_nested_pickle_leaves_are_found_by_name_and_inside_a_passed_on_dict():
    schema = Schema.from_dict(
        {
            "encoding": "p",
            "members": {
                "p.pickle": {
                    "kind": "pickle",
                    "leaves": {
                        "meta": {
                            "kind": "object",
                            "fields": {"clip": {"kind": "tensor", "shape": [4]}, "n": "int"},
                        },
                        "t5": {
                            "kind": "list",
                            "of": {"kind": "npy", "shape": [2], "dtype": "float16"},
                            "length": 2,
                        },
                    },
                }
            },
        }
    )
    spec = schema.members["p.pickle"]
    factory = PayloadFactory(schema, seed=1)
    value = factory.structure("p.pickle", spec, 0)
    data = pickle_bytes(value, spec.protocol)
    found = {e.leaf: e for e in expectations("p.pickle", spec, data, required=True)}
    assert list(found) == ["meta.clip", "meta.n", "t5[0]", "t5[1]"]
    clip = value["meta"]["clip"]
    assert locate(found["meta.clip"], {"clip": clip.clone()}) == ("clip", "by name")
    assert locate(found["meta.n"], {"meta": {"clip": clip.clone(), "n": value["meta"]["n"]}}) == (
        "meta",
        NESTED,
    )
    assert locate(found["t5[1]"], {"t5": torch.from_numpy(value["t5"][1])}) == ("t5", "by value")
    assert locate(found["meta.clip"], {"meta": {"clip": torch.zeros(4), "n": value["meta"]["n"]}}) == (
        None,
        "",
    )


def test_fidelity_calls_unmatched_nested_json_leaves_advice_and_judges_the_found_ones(member):
    from primus_energon.conformance.core.claims import ClaimRecorder
    from primus_energon.conformance.properties import fidelity

    data, document = member
    cooked = {"long": json.loads(document["captions"])["long"], "source": document["source"], "width": 0}
    claims = ClaimRecorder(fidelity.CLAIMS, kind="cooker", reproduce=lambda name: "")
    for expected in expectations("json", SPEC, data, required=is_required(SCHEMA, "json", SPEC)):
        fidelity._judge(claims, expected, cooked, "dataset main", "k3", None)
    verdicts = {r.id: r for r in claims.results()}
    assert verdicts["fidelity/text"].verdict == "pass"
    assert verdicts["fidelity/unmatched"].verdict == "advice"
    assert "leaf 'captions.short'" in verdicts["fidelity/unmatched"].message
    assert "leaf 'source.url'" not in verdicts["fidelity/unmatched"].message  # held by the whole `source`
    assert verdicts["fidelity/other"].verdict == "fail"  # `width` found by name, with another value
    assert f"expected {document['width']}" in verdicts["fidelity/other"].message
