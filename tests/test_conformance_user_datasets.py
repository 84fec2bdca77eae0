"""The suite on a user's own dataset (``--conformance-dataset``): every property, on the reference targets,
over datasets of the shapes users have (one shard, many tiny shards, a train/val/test split, uneven shards,
a metadataset), exits 0; claims that depend on how Energon samples the dataset ask of the target only what
Energon itself delivers for the suite's pass-through reference (determinism/seed on a train split of two
shards read by two workers: one order for any seed, so it is checked on generated data of the same format,
and the report says so), locally and on object storage. A target that pins the order still fails."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from primus_energon.conformance import check_task_encoder
from primus_energon.conformance.core.profiles import PROFILES
from primus_energon.conformance.properties.determinism import _seed_plan
from primus_energon.synthetic import LoopbackObjectStore, generate_dataset, write_metadataset
from tests.helpers import SMALL_SHAPES, run_pytest

REPO = Path(__file__).resolve().parents[1]
TINY = [
    arg for name, dims in SMALL_SHAPES.items() for arg in ("--shape", f"{name}={'x'.join(map(str, dims))}")
]

#: name -> generate_dataset options of a user-style dataset (tiny tensors: the shape of the shards matters)
SHAPES: dict[str, dict[str, Any]] = {
    "one_shard": {"num_samples": 12, "shard_size": 12},
    "tiny_shards": {"num_samples": 20, "shard_size": 1},
    "train_val_test": {"num_samples": 48, "shard_size": 12, "split": (0.5, 0.25, 0.25)},
    "uneven_shards": {"num_samples": 29, "shard_size": 8},
}

#: the reference targets checked on each shape (a cooker and a TaskEncoder of the preencoded format)
TARGETS = (
    "--cooker=primus_energon:PREENCODED_COOKER",
    "--task-encoder=primus_energon:EncodedDiffusionTaskEncoder",
)


def synth(out: Path, *args: str) -> Path:
    """``primus-synth generate OUT ARGS`` in a real subprocess, as a user makes a small dataset."""
    run = subprocess.run(
        [sys.executable, "-m", "primus_energon.synthetic", "generate", str(out), *TINY, "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return out


@pytest.fixture(scope="module")
def user_datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("user-datasets")
    out = {}
    for seed, (name, options) in enumerate(SHAPES.items()):
        out[name] = root / name
        generate_dataset(out[name], shapes=SMALL_SHAPES, seed=seed, key_prefix=f"u{seed}", **options)
    first = generate_dataset(
        root / "leaf_a", shapes=SMALL_SHAPES, num_samples=16, shard_size=8, key_prefix="la"
    )
    second = generate_dataset(
        root / "leaf_b", shapes=SMALL_SHAPES, num_samples=9, shard_size=2, key_prefix="lb"
    )
    assert first and second
    out["metadataset"] = write_metadataset(
        root / "blend.yaml", [(root / "leaf_a", 2.0, {}), (root / "leaf_b", 1.0, {})]
    )
    # the issue's case: 48 samples in shards of 12, half train, half val (two train shards)
    out["issue"] = synth(root / "issue", "--samples", "48", "--shard-size", "12", "--split", "0.5,0.5,0")
    return out


def suite(tmp_path: Path, dataset: str | Path, *targets: str) -> tuple[Any, dict]:
    """The quick profile of every property on ``targets`` with ``--conformance-dataset DATASET``: the
    finished process and its report.json."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    run = run_pytest(
        tmp_path,
        "--rootdir",
        str(tmp_path),
        *(targets or TARGETS[1:]),
        f"--conformance-dataset={dataset}",
        "--conformance-profile=quick",
        f"--conformance-report={tmp_path / 'report'}",
        "-q",
    )
    report = tmp_path / "report" / "report.json"
    return run, json.loads(report.read_text(encoding="utf-8")) if report.exists() else {}


def claims_of(report: dict) -> dict[tuple[str, str], dict]:
    return {(r["target"], c["id"]): c for r in report["results"] for c in r["claims"]}


def assert_passes(run: Any, report: dict) -> dict[tuple[str, str], dict]:
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    claims = claims_of(report)
    bad = {
        k: (c["verdict"], c["message"][:300]) for k, c in claims.items() if c["verdict"] in ("fail", "error")
    }
    assert not bad, bad
    return claims


