"""Property 8 (weight ratios): passes on reference targets; blend/ratios fails on a TaskEncoder that
filters one source after the blend (chi-square), blend/duplicates on a user metadataset that lists a
dataset twice, and blend/subflavors gives advice (never a failure) on a cooker that drops the per-entry
subflavors. The blend runs here use a large effect size (N ~ 1.6k instead of ~25k) to stay fast; the
statistics at the real N are tested in test_conformance_stats.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from primus_energon.conformance import check_cooker, check_task_encoder
from primus_energon.conformance.core.profiles import PROFILES
from primus_energon.conformance.core.results import PropertyResult
from primus_energon.conformance.oracles.stats import required_n
from primus_energon.conformance.properties import blend
from primus_energon.energon_compat import energon_key
from primus_energon.synthetic import generate_dataset, write_metadataset

ZOO = "tests.conformance_zoo.blend_broken"


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Power against w = 0.2 instead of the ci profile's 0.05: 16x fewer draws (the broken targets deviate
    by w > 0.3)."""
    monkeypatch.setitem(PROFILES, "ci", dataclasses.replace(PROFILES["ci"], blend_effect=0.2))


def _blend(kind: str, target: object, workdir: Path, **options: object) -> PropertyResult:
    check = check_cooker if kind == "cooker" else check_task_encoder
    (result,) = check(target, properties=["blend"], profile="ci", workdir=workdir, **options)
    return result


def test_statistical_parameters() -> None:
    assert (blend.ALPHA, blend.POWER) == (1e-6, 0.99)
    assert {name: p.blend_effect for name, p in PROFILES.items()} == {
        "quick": 0.15,
        "ci": 0.1,
        "thorough": 0.05,
    }
    assert (blend.WORLD_SIZE, blend.NUM_WORKERS) == (2, 2)


@pytest.mark.parametrize(
    ("kind", "spec"),
    [
        ("cooker", "primus_energon:PREENCODED_COOKER"),
        ("task_encoder", "primus_energon:RawDiffusionTaskEncoder"),
    ],
)
def test_reference_targets_pass(kind: str, spec: str, workdir: Path, fast: None) -> None:
    result = _blend(kind, spec, workdir)
    assert result.verdict == "pass", result.message
    assert result.verdicts() == {
        "blend/ratios": "pass" if kind == "task_encoder" else "skip",
        "blend/subflavors": "pass",
        "blend/duplicates": "skip",
    }
    assert "applies to a user's metadataset" in result.claim("blend/duplicates").message
    (run,) = result.details["blends"]
    if kind == "cooker":  # Energon cooks before it blends: a cooker's blend is read for its subflavors only
        assert "Energon cooks each dataset before blending it" in result.claim("blend/ratios").message
        assert run["n"] == blend.SUBFLAVOR_BATCHES * blend.BATCH_SIZE * blend.WORLD_SIZE * blend.NUM_WORKERS
        assert run["ratios"] == "not applicable to a cooker" and "p_value" not in run
        assert result.claim("blend/subflavors").examined == run["subflavor_samples_checked"] >= run["n"]
        assert set(run["counts"]) != {0} and "not applicable to a cooker" in result.details["summary"]
        return
    assert result.claim("blend/ratios").examined == run["n"]
    assert result.claim("blend/subflavors").examined == run["subflavor_samples_checked"]
    assert 2 <= len(run["weights"]) <= 5
    assert run["n"] >= run["required_n"] == required_n(len(run["weights"]), w=0.2)
    assert run["counted_at"] == "batch" and run["p_value"] >= 1e-6
    assert run["subflavor_samples_checked"] >= run["n"]
    # Energon 7.4.1 gives a dataset listed twice the same stream (NVIDIA/Megatron-Energon#266): reported, not failed.
    assert result.details["duplicate_entry"]["identical_streams"] is True
    assert "NVIDIA/Megatron-Energon#266" in result.details["summary"]


def test_filtering_after_the_blend_fails(workdir: Path, fast: None) -> None:
    result = _blend("task_encoder", f"{ZOO}:FiltersOneSourceTaskEncoder", workdir)
    claim = result.claim("blend/ratios")
    assert claim.verdict == "fail", f"{claim.verdict}: {claim.message}"
    assert "the realised fractions differ from the weights (chi-square goodness of fit: N=" in claim.message
    assert "entry 1 (dataset blend1, weight " in claim.message and "observed " in claim.message
    assert "on each of 2 workers x 2 ranks" in claim.message
    assert "after the blend" in claim.fix
    # The samples it keeps carry their entry's subflavors.
    assert result.claim("blend/subflavors").verdict == "pass", result.claim("blend/subflavors").message
    assert result.verdict == "fail" and "] blend/ratios: " in result.message
    assert result.reproduce.endswith("--conformance-property blend")


