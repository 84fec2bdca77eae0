"""The CLI, run as real subprocesses: ``python -m primus_energon.synthetic`` and the ``primus-synth`` console script."""

from __future__ import annotations

import pytest
import yaml

from primus_energon.synthetic import FAULT_KINDS, Manifest, generate_dataset
from primus_energon.synthetic.cli import build_parser

try:
    from . import synthetic_helpers as h
except ImportError:
    import synthetic_helpers as h

SMALL_ARGS = [
    "--shape",
    "latents=4x8x8",
    "--shape",
    "prompt_embeds=7x16",
    "--shape",
    "pooled_prompt_embeds=16",
]


def _flags(parser, command: str) -> list[str]:
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return [opt for action in sub._actions for opt in action.option_strings if opt not in ("-h",)]


@pytest.mark.parametrize("command", ["generate", "metadataset"])
def test_help_documents_every_flag(command):
    proc = h.run_cli([command, "--help"])
    assert proc.returncode == 0, proc.stderr
    flags = _flags(build_parser(), command)
    assert flags, "no flags found"
    missing = [f for f in flags if f not in proc.stdout]
    assert not missing, f"`{command} --help` does not mention {missing}"
    if command == "generate":
        assert all(kind in proc.stdout for kind in FAULT_KINDS), "not every fault kind is documented"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "OUT", "--fault", "bogus"], "unknown fault kind 'bogus'"),
        (["generate", "OUT", "--samples", "0"], "argument --samples: must be >= 1"),
        (["generate", "OUT", "--seed", "-3"], "argument --seed"),
        (["generate", "OUT", "--encoding", "video"], "invalid choice: 'video'"),
        (["generate"], "OUT_DIR"),
        (["generate", "OUT", "--shape", "latents"], "must be NAME=DIMS"),
        (["generate", "OUT", "--split", "1,2"], "TRAIN,VAL,TEST"),
        (
            ["generate", "OUT", "--schema", "/nonexistent/s.yaml"],
            "schema file '/nonexistent/s.yaml' does not exist",
        ),
        (["generate", "OUT", "--shape", "nope=2"], "'nope', which is not a member"),
        (["metadataset", "m.yaml", "--blend", "data/a"], "expected PATH:WEIGHT"),
        (["metadataset", "m.yaml"], "--blend"),
        (["metadataset", "m.yaml", "--blend", "missing:1"], "is not a prepared dataset"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_give_one_clear_line_and_exit_2(args, message, tmp_path):
    proc = h.run_cli(args, cwd=tmp_path)
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got:\n{proc.stderr}"
    assert lines[0].startswith("primus-synth") and "error:" in lines[0] and message in lines[0], lines[0]
    assert not (tmp_path / "OUT").exists()


CUSTOM = (
    "encoding: custom_v2\nmembers:\n  vae_output.pth: {shape: [4, 4]}\n  text_embed.pth: {shape: [3, 8]}\n"
    "  clip_embed.pth: {shape: [8]}\n  caption.txt: {}\n"
)


def test_console_script_generates_a_schema_dataset_like_the_api(tmp_path):
    schema = tmp_path / "custom.yaml"
    schema.write_text(CUSTOM)
    args = [
        "--schema",
        str(schema),
        "--samples",
        "10",
        "--shard-size",
        "4",
        "--seed",
        "5",
        "--dtype",
        "float16",
    ]
    proc = h.run_cli(
        ["generate", str(tmp_path / "script"), *args, "--fault", "missing-member:2"], module=False
    )
    assert proc.returncode == 0, proc.stderr
    m = Manifest.load(tmp_path / "script")
    size = sum(s.size for s in m.shards) / 1e6
    assert proc.stdout.strip() == (
        f"wrote 10 custom_v2 samples in 3 shards ({size:.1f} MB) to {tmp_path / 'script'}; faults: missing-member:2"
    )
    assert {r.dtype for s in m for r in s.members.values() if r.kind == "tensor"} == {"float16"}
    generate_dataset(
        tmp_path / "api", schema=schema, num_samples=10, shard_size=4, seed=5, dtype="float16",
        faults={"missing-member": 2},
    )  # fmt: skip
    h.assert_same_dataset(tmp_path / "script", tmp_path / "api")


def test_module_generates_the_api_dataset(tmp_path):
    args = ["--samples", "10", "--shard-size", "4", "--seed", "5", *SMALL_ARGS, "--split", "2,1,1"]
    proc = h.run_cli(["generate", str(tmp_path / "module"), *args, "--fault", "nan-tensor", "--quiet"])
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    generate_dataset(
        tmp_path / "api",
        num_samples=10,
        shard_size=4,
        seed=5,
        shapes=h.SMALL,
        split=(2, 1, 1),
        faults=["nan-tensor"],
    )
    h.assert_same_dataset(tmp_path / "module", tmp_path / "api")


def test_existing_output_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "ds"
    generate_dataset(out, encoding="raw", num_samples=4, image_format="png")
    again = h.run_cli(["generate", str(out), "--samples", "4", "--encoding", "raw"])
    assert again.returncode == 2 and "is not empty" in again.stderr and "--overwrite" in again.stderr
    assert "png" in Manifest.load(out).schema.members, "a refused run changed the dataset"
    over = h.run_cli(
        ["generate", str(out), "--samples", "6", "--encoding", "raw", "--overwrite", "--no-progress"]
    )
    assert over.returncode == 0, over.stderr
    assert len(Manifest.load(out).samples) == 6 and "jpg" in Manifest.load(out).schema.members


def test_metadataset_command(tmp_path):
    generate_dataset(tmp_path / "c", num_samples=4, shapes=h.SMALL)
    meta = h.run_cli(
        [
            "metadataset",
            str(tmp_path / "mix.yaml"),
            "--blend",
            f"{tmp_path / 'c'}:2:source=c,tier=gold",
            "--legacy",
        ]
    )
    assert meta.returncode == 0, meta.stderr
    doc = yaml.safe_load((tmp_path / "mix.yaml").read_text())
    assert doc == {
        "__module__": "megatron.energon",
        "__class__": "Metadataset",
        "splits": {
            "train": {
                "datasets": [{"weight": 2.0, "path": "c", "subflavors": {"source": "c", "tier": "gold"}}]
            }
        },
    }
    v2 = h.run_cli(
        ["metadataset", str(tmp_path / "v2.yaml"), "--blend", f"{tmp_path / 'c'}:1", "--split", "val"]
    )
    assert v2.returncode == 0, v2.stderr
    assert yaml.safe_load((tmp_path / "v2.yaml").read_text())["splits"] == {
        "val": {"blend": [{"weight": 1.0, "path": "c"}]}
    }


def test_progress_bar_reports_samples(tmp_path, capsys):
    generate_dataset(tmp_path / "p", num_samples=6, shard_size=2, shapes=h.SMALL, progress=True)
    err = capsys.readouterr().err
    assert "6/6" in err and "sample" in err, f"no progress bar on stderr: {err!r}"
