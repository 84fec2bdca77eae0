"""The formats a target is checked on: every format its cookers declare that the suite knows (built in,
a shipped example schema, or one --conformance-schema file per format), shared tensor fields harmonised
so the formats can meet in a batch, mixed batches and blends, and the formats listed in the report."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from megatron.energon import basic_sample_keys, stateless

from primus_energon.conformance import check_cooker, check_task_encoder
from primus_energon.conformance.engine.session import make_context
from primus_energon.conformance.engine.target import resolve_target
from primus_energon.formats import SIZES
from primus_energon.synthetic import (
    BytesSpec,
    NpySpec,
    Schema,
    TensorSpec,
    builtin_schema,
    example_schemas,
    harmonised,
    load_schema,
)
from tests.helpers import run_pytest

ZOO = "tests.conformance_zoo.formats"
ROOT = Path(__file__).parents[1]

EXOTIC = """
from megatron.energon import Cooker
from primus_energon import EncodedDiffusionTaskEncoder, cook_preencoded_diffusion

class OnlyExotic(EncodedDiffusionTaskEncoder):
    cookers = [Cooker(cook_preencoded_diffusion, has_subflavors={"encoding": "exotic"})]

class AlsoExotic(EncodedDiffusionTaskEncoder):
    cookers = [
        Cooker(cook_preencoded_diffusion, has_subflavors={"encoding": "preencoded"}),
        Cooker(cook_preencoded_diffusion, has_subflavors={"encoding": "exotic"}),
    ]