def test_cooker_dropping_entry_subflavors_is_advice(workdir: Path, fast: None) -> None:
    (keys, result) = check_cooker(
        f"{ZOO}:KEEPS_KNOWN_SUBFLAVORS", properties=["keys", "blend"], profile="ci", workdir=workdir
    )
    assert keys.verdict == "pass", keys.message  # on a single dataset it looks right
    assert not keys.advice, keys.advice
    claim = result.claim("blend/subflavors")
    ratios = result.claim("blend/ratios")
    assert claim.verdict == "advice", (
        f"{claim.verdict}: {claim.message} (ratios: {ratios.verdict}: {ratios.message})"
    )
    assert claim.examined > 0 and result.advice == [claim]
    assert claim.message.startswith(f"- sample '{energon_key('shard-000000.tar', 'blend')}"), claim.message
    assert "came from blend entry " in claim.message
    assert "__subflavors__ {'encoding': 'preencoded'} (blend_entry: absent)" in claim.message
    assert "basic_sample_keys" in claim.fix
    # An opinion (and a cooker cannot move the ratios), so the property passes.
    assert result.claim("blend/ratios").verdict == "skip", result.claim("blend/ratios").message
    assert result.verdict == "pass" and result.message == "", result.message


def _dataset(root: Path, name: str) -> Path:
    generate_dataset(root / name, encoding="preencoded", num_samples=4, shard_size=4, seed=1)
    return root / name


def test_user_metadataset_with_a_dataset_twice_fails(tmp_path: Path, fast: None) -> None:
    a, b = _dataset(tmp_path, "a"), _dataset(tmp_path, "b")
    inner = write_metadataset(tmp_path / "sub" / "inner.yaml", [(a, 1.0), (b, 2.0)], legacy=True)
    outer = write_metadataset(tmp_path / "outer.yaml", [(inner, 1.0), (a, 3.0)])
    result = _blend("cooker", "primus_energon:PREENCODED_COOKER", tmp_path / "ws", dataset=str(outer))
    claim = result.claim("blend/duplicates")
    assert claim.verdict == "fail", f"{claim.verdict}: {claim.message}"
    assert claim.examined == 3  # a and b inside inner.yaml, a again in outer.yaml
    assert claim.message.startswith(f"{str(a)!r} is listed at "), claim.message
    assert "sub/inner.yaml: splits.train.datasets[0] and again at " in claim.message
    assert f"outer.yaml: splits.train.blend[1] in {str(outer)!r}" in claim.message
    assert "identical sample streams" in claim.message and "NVIDIA/Megatron-Energon#266" in claim.fix
    assert str(b) not in claim.message
    # A blend the suite generates (in the format of the user's data) is still read for its subflavors.
    assert result.claim("blend/subflavors").verdict == "pass", result.claim("blend/subflavors").message
    assert result.verdict == "fail" and "] blend/duplicates: " in result.message
    assert f"--conformance-dataset {outer}" in result.reproduce, result.reproduce
    assert result.reproduce.endswith("--conformance-property blend"), result.reproduce


def test_user_metadataset_listing_each_dataset_once_passes_duplicates(tmp_path: Path) -> None:
    """blend/duplicates alone, through the ClaimRecorder the property uses."""
    from primus_energon.conformance.core.claims import ClaimRecorder

    a, b = _dataset(tmp_path, "a"), _dataset(tmp_path, "b")
    inner = write_metadataset(tmp_path / "sub" / "inner.yaml", [(a, 1.0)], legacy=True)
    outer = write_metadataset(tmp_path / "outer.yaml", [(inner, 1.0), (b, 3.0)])
    claims = ClaimRecorder(blend.CLAIMS, kind="cooker", reproduce=lambda _: "")
    leaves = blend._check_user_metadataset(claims, str(outer))
    assert [Path(leaf.path).name for leaf in leaves] == ["a", "b"]
    (duplicates,) = [c for c in claims.results() if c.id == "blend/duplicates"]
    assert (duplicates.verdict, duplicates.examined, duplicates.message) == ("pass", 2, "")


