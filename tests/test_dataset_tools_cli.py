"""The dataset subcommands: finalize, validate on metadatasets, info and preview, in process and as real
subprocesses (``python -m primus_energon``)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from primus_energon.__main__ import build_parser, main
from primus_energon.datasets.finalize import FinalizeError, finalize_dataset, parse_split
from primus_energon.datasets.info import dataset_info
from primus_energon.datasets.metadataset import resolve_metadataset, validate_metadataset
from primus_energon.datasets.preview import preview_dataset
from primus_energon.datasets.validate import validate_dataset
from primus_energon.energon_compat import ENERGON_VERSION, key_in_shard
from primus_energon.synthetic import write_metadataset
from tests.test_dataset_tools import PRE, RAW, dataset

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m primus_energon ARGS`` in a real subprocess."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    return subprocess.run(
        [sys.executable, "-m", "primus_energon", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        env=env,
        timeout=300,
        check=False,
    )


def unprepared(src: Path, dst: Path) -> Path:
    """A copy of the shards of `src` only: no .nv-meta, no .tar.idx, no manifest."""
    dst.mkdir(parents=True)
    for p in src.glob("*.tar"):
        shutil.copy(p, dst / p.name)
    return dst


# -- a dataset prepared by Energon's own CLI ----------------------------------------------------------------------
def energon_prepare(root: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """Energon's own ``energon prepare ROOT --non-interactive ...`` in a real subprocess, as a user (or the
    DFM / Megatron-Bridge prepare scripts) runs it: a CrudeWebdataset whose dataset.yaml has no subflavors."""
    code = "import sys; from megatron.energon.cli.main import main; sys.argv[0] = 'energon'; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, "prepare", str(root), "--non-interactive", *options],
        capture_output=True,
        text=True,
        cwd=root.parent,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    ("kind", "split"),
    [("preencoded", ("--split-ratio", "1,0,0")), ("raw", ("--split-ratio", "0.5,0.5,0"))],
)
def test_validate_accepts_a_dataset_energon_prepare_wrote_without_subflavors(
    tmp_path_factory, tmp_path, capsys, kind, split
):
    """Energon's CLI prepares in a subprocess; validate runs in process (its subprocess form is tested below)."""

    def validate(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(["validate", str(root), "--workers", "1", "--no-progress", *args])
        return code, capsys.readouterr().out

    src, _ = dataset(tmp_path_factory, f"clean-{kind}", **(PRE if kind == "preencoded" else RAW))
    root = unprepared(src, tmp_path / "ds")
    prepared = energon_prepare(
        root, *split, "--sample-type", "CrudeWebdataset", "--no-progress", "--num-workers", "1"
    )
    assert prepared.returncode == 0, prepared.stdout[-2000:] + prepared.stderr[-2000:]
    written = yaml.safe_load((root / ".nv-meta" / "dataset.yaml").read_text())
    assert written == {"__module__": "megatron.energon", "__class__": "CrudeWebdataset"}  # no subflavors
    code, out = validate()
    assert code == 0, out[-3000:]
    assert "encoding-mismatch" not in out and "ERROR" not in out
    assert f"encoding {kind} (from detected)" in out
    assert "note: .nv-meta/dataset.yaml declares no subflavors.encoding, which Energon does not need" in out
    assert f"the {kind} encoding (inferred from the members)" in out
    doc = json.loads(validate("--json", "-")[1])
    assert doc["ok"] is True and doc["problems"] == [] and doc["summary"]["warnings"] == 0
    assert doc["encoding"]["declared"] is None and doc["encoding"]["used"] == kind
    # --strict fails on warnings; the note is none
    assert validate("--strict")[0] == 0
    # a declared encoding the members contradict is still an error
    other = "raw" if kind == "preencoded" else "preencoded"
    (root / ".nv-meta" / "dataset.yaml").write_text(
        f"__module__: megatron.energon\n__class__: CrudeWebdataset\nsubflavors:\n  encoding: {other}\n"
    )
    code, out = validate()
    assert code == 1 and "encoding-mismatch" in out, out[-3000:]
    assert "note:" not in out


# -- finalize --------------------------------------------------------------------------------------------------
@pytest.fixture
def pre_clean(tmp_path_factory):
    return dataset(tmp_path_factory, "clean-preencoded", **PRE)


def test_finalize_prepares_writes_dataset_yaml_and_validates(pre_clean, tmp_path, capsys):
    src, manifest = pre_clean
    root = unprepared(src, tmp_path / "ds")
    rc = main(
        [
            "finalize",
            str(root),
            "--encoding",
            "preencoded",
            "--split",
            "0.5,0.25,0.25",
            "--workers",
            "1",
            "--subflavor",
            "source=laion",
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert (root / ".nv-meta" / "dataset.yaml").read_text() == (
        "__module__: megatron.energon\n__class__: CrudeWebdataset\nsubflavors:\n  encoding: preencoded\n"
        "  source: laion\n"
    )
    for name in (".info.json", "split.yaml", "index.sqlite"):
        assert (root / ".nv-meta" / name).is_file()
    assert all((root / (p.name + ".idx")).is_file() for p in root.glob("*.tar"))
    split = yaml.safe_load((root / ".nv-meta" / "split.yaml").read_text())
    assert set(split["split_parts"]) == {"train", "val", "test"}
    assert "OK" in out and "FAILED" not in out
    report = validate_dataset(root)
    assert report.ok and report.problems == []
    assert (
        report.splits["train"]["samples"] + report.splits["val"]["samples"] + report.splits["test"]["samples"]
        == 48
    )
    # Energon itself loads it, with the reference cookers
    items, stop = preview_dataset(root, n=2)
    assert stop is None and [i.error for i in items] == [None, None]


@pytest.mark.parametrize(
    "split", ["0.5,0.5", "0.5,0.6,-0.1", "a,b,c", "0.5,0.3,0.1", "1,0,0,0", "nan,0,1", "0.8;0.1;0.1"]
)
def test_finalize_refuses_bad_split_ratios_with_one_line(split, pre_clean, tmp_path, capsys):
    root = unprepared(pre_clean[0], tmp_path / "ds")
    rc = main(["finalize", str(root), "--encoding", "preencoded", "--split", split])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "--split must be three non-negative numbers" in err
    assert not (root / ".nv-meta").exists()


def test_parse_split_accepts_good_ratios():
    assert parse_split("0.9,0.05,0.05") == (0.9, 0.05, 0.05)
    assert parse_split((1, 0, 0)) == (1.0, 0.0, 0.0)
    with pytest.raises(FinalizeError):
        parse_split((0.5, 0.5, 0.5))


def test_finalize_explains_compressed_shards_and_decompresses_on_request(pre_clean, tmp_path, capsys):
    root = unprepared(pre_clean[0], tmp_path / "ds")
    for p in sorted(root.glob("*.tar"))[:2]:
        with gzip.open(root / (p.name + ".gz"), "wb") as f:
            f.write(p.read_bytes())
        p.unlink()
    rc = main(["finalize", str(root), "--encoding", "preencoded"])
    err = capsys.readouterr().err
    assert rc == 2 and "compressed" in err and "--decompress" in err and "byte offset" in err
    assert len(err.strip().splitlines()) == 1
    rc = main(
        ["finalize", str(root), "--encoding", "preencoded", "--decompress", "--workers", "1", "--no-progress"]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.out + captured.err
    assert "decompressed shard-000000.tar" in captured.err
    assert validate_dataset(root).num_samples == 48


def test_finalize_refuses_a_prepared_directory_unless_forced(pre_clean, tmp_path, capsys):
    root = unprepared(pre_clean[0], tmp_path / "ds")
    finalize_dataset(root, "preencoded")
    with pytest.raises(FinalizeError, match="already prepared") as exc:
        finalize_dataset(root, "preencoded")
    assert exc.value.exit_code == 2
    result = finalize_dataset(root, "raw", force=True)
    assert "encoding: raw" in result.dataset_yaml.read_text()
    assert [p.code for p in validate_dataset(root).problems] == ["encoding-mismatch"]


@pytest.mark.skipif(
    ENERGON_VERSION < (7, 3), reason="Energon 7.0-7.2 prepare a dataset whose keys repeat without complaint"
)
def test_finalize_turns_energons_exit_on_duplicate_keys_into_a_clear_error(
    tmp_path_factory, tmp_path, capsys
):
    src, manifest = dataset(tmp_path_factory, "preencoded-duplicate-key", **PRE, faults={"duplicate-key": 2})
    root = unprepared(src, tmp_path / "ds")
    rc = main(["finalize", str(root), "--encoding", "preencoded", "--workers", "1"])
    captured = capsys.readouterr()
    assert rc == 1
    assert "not unique" in captured.err and "Traceback" not in captured.err
    # then the shards are validated, naming each duplicate (and nothing about the missing metadata)
    assert captured.out.count("key 's5_") == 2 and "duplicate-key (2)" in captured.out
    assert "missing-metadata" not in captured.out


def test_finalize_exits_non_zero_when_validation_fails(tmp_path_factory, tmp_path, capsys):
    src, manifest = dataset(tmp_path_factory, "preencoded-nan-tensor", **PRE, faults={"nan-tensor": 2})
    root = unprepared(src, tmp_path / "ds")
    rc = main(
        [
            "finalize",
            str(root),
            "--encoding",
            "preencoded",
            "--workers",
            "1",
            "--no-progress",
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 1 and "nan-tensor" in out
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["ok"] is False and doc["summary"]["by_code"] == {"nan-tensor": 2}


def test_finalize_on_a_truncated_shard_fails(tmp_path_factory, tmp_path, capsys):
    src, manifest = dataset(
        tmp_path_factory, "preencoded-truncated-shard", **PRE, faults={"truncated-shard": 1}
    )
    root = unprepared(src, tmp_path / "ds")
    rc = main(["finalize", str(root), "--encoding", "preencoded", "--workers", "1", "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 1
    assert "truncated-shard" in captured.out and manifest.faults[0].key in captured.out


# -- metadatasets ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    pre, _ = dataset(tmp_path_factory, "clean-preencoded", **PRE)
    raw, _ = dataset(tmp_path_factory, "clean-raw-jpg", **RAW)
    root = tmp_path_factory.mktemp("mds")
    return root, pre, raw


@pytest.mark.parametrize("legacy", [False, True], ids=["MetadatasetV2", "Metadataset"])
def test_metadataset_resolves_leaves_like_energon(blend, legacy):
    traverse_metadataset = getattr(
        pytest.importorskip("megatron.energon.metadataset.loader"), "traverse_metadataset", None
    )
    if traverse_metadataset is None:
        pytest.skip(
            f"Energon {'.'.join(map(str, ENERGON_VERSION))} has no traverse_metadataset to compare the leaves with (7.4 has)"
        )

    root, pre, raw = blend
    name = "legacy" if legacy else "v2"
    inner = write_metadataset(
        root / f"inner-{name}.yaml",
        [(pre, 1.0, {"source": "inner", "x": "1"}), (raw, 3.0)],
        legacy=legacy,
        splits=("train", "val"),
    )
    top = write_metadataset(
        root / f"top-{name}.yaml",
        [(inner, 2.0, {"source": "outer"}), (pre, 2.0)],
        legacy=legacy,
        splits=("train", "val"),
    )
    form, leaves, problems = resolve_metadataset(top)
    assert form == ("Metadataset (legacy)" if legacy else "MetadatasetV2")
    energon = traverse_metadataset(top, split_part="train")
    mine = [lf for lf in leaves if lf.split == "train"]
    assert [(str(t.path), t.split_part, t.subflavors) for t in energon] == [
        (str(lf.path), lf.split_part, lf.subflavors) for lf in mine
    ]
    assert [lf.normalized_weight for lf in mine] == [0.125, 0.375, 0.5]
    assert [p.code for p in problems] == [
        "duplicate-leaf",
        "duplicate-leaf",
    ]  # pre twice, in train and in val
    assert all(p.severity == "warning" for p in problems)  # different subflavors: a deliberate variant
    report = validate_metadataset(top)
    assert len(report.leaves) == 6
    assert {lf.subflavors["encoding"] for lf in report.leaves} == {"preencoded", "raw"}
    # the leaves have no val samples: Energon would raise EmptyDatasetError, so it is an error (once per leaf)
    assert not report.ok
    assert sorted(p.dataset for p in report.errors) == sorted([str(pre), str(raw)])
    assert {p.code for p in report.errors} == {"split-mismatch"}
    train_only = write_metadataset(
        root / f"train-{name}.yaml", [(pre, 0.7, {"source": "a"}), (raw, 0.3)], legacy=legacy
    )
    report = validate_metadataset(train_only)
    assert (
        report.ok and report.problems == [] and [lf.normalized_weight for lf in report.leaves] == [0.7, 0.3]
    )


def test_metadataset_problems(blend, tmp_path_factory):
    root, pre, raw = blend
    bad, manifest = dataset(tmp_path_factory, "preencoded-wrong-dtype", **PRE, faults={"wrong-dtype": 2})
    doc = {
        "__module__": "megatron.energon",
        "__class__": "MetadatasetV2",
        "splits": {
            "train": {
                "blend": [
                    {"weight": 1, "path": str(pre)},
                    {"weight": 0, "path": str(raw)},
                    {"weight": -2, "path": str(raw)},
                    {"weight": 1, "path": "does/not/exist"},
                    {"weight": 2, "path": str(pre)},
                    {"weight": 1, "path": str(bad)},
                ]
            }
        },
    }
    top = root / "bad.yaml"
    top.write_text(yaml.safe_dump(doc))
    report = validate_metadataset(top)
    assert not report.ok
    meta = sorted((p.code, p.severity) for p in report.problems if p.code not in ("wrong-dtype",))
    assert meta == [
        ("bad-weight", "error"),
        ("bad-weight", "error"),
        ("duplicate-leaf", "error"),
        ("missing-path", "error"),
    ]
    leaf_problems = [p for p in report.problems if p.code == "wrong-dtype"]
    assert {p.dataset for p in leaf_problems} == {str(bad)} and len(leaf_problems) == 2
    assert [lf.normalized_weight for lf in report.leaves] == [
        0.2,
        0.4,
        0.2,
    ]  # the missing path keeps its share
    assert "duplicate-leaf" in report.to_json() and json.loads(report.to_json())["kind"] == "metadataset"


@pytest.mark.parametrize(
    "doc,needle",
    [
        ({"__class__": "MetadatasetV2", "blend": []}, "inside 'splits"),
        ({"__class__": "MetadatasetV2", "splits": {"train": {"datasets": []}}}, "legacy 'datasets:'"),
        ({"__class__": "Metadataset", "splits": {"train": {"blend": []}}}, "MetadatasetV2"),
        ({"__class__": "Nope", "splits": {}}, "not Metadataset"),
    ],
)
def test_malformed_metadatasets_are_explained(tmp_path, doc, needle):
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump(doc))
    report = validate_metadataset(p)
    assert (
        not report.ok
        and report.problems[0].code == "bad-metadataset"
        and needle in report.problems[0].message
    )


# -- info and preview ------------------------------------------------------------------------------------------
def test_info_reports_splits_sizes_members_shapes(tmp_path_factory, capsys):
    root, manifest = dataset(
        tmp_path_factory,
        "clean-preencoded-buckets-info",
        **PRE,
        variable_shapes=True,
        split=(0.5, 0.25, 0.25),
    )
    rc = main(["info", str(root), "-n", "4", "--json", str(root.parent / "info.json")])
    out = capsys.readouterr().out
    assert rc == 0
    for needle in (
        "encoding: preencoded",
        "48 samples in 6 shards",
        "train",
        "val",
        "test",
        "latents.pth",
        "prompt_embeds.pth",
        "float32",
        "[7, 16]",
        "first 4 samples",
    ):
        assert needle in out, needle
    doc = json.loads((root.parent / "info.json").read_text())
    assert doc["samples"] == 48 and doc["splits"]["train"]["samples"] == len(manifest.keys("train"))
    assert doc["bytes"] == sum(s.size for s in manifest.shards)
    full = dataset_info(root, full=True)
    shapes = {tuple(s.members["latents.pth"].shape) for s in manifest.samples}
    assert set(full.members["latents.pth"].shapes) == shapes and full.members["latents.pth"].bucketed


def test_preview_shows_samples_as_the_reference_task_encoder_sees_them(tmp_path_factory, capsys):
    root, manifest = dataset(tmp_path_factory, "clean-preencoded", **PRE)
    assert main(["preview", str(root), "-n", "3"]) == 0
    out = capsys.readouterr().out
    assert (
        len(re.findall(r"key (?:\S+\.tar/)?s5_", out)) == 3
        and "latents" in out
        and "tensor float32 [4, 8, 8]" in out
    )
    assert "caption" in out and "min" in out
    raw, _ = dataset(tmp_path_factory, "clean-raw-jpg", **RAW)
    assert main(["preview", str(raw), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "PIL image RGB 24x16" in out and "txt" in out


def test_preview_shows_rejected_samples_and_never_runs_the_payload(tmp_path_factory):
    root, manifest = dataset(
        tmp_path_factory, "preencoded-malicious-pickle", **PRE, faults={"malicious-pickle": 2}
    )
    bad = {f.key for f in manifest.faults}
    items, stop = preview_dataset(root, n=48)
    assert stop is None
    assert {key_in_shard(i.key) for i in items if i.error} == bad
    assert all("not a tensor" in i.error or "refused" in i.error for i in items if i.error)
    assert not Path(manifest.marker_path).exists()


# -- real subprocesses -----------------------------------------------------------------------------------------
def test_cli_validate_in_a_subprocess(tmp_path_factory, tmp_path):
    clean, _ = dataset(tmp_path_factory, "clean-preencoded", **PRE)
    r = cli("validate", str(clean), "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "ERROR" not in r.stdout and "ready for training" in r.stdout
    faulty, manifest = dataset(
        tmp_path_factory, "preencoded-malicious-pickle", **PRE, faults={"malicious-pickle": 2}
    )
    r = cli("validate", str(faulty), "--workers", "2", "--json", "-", "--progress")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["summary"]["by_code"] == {"malicious-pickle": 2}
    assert "malicious-pickle" in r.stderr and "FAILED" in r.stderr
    assert f"validate {faulty.name}:" in r.stderr and "B/s]" in r.stderr  # the progress bar (forced on)
    r = cli("validate", str(faulty), "--workers", "1")
    assert f"validate {faulty.name}:" not in r.stderr  # no bar when stderr is not a terminal
    assert not Path(manifest.marker_path).exists()


def test_cli_refusals_in_a_subprocess(tmp_path):
    r = cli("validate", str(tmp_path / "missing"))
    assert r.returncode == 2 and r.stderr.strip().endswith("does not exist") and "Traceback" not in r.stderr
    (tmp_path / "ds").mkdir()
    r = cli("finalize", str(tmp_path / "ds"), "--encoding", "raw", "--split", "0.7,0.7,0")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["finalize", "validate", "info", "preview"])
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: primus-energon {command}")
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    for action in sub._actions:
        for flag in action.option_strings:
            assert flag in out


def test_register_wires_into_another_parser():
    import argparse

    from primus_energon.datasets.commands import register, validate

    parser = argparse.ArgumentParser(prog="primus-energon")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo")
    register(commands)
    args = parser.parse_args(["validate", "x", "--workers", "3"])
    assert args.handler is validate.run and args.workers == 3