"""


@stateless
def cook_members_as_they_are(sample: dict) -> dict:
    """Any format: every member passed on as it is."""
    return {**basic_sample_keys(sample), **{k: v for k, v in sample.items() if not k.startswith("__")}}


@pytest.fixture
def exotic_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "exotic_targets.py").write_text(EXOTIC)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_the_shipped_examples_are_known_formats() -> None:
    examples = example_schemas()
    assert {"flux", "nemo", "preencoded_numpy", "raw_control"} <= set(examples)
    for encoding, path in examples.items():
        assert load_schema(path).encoding == encoding


def test_harmonised_shares_shape_and_dtype_from_the_format_that_fixes_them() -> None:
    preencoded = builtin_schema("preencoded", shapes=SIZES["tiny"])
    mlperf = load_schema(example_schemas()["preencoded_numpy"])
    pre, numpy_layout = harmonised([preencoded, mlperf])
    # prompt_embeds and pooled_prompt_embeds are in both: the headerless bytes fix shape and dtype
    assert pre.members["prompt_embeds.pth"] == TensorSpec((12, 32), "bfloat16")
    assert pre.members["pooled_prompt_embeds.pth"] == TensorSpec((32,), "bfloat16")
    assert numpy_layout.members == mlperf.members
    # latents (only preencoded) and the caption keep theirs
    assert pre.members["latents.pth"] == preencoded.members["latents.pth"]
    assert pre.members["caption.txt"] == preencoded.members["caption.txt"]


def test_harmonised_without_a_fixed_format_takes_the_first_and_never_gives_numpy_bfloat16() -> None:
    a = builtin_schema("preencoded", shapes=SIZES["tiny"])
    b = builtin_schema("preencoded", shapes=SIZES["small"], dtype="bfloat16")
    first, second = harmonised([a, b])
    assert first.members == a.members
    assert second.members["latents.pth"].shape == (4, 8, 8)
    assert second.members["latents.pth"].dtype == "float32"
    npy = Schema(encoding="npy_embeds", members={"prompt_embeds.npy": NpySpec((7, 16), "float16")})
    raw = Schema(
        encoding="raw_embeds",
        members={"prompt_embeds.bytes": BytesSpec(dtype="bfloat16", shape=(3, 4))},
    )
    # both fix theirs: the first one that does wins, but a numpy array is never made bfloat16
    _, npy_out = harmonised([raw, npy])
    assert npy_out.members["prompt_embeds.npy"] == NpySpec((3, 4), "float16")
    _, raw_out = harmonised([npy, raw])
    assert raw_out.members["prompt_embeds.bytes"] == BytesSpec(dtype="float16", shape=(7, 16))


def test_a_task_encoder_is_checked_on_each_format_its_cookers_declare() -> None:
    ctx = make_context(resolve_target(f"{ZOO}:EverySampleTaskEncoder"), workdir="/nonexistent")
    assert ctx.encodings() == ["preencoded", "preencoded_numpy"]
    assert ctx.formats() == {
        "checked": [
            {"encoding": "preencoded", "source": "built in"},
            {"encoding": "preencoded_numpy", "source": "example schema mlperf_numpy.yaml"},
        ],
        "not_checked": [],
    }
    # the shared fields of the generated data agree, so the formats can meet in one batch
    pre, numpy_layout = (ctx.workspace.schema(e) for e in ctx.encodings())
    assert pre.members["prompt_embeds.pth"].shape == numpy_layout.members["t5.bytes"].shape


def test_an_unknown_format_beside_a_known_one_is_listed_as_not_checked(exotic_module: Path) -> None:
    (accepted,) = check_task_encoder("exotic_targets:AlsoExotic", properties=["accepted"], profile="quick")
    assert accepted.verdict == "pass", accepted.message
    assert [f["encoding"] for f in accepted.formats["checked"]] == ["preencoded"]
    (missing,) = accepted.formats["not_checked"]
    assert missing["encoding"] == "exotic" and "--conformance-schema" in missing["why"]


def test_only_unknown_formats_is_a_usage_error(exotic_module: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="encoding 'exotic', which the suite has no data for"):
        check_task_encoder("exotic_targets:OnlyExotic", properties=["accepted"], profile="quick")
    run = _pytest(exotic_module, "--task-encoder", "exotic_targets:OnlyExotic")
    assert run.returncode == 4, run.stdout + run.stderr
    assert "--task-encoder exotic_targets:OnlyExotic: its cookers ask for encoding 'exotic'" in run.stderr


def test_one_schema_file_per_format(tmp_path: Path) -> None:
    """Two --conformance-schema files check a cooker on both formats; two files of one encoding are refused."""
    mlperf = example_schemas()["preencoded_numpy"]
    nemo = example_schemas()["nemo"]
    results = check_cooker(
        "tests.test_conformance_formats:cook_members_as_they_are",
        properties=["accepted"],
        profile="quick",
        schema=[str(mlperf), str(nemo)],
    )
    assert [f["encoding"] for f in results[0].formats["checked"]] == ["preencoded_numpy", "nemo"]
    assert results[0].verdict == "pass", results[0].message
    run = _pytest(
        tmp_path,
        "--cooker",
        "primus_energon:PREENCODED_COOKER",
        "--conformance-schema",
        str(mlperf),
        "--conformance-schema",
        str(mlperf),
    )
    assert run.returncode == 4
    assert "encoding 'preencoded_numpy' is already described by" in run.stderr


def test_the_report_lists_the_formats_checked(exotic_module: Path) -> None:
    report = exotic_module / "report"
    run = _pytest(
        exotic_module,
        "--task-encoder",
        "exotic_targets:AlsoExotic",
        "--conformance-property",
        "accepted",
        "--conformance-report",
        str(report),
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert "AlsoExotic: formats checked: preencoded (built in)" in run.stdout
    assert "not checked: exotic" in run.stdout
    (target,) = json.loads((report / "report.json").read_text())["targets"]
    assert target["formats"]["checked"] == [{"encoding": "preencoded", "source": "built in"}]
    assert target["formats"]["not_checked"][0]["encoding"] == "exotic"
    assert "Not checked: `exotic`" in (report / "report.md").read_text()


def test_blends_mix_the_formats_when_mixed_batches_work() -> None:
    (blend,) = check_task_encoder(f"{ZOO}:EverySampleTaskEncoder", properties=["blend"], profile="quick")
    assert blend.verdict == "pass", blend.message
    assert blend.details["mixed_formats"] is True
    (drawn,) = blend.details["blends"]
    assert {"preencoded", "preencoded_numpy"} == set(drawn["encodings"])


def test_a_mixed_batch_failure_is_reported_once_by_batch_not_again_by_blend() -> None:
    results = {
        r.property: r
        for r in check_task_encoder(
            f"{ZOO}:FirstSampleDecidesTaskEncoder", properties=["batch", "blend"], profile="quick"
        )
    }
    assert results["batch"].claim("mixed_formats_batched").verdict == "fail"
    assert results["blend"].verdict == "pass", results["blend"].message
    assert results["blend"].details["mixed_formats"] is False
    assert len(set(results["blend"].details["blends"][0]["encodings"])) == 1


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run_pytest(cwd, "--conformance-profile", "quick", *args, pythonpath=str(cwd))


def test_nan_values_in_a_users_data_are_no_false_alarm(tmp_path: Path) -> None:
    """Random bytes read as bfloat16 hold NaNs; fidelity and the batch rows compare bits, so a cooker
    that passes them through intact passes (``torch.equal`` would call every NaN row different)."""
    import numpy as np

    from tests.conformance_zoo.formats import _MLPERF_SHAPES
    from tests.helpers import write_prepared_dataset

    rng = np.random.default_rng(7)
    samples = []
    for index in range(8):
        members = {}
        for member, shape in _MLPERF_SHAPES.items():
            words = rng.integers(0, 2**16, size=int(np.prod(shape)), dtype=np.uint16)
            words[::5] = 0x7FC1  # a bfloat16 NaN
            members[member] = words.tobytes()
        samples.append((f"nan_{index:03d}", members))
    dataset = write_prepared_dataset(tmp_path / "nan", samples, {"encoding": "preencoded_numpy"})
    results = {
        r.property: r
        for r in check_task_encoder(
            f"{ZOO}:EverySampleTaskEncoder",
            properties=["fidelity", "batch"],
            profile="quick",
            dataset=str(dataset),
        )
    }
    for name in (
        "fidelity/other",
        "batch/rows",
    ):  # headerless bytes are inferred as bytes: found by raw bytes
        claim = results[name.partition("/")[0]].claim(name)
        assert claim.verdict == "pass" and claim.examined > 0, f"{name}: {claim.verdict} {claim.message}"


def test_crude_samples_keep_the_decoders_numpy_arrays(tmp_path: Path) -> None:
    """The crude samples the checks cook are what Energon hands a cooker: a decoder's numpy array stays a
    numpy array (torch's DataLoader would turn it into a tensor on the way out of the reading loader)."""
    import numpy as np

    from primus_energon.conformance.data.workspace import read_crude
    from primus_energon.decoding import SafeSampleDecoder
    from primus_energon.synthetic import generate_dataset

    dataset = tmp_path / "nemo"
    generate_dataset(dataset, schema=load_schema(example_schemas()["nemo"]), num_samples=2, shard_size=2)
    (first, _) = read_crude(dataset, decoder=SafeSampleDecoder())
    assert isinstance(first[".pickle"], np.ndarray) and first[".pickle"].dtype == np.float16


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cooker", "example"),
    [
        ("cook_dfm_flux", "flux"),
        ("cook_nemo", "nemo"),
        ("cook_nemo_raw_images", "raw_control"),
        ("cook_mlperf_numpy", "preencoded_numpy"),
    ],
)
def test_a_correct_cooker_of_each_real_format_passes_every_property(
    cooker: str, example: str, tmp_path: Path
) -> None:
    """Data written as each project's prepare script writes it, and a correct cooker for it, passes
    every property, exit status 0 (pytest through the plugin, as a user runs it)."""
    run = _pytest(
        tmp_path, "--cooker", f"{ZOO}:{cooker}", "--conformance-schema", str(example_schemas()[example])
    )
    assert run.returncode == 0, run.stdout[-4000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "failed" not in summary and "error" not in summary, summary