def test_check_subflavors_reports_what_differs() -> None:
    prefixes = {"blend0": 0, "blend1": 1}
    records = [
        {"stage": "cook", "key": "blend0_000000", "in": 0, "out": 0, "out_subflavors": "{...}"},
        {"stage": "cook", "key": "blend1_000000", "in": 1, "out": "absent", "out_subflavors": "{'e': 1}"},
        {"stage": "cook", "key": "other_000000", "in": "missing", "out": "missing", "out_subflavors": ""},
        {"stage": "batch", "keys": ["blend0_000000", "blend1_000001", None], "entries": [0, 0, 1]},
    ]
    problems: list[str] = []
    assert blend._check_subflavors(records, prefixes, problems) == 2  # the cooked samples with an entry
    assert len(problems) == 2, problems
    assert problems[0].startswith("sample 'blend1_000000' came from blend entry 1")
    assert "__subflavors__ {'e': 1} (blend_entry: absent)" in problems[0]
    assert problems[1].startswith(
        "sample 'blend1_000001' of blend entry 1 reached batch() with blend_entry: 0"
    )
    assert blend._check_subflavors(records[:1], prefixes, []) == 1


def test_metadataset_leaves_and_duplicates(tmp_path: Path) -> None:
    """The resolver blend/duplicates shares with `primus-energon validate`: nested files, subsets, split parts."""
    from primus_energon.datasets.metadataset import duplicate_leaves, resolve_metadataset

    a, b = _dataset(tmp_path, "a"), _dataset(tmp_path, "b")
    inner = write_metadataset(tmp_path / "sub" / "inner.yaml", [(b, 1.0)], legacy=True)
    doc = {
        "__module__": "megatron.energon",
        "__class__": "MetadatasetV2",
        "splits": {
            "train": {
                "blend": [
                    {"weight": 1, "path": "a", "subset": {"range": ["0%", "50%"]}},
                    {"weight": 1, "path": "./a", "subset": {"range": ["50%", "100%"]}},
                    {"weight": 1, "path": "sub/inner.yaml"},
                    {"weight": 1, "path": "b", "split_part": "val"},
                ]
            },
            "val": {"path": "a"},
        },
    }
    (tmp_path / "mds.yaml").write_text(yaml.safe_dump(doc))
    _, resolved, problems = resolve_metadataset(tmp_path / "mds.yaml")
    assert problems == []
    leaves = [leaf for leaf in resolved if leaf.split == "train"]
    assert [(Path(leaf.path).name, leaf.split_part) for leaf in leaves] == [
        ("a", "train"),
        ("a", "train"),
        ("b", "train"),
        ("b", "val"),
    ]
    assert leaves[0].where.endswith("mds.yaml: splits.train.blend[0]") and leaves[0].subset
    assert leaves[2].where.endswith("inner.yaml: splits.train.datasets[0]")
    assert leaves[3].where.endswith("mds.yaml: splits.train.blend[3]")
    # Disjoint subsets of one dataset, or different split parts, are not duplicates.
    assert duplicate_leaves(leaves) == []
    assert [Path(leaf.path).name for leaf in resolved if leaf.split == "val"] == ["a"]
    # The same subset twice is.
    doc["splits"]["train"]["blend"][1]["subset"] = doc["splits"]["train"]["blend"][0]["subset"]
    (tmp_path / "mds.yaml").write_text(yaml.safe_dump(doc))
    _, resolved, problems = resolve_metadataset(tmp_path / "mds.yaml")
    (pair,) = duplicate_leaves(resolved)
    assert pair[1].where.endswith("mds.yaml: splits.train.blend[1]")
    assert [p.code for p in problems] == [
        "duplicate-leaf"
    ] and "splits.train.blend[0] and again at" in problems[0].message
    assert str(inner).endswith("inner.yaml") and a.is_dir()


def test_instrumenting_an_instance_target_leaves_it_alone(tmp_path: Path) -> None:
    from primus_energon import EncodedDiffusionTaskEncoder
    from primus_energon.conformance.engine.session import make_context
    from primus_energon.conformance.engine.target import resolve_target

    instance = EncodedDiffusionTaskEncoder()
    cookers, batch = list(instance.cookers), instance.batch
    ctx = make_context(resolve_target(instance), workdir=tmp_path)
    instrumented = blend._instrumented(ctx, tmp_path / "sink.jsonl")
    assert instrumented is not instance
    assert instrumented.cookers[0].cook is not cookers[0].cook
    assert instance.cookers == cookers and instance.batch == batch


def test_a_record_still_being_written_is_not_read(tmp_path: Path) -> None:
    """Workers append records while the suite reads them: a last line without its newline is left for
    the next read instead of failing the check with a JSON error."""
    from primus_energon.conformance.engine.recording import read_records

    sink = tmp_path / "records.jsonl"
    sink.write_text('{"stage": "cook", "key": "a"}\n{"stage": "batch", "ke')
    assert read_records(sink) == [{"stage": "cook", "key": "a"}]
