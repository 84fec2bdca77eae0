"""`primus_energon.datasets` validate: clean datasets validate clean; every fault the synthetic generator can
inject is reported exactly (compared with its manifest: no extra, no missing problem); metadata defects;
the strict tar reader; the resolution-bucket rule; the same report for any worker count."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primus_energon.datasets.problems import CODES
from primus_energon.datasets.report import REPORT_FORMAT, REPORT_VERSION, render_summary
from primus_energon.datasets.tarscan import TarCorrupt, TarTruncated, iter_members
from primus_energon.datasets.validate import ValidationError, validate_dataset, validate_path
from primus_energon.synthetic import FAULT_KINDS, Manifest, Schema, TensorSpec, TextSpec, generate_dataset

REPO = Path(__file__).resolve().parents[1]
SMALL = {"latents": (4, 8, 8), "prompt_embeds": (7, 16), "pooled_prompt_embeds": (16,)}
PRE = dict(encoding="preencoded", num_samples=48, shard_size=8, seed=5, shapes=SMALL)
RAW = dict(encoding="raw", num_samples=24, shard_size=6, seed=6, image_size=(16, 24))
#: fault kinds a raw (image + caption) dataset can carry
RAW_KINDS = (
    "truncated-shard",
    "garbage-payload",
    "missing-member",
    "duplicate-key",
    "dotted-key",
    "empty-shard",
    "non-utf8-caption",
)
SHARD_KINDS = ("truncated-shard", "empty-shard")

_CACHE: dict[str, tuple[Path, Manifest]] = {}


def dataset(tmp_path_factory: pytest.TempPathFactory, name: str, **kwargs: Any) -> tuple[Path, Manifest]:
    """Generate dataset `name` once per test process."""
    if name not in _CACHE:
        root = tmp_path_factory.mktemp("dt")
        if "faults" in kwargs and "malicious-pickle" in kwargs["faults"]:
            kwargs.setdefault("marker_path", root / f"{name}.PWNED")
        _CACHE[name] = (root / name, generate_dataset(root / name, **kwargs))
    return _CACHE[name]


def copy_dataset(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def expected_faults(manifest: Manifest) -> list[tuple[str, str, str | None, str | None]]:
    """What validate must report for the manifest's faults, as sorted (code, shard, key, member).

    A ``duplicate-key`` fault stores sample K under its partner's key P; the tar then holds two samples
    with key P, and validate reports the later one (in shard order) under the key it can see, P."""
    by_key = {s.key: s for s in manifest.samples}
    out = []
    for f in manifest.faults:
        if f.kind == "duplicate-key":
            stored = f.detail["stored_key"]
            later = max(by_key[f.key], by_key[stored], key=lambda s: s.index)
            out.append(("duplicate-key", later.shard, stored, None))
        else:
            out.append((f.kind, f.shard, f.key, f.member))
    return sorted(out, key=repr)


def reported(report: Any) -> list[tuple[str, str | None, str | None, str | None]]:
    return sorted(((p.code, p.shard, p.key, p.member) for p in report.problems), key=repr)


def assert_exact(report: Any, manifest: Manifest) -> None:
    got, want = reported(report), expected_faults(manifest)
    extra = [x for x in got if x not in want]
    missing = [x for x in want if x not in got]
    assert not extra and not missing and len(got) == len(want), (
        f"extra problems {extra}\nmissing problems {missing}\nfull report:\n{render_summary(report)}"
    )


def assert_marker_absent(manifest: Manifest) -> None:
    if manifest.marker_path:
        assert not Path(manifest.marker_path).exists(), "the malicious payload ran: its marker file exists"


# -- clean datasets ------------------------------------------------------------------------------------------
CLEAN = {
    "preencoded": PRE,
    "preencoded-bf16-buckets": {**PRE, "dtype": "bfloat16", "variable_shapes": True},
    "raw-jpg": RAW,
    "raw-png-buckets": {**RAW, "image_format": "png", "variable_shapes": True},
    "raw-webp-split": {**RAW, "image_format": "webp", "split": (0.5, 0.25, 0.25)},
}


def run_validate_cli(root: Path, json_path: Path, capsys: Any) -> tuple[int, str, dict[str, Any]]:
    """`primus-energon validate ROOT --json FILE` in process: (exit status, stdout, JSON report)."""
    from primus_energon.__main__ import main

    rc = main(["validate", str(root), "--workers", "1", "--json", str(json_path)])
    out = capsys.readouterr().out
    return rc, out, json.loads(json_path.read_text())


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_clean_dataset_validates_with_no_problem_lines(tmp_path_factory, tmp_path, capsys, name):
    root, manifest = dataset(tmp_path_factory, f"clean-{name}", **CLEAN[name])
    rc, out, doc = run_validate_cli(root, tmp_path / "report.json", capsys)
    assert rc == 0 and doc["ok"] is True and doc["problems"] == []
    assert not [line for line in out.splitlines() if line.startswith(("ERROR", "WARNING", "  - "))], out
    report = validate_dataset(root)
    assert report.ok and report.problems == [], render_summary(report)
    text = render_summary(report)
    assert "ERROR" not in text and "WARNING" not in text and text.rstrip().endswith("ready for training")
    assert report.num_samples == len(manifest) and len(report.shards) == len(manifest.shards)
    assert report.encoding["used"] == manifest.encoding == report.encoding["detected"]
    assert set(report.members) == set(manifest.schema.members)
    for split in ("train", "val", "test"):
        assert report.splits[split]["samples"] == len(manifest.keys(split))


def test_resolution_buckets_are_listed_not_reported(tmp_path_factory):
    root, manifest = dataset(
        tmp_path_factory, "clean-preencoded-bf16-buckets", **CLEAN["preencoded-bf16-buckets"]
    )
    report = validate_dataset(root)
    lat = report.members["latents.pth"]
    want = {tuple(s.members["latents.pth"].shape) for s in manifest.samples}
    assert lat.bucketed and set(lat.shapes) == want and len(want) > 1
    assert lat.dtypes == {"bfloat16": len(manifest)}
    assert not report.members["prompt_embeds.pth"].bucketed
    assert "(resolution buckets)" in render_summary(report)


# -- every fault kind, compared with the manifest --------------------------------------------------------------
def _fault_cases() -> list[Any]:
    cases = []
    for kind in FAULT_KINDS:
        count = 1 if kind in SHARD_KINDS else 2
        cases.append(pytest.param("preencoded", kind, count, id=f"preencoded-{kind}"))
        if kind in RAW_KINDS:
            cases.append(pytest.param("raw", kind, 1 if kind in SHARD_KINDS else 2, id=f"raw-{kind}"))
    cases.append(pytest.param("buckets", "wrong-shape", 4, id="buckets-wrong-shape"))
    cases.append(pytest.param("bf16", "wrong-dtype", 2, id="bf16-wrong-dtype"))
    cases.append(pytest.param("bf16", "nan-tensor", 2, id="bf16-nan-tensor"))
    return cases


_BASES = {
    "preencoded": PRE,
    "raw": RAW,
    "buckets": {**PRE, "variable_shapes": True},
    "bf16": {**PRE, "dtype": "bfloat16"},
}


@pytest.mark.parametrize("base,kind,count", _fault_cases())
def test_each_fault_kind_is_reported_exactly(tmp_path_factory, tmp_path, capsys, base, kind, count):
    root, manifest = dataset(tmp_path_factory, f"{base}-{kind}", **_BASES[base], faults={kind: count})
    assert len(manifest.faults) == count
    rc, out, doc = run_validate_cli(root, tmp_path / "report.json", capsys)
    assert rc == 1 and doc["ok"] is False
    got = sorted(((p["code"], p["shard"], p["key"], p["member"]) for p in doc["problems"]), key=repr)
    assert got == expected_faults(manifest), out
    report = validate_dataset(root)
    assert not report.ok
    assert_exact(report, manifest)
    assert_marker_absent(manifest)
    for p in report.problems:
        assert p.severity == "error" and p.message and p.hint == CODES[p.code][1]


ALL = {
    "garbage-payload": 1,
    "missing-member": 1,
    "duplicate-key": 1,
    "dotted-key": 1,
    "malicious-pickle": 1,
    "non-utf8-caption": 1,
    "nan-tensor": 1,
    "wrong-dtype": 1,
    "wrong-shape": 1,
    "truncated-shard": 1,
    "empty-shard": 1,
}


@pytest.fixture(scope="module")
def all_faults(tmp_path_factory):
    return dataset(tmp_path_factory, "all-faults", **{**PRE, "num_samples": 64}, faults=ALL)


def test_all_fault_kinds_together_are_reported_exactly(all_faults):
    root, manifest = all_faults
    report = validate_dataset(root)
    assert_exact(report, manifest)
    assert_marker_absent(manifest)
    text = render_summary(report)
    for f in manifest.faults:
        assert f.shard in text and f.kind in text
    assert text.rstrip().endswith(f"FAILED: {len(manifest.faults)} errors")


def test_the_report_is_the_same_for_any_worker_count(all_faults):
    root, manifest = all_faults
    one = validate_dataset(root, workers=1).to_dict()
    two = validate_dataset(root, workers=2).to_dict()
    three = validate_dataset(root, workers=3).to_dict()
    assert one == two == three
    assert_marker_absent(manifest)


def test_json_report_schema(all_faults, tmp_path):
    root, manifest = all_faults
    doc = json.loads(validate_dataset(root).to_json())
    assert doc["format"] == REPORT_FORMAT and doc["version"] == REPORT_VERSION == 1
    assert doc["kind"] == "dataset" and doc["ok"] is False
    assert doc["summary"]["errors"] == len(manifest.faults) and doc["summary"]["warnings"] == 0
    assert sum(doc["summary"]["by_code"].values()) == len(doc["problems"])
    for p in doc["problems"]:
        assert set(p) >= {"code", "severity", "shard", "key", "member", "message", "hint"}
    assert set(doc["members"]) == set(manifest.schema.members)
    assert {"requested", "declared", "detected", "used", "note"} == set(doc["encoding"])


# -- custom schemas: the bucket rule beyond the built-in layout -----------------------------------------------
def _two_bucketed_schema() -> Schema:
    return Schema(
        encoding="custom_buckets",
        members={
            "mean.pth": TensorSpec((4, 8, 8), "float32", bucketed=True),
            "logvar.pth": TensorSpec((4, 8, 8), "float32", bucketed=True),
            "mask.pth": TensorSpec((8, 8), "float32", bucketed=True),
            "prompt_embeds.pth": TensorSpec((6, 8), "float32"),
            "caption.txt": TextSpec(),
        },
    )


def test_custom_schema_with_several_bucketed_members_validates_clean(tmp_path_factory):
    root, manifest = dataset(
        tmp_path_factory,
        "custom-buckets",
        schema=_two_bucketed_schema(),
        num_samples=40,
        shard_size=8,
        seed=3,
        variable_shapes=True,
    )
    report = validate_dataset(root)
    assert report.ok and report.problems == [], render_summary(report)
    for name in ("mean.pth", "logvar.pth", "mask.pth"):
        assert report.members[name].bucketed and len(report.members[name].shapes) > 1
    assert report.encoding["used"] == "custom_buckets" and report.encoding["detected"] is None


def test_custom_schema_wrong_shapes_are_found_among_buckets(tmp_path_factory):
    root, manifest = dataset(
        tmp_path_factory,
        "custom-buckets-wrong",
        schema=_two_bucketed_schema(),
        num_samples=48,
        shard_size=8,
        seed=4,
        variable_shapes=True,
        faults={"wrong-shape": 6, "wrong-dtype": 2, "missing-member": 2},
    )
    assert_exact(validate_dataset(root), manifest)


def test_a_spatial_size_off_the_samples_bucket_is_wrong_shape(tmp_path):
    """Hand-made: two bucketed members whose spatial scales disagree in one sample."""
    from primus_energon.datasets.analysis import analyze
    from primus_energon.datasets.scan import SampleRecord, ShardScan

    def rec(key, a, b):
        return SampleRecord(key, 0, (("a.pth", "tensor", "float32", a), ("b.pth", "tensor", "float32", b)))

    samples = [rec(f"k{i}", (4, 8, 8), (2, 16, 16)) for i in range(6)]
    samples += [rec(f"h{i}", (4, 6, 10), (2, 12, 20)) for i in range(3)]
    samples.append(rec("bad", (4, 6, 10), (2, 16, 16)))  # b stays at the base size while a is in a bucket
    analysis = analyze([ShardScan("s.tar", 0, samples=samples)], encoding=None)
    assert [(p.code, p.key) for p in analysis.problems] == [("wrong-shape", "bad")]
    assert analysis.problems[0].member in ("a.pth", "b.pth")


# -- metadata defects ------------------------------------------------------------------------------------------
@pytest.fixture
def clean_copy(tmp_path_factory, tmp_path):
    root, manifest = dataset(tmp_path_factory, "clean-preencoded", **PRE)
    return copy_dataset(root, tmp_path / "ds"), manifest


def _codes(report: Any) -> list[tuple[str, str | None]]:
    return [(p.code, p.shard) for p in report.problems]


def test_missing_index_file(clean_copy):
    root, manifest = clean_copy
    (root / "shard-000002.tar.idx").unlink()
    assert _codes(validate_dataset(root)) == [("missing-index", "shard-000002.tar")]


def test_index_that_does_not_match_the_shard(clean_copy):
    root, _ = clean_copy
    idx = root / "shard-000001.tar.idx"
    raw = bytearray(idx.read_bytes())
    raw[8 * 3 : 8 * 4] = (12345).to_bytes(8, "little")
    idx.write_bytes(bytes(raw))
    (root / "shard-000003.tar.idx").write_bytes(b"\x00" * 13)
    report = validate_dataset(root)
    assert _codes(report) == [("index-mismatch", "shard-000001.tar"), ("index-mismatch", "shard-000003.tar")]
    assert report.problems[0].key == "s5_000011" and "entry 3" in report.problems[0].message


def test_info_json_count_that_differs_from_the_shard(clean_copy):
    root, _ = clean_copy
    info = root / ".nv-meta" / ".info.json"
    doc = json.loads(info.read_text())
    doc["shard_counts"]["shard-000004.tar"] = 9
    info.write_text(json.dumps(doc))
    report = validate_dataset(root)
    assert _codes(report) == [("count-mismatch", "shard-000004.tar")]
    assert "lists 9 samples, the shard holds 8" in report.problems[0].message


def test_missing_and_unlisted_shards(clean_copy):
    root, _ = clean_copy
    (root / "shard-000005.tar").rename(root / "extra.tar")
    report = validate_dataset(root)
    assert sorted(_codes(report)) == [("missing-shard", "shard-000005.tar"), ("unlisted-shard", "extra.tar")]


def test_split_yaml_problems(clean_copy):
    root, _ = clean_copy
    split = root / ".nv-meta" / "split.yaml"
    split.write_text(
        yaml.safe_dump(
            {
                "split_parts": {
                    "train": ["shard-{000000..000003}.tar", "nope.tar"],
                    "val": ["shard-000003.tar"],
                    "test": [],
                },
                "exclude": [],
            }
        )
    )
    report = validate_dataset(root)
    got = sorted((p.code, p.shard, p.severity) for p in report.problems)
    assert got == [
        ("split-mismatch", "nope.tar", "error"),
        ("split-mismatch", "shard-000003.tar", "error"),
        ("split-mismatch", "shard-000004.tar", "warning"),
        ("split-mismatch", "shard-000005.tar", "warning"),
    ]


def test_dataset_yaml_encoding_against_the_data_and_the_option(clean_copy):
    root, _ = clean_copy
    dy = root / ".nv-meta" / "dataset.yaml"
    dy.write_text(dy.read_text().replace("encoding: preencoded", "encoding: raw"))
    report = validate_dataset(root)
    assert _codes(report) == [("encoding-mismatch", None)]
    assert "holds preencoded samples" in report.problems[0].message
    report = validate_dataset(root, encoding="preencoded")
    assert _codes(report) == [("encoding-mismatch", None)]
    assert "--encoding is 'preencoded'" in report.problems[0].message
    # No subflavors is valid Energon (as `energon prepare` writes it): the format is inferred, with a note.
    dy.write_text("__module__: megatron.energon\n__class__: CrudeWebdataset\n")
    report = validate_dataset(root)
    assert report.ok and _codes(report) == []
    assert report.encoding["declared"] is None and report.encoding["used"] == "preencoded"
    assert "declares no subflavors.encoding" in report.encoding["note"]
    assert "preencoded encoding (inferred from the members)" in report.encoding["note"]
    # A declared encoding the members contradict is still a mismatch; an encoding given is no note.
    assert validate_dataset(root, encoding="preencoded").encoding["note"] is None
    assert _codes(validate_dataset(root, encoding="raw")) == [("encoding-mismatch", None)]


def test_missing_metadata_still_checks_every_shard(tmp_path_factory, tmp_path):
    src, manifest = dataset(tmp_path_factory, "preencoded-nan-tensor", **PRE, faults={"nan-tensor": 2})
    root = copy_dataset(src, tmp_path / "ds")
    shutil.rmtree(root / ".nv-meta")
    report = validate_dataset(root)
    assert [p.code for p in report.problems].count("missing-metadata") == 1
    assert sorted((p.code, p.key) for p in report.problems if p.code == "nan-tensor") == sorted(
        (f.kind, f.key) for f in manifest.faults
    )
    assert report.encoding["used"] == "preencoded" and report.encoding["declared"] is None


def test_missing_sqlite_is_a_warning_and_strict_fails(clean_copy):
    root, _ = clean_copy
    (root / ".nv-meta" / "index.sqlite").unlink()
    report = validate_dataset(root)
    assert report.ok and [(p.code, p.severity) for p in report.problems] == [("missing-sqlite", "warning")]
    assert not validate_dataset(root, strict=True).ok


def test_compressed_shard_is_explained(clean_copy):
    root, _ = clean_copy
    with gzip.open(root / "more.tar.gz", "wb") as f:
        f.write((root / "shard-000000.tar").read_bytes())
    report = validate_dataset(root)
    assert _codes(report) == [("compressed-shard", "more.tar.gz")]
    assert "ignores" in report.problems[0].message


def test_excluded_problems_are_warnings(tmp_path_factory, tmp_path):
    src, manifest = dataset(tmp_path_factory, "preencoded-nan-tensor", **PRE, faults={"nan-tensor": 2})
    root = copy_dataset(src, tmp_path / "ds")
    split = root / ".nv-meta" / "split.yaml"
    doc = yaml.safe_load(split.read_text())
    doc["exclude"] = [f"{f.shard}/{f.key}" for f in manifest.faults]
    split.write_text(yaml.safe_dump(doc))
    report = validate_dataset(root)
    assert report.ok and {p.severity for p in report.problems} == {"warning"}
    assert len(report.problems) == 2


def test_not_a_directory_is_refused(tmp_path):
    with pytest.raises(ValidationError, match="does not exist"):
        validate_path(tmp_path / "nope")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(ValidationError, match="neither"):
        validate_path(tmp_path / "f.txt")


# -- the strict tar reader -------------------------------------------------------------------------------------
def _tar(
    entries: list[tuple[str, bytes]], fmt: int = tarfile.GNU_FORMAT, dirs: tuple[str, ...] = ()
) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _members(raw: bytes) -> list[tuple[str | None, str | None, bytes | None]]:
    return [(m.key, m.part, None if d is None else bytes(d)) for m, d in iter_members(raw)]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_reader_handles_long_names_pax_dirs_and_meta_entries(fmt):
    long_dir = (
        "d" * 60 + "/" + "e" * 30
    )  # > 100 characters with the key: GNU long name / pax path / ustar prefix
    entries = [
        (f"{long_dir}/k_000001.latents.pth", b"x" * 700),
        (f"{long_dir}/k_000001.txt", b"hi"),
        ("__index__", b"{}"),
        ("README", b"no dot"),
    ]
    got = _members(_tar(entries, fmt, dirs=("somedir",)))
    assert got == [
        (f"{long_dir}/k_000001", "latents.pth", b"x" * 700),
        (f"{long_dir}/k_000001", "txt", b"hi"),
        (None, None, b"{}"),
        (None, None, b"no dot"),
    ]


def test_reader_reports_truncation_and_corruption():
    raw = _tar([("a.x.pth", b"1" * 1000), ("b.x.pth", b"2" * 1000)])
    with pytest.raises(TarTruncated) as exc:
        _members(raw[: 512 * 3 + 512 + 100])  # inside b's data
    assert exc.value.name == "b.x.pth" and exc.value.available == 100
    with pytest.raises(TarTruncated) as exc:
        _members(raw[: 512 * 3 + 200])  # inside b's header
    assert exc.value.name is None
    with pytest.raises(TarTruncated, match="end-of-archive"):
        _members(raw[: 512 * 6])  # both members, no end marker
    bad = bytearray(raw)
    bad[512 * 3 + 148] ^= 0x55  # b's header checksum
    with pytest.raises(TarCorrupt):
        _members(bytes(bad))


def test_a_shard_cut_at_a_member_boundary_or_overwritten_is_reported(clean_copy):
    root, _ = clean_copy
    shard = root / "shard-000001.tar"
    with tarfile.open(shard) as tf:
        offsets = [m.offset for m in tf]
    raw = shard.read_bytes()
    shard.write_bytes(raw[: offsets[8]])  # 2 samples of 4 members, no end marker
    (root / "shard-000002.tar").write_bytes(b"\x7fELF" + bytes(2000))
    report = validate_dataset(root)
    got = [(p.code, p.shard) for p in report.problems]
    assert got == [("truncated-shard", "shard-000001.tar"), ("corrupt-shard", "shard-000002.tar")]
    assert report.problems[0].key is None and "end-of-archive" in report.problems[0].message


def test_payloads_are_never_unpickled_beyond_tensors(tmp_path):
    """A pickled object in a .pth member: malicious-pickle, and its __reduce__ never runs."""
    import tarfile as tf

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    buf = io.BytesIO()
    torch.save({"x": Evil()}, buf)
    root = tmp_path / "ds"
    root.mkdir()
    with tf.open(root / "s.tar", "w") as t:
        for name, data in (("k_0.latents.pth", buf.getvalue()), ("k_0.txt", b"ok")):
            info = tf.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    report = validate_dataset(root)
    assert ("malicious-pickle", "s.tar", "k_0", "latents.pth") in reported(report)
    assert not marker.exists()


def test_no_permissive_unpickling_in_the_sources():
    pattern = "weights_only=" + "False"
    for path in (REPO / "primus_energon" / "datasets").glob("*.py"):
        assert pattern not in path.read_text(), f"{path} mentions {pattern}"


# -- the tensor fast path (verified templates) agrees with torch.load -----------------------------------------
def _saved(t: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


_TENSORS = [
    lambda g: torch.randn(4, 8, 8, generator=g),
    lambda g: torch.randn(7, 16, generator=g).to(torch.bfloat16),
    lambda g: torch.randn(16, generator=g).to(torch.float16),
    lambda g: torch.randn(3, 5, generator=g).t(),  # a non-contiguous view
    lambda g: torch.randn(10, 6, generator=g)[2:5, 1:4],  # a view of a larger storage
    lambda g: torch.randint(-5, 5, (6, 2), generator=g),
    lambda g: torch.randint(0, 2, (9,), generator=g).bool(),
    lambda g: torch.randint(0, 255, (2, 3, 4), generator=g).to(torch.uint8),
    lambda g: torch.tensor(3.5),
    lambda g: torch.randn(4, 8, generator=g),  # same archive length as (8, 4): must not take its template
    lambda g: torch.randn(8, 4, generator=g),
]


def test_tensor_fast_path_returns_what_torch_load_returns():
    from primus_energon.datasets import checks

    g = torch.Generator().manual_seed(0)
    for make in _TENSORS:
        for _ in range(3):  # the first read builds the template, the others use it
            data = _saved(make(g))
            got, code, why = checks._load_tensor(memoryview(data))
            want = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            assert code is None and got is not None, why
            assert (got.dtype, got.shape, got.stride(), got.storage_offset()) == (
                want.dtype,
                want.shape,
                want.stride(),
                want.storage_offset(),
            )
            assert torch.equal(got, want)
    from primus_energon import tensorfile

    assert tensorfile._layout_count, "no layout was remembered"


def test_tensor_fast_path_never_accepts_a_changed_header():
    from primus_energon.datasets import checks

    g = torch.Generator().manual_seed(1)
    good = _saved(torch.randn(4, 8, 8, generator=g))
    checks._load_tensor(good)
    checks._load_tensor(good)  # the layout is remembered
    t = torch.load(io.BytesIO(good), weights_only=True)
    start = good.index(t.numpy().tobytes())
    crc = good.index(b"PK\x07\x08", start) + 4  # the storage's CRC-32 (torch.load does not check it)
    for pos in (30, 60, 100, start - 1, crc, crc + 5, len(good) - 30, len(good) - 5):
        bad = bytearray(good)
        bad[pos] ^= 0x41
        got, code, _ = checks._load_tensor(bytes(bad))
        try:
            want = torch.load(io.BytesIO(bytes(bad)), map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - torch refuses it: so must we
            assert got is None and code in ("garbage-payload", "malicious-pickle"), pos
            continue
        assert got is not None and torch.equal(got, want) and got.shape == want.shape, pos


def test_raw_samples_may_use_any_image_member():
    from primus_energon.datasets.analysis import analyze
    from primus_energon.datasets.scan import SampleRecord, ShardScan

    png = (("png", "image", "uint8", (8, 8, 3)), ("txt", "text", None, None))
    jpg = (("jpg", "image", "uint8", (8, 8, 3)), ("txt", "text", None, None))
    bare = (("txt", "text", None, None),)
    samples = [SampleRecord(f"p{i}", 0, png) for i in range(6)] + [SampleRecord("j0", 0, jpg)]
    samples.append(SampleRecord("none", 0, bare))
    analysis = analyze([ShardScan("s.tar", 0, samples=samples)], encoding="raw")
    assert [(p.code, p.key, p.member) for p in analysis.problems] == [("missing-member", "none", "png")]


def test_a_key_written_twice_in_a_row_is_two_samples(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    entries = [("k_0.txt", b"a"), ("k_0.json", b"{}"), ("k_0.txt", b"b"), ("k_0.json", b"{}"),
               ("k_1.txt", b"c"), ("k_1.json", b"{}")]  # fmt: skip
    (root / "s.tar").write_bytes(_tar(entries))
    report = validate_dataset(root)
    assert report.num_samples == 3
    assert [(p.code, p.key) for p in report.problems if p.code != "missing-metadata"] == [
        ("duplicate-key", "k_0")
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.from_regex(
                r"[a-z]{1,8}(/[a-z]{1,60}){0,3}_[0-9]{1,4}\.[a-z]{1,5}(\.[a-z]{1,3})?", fullmatch=True
            ),
            st.binary(max_size=1500),
        ),
        max_size=8,
    ),
    st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
)
def test_reader_agrees_with_tarfile(entries, fmt):
    raw = _tar(entries, fmt)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        want = [(m.name, tf.extractfile(m).read(), m.offset) for m in tf if m.isreg()]  # type: ignore[union-attr]
    got = [(m.name, bytes(d or b""), m.offset) for m, d in iter_members(raw)]
    assert got == want


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.binary(min_size=512, max_size=512) | st.sampled_from([bytes(512), b"\xff" * 512]))
def test_tar_header_byte_sum_is_exact(block: bytes) -> None:
    from primus_energon.datasets.tarscan import _byte_sum

    assert _byte_sum(block) == sum(block)