@pytest.mark.slow
@pytest.mark.parametrize("shape", [*SHAPES, "metadataset"])
def test_every_property_passes_the_reference_targets_on_a_user_dataset(
    user_datasets: dict[str, Path], tmp_path: Path, shape: str
) -> None:
    targets = TARGETS if shape == "train_val_test" else TARGETS[1:]
    run, report = suite(tmp_path, user_datasets[shape], *targets)
    claims = assert_passes(run, report)
    assert len({target for target, _ in claims}) == len(targets)
    seed = [c for (_, claim_id), c in claims.items() if claim_id == "determinism/seed"]
    assert seed and all(c["verdict"] in ("pass", "skip") for c in seed)
    if shape == "one_shard":  # one shard: one slice per worker for every worker count
        for claim in seed:
            assert claim["verdict"] == "pass", claim
            assert "num_workers=0: Energon itself delivers one_shard in one order" in claim["message"]
            assert "checked on a dataset derived from your samples instead" in claim["message"]
    # the claims checked on data derived from the user's samples say so
    sharding = [c for (_, claim_id), c in claims.items() if claim_id == "sharding/in_process"]
    assert all(f"of your samples of {user_datasets[shape]}" in c["message"] for c in sharding)


@pytest.mark.slow
def test_the_issue_case_passes_locally_and_on_object_storage(
    user_datasets: dict[str, Path], tmp_path: Path
) -> None:
    """48 samples, shards of 12, split 0.5,0.5,0: with two workers and two train shards Energon gives one
    order for any seed; determinism/seed says so and checks that worker count on generated data."""
    with LoopbackObjectStore() as store:
        store.upload(user_datasets["issue"], "issue")
        remote_run, remote = suite(tmp_path / "remote", store.url("issue"))
    here_run, here = suite(tmp_path / "local", user_datasets["issue"])
    for run, report in ((remote_run, remote), (here_run, here)):
        claims = assert_passes(run, report)
        (seed,) = [c for (_, claim_id), c in claims.items() if claim_id == "determinism/seed"]
        assert seed["verdict"] == "pass", seed
        assert (
            "num_workers=2: Energon itself delivers issue in one order for seeds 0 and 1" in seed["message"]
        )
        assert "its train split has 24 samples in 2 shards" in seed["message"]
        assert "checked on a dataset derived from your samples instead" in seed["message"]
        assert "num_workers=0" not in seed["message"]  # compared on the user's dataset itself
        details = next(r for r in report["results"] if r["property"] == "determinism")["details"]
        assert details["seed_compared"][0] == "issue num_workers=0"
        assert (
            details["seed_compared"][1].endswith("num_workers=2")
            and "determinism" in details["seed_compared"][1]
        )
    verdicts = {k: c["verdict"] for k, c in claims_of(here).items()}
    assert {k: c["verdict"] for k, c in claims_of(remote).items()} == verdicts


@pytest.mark.slow
def test_a_target_that_pins_the_order_still_fails_on_the_issue_case(
    user_datasets: dict[str, Path], tmp_path: Path
) -> None:
    (result,) = check_task_encoder(
        "tests.conformance_zoo.determinism_broken:PinnedSeedTaskEncoder",
        properties=["determinism"],
        profile="quick",
        workdir=tmp_path,
        dataset=str(user_datasets["issue"]),
    )
    claim = result.claim("determinism/seed")
    assert claim.verdict == "fail", claim.message
    # on the user's dataset (num_workers=0, where Energon's order follows the seed) and on the generated one
    assert "seed has no effect on the order for num_workers=0" in claim.message
    assert "num_workers=2" in claim.message and "dataset preencoded-determinism-" in claim.message
    assert result.claim("determinism/fresh_processes").verdict == "pass"


def _run(keys_by_seed: dict[int, list[list[str]]]) -> dict[str, Any]:
    return {str(seed): keys for seed, keys in keys_by_seed.items()}


