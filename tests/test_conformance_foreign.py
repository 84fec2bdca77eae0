"""The suite on a user's own dataset in a format its generator cannot write (``--conformance-dataset``): six
user-style formats (``tests/conformance_zoo/foreign.py``: an extension-less JPEG beside JSON whose captions are
a JSON string, nested JSON, a JSON document that is a string, float16 ``.npy`` under ``.bytes``, a clip as
frame members, a pickled dict of tensors), each on a dataset of several shards and on a one-shard dataset of
four samples. Every correct target passes every property there; every broken one fails the claim meant for
its one defect."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest

from primus_energon.conformance import check_cooker, check_task_encoder
from tests.conformance_zoo.foreign import BROKEN, CORRECT, FORMATS, SUBFLAVORS

#: dataset variant -> builder options: three shards of four, and one shard of four samples
VARIANTS: dict[str, dict[str, int]] = {
    "sharded": {"num_samples": 12, "shard_size": 4},
    "one_shard": {"num_samples": 4, "shard_size": 4},
}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """(format, variant) -> a prepared dataset; each variant of each format with its own seed."""
    root = tmp_path_factory.mktemp("foreign")
    out = {}
    for index, (name, build) in enumerate(FORMATS.items()):
        for offset, (variant, options) in enumerate(VARIANTS.items()):
            out[name, variant] = build(root / f"{name}-{variant}", seed=10 * index + offset, **options)
    return out


def _check(spec: str, kind: str, dataset: Path, tmp_path: Path, **options: Any) -> list[Any]:
    check = check_task_encoder if kind == "task_encoder" else check_cooker
    return check(spec, profile="quick", workdir=tmp_path, dataset=str(dataset), **options)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:400] if text.strip() else ""


def _members(dataset: Path) -> dict[str, dict[str, bytes]]:
    """key -> {member: bytes}, read with tarfile from every shard."""
    samples: dict[str, dict[str, bytes]] = {}
    for shard in sorted(dataset.rglob("*.tar")):
        with tarfile.open(shard) as tar:
            for info in tar.getmembers():
                key, _, member = info.name.partition(".")
                handle = tar.extractfile(info)
                assert handle is not None and info.mtime == 0, info.name
                samples.setdefault(key, {})[member] = handle.read()
    return samples


EXPECTED_MEMBERS = {
    "t2i_image_json": {"image", "json"},
    "nested_json": {"latents.pth", "meta.json"},
    "json_string": {"latents.pth", "record.json"},
    "npy_renamed": {"t5.bytes", "clip.bytes", "latents.bytes"},
    "video_frames": {"frame_000.png", "frame_001.png", "frame_002.png", "frame_003.png", "caption.txt"},
    "pickled_tensors": {"embeds.pickle", "latents.pth", "caption.txt"},
}


#: format -> the fidelity claims of its main payloads: a correct target must pass them, judged (a skip there
#: would mean the suite never compared those members with the target's output)
JUDGED = {
    "t2i_image_json": ("fidelity/images",),
    "nested_json": ("fidelity/tensors",),
    "json_string": ("fidelity/tensors",),
    "npy_renamed": ("fidelity/tensors",),
    "video_frames": ("fidelity/images", "fidelity/text"),
    "pickled_tensors": ("fidelity/tensors", "fidelity/text"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FORMATS))
def test_the_foreign_datasets_are_what_they_claim(
    datasets: dict[tuple[str, str], Path], tmp_path: Path, name: str
) -> None:
    """Members as named, every payload distinct across samples, Energon-prepared, reproducible bytes."""
    for variant, options in VARIANTS.items():
        dataset = datasets[name, variant]
        samples = _members(dataset)
        assert len(samples) == options["num_samples"], sorted(samples)
        shards = sorted(dataset.rglob("*.tar"))
        assert len(shards) == options["num_samples"] // options["shard_size"], shards
        assert all(shard.with_name(shard.name + ".idx").exists() for shard in shards)
        meta = dataset / ".nv-meta"
        assert (meta / "dataset.yaml").exists() and (meta / "split.yaml").exists()
        for key, members in samples.items():
            assert set(members) == EXPECTED_MEMBERS[name], (key, sorted(members))
        for member in EXPECTED_MEMBERS[name]:
            payloads = [members[member] for members in samples.values()]
            assert len(set(payloads)) == len(payloads), f"{name}: {member} repeats across samples"
    again = FORMATS[name](tmp_path / "again", seed=10 * list(FORMATS).index(name), **VARIANTS["sharded"])
    first = sorted(datasets[name, "sharded"].rglob("*.tar"))
    assert [p.read_bytes() for p in sorted(again.rglob("*.tar"))] == [p.read_bytes() for p in first]
    text = (datasets[name, "sharded"] / ".nv-meta" / "dataset.yaml").read_text(encoding="utf-8")
    assert ("encoding:" in text) == bool(SUBFLAVORS[name]), text


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("spec", list(CORRECT))
def test_a_correct_target_passes_every_property_on_its_own_format(
    datasets: dict[tuple[str, str], Path], tmp_path: Path, spec: str, variant: str
) -> None:
    name, kind = CORRECT[spec]
    results = _check(spec, kind, datasets[name, variant], tmp_path)
    bad = {
        claim.id: f"{claim.verdict}: {_first_line(claim.message)}"
        for result in results
        for claim in result.claims
        if claim.verdict in ("fail", "error")
    }
    assert not bad, f"{spec} on {name} ({variant}): claims that should pass: {bad}"
    not_ok = {r.property: f"{r.verdict}: {_first_line(r.message)}" for r in results if not r.ok}
    assert not not_ok, f"{spec} on {name} ({variant}): properties not ok: {not_ok}"
    # it was judged, not waved through: the loader ran on the dataset and every clean sample cooked
    accepted = next(r for r in results if r.property == "accepted")
    assert accepted.claim("accepted/loads").verdict == "pass", accepted.claim("accepted/loads").message
    blocked = [r.property for r in results if r.details.get("blocked")]
    assert not blocked, f"{spec} on {name} ({variant}): blocked properties {blocked}"
    fidelity = next(r for r in results if r.property == "fidelity")
    assert fidelity.claim("fidelity/cooks").verdict == "pass", fidelity.claim("fidelity/cooks").message
    unjudged = {
        claim_id: f"{fidelity.claim(claim_id).verdict}: {_first_line(fidelity.claim(claim_id).message)}"
        for claim_id in JUDGED[name]
        if fidelity.claim(claim_id).verdict != "pass"
    }
    assert not unjudged, f"{spec} on {name} ({variant}): its main payloads were not compared: {unjudged}"


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("spec", list(BROKEN))
def test_a_broken_target_fails_the_claim_meant_for_its_defect(
    datasets: dict[tuple[str, str], Path], tmp_path: Path, spec: str, variant: str
) -> None:
    """Caught on the sharded dataset and on the single shard of four samples alike."""
    name, claim_id, kind = BROKEN[spec]
    prop = claim_id.partition("/")[0]
    results = _check(spec, kind, datasets[name, variant], tmp_path, properties=[prop])
    (result,) = [r for r in results if r.property == prop]
    claim = result.claim(claim_id)
    others = {c.id: c.verdict for r in results for c in r.claims if c.verdict not in ("pass", "skip")}
    assert claim.verdict == "fail", (
        f"{spec} on {name}: expected {claim_id} to fail, observed {claim.verdict}: "
        f"{_first_line(claim.message) or result.message[:400]} (property {prop}: {result.verdict}; "
        f"other verdicts: {others})"
    )
    assert result.verdict == "fail" and f"] {claim_id}: " in result.message, result.message


@pytest.mark.slow
def test_data_of_a_dtype_the_user_never_stores_is_not_derived(
    datasets: dict[tuple[str, str], Path], tmp_path: Path
) -> None:
    """A reader that casts to float16 is right on float16 data: every variant stays inside the user's format,
    so no float32 or bfloat16 copy is derived, and fidelity/dtypes says why it does not apply."""
    spec = "tests.conformance_zoo.foreign:NpyForcesFloat16TaskEncoder"
    (result,) = _check(
        spec, "task_encoder", datasets["npy_renamed", "sharded"], tmp_path, properties=["fidelity"]
    )
    claim = result.claim("fidelity/dtypes")
    assert claim.verdict == "skip" and "float16" in claim.message and "outside your format" in claim.message
    assert result.verdict == "pass", result.message
