"""Datasets on object storage: a real S3-compatible server on the loopback address (moto), a real
multi-storage-client profile, real ranged GETs. Every tool reads a remote dataset as it reads the local copy
it was uploaded from."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from primus_energon import EncodedDiffusionTaskEncoder, get_loader
from primus_energon.datasets import (
    FinalizeError,
    ValidationError,
    dataset_info,
    finalize_dataset,
    preview_dataset,
    resolve_metadataset,
    validate_path,
)
from primus_energon.energon_compat import key_in_shard
from primus_energon.storage import ForwardWindow, RemotePath, dataset_path, is_remote
from primus_energon.synthetic import (
    FAULT_KINDS,
    LoopbackObjectStore,
    Manifest,
    generate_dataset,
    write_metadataset,
)
from tests.helpers import SMALL_SHAPES, run_pytest

REPO = Path(__file__).resolve().parents[1]

#: every fault kind the generator makes, one dataset holding them all
FAULTS = {kind: 1 for kind in FAULT_KINDS}


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("remote-src")
    generate_dataset(root / "clean", num_samples=32, shard_size=8, seed=3, shapes=SMALL_SHAPES)
    generate_dataset(
        root / "faulty", num_samples=48, shard_size=8, seed=4, shapes=SMALL_SHAPES, faults=FAULTS
    )
    return {"clean": root / "clean", "faulty": root / "faulty"}


@pytest.fixture(scope="module")
def store(local: dict[str, Path]) -> LoopbackObjectStore:
    with LoopbackObjectStore() as s:
        for name, path in local.items():
            s.upload(path, name)
        yield s


def comparable(report: dict) -> dict:
    """A validation report's JSON without what differs between two reads of one dataset (path, timing)."""
    doc = dict(report)
    for k in ("path", "elapsed_s", "distributed"):
        doc.pop(k, None)
    return doc


def report_json(path: str | Path, **kw: object) -> dict:
    return comparable(json.loads(validate_path(path, **kw).to_json()))


# -- paths -------------------------------------------------------------------------------------------------
def test_a_url_stays_a_url_and_a_local_path_stays_a_path(store: LoopbackObjectStore) -> None:
    remote = dataset_path("msc://loopback/clean")
    assert isinstance(remote, RemotePath) and str(remote) == "msc://loopback/clean"
    assert str(remote / ".nv-meta" / "split.yaml") == "msc://loopback/clean/.nv-meta/split.yaml"
    assert str((remote / "x").parent) == "msc://loopback/clean"
    assert isinstance(dataset_path("file:///tmp/x"), Path) and str(dataset_path("file:///tmp/x")) == "/tmp/x"
    assert is_remote("msc://p/x") and not is_remote("/data/x") and not is_remote("file:///x")


def test_a_listing_is_taken_once_and_answers_below_it(
    store: LoopbackObjectStore, local: dict[str, Path]
) -> None:
    top = RemotePath("msc://loopback/clean").snapshot()
    names = [rel for rel, _ in top.walk_files()]
    expected = sorted(
        p.relative_to(local["clean"]).as_posix() for p in local["clean"].rglob("*") if p.is_file()
    )
    assert names == expected
    shard = top / "shard-000000.tar"
    assert shard.is_file() and not shard.is_dir()
    assert shard.stat().st_size == (local["clean"] / "shard-000000.tar").stat().st_size
    assert (top / ".nv-meta").is_dir() and not (top / "nope.tar").is_file()
    assert [p.name for p in (top / ".nv-meta").iterdir()] == sorted(
        p.name for p in (local["clean"] / ".nv-meta").iterdir()
    )


# -- validate ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", ["clean", "faulty"])
def test_validate_remote_equals_validate_local(
    store: LoopbackObjectStore, local: dict[str, Path], name: str, workers: int
) -> None:
    remote = report_json(store.url(name), workers=workers)
    assert remote == report_json(local[name], workers=workers)
    codes = {p["code"] for p in remote["problems"]}
    if name == "faulty":  # every fault kind is found remotely, not only "some problem"
        assert set(FAULT_KINDS) <= codes, sorted(set(FAULT_KINDS) - codes)
    else:
        assert remote["ok"] and not remote["problems"]