def test_the_seed_claim_does_not_apply_where_energon_gives_one_order_everywhere() -> None:
    """The plan on what the children reported: a worker count where the reference gives the user's dataset
    one order goes to the fallback; where the fallback's order is fixed too, nothing is compared."""

    class Ctx:
        seed = 0
        profile = PROFILES["quick"]

    fixed, varying = [["a", "b"]], {0: [["a", "b"]], 1: [["b", "a"]]}

    def child(user: dict[int, Any], fallback: dict[int, Any]) -> dict[str, Any]:
        reference = {
            str(s): {"/u": {"0": user[s], "2": user[s]}, "/g": {"0": fallback[s], "2": fallback[s]}}
            for s in (0, 1)
        }
        results = {str(s): {"/u": {}, "/g": {}} for s in (0, 1)}
        return {"results": results, "reference": reference}

    pairs, notes = _seed_plan(Ctx(), child(varying, varying), "/g")  # type: ignore[arg-type]
    assert pairs == [("/u", 0), ("/u", 2)] and notes == []
    pairs, notes = _seed_plan(Ctx(), child({0: fixed, 1: fixed}, varying), "/g")  # type: ignore[arg-type]
    assert pairs == [("/g", 0), ("/g", 2)] and len(notes) == 2
    assert all("checked on a dataset derived from your samples instead" in n for n in notes)
    pairs, notes = _seed_plan(Ctx(), child({0: fixed, 1: fixed}, {0: fixed, 1: fixed}), "/g")  # type: ignore[arg-type]
    assert pairs == [] and all("Energon's order did not depend on the seed either" in n for n in notes)


# --- a schema beside the user's dataset: it refines the inferred format, or the pair is a usage error ----


