"""Metadatasets: weighted blends with per-entry subflavors, in the V2 (blend) and legacy (datasets) forms."""

from __future__ import annotations

from collections import Counter

import pytest
import yaml

from primus_energon.synthetic import SyntheticError, write_metadataset

try:
    from . import synthetic_helpers as h
except ImportError:
    import synthetic_helpers as h


@pytest.fixture(scope="session")
def pair(tmp_path_factory):
    pre = h.cached_dataset(
        tmp_path_factory, "blend_pre", num_samples=16, shard_size=4, seed=21, shapes=h.SMALL
    )
    raw = h.cached_dataset(
        tmp_path_factory, "blend_raw", encoding="raw", num_samples=12, shard_size=4, seed=22
    )
    return pre, raw


@pytest.mark.parametrize("legacy", [False, True], ids=["v2-blend", "legacy-datasets"])
def test_energon_blends_by_weight_with_merged_subflavors(pair, legacy, tmp_path):
    (pre_path, pre), (raw_path, raw) = pair
    out = write_metadataset(
        tmp_path / "mix.yaml",
        [(pre_path, 0.7, {"source": "a"}), (raw_path, 0.3, {"source": "b", "tier": "gold"})],
        legacy=legacy,
    )
    doc = yaml.safe_load(out.read_text())
    group = "datasets" if legacy else "blend"
    assert doc["__class__"] == ("Metadataset" if legacy else "MetadatasetV2")
    assert [e["weight"] for e in doc["splits"]["train"][group]] == [0.7, 0.3]
    samples = h.load_blend(out, 400)
    by_source = Counter(s["__subflavors__"]["source"] for s in samples)
    assert 0.6 < by_source["a"] / 400 < 0.8, f"blend gave {dict(by_source)} for weights 0.7/0.3"
    manifests = {"a": pre, "b": raw}
    for s in samples:
        sub = s["__subflavors__"]
        expected = {"encoding": "preencoded", "source": "a"} if sub["source"] == "a" else {
            "encoding": "raw", "source": "b", "tier": "gold"
        }  # fmt: skip
        assert sub == expected, f"{s['__key__']}: subflavors {sub}"
        record = manifests[sub["source"]].sample(s["__key__"])
        assert {n: h.sha(s[n]) for n in record.members} == {n: r.sha256 for n, r in record.members.items()}


def test_entry_subflavors_override_the_dataset_encoding(pair, tmp_path):
    (pre_path, _), _ = pair
    out = write_metadataset(tmp_path / "m.yaml", [(pre_path, 1.0, {"encoding": "custom_v2"})])
    assert {s["__subflavors__"]["encoding"] for s in h.load_blend(out, 8)} == {"custom_v2"}


def test_yaml_layout_paths_and_splits(pair, tmp_path):
    _, (raw_path, _) = pair
    inside = tmp_path / "data" / "pre"
    (inside / ".nv-meta").mkdir(parents=True)
    out = write_metadataset(
        tmp_path / "mix.yaml", [(inside, 1), (raw_path, 2.5, {})], splits=("train", "val")
    )
    doc = yaml.safe_load(out.read_text())
    blend = [{"weight": 1.0, "path": "data/pre"}, {"weight": 2.5, "path": str(raw_path)}]
    assert doc == {
        "__module__": "megatron.energon",
        "__class__": "MetadatasetV2",
        "splits": {"train": {"blend": blend}, "val": {"blend": blend}},
    }, "a dataset below the YAML is written relative to it, one elsewhere absolute, the blend once per split"
    assert "&id" not in out.read_text(), "YAML anchors make the file hard to read"


@pytest.mark.parametrize(
    ("entries", "kwargs", "message"),
    [
        ([], {}, "at least one blend entry"),
        ([("{pre}", 0)], {}, "weight must be a positive number"),
        ([("{pre}", "1")], {}, "weight must be a positive number"),
        ([("{pre}",)], {}, r"must be \(path, weight\)"),
        ([("/nonexistent/ds", 1)], {}, "is not a prepared dataset"),
        ([("{pre}", 1)], {"splits": ()}, "at least one split"),
    ],
)
def test_bad_metadataset_requests(pair, entries, kwargs, message, tmp_path):
    (pre_path, _), _ = pair
    entries = [tuple(str(e).format(pre=pre_path) if i == 0 else e for i, e in enumerate(t)) for t in entries]
    with pytest.raises(SyntheticError, match=message):
        write_metadataset(tmp_path / "m.yaml", entries, **kwargs)
    with pytest.raises(SyntheticError, match="must end in .yaml"):
        write_metadataset(tmp_path / "m.txt", [(pre_path, 1)])
