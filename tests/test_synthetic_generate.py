"""Clean datasets: Energon loads them as they are and yields exactly the manifest's samples and bytes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from primus_energon.synthetic import Manifest, SyntheticError, builtin_schema, generate_dataset

try:
    from . import synthetic_helpers as h
except ImportError:
    import synthetic_helpers as h

DATASETS = {
    "pre_f32": dict(num_samples=24, shard_size=8, seed=3, shapes=h.SMALL),
    "pre_bf16": dict(num_samples=12, shard_size=4, seed=4, shapes=h.SMALL, dtype="bfloat16"),
    "pre_f16": dict(num_samples=12, shard_size=4, seed=5, shapes=h.SMALL, dtype="float16"),
    "raw_jpg": dict(encoding="raw", num_samples=10, shard_size=4, seed=6),
    "raw_png": dict(
        encoding="raw", num_samples=10, shard_size=4, seed=7, image_format="png", image_size=(16, 24)
    ),
    "raw_webp": dict(encoding="raw", num_samples=10, shard_size=4, seed=8, image_format="webp"),
}


@pytest.fixture(scope="session", params=sorted(DATASETS))
def clean(request, tmp_path_factory) -> tuple[Path, Manifest]:
    return h.cached_dataset(tmp_path_factory, request.param, **DATASETS[request.param])


@pytest.fixture(scope="session")
def split_ds(tmp_path_factory) -> tuple[Path, Manifest]:
    return h.cached_dataset(
        tmp_path_factory, "split", num_samples=40, shard_size=4, seed=9, shapes=h.SMALL, split=(0.8, 0.1, 0.1)
    )


def test_energon_yields_exactly_the_manifest_samples(clean):
    path, manifest = clean
    h.assert_yields_manifest(h.load_with_energon(path), manifest)


def test_every_member_matches_its_manifest_record(clean):
    path, manifest = clean
    for shard in manifest.shards:
        for name, data in h.tar_members(path / shard.name):
            key, member = name.split(".", 1)
            record = manifest.sample(key).members[member]
            assert h.sha(data) == record.sha256, f"{shard.name}/{name}: digest differs from the manifest"
            if record.kind == "tensor":
                t = h.tensor_of(data)
                assert str(t.dtype) == f"torch.{record.dtype}", (
                    f"{name}: dtype {t.dtype}, manifest {record.dtype}"
                )
                assert tuple(t.shape) == record.shape, (
                    f"{name}: shape {tuple(t.shape)}, manifest {record.shape}"
                )
                assert t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size(), (
                    f"{name}: tensor is not a plain contiguous tensor owning exactly its storage"
                )
                assert torch.isfinite(t.float()).all(), f"{name}: clean tensor holds non-finite values"
            elif record.kind == "image":
                img = Image.open(io.BytesIO(data))
                expected_format = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}[member]
                assert img.format == expected_format, (
                    f"{name}: Pillow sees {img.format}, expected {expected_format}"
                )
                assert (img.height, img.width, len(img.getbands())) == record.shape, (
                    f"{name}: image size differs"
                )
            elif record.kind == "text":
                data.decode("utf-8")


@pytest.mark.parametrize("name", ["pre_f32", "pre_bf16", "pre_f16"])
def test_preencoded_tensors_follow_the_requested_dtype_and_shapes(name, tmp_path_factory):
    _, manifest = h.cached_dataset(tmp_path_factory, name, **DATASETS[name])
    dtype = DATASETS[name].get("dtype", "float32")
    for sample in manifest:
        for stem, shape in h.SMALL.items():
            record = sample.members[f"{stem}.pth"]
            assert (record.dtype, record.shape) == (dtype, shape), f"{sample.key} {stem}: {record}"


def test_keys_are_unique_and_have_no_dots(clean):
    _, manifest = clean
    keys = manifest.keys()
    assert len(set(keys)) == len(keys) == manifest.num_samples
    assert not [k for k in keys if "." in k], "keys with dots"
    assert keys == sorted(keys)


def test_captions_include_non_ascii_and_long_ones(tmp_path_factory):
    path, manifest = h.cached_dataset(tmp_path_factory, "pre_f32", **DATASETS["pre_f32"])
    captions = {
        name.split(".", 1)[0]: data.decode("utf-8")
        for shard in manifest.shards
        for name, data in h.tar_members(path / shard.name)
        if name.endswith(".caption.txt")
    }
    assert len(captions) == manifest.num_samples
    non_ascii = [k for k, c in captions.items() if not c.isascii()]
    long = [k for k, c in captions.items() if len(c) >= 1000]
    assert len(non_ascii) >= manifest.num_samples // 2, f"only {len(non_ascii)} non-ASCII captions"
    assert long, f"no caption of 1000+ characters; longest is {max(map(len, captions.values()))}"
    assert len(set(captions.values())) == len(captions), "captions repeat"


def test_dataset_is_prepared_by_energon_with_subflavors(clean):
    path, manifest = clean
    meta = path / ".nv-meta"
    for name in (".info.json", "split.yaml", "index.sqlite", "dataset.yaml"):
        assert (meta / name).is_file(), f"{meta / name} missing"
    info = json.loads((meta / ".info.json").read_text())
    assert info["shard_counts"] == {s.name: s.num_samples for s in manifest.shards}
    for shard in manifest.shards:
        assert (path / f"{shard.name}.idx").is_file(), f"{shard.name}.idx missing"
        assert (path / shard.name).stat().st_size == shard.size
    dataset_yaml = yaml.safe_load((meta / "dataset.yaml").read_text())
    assert dataset_yaml == {
        "__module__": "megatron.energon",
        "__class__": "CrudeWebdataset",
        "subflavors": {"encoding": manifest.encoding},
    }
    loaded = h.load_with_energon(path)
    assert {tuple(s["__subflavors__"].items()) for s in loaded.samples} == {
        (("encoding", manifest.encoding),)
    }


def test_split_ratios_assign_whole_shards_and_energon_loads_each_split(split_ds):
    path, manifest = split_ds
    assert [s.split for s in manifest.shards] == ["train"] * 8 + ["val"] + ["test"]
    assert (
        len(manifest.keys("train")) == 32
        and len(manifest.keys("val")) == 4
        and len(manifest.keys("test")) == 4
    )
    for split in ("train", "val", "test"):
        h.assert_yields_manifest(h.load_with_energon(path, split), manifest, split)


def test_variable_shapes_give_resolution_buckets(tmp_path):
    m = generate_dataset(tmp_path / "pre", num_samples=16, shard_size=8, shapes=h.SMALL, variable_shapes=True)
    latents = {s.members["latents.pth"].shape for s in m}
    assert len(latents) > 1, f"latents shapes do not vary: {latents}"
    allowed = {(4, max(1, int(8 * a + 0.5)), max(1, int(8 * b + 0.5))) for a, b in m.schema.buckets}
    assert latents <= allowed, f"latent shapes {latents - allowed} are not buckets"
    assert {s.members["prompt_embeds.pth"].shape for s in m} == {(7, 16)}, "non-bucketed member changed shape"
    h.assert_yields_manifest(h.load_with_energon(tmp_path / "pre"), m)
    raw = generate_dataset(
        tmp_path / "raw", encoding="raw", num_samples=12, shard_size=6, variable_shapes=True
    )
    assert len({s.members["jpg"].shape for s in raw}) > 1


def test_builtin_schemas_follow_the_preencoded_layout():
    pre = builtin_schema("preencoded")
    shapes = {n: (s.shape, s.dtype) for n, s in pre.members.items() if s.kind == "tensor"}
    assert shapes == {
        "latents.pth": ((64, 32, 32), "float32"),
        "prompt_embeds.pth": ((77, 4096), "float32"),
        "pooled_prompt_embeds.pth": ((768,), "float32"),
    }
    assert list(pre.members) == [
        "latents.pth",
        "prompt_embeds.pth",
        "pooled_prompt_embeds.pth",
        "caption.txt",
    ]
    assert list(builtin_schema("raw", image_format="webp").members) == ["webp", "txt"]
    assert builtin_schema("preencoded", dtype="bfloat16").members["latents.pth"].dtype == "bfloat16"


def test_manifest_round_trips_through_its_file(clean):
    path, manifest = clean
    text = (path / "manifest.json").read_text()
    assert Manifest.load(path).to_json() == text == manifest.to_json()
    assert Manifest.load(path / "manifest.json").keys() == manifest.keys()


def test_default_key_prefix_comes_from_the_seed_and_a_custom_one_is_used(tmp_path):
    m = generate_dataset(tmp_path / "a", num_samples=3, shard_size=2, seed=42, shapes=h.SMALL)
    assert m.keys() == ["s42_000000", "s42_000001", "s42_000002"]
    m = generate_dataset(tmp_path / "b", num_samples=2, shard_size=2, shapes=h.SMALL, key_prefix="img-x")
    assert m.keys() == ["img-x_000000", "img-x_000001"]
    with pytest.raises(SyntheticError, match="no dots"):
        generate_dataset(tmp_path / "c", num_samples=2, shapes=h.SMALL, key_prefix="a.b")


def test_non_empty_out_dir_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "ds"
    first = generate_dataset(out, num_samples=4, shard_size=2, seed=1, shapes=h.SMALL)
    with pytest.raises(SyntheticError, match="not empty.*overwrite"):
        generate_dataset(out, num_samples=4, shard_size=2, seed=2, shapes=h.SMALL)
    assert Manifest.load(out).to_json() == first.to_json(), "a refused run changed the dataset"
    second = generate_dataset(out, num_samples=2, shard_size=2, seed=2, shapes=h.SMALL, overwrite=True)
    assert sorted(p.name for p in out.glob("*.tar")) == ["shard-000000.tar"]
    assert Manifest.load(out).keys() == second.keys()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SyntheticError, match="did not make.*notes.txt"):
        generate_dataset(out, num_samples=2, shapes=h.SMALL, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