@pytest.fixture(scope="module")
def preencoded_user(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("refine") / "mine"
    generate_dataset(out, shapes=SMALL_SHAPES, num_samples=4, shard_size=4, key_prefix="m")
    return out


def _context(tmp_path: Path, dataset: Path, schema: Path) -> Any:
    from primus_energon.conformance.data.workspace import Workspace
    from primus_energon.conformance.engine.context import CheckContext
    from primus_energon.conformance.engine.target import resolve_target

    workspace = Workspace(tmp_path / "ws", schema_files=(str(schema),), dataset=str(dataset))
    target = resolve_target("primus_energon:EncodedDiffusionTaskEncoder", kind="task_encoder")
    return CheckContext(target, workspace, PROFILES["quick"])


def test_a_schema_beside_the_dataset_refines_the_inferred_format(
    preencoded_user: Path, tmp_path: Path
) -> None:
    schema = tmp_path / "refine.yaml"
    schema.write_text(
        "encoding: preencoded\nrequired: [caption.txt]\nmembers:\n"
        "  pooled_prompt_embeds.pth: {kind: tensor, shape: [16], field: pooled}\n"
        "  caption.txt: {kind: text}\n"
    )
    ctx = _context(tmp_path, preencoded_user, schema)
    assert ctx.format_problem() is None
    refined = ctx.workspace.schema(None)
    assert refined.members["pooled_prompt_embeds.pth"].field == "pooled"  # the schema's spec
    assert refined.members["latents.pth"].shape == tuple(SMALL_SHAPES["latents"])  # inferred, kept
    assert list(refined.members) == [
        "latents.pth",
        "prompt_embeds.pth",
        "pooled_prompt_embeds.pth",
        "caption.txt",
    ]
    assert refined.required == ("caption.txt",)
    assert ctx.formats()["checked"] == [
        {"encoding": "preencoded", "source": f"inferred from {preencoded_user}, refined by schema {schema}"}
    ]


@pytest.mark.parametrize(
    ("schema_text", "expected"),
    [
        (
            "encoding: preencoded\nmembers:\n  t5.bytes: {kind: npy, shape: [4], dtype: float16}\n",
            r"describes member\(s\) \['t5.bytes'\] that the dataset's samples do not have",
        ),
        (
            "encoding: other\nmembers:\n  latents.pth: {kind: tensor, shape: [4, 8, 8]}\n",
            "the schema's encoding 'other' is not the dataset's \\('preencoded'",
        ),
        (
            "encoding: preencoded\nmembers:\n  latents.pth: {kind: image, size: [8, 8], format: png}\n",
            "member 'latents.pth' of the dataset's first sample does not read as the schema's image",
        ),
    ],
)
def test_a_schema_that_disagrees_with_the_dataset_is_a_usage_error(
    preencoded_user: Path, tmp_path: Path, schema_text: str, expected: str
) -> None:
    schema = tmp_path / "bad.yaml"
    schema.write_text(schema_text)
    problem = _context(tmp_path, preencoded_user, schema).format_problem()
    assert problem is not None and re.search(expected, problem), problem
    assert problem.startswith(f"--conformance-schema {schema} with --conformance-dataset {preencoded_user}")


def test_the_pair_that_disagrees_stops_the_run_with_exit_4(preencoded_user: Path, tmp_path: Path) -> None:
    schema = tmp_path / "bad.yaml"
    schema.write_text("encoding: preencoded\nmembers:\n  t5.bytes: {kind: npy, shape: [4], dtype: float16}\n")
    run = run_pytest(
        tmp_path,
        "--task-encoder=primus_energon:EncodedDiffusionTaskEncoder",
        f"--conformance-dataset={preencoded_user}",
        f"--conformance-schema={schema}",
        "--conformance-profile=quick",
    )
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "that the dataset's samples do not have" in run.stdout + run.stderr


# --- a target that cooks the user's samples but not their derived copies: inconclusive, never a defect ---


@pytest.mark.slow
def test_a_target_that_cannot_cook_derived_copies_is_inconclusive_not_failed(tmp_path: Path) -> None:
    """Keys ``img_<n>``: the target cooks every sample of the user's dataset, and no copy the suite derives
    (re-keyed): the claims on the user's own data pass, those that need derived data are inconclusive
    with the reason, the run exits 0 (1 with --conformance-strict)."""
    dataset = tmp_path / "mine"
    generate_dataset(dataset, shapes=SMALL_SHAPES, num_samples=8, shard_size=8, key_prefix="img")
    target = "--task-encoder=tests.conformance_zoo.user_data:KeyNumberTaskEncoder"
    properties = (
        "--conformance-property=accepted",
        "--conformance-property=keys",
        "--conformance-property=resume",
        "--conformance-property=sharding",
    )
    run, report = suite(tmp_path / "run", dataset, target, *properties)
    assert run.returncode == 0, run.stdout[-4000:]
    claims = claims_of(report)
    verdicts = {claim_id: c["verdict"] for (_, claim_id), c in claims.items()}
    assert verdicts["accepted/loads"] == "pass" and verdicts["accepted/complete_epoch"] == "pass"
    assert {v for k, v in verdicts.items() if k.startswith("keys/")} <= {"pass", "skip"}  # on the user's data
    for claim_id in ("resume/checkpoint", "sharding/in_process"):
        assert verdicts[claim_id] == "inconclusive", (
            claim_id,
            claims[next(k for k in claims if k[1] == claim_id)],
        )
    message = next(c["message"] for (_, claim_id), c in claims.items() if claim_id == "resume/checkpoint")
    # the probe tries a copy whose values the derivation edited (the checks use those), here repeat 1 of img_000000
    assert re.search(r"the target cooks your sample 'img_000000' but not its copy 'resume_\d+'", message), (
        message
    )
    assert "its values edited inside their own format" in message
    assert "keys in our datasets are img_<number>" in message
    assert not [k for k, v in verdicts.items() if v in ("fail", "error")]
    assert "inconclusive" in run.stdout and report["inconclusive"]
    strict, _ = suite(tmp_path / "strict", dataset, target, *properties, "--conformance-strict")
    assert strict.returncode == 1


def test_the_derived_datasets_are_removed_after_the_run_unless_kept(
    preencoded_user: Path, tmp_path: Path
) -> None:
    """Derived from large samples they take gigabytes, and pytest keeps its last three temporary folders:
    the run removes each target's datasets at its end; --conformance-keep-data keeps them."""
    for keep in (False, True):
        basetemp = tmp_path / f"base-{keep}"
        run = run_pytest(
            tmp_path,
            "--task-encoder=primus_energon:EncodedDiffusionTaskEncoder",
            f"--conformance-dataset={preencoded_user}",
            "--conformance-profile=quick",
            "--conformance-property=resume",
            f"--basetemp={basetemp}",
            *(["--conformance-keep-data"] if keep else []),
        )
        assert run.returncode == 0, run.stdout[-3000:]
        # the header and the summary say the data is derived, and from how many of the user's samples
        assert f"conformance data: your dataset {preencoded_user};" in run.stdout
        assert (
            f"1 dataset(s) derived from 4 of your samples of {preencoded_user}: resume (24 samples)"
            in run.stdout
        )
        derived = sorted(p.name for p in basetemp.glob("conformance-*/*") if (p / "manifest.json").exists())
        if keep:
            assert derived and all("-resume-derived-" in name for name in derived), derived
        else:
            assert derived == [], derived