@pytest.mark.slow  # a fresh process over object storage: the slow tier
def test_validate_cli_on_a_remote_dataset(
    store: LoopbackObjectStore, local: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "primus_energon",
            "validate",
            store.url("faulty"),
            "--json",
            str(out),
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 1, run.stderr
    doc = json.loads(out.read_text())
    assert doc["path"] == "msc://loopback/faulty"
    assert comparable(doc) == report_json(local["faulty"])
    assert "does not exist" not in run.stderr and "msc:/loopback" not in run.stdout + run.stderr


def test_a_read_that_fails_part_way_is_an_unreadable_shard(local: dict[str, Path], tmp_path: Path) -> None:
    with LoopbackObjectStore(profile="vanishing") as s:
        url = s.upload(local["clean"], "gone")
        top = RemotePath(url).snapshot()
        assert top.is_dir()  # listed now: the shard is known, with its size
        s.client().delete_object(Bucket=s.bucket, Key="gone/shard-000001.tar")  # removed mid-run
        report = validate_path(top)
    bad = [p for p in report.problems if p.shard == "shard-000001.tar"]
    assert [p.code for p in bad] == ["unreadable-shard"], [p.to_dict() for p in report.problems]
    assert "shard-000001.tar" in bad[0].message
    assert not report.ok


def test_a_remote_path_that_is_not_there_says_so(store: LoopbackObjectStore) -> None:
    with pytest.raises(ValidationError, match=r"'msc://loopback/nothing-here' does not exist"):
        validate_path("msc://loopback/nothing-here")


def test_an_unknown_profile_names_the_configuration(store: LoopbackObjectStore) -> None:
    with pytest.raises(ValidationError, match=r"cannot open msc://no-such-profile/x.*MSC_CONFIG"):
        validate_path("msc://no-such-profile/x")


# -- info, preview, the loader -----------------------------------------------------------------------------
def test_info_full_reads_every_remote_sample_once(store: LoopbackObjectStore, local: dict[str, Path]) -> None:
    remote, here = dataset_info(store.url("clean"), full=True), dataset_info(local["clean"], full=True)
    assert remote.samples_inspected == here.samples_inspected == 32
    a, b = json.loads(remote.to_json()), json.loads(here.to_json())
    assert a.pop("path") == "msc://loopback/clean"
    b.pop("path")
    assert a == b


@pytest.mark.parametrize("num_workers", [0, 2])
def test_get_loader_reads_every_remote_sample_exactly_once(
    store: LoopbackObjectStore, local: dict[str, Path], num_workers: int
) -> None:
    with get_loader(
        store.url("clean"),
        EncodedDiffusionTaskEncoder,
        batch_size=4,
        mode="val",
        split_part="train",
        num_workers=num_workers,
    ) as wrapper:
        keys = [key for batch in wrapper.dataloader for key in batch["__key__"]]
    expected = Manifest.load(local["clean"] / "manifest.json").keys("train")
    assert len(keys) == len(expected) and sorted(key_in_shard(k) for k in keys) == sorted(expected)


def test_preview_a_remote_dataset(store: LoopbackObjectStore) -> None:
    items, stop = preview_dataset(store.url("clean"), n=3)
    assert stop is None and len(items) == 3 and all(i.error is None and i.fields for i in items)


# -- metadatasets ------------------------------------------------------------------------------------------
def test_a_local_metadataset_with_remote_entries(
    store: LoopbackObjectStore, local: dict[str, Path], tmp_path: Path
) -> None:
    mix = write_metadataset(tmp_path / "mix.yaml", [(local["clean"], 0.5), (local["clean"], 0.5)])
    text = mix.read_text().replace(str(local["clean"]), "msc://loopback/clean", 1)
    mix.write_text(text)
    _, leaves, problems = resolve_metadataset(mix)
    assert sorted(str(leaf.path) for leaf in leaves if leaf.split == "train") == sorted(
        ["msc://loopback/clean", str(local["clean"])]
    )
    assert not [p for p in problems if p.code == "missing-path"]
    report = validate_path(mix)
    assert report.ok, [p.to_dict() for p in report.problems]


def test_a_remote_metadataset_with_relative_entries(
    store: LoopbackObjectStore, local: dict[str, Path], tmp_path: Path
) -> None:
    mix = write_metadataset(tmp_path / "mix.yaml", [(local["clean"], 1.0)])
    text = mix.read_text().replace(str(local["clean"]), "clean")
    store.put("mix.yaml", text.encode())
    report = validate_path("msc://loopback/mix.yaml")
    assert report.ok and [leaf.path for leaf in report.leaves] == ["msc://loopback/clean"] * len(
        report.leaves
    )


# -- finalize ----------------------------------------------------------------------------------------------
def test_finalize_refuses_a_remote_path_and_says_what_to_do() -> None:
    with pytest.raises(FinalizeError, match=r"writable local directory.*msc sync --no-ignore-hidden"):
        finalize_dataset("msc://loopback/clean", "preencoded")


# -- the streaming window ----------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 7, 512, 4096, 1 << 20])
def test_forward_window_slices_like_the_bytes(chunk: int) -> None:
    data = bytes(range(256)) * 40
    calls: list[tuple[int, int]] = []

    def read(offset: int, size: int) -> bytes:
        calls.append((offset, size))
        return data[offset : offset + size]

    window = ForwardWindow(read, len(data), chunk=chunk)
    try:
        spans = [(0, 512), (512, 1000), (1000, 1000), (1500, 5000), (9000, 20000), (10239, 10240)]
        for a, b in spans:
            assert bytes(window[a:b]) == data[a:b], (a, b)
        if chunk < len(data):  # byte 0 was dropped long ago
            with pytest.raises(ValueError, match="forward only"):
                window[0:10]
    finally:
        window.close()
    assert all(size <= chunk for _, size in calls)
    if chunk <= 512:  # the jump from byte 5000 to 9000 was skipped, not read
        assert not any(5000 + chunk < a < 9000 - chunk for a, _ in calls), calls


def test_forward_window_ends_where_a_short_object_ends() -> None:
    data = b"x" * 1000
    window = ForwardWindow(lambda o, n: data[o : o + n], 4096, chunk=300)
    assert len(bytes(window[0:4096])) == 1000
    assert len(window) == 1000
    window.close()


# -- the conformance suite on a remote dataset -------------------------------------------------------------
def suite(tmp_path: Path, dataset: str | Path, *extra: str) -> Any:
    """The conformance suite on the reference TaskEncoder with ``--conformance-dataset DATASET``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    return run_pytest(
        tmp_path,
        "--rootdir",
        str(tmp_path),
        "--task-encoder=primus_energon:EncodedDiffusionTaskEncoder",
        f"--conformance-dataset={dataset}",
        *extra,
    )


def claims_line(stdout: str) -> str:
    """The suite's ``N pass, M skip`` line."""
    match = re.search(r"^\d+ pass, .*$", stdout.split("conformance claims")[-1], re.M)
    assert match, stdout[-3000:]
    return match.group(0)


@pytest.mark.slow
def test_quick_profile_passes_the_reference_task_encoder_on_a_remote_dataset(
    store: LoopbackObjectStore, local: dict[str, Path], tmp_path: Path
) -> None:
    remote = suite(tmp_path / "remote", store.url("clean"), "--conformance-profile=quick", "-q")
    assert remote.returncode == 0, remote.stdout[-4000:] + remote.stderr[-2000:]
    assert "formats checked: preencoded (inferred from msc://loopback/clean)" in remote.stdout
    here = suite(tmp_path / "local", local["clean"], "--conformance-profile=quick", "-q")
    assert here.returncode == 0, here.stdout[-4000:]
    assert claims_line(remote.stdout) == claims_line(here.stdout)  # the same claims checked as on the copy
    assert " error" not in claims_line(remote.stdout)


@pytest.mark.slow  # a fresh process over object storage: the slow tier
def test_conformance_dataset_that_is_not_there_is_a_usage_error(
    store: LoopbackObjectStore, tmp_path: Path
) -> None:
    run = suite(tmp_path, "msc://loopback/absent")
    assert run.returncode == 4, run.stdout + run.stderr
    assert "--conformance-dataset msc://loopback/absent: not a prepared dataset" in run.stderr
