"""Each fault kind does exactly the damage its manifest entry says, and nothing else changes."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from primus_energon.energon_compat import ENERGON_VERSION
from primus_energon.synthetic import FAULT_KINDS, FaultRecord, Manifest, SyntheticError, generate_dataset
from primus_energon.synthetic.tar import EMPTY_TAR

try:
    from . import synthetic_helpers as h
except ImportError:
    import synthetic_helpers as h

BASE = dict(num_samples=48, shard_size=6, seed=11, shapes=h.SMALL)
SAMPLE_FAULTS = {
    "garbage-payload": 2,
    "missing-member": 2,
    "duplicate-key": 1,
    "dotted-key": 1,
    "malicious-pickle": 1,
    "non-utf8-caption": 1,
    "nan-tensor": 2,
    "wrong-dtype": 1,
    "wrong-shape": 1,
}
ALL_FAULTS = {**SAMPLE_FAULTS, "truncated-shard": 1, "empty-shard": 1}
RAW = dict(encoding="raw", num_samples=16, shard_size=4, seed=12)
RAW_FAULTS = {"garbage-payload": 1, "missing-member": 1, "non-utf8-caption": 1, "dotted-key": 1}


@pytest.fixture(scope="session")
def clean_twin(tmp_path_factory):
    return h.cached_dataset(tmp_path_factory, "faults_clean", **BASE)


@pytest.fixture(scope="session")
def sample_faults(tmp_path_factory):
    marker = tmp_path_factory.mktemp("marker") / "sample_faults.PWNED"
    return h.cached_dataset(
        tmp_path_factory, "sample_faults", **BASE, faults=SAMPLE_FAULTS, marker_path=marker
    )


@pytest.fixture(scope="session")
def all_faults(tmp_path_factory):
    marker = tmp_path_factory.mktemp("marker") / "all_faults.PWNED"
    return h.cached_dataset(tmp_path_factory, "all_faults", **BASE, faults=ALL_FAULTS, marker_path=marker)


@pytest.fixture(scope="session")
def raw_pair(tmp_path_factory):
    clean = h.cached_dataset(tmp_path_factory, "raw_clean", **RAW)
    faulty = h.cached_dataset(tmp_path_factory, "raw_faults", **RAW, faults=RAW_FAULTS)
    return clean, faulty


def _members(path: Path, shard: str) -> dict[str, bytes]:
    return dict(h.tar_members(path / shard))


def _stored(fault: FaultRecord) -> str:
    return f"{fault.key}.{fault.member}"


# -- one check per fault kind: reads the files and proves the damage is exactly what the record says -------------
def check_truncated_shard(path: Path, m: Manifest, clean: Manifest, f: FaultRecord) -> None:
    shard = path / f.shard
    assert shard.stat().st_size == f.detail["size_after"] < f.detail["size_before"]
    keys = [s.key for s in m if s.shard == f.shard]
    damaged = f.detail["damaged_keys"]
    assert damaged == keys[keys.index(f.key) :], f"{f.shard}: damaged keys are not the tail from {f.key}"
    intact: set[str] = set()
    with pytest.raises(tarfile.ReadError):
        with tarfile.open(shard, "r:") as tar:
            for member in tar:
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                key, name = member.name.split(".", 1)
                assert h.sha(data) == m.sample(key).members[name].sha256
                intact.add(key)
    complete = {k for k in intact if k not in damaged}
    assert complete == set(keys) - set(damaged), (
        f"readable samples {sorted(complete)} differ from undamaged ones"
    )
    assert f.key not in complete


def check_empty_shard(path: Path, m: Manifest, clean: Manifest, f: FaultRecord) -> None:
    assert (path / f.shard).read_bytes() == EMPTY_TAR
    assert h.tar_members(path / f.shard) == []
    assert f.detail["damaged_keys"] == [s.key for s in m if s.shard == f.shard]
    assert f.detail["size_before"] == next(s.size for s in clean.shards if s.name == f.shard)


def check_duplicate_key(path: Path, m: Manifest, clean: Manifest, f: FaultRecord) -> None:
    stored, original = f.detail["stored_key"], f.key
    assert stored != original and f.detail["duplicate_of"] == stored
    broken = {g.shard for g in m.faults if g.kind in ("truncated-shard", "empty-shard")}
    names = [n for s in m.shards if s.name not in broken for n, _ in h.tar_members(path / s.name)]
    assert not [n for n in names if n.startswith(original + ".")], (
        f"{original} is still stored under its own key"
    )
    assert Counter(n.split(".", 1)[0] for n in names)[stored] == 2 * len(m.sample(stored).members)
    stored_here = {
        n.split(".", 1)[1]: d for n, d in h.tar_members(path / f.shard) if n.startswith(stored + ".")
    }
    record = m.sample(original)
    if f.shard != f.detail["duplicate_of_shard"]:
        assert {k: h.sha(v) for k, v in stored_here.items()} == {
            k: r.sha256 for k, r in record.members.items()
        }


def check_dotted_key(path: Path, m: Manifest, clean: Manifest, f: FaultRecord) -> None:
    members = _members(path, f.shard)
    prefix = f.detail["stored_key"] + "."
    assert "." in f.detail["stored_key"] and f.detail["stored_key"].startswith(f.key + ".")
    stored = {n[len(prefix) :]: d for n, d in members.items() if n.startswith(prefix)}
    assert sorted(stored) == sorted(m.sample(f.key).members)
    assert sorted(f"{f.detail['stored_key'].split('.', 1)[1]}.{n}" for n in stored) == sorted(
        f.detail["energon_members"]
    )
    assert {k: h.sha(v) for k, v in stored.items()} == {
        k: r.sha256 for k, r in clean.sample(f.key).members.items()
    }, "a dotted key must not change the payloads"


def check_garbage_payload(path: Path, m: Manifest, clean: Manifest, f: FaultRecord) -> None:
    data = _members(path, f.shard)[_stored(f)]
    record = m.sample(f.key).members[f.member]
    assert len(data) == f.detail["size"] == record.size and data[:1] == b"\x00"
    assert (record.dtype, record.shape) == (None, None)
    if record.kind == "tensor":
        with pytest.raises(Exception):  # noqa: B017 - any decoding error is right
            torch.load(io.BytesIO(data), weights_only=True)
    elif record.kind == "image":
        with pytest.raises(Exception):  # noqa: B017
            Image.open(io.BytesIO(data)).load()


def check_missing_member(path: Path, m: Manifest, clean: Manifest, f: FaultRecord) -> None:
    members = _members(path, f.shard)
    assert _stored(f) not in members
    assert f.member not in m.sample(f.key).members
    assert sorted(n for n in members if n.startswith(f.key + ".")) == sorted(
        f"{f.key}.{n}" for n in clean.sample(f.key).members if n != f.member
    )


def check_malicious_pickle(path: Path, m: Manifest, clean: Manifest, f: FaultRecord) -> None:
    data = _members(path, f.shard)[_stored(f)]
    marker = Path(f.detail["marker_path"])
    assert str(marker) == m.marker_path and marker.is_absolute()
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(io.BytesIO(data), weights_only=True)
    assert not marker.exists(), "the marker exists before anything unpickled the payload"
    victim = path.parent / f"victim-{f.key}.pth"
    victim.write_bytes(data)
    code = f"import torch; torch.load({str(victim)!r}, weights_only=False)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True)
    assert marker.exists(), "unpickling with weights_only=False did not run the payload"
    marker.unlink()


def check_non_utf8_caption(path: Path, m: Manifest, clean: Manifest, f: FaultRecord) -> None:
    data = _members(path, f.shard)[_stored(f)]
    with pytest.raises(UnicodeDecodeError) as info:
        data.decode("utf-8")
    assert info.value.start == f.detail["invalid_byte_offset"]
    assert data.decode(f.detail["encoding"]).startswith("Café ")


def _clean_tensor(clean_path: Path, clean: Manifest, f: FaultRecord) -> torch.Tensor:
    return h.tensor_of(_members(clean_path, f.shard)[_stored(f)])


def check_nan_tensor(path: Path, m: Manifest, clean: Manifest, f: FaultRecord, clean_path: Path) -> None:
    t = h.tensor_of(_members(path, f.shard)[_stored(f)])
    ref = _clean_tensor(clean_path, clean, f)
    nan_at = torch.isnan(t.view(-1)).nonzero().view(-1).tolist()
    assert nan_at == f.detail["nan_indices"] and nan_at
    keep = ~torch.isnan(t.view(-1))
    assert torch.equal(t.view(-1)[keep], ref.view(-1)[keep]), "values other than the NaNs changed"


def check_wrong_dtype(path: Path, m: Manifest, clean: Manifest, f: FaultRecord, clean_path: Path) -> None:
    t = h.tensor_of(_members(path, f.shard)[_stored(f)])
    ref = _clean_tensor(clean_path, clean, f)
    assert str(ref.dtype) == f"torch.{f.detail['expected']}" != str(t.dtype) == f"torch.{f.detail['actual']}"
    assert m.sample(f.key).members[f.member].dtype == f.detail["actual"]
    assert torch.equal(t, ref.to(t.dtype)), "wrong-dtype changed the values, not only the dtype"


def check_wrong_shape(path: Path, m: Manifest, clean: Manifest, f: FaultRecord, clean_path: Path) -> None:
    t = h.tensor_of(_members(path, f.shard)[_stored(f)])
    ref = _clean_tensor(clean_path, clean, f)
    assert (
        list(ref.shape) == f.detail["expected"]
        and list(t.shape) == f.detail["actual"] != f.detail["expected"]
    )
    assert m.sample(f.key).members[f.member].shape == tuple(f.detail["actual"])


CHECKS = {
    name.removeprefix("check_").replace("_", "-"): fn
    for name, fn in dict(globals()).items()
    if name.startswith("check_")
}


def test_there_is_a_check_for_every_fault_kind():
    assert sorted(CHECKS) == sorted(FAULT_KINDS)


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_fault_does_exactly_what_its_record_says(kind, all_faults, clean_twin):
    path, m = all_faults
    clean_path, clean = clean_twin
    faults = m.faults_of(kind)
    assert len(faults) == ALL_FAULTS[kind], (
        f"{kind}: manifest lists {len(faults)}, requested {ALL_FAULTS[kind]}"
    )
    for f in faults:
        fn = CHECKS[kind]
        if fn.__code__.co_argcount == 5:
            fn(path, m, clean, f, clean_path)
        else:
            fn(path, m, clean, f)


def test_nothing_outside_the_faults_changes(all_faults, clean_twin):
    path, m = all_faults
    _, clean = clean_twin
    damaged = m.damaged_keys()
    hit_members = {(f.key, f.member) for f in m.faults if f.member is not None}
    assert len(m.samples) == len(clean.samples)
    for sample, twin in zip(m, clean, strict=True):
        assert sample.key == twin.key and sample.shard == twin.shard
        for name, record in twin.members.items():
            if (sample.key, name) in hit_members:
                continue
            assert sample.members.get(name) == record, f"{sample.key}/{name} differs from the clean twin"
        if sample.key not in damaged:
            assert sample == twin
    for shard in m.shards:
        faulted = {f.shard for f in m.faults}
        if shard.name not in faulted:
            assert (path / shard.name).read_bytes() == (clean_twin[0] / shard.name).read_bytes()


def test_sample_faults_stay_out_of_faulted_shards(all_faults):
    _, m = all_faults
    shard_faulted = {f.shard for f in m.faults if f.kind in ("truncated-shard", "empty-shard")}
    assert len(shard_faulted) == 2
    for f in m.faults:
        if f.kind not in ("truncated-shard", "empty-shard"):
            assert f.shard not in shard_faulted, f"{f.kind} on {f.key} landed in faulted shard {f.shard}"
    keys = [f.key for f in m.faults if f.key and f.kind not in ("truncated-shard",)]
    assert len(keys) == len(set(keys)), "a sample carries two faults"


def test_a_reference_reader_on_energon_reports_exactly_the_manifest_faults(sample_faults):
    path, m = sample_faults
    loaded = h.load_with_energon(path)
    assert loaded.error is None, f"Energon stopped: {loaded.error!r}"
    assert len(loaded.samples) == m.num_samples
    expected = set()
    for f in m.faults:
        key = f.detail["stored_key"] if f.kind == "duplicate-key" else f.key
        expected.add((f.kind, key, f.member))
    reported = h.report_faults(loaded.samples, m.schema)
    assert reported == expected, f"missed {expected - reported}; spurious {reported - expected}"
    clean_keys = {s.key for s in m.clean_samples()}
    for crude in loaded.samples:
        if crude["__key__"] in clean_keys:
            record = m.sample(crude["__key__"])
            assert {n: h.sha(crude[n]) for n in record.members} == {
                n: r.sha256 for n, r in record.members.items()
            }


def test_energon_stops_at_a_truncated_or_emptied_shard(tmp_path):
    for kind in ("truncated-shard", "empty-shard"):
        m = generate_dataset(
            tmp_path / kind, num_samples=12, shard_size=4, seed=2, shapes=h.SMALL, faults=[kind]
        )
        (f,) = m.faults
        loaded = h.load_with_energon(tmp_path / kind)
        assert loaded.error is not None, f"{kind}: Energon read {f.shard} without error"
        first_bad = m.keys().index(f.detail["damaged_keys"][0])
        assert loaded.keys() == m.keys()[:first_bad], f"{kind}: yielded {loaded.keys()}"


@pytest.mark.skipif(
    ENERGON_VERSION < (7, 3), reason="Energon 7.0-7.2 prepare a dataset whose keys repeat without complaint"
)
def test_post_prepare_faults_would_stop_energon_preparation(all_faults, tmp_path):
    from megatron.energon.flavors.webdataset.prepare import WebdatasetPreparator

    path, m = all_faults
    (dup,) = m.faults_of("duplicate-key")
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(path / dup.shard, copy / dup.shard)
    shutil.copy(path / dup.detail["duplicate_of_shard"], copy / dup.detail["duplicate_of_shard"])
    with pytest.raises(SystemExit):
        WebdatasetPreparator.prepare_dataset(
            copy, sorted(p.name for p in copy.glob("*.tar")), split_parts_ratio=[("train", 1.0)], workers=1
        )


def test_raw_dataset_faults(raw_pair):
    (clean_path, clean), (path, m) = raw_pair
    assert Counter(f.kind for f in m.faults) == RAW_FAULTS
    for f in m.faults:
        CHECKS[f.kind](path, m, clean, f)
    loaded = h.load_with_energon(path)
    reported = h.report_faults(loaded.samples, m.schema)
    assert reported == {(f.kind, f.key, f.member) for f in m.faults}


def test_fault_positions_are_seeded(tmp_path):
    spec = ["missing-member:3", "nan-tensor:2"]
    a = generate_dataset(tmp_path / "a", **{**BASE, "seed": 1}, faults=spec)
    b = generate_dataset(tmp_path / "b", **{**BASE, "seed": 1}, faults={"missing-member": 3, "nan-tensor": 2})
    c = generate_dataset(tmp_path / "c", **{**BASE, "seed": 2}, faults=spec)

    def positions(m: Manifest) -> list[tuple[str, int, str | None]]:
        return [(f.kind, m.sample(f.key).index, f.member) for f in m.faults]

    assert a.faults == b.faults, "the list and dict forms of the same request placed faults differently"
    assert positions(a) != positions(c), "another seed placed the faults identically"


def test_default_marker_path_is_beside_the_dataset(tmp_path):
    m = generate_dataset(
        tmp_path / "ds", num_samples=4, shard_size=4, shapes=h.SMALL, faults=["malicious-pickle"]
    )
    assert m.marker_path == str(tmp_path / "ds.PWNED") == m.faults[0].detail["marker_path"]
    assert generate_dataset(tmp_path / "clean", num_samples=2, shapes=h.SMALL).marker_path is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(faults=["bogus"]), "unknown fault kind 'bogus'; known kinds: truncated-shard"),
        (dict(faults=["nan-tensor:x"]), "count must be a positive integer"),
        (dict(faults="nan-tensor"), "must be a list"),
        (dict(faults={"nan-tensor": 9}), "need 9 distinct samples.*only 8"),
        (dict(faults={"empty-shard": 3}), "need as many shards, but there are 2"),
        (dict(encoding="raw", faults=["nan-tensor"]), "needs a floating-point tensor member"),
        (dict(encoding="raw", faults=["malicious-pickle"]), "needs a tensor member"),
    ],
)
def test_bad_fault_requests_say_what_to_do(kwargs, message, tmp_path):
    options = {"num_samples": 8, "shard_size": 4, **kwargs}
    if options.get("encoding") != "raw":
        options["shapes"] = h.SMALL
    with pytest.raises(SyntheticError, match=message):
        generate_dataset(tmp_path / "x", **options)
    assert not (tmp_path / "x").exists(), "a refused request left files behind"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    num_samples=st.integers(6, 30),
    shard_size=st.integers(2, 8),
    seed=st.integers(0, 1000),
    request=st.dictionaries(st.sampled_from(FAULT_KINDS), st.integers(1, 2), max_size=4),
)
def test_any_fault_request_that_fits_is_honoured_exactly(
    num_samples, shard_size, seed, request, tmp_path_factory
):
    out = tmp_path_factory.mktemp("prop") / "ds"
    try:
        m = generate_dataset(
            out, num_samples=num_samples, shard_size=shard_size, seed=seed, shapes=h.SMALL, faults=request
        )
    except SyntheticError as exc:
        assert "distinct samples" in str(exc) or "shard" in str(exc), str(exc)
        return
    assert Counter(f.kind for f in m.faults) == Counter(request)
    assert sum(s.num_samples for s in m.shards) == num_samples == len(m.samples)
    assert m.damaged_keys() <= set(m.keys())
    for f in m.faults:
        assert f.shard in {s.name for s in m.shards}
        assert f.key is None or m.sample(f.key).shard == f.shard
