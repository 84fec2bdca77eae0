"""The project on every Energon release it supports, each in an environment of its own as its users have it:
5.2.0 (NeMo's pin), 6.0.1 with multi-storage-client 0.34 and the av-decode extra (DFM's lock), 7.0.0 with
multi-storage-client 0.x, beside the default 7.4 of this environment.

Each environment is built once (torch from the CPU build on disk, then the release, then this project
*with its dependencies resolved*, as ``pip install primus-energon`` would) and cached under
``.venv/energon-releases/`` (``PRIMUS_ENERGON_RELEASE_ENVS`` moves it). In each:
- installing the project keeps the release and its multi-storage-client;
- the run's header names the release that judged the code;
- the reference TaskEncoder, cooker and wrapper pass the quick profile;
- ``primus-synth generate``, ``finalize``, ``validate``, ``info`` and ``preview`` work;
- on 5.2.0 and 6.0.1, a DiT-style TaskEncoder written for 6.x (reads ``__subflavor__``, lets the dataset
  decode, shuffles its packs with the unseeded global ``random``, as DFM's does) gets exactly its real
  findings, and its fixed twin passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import filelock
import pytest

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints" / "test.txt"

#: release -> what else its users' environments pin (6.0.1: DFM's lock; the newest bitstring lacks the
#: ConstBitStream Energon 6's AV decoding imports)
RELEASES = {
    "5.2.0": (),
    "6.0.1": (
        "multi-storage-client==0.34.*",
        "megatron-energon[av-decode]==6.0.1",
        "av==15.1.*",
        "bitstring==4.3.*",
    ),
    "7.0.0": ("multi-storage-client<1",),
}

pytestmark = pytest.mark.slow


def _envs_root() -> Path:
    return Path(os.environ.get("PRIMUS_ENERGON_RELEASE_ENVS", ROOT / ".venv" / "energon-releases"))


def _pip(python: Path, *args: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
        check=True,
        timeout=1200,
    )


def _versions(python: Path) -> dict[str, str]:
    code = (
        "import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
        "('megatron-energon', 'multi-storage-client')}))"
    )
    return json.loads(
        subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    )


@pytest.fixture(scope="module", params=list(RELEASES))
def release_env(request: pytest.FixtureRequest) -> tuple[str, Path, dict[str, str], dict[str, str]]:
    """``(release, python, versions before installing the project, after)``."""
    release = request.param
    folder = _envs_root() / release
    python = folder / "bin" / "python"
    stamp = folder / ".ready.json"
    folder.parent.mkdir(parents=True, exist_ok=True)
    # one builder at a time (pytest-xdist runs this module's tests in two processes)
    with filelock.FileLock(str(folder) + ".lock", timeout=3600):
        if not stamp.is_file():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True)
            _pip(python, "-c", str(CONSTRAINTS), "torch==2.13.0")
            _pip(python, "-c", str(CONSTRAINTS), f"megatron-energon=={release}", *RELEASES[release])
            before = _versions(python)
            # the project with its dependencies resolved, as a user's `pip install primus-energon` would
            _pip(python, "-c", str(CONSTRAINTS), "-e", f"{ROOT}[test]")
            stamp.write_text(json.dumps({"before": before, "after": _versions(python), "root": str(ROOT)}))
        recorded = json.loads(stamp.read_text())
        if recorded.get("root") != str(ROOT):  # built from another checkout: point it at this one
            _pip(python, "--no-deps", "-e", str(ROOT))
            stamp.write_text(json.dumps({**recorded, "root": str(ROOT)}))
    return release, python, recorded["before"], recorded["after"]


def _run(python: Path, *args: str, cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PRIMUS_CONFORMANCE"))}
    env["PYTHONDONTWRITEBYTECODE"] = ""
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1500, check=False
    )


def _quick_profile(
    python: Path, tmp_path: Path, *targets: str, pythonpath: str | None = None
) -> tuple[subprocess.CompletedProcess, Path]:
    """The quick profile on ``targets`` (``--task-encoder=...`` options) from an empty folder, with a report."""
    report = tmp_path / "report"
    run = _run(
        python,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--conformance-profile=quick",
        f"--conformance-report={report}",
        *targets,
        cwd=tmp_path,
        pythonpath=pythonpath,
    )
    return run, report


def _claims(report: Path) -> dict[str, dict[str, str]]:
    document = json.loads((report / "report.json").read_text())
    out: dict[str, dict[str, str]] = {}
    for result in document["results"]:
        for claim in result["claims"]:
            out.setdefault(result["target"], {})[claim["id"]] = claim["verdict"]
    return out


def test_installing_keeps_the_release(release_env: tuple) -> None:
    release, _, before, after = release_env
    assert before["megatron-energon"] == release
    assert after == before, f"installing primus-energon changed the environment: {before} -> {after}"


def test_reference_targets_pass_the_quick_profile(release_env: tuple, tmp_path: Path) -> None:
    release, python, _, _ = release_env
    run, report = _quick_profile(
        python,
        tmp_path,
        "--task-encoder=primus_energon:EncodedDiffusionTaskEncoder",
        "--cooker=primus_energon:RAW_COOKER",
        "--wrapper=primus_energon:MegatronDataloaderWrapper",
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"megatron-energon {release}" in run.stdout  # the header names the release that judged
    claims = _claims(report)
    assert set(claims) == {
        "primus_energon:EncodedDiffusionTaskEncoder",
        "primus_energon:RAW_COOKER",
        "primus_energon:MegatronDataloaderWrapper",
    }
    for target, verdicts in claims.items():
        assert "fail" not in verdicts.values(), (target, verdicts)
        assert list(verdicts.values()).count("pass") >= 5, (target, verdicts)


def test_dataset_tools_work(release_env: tuple, tmp_path: Path) -> None:
    release, python, _, _ = release_env
    bin_dir = python.parent
    data = tmp_path / "data"
    steps = [
        [bin_dir / "primus-synth", "generate", "--samples", "16", "--shard-size", "8", "--no-progress", data],
        [bin_dir / "primus-energon", "validate", data],
        [bin_dir / "primus-energon", "info", data],
        [bin_dir / "primus-energon", "preview", data],
    ]
    for step in steps:
        run = subprocess.run([str(part) for part in step], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, (release, step, run.stdout[-2000:], run.stderr[-2000:])
        assert "Traceback" not in run.stderr, (release, step, run.stderr[-2000:])
    # finalize an unprepared copy: the release's own prepare, then the checks
    for meta in (data / ".nv-meta").iterdir():
        meta.unlink()
    (data / ".nv-meta").rmdir()
    run = subprocess.run(
        [str(bin_dir / "primus-energon"), "finalize", "--encoding", "preencoded", str(data)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0 and "ready for training" in run.stdout, (
        run.stdout[-2000:],
        run.stderr[-2000:],
    )
    assert "WARNING" not in run.stdout, run.stdout[-2000:]


def test_dit_style_taskencoder_for_6x_gets_its_real_findings_only(release_env: tuple, tmp_path: Path) -> None:
    release, python, _, _ = release_env
    if release.startswith("7."):
        pytest.skip("a 6.x TaskEncoder reads __subflavor__, which Energon 7 removed")
    run, report = _quick_profile(
        python,
        tmp_path,
        "--task-encoder=tests.conformance_zoo.energon6:DiTStyleTaskEncoder",
        "--task-encoder=tests.conformance_zoo.energon6:SafeDiTStyleTaskEncoder",
        "--task-encoder=tests.conformance_zoo.energon6:SafeDecoderDiTStyleTaskEncoder",
        pythonpath=str(ROOT),
    )
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-2000:]
    claims = _claims(report)
    dit = claims["tests.conformance_zoo.energon6:DiTStyleTaskEncoder"]
    failed = {claim for claim, verdict in dit.items() if verdict == "fail"}
    # the unseeded pack shuffle (a run and its restore, two fresh processes) and the release's decoding
    assert "bad_input/code_execution" in failed
    assert "determinism/fresh_processes" in failed or "packing/resume" in failed
    assert failed <= {
        "bad_input/code_execution",
        "determinism/fresh_processes",
        "packing/resume",
        "packing/determinism",
    }
    for fixed in ("SafeDiTStyleTaskEncoder", "SafeDecoderDiTStyleTaskEncoder"):
        verdicts = claims[f"tests.conformance_zoo.energon6:{fixed}"]
        assert "fail" not in verdicts.values() and "inconclusive" not in verdicts.values(), (fixed, verdicts)
        assert verdicts["bad_input/code_execution"] == "pass", (fixed, verdicts)
    assert "inconclusive" not in dit.values()


_MEMBER_FORMS = r"""
import sys
from megatron.energon import Cooker, DefaultTaskEncoder, basic_sample_keys, stateless
from primus_energon import get_loader
from primus_energon.decoding import SafeSampleDecoder
from primus_energon.synthetic import generate_dataset

generate_dataset(sys.argv[1], encoding="preencoded", num_samples=4, shard_size=4, seed=0)

@stateless
def cook(sample):
    return {"__key__": sample["__key__"], "form": type(sample["latents.pth"]).__name__}

class Undeclared(DefaultTaskEncoder):
    cookers = [Cooker(cook)]
    @stateless
    def batch(self, samples):
        return [s["form"] for s in samples]

class Bytes(Undeclared):
    decoder = None

class Safe(Undeclared):
    decoder = SafeSampleDecoder()

for encoder in (Undeclared, Bytes, Safe):
    loader = get_loader(sys.argv[1], encoder, batch_size=4, num_workers=0)
    print(encoder.__name__, next(iter(loader))[0])
    loader.close()
"""


def test_a_declared_decoder_decides_on_every_release(release_env: tuple, tmp_path: Path) -> None:
    """None: the cooker gets the members' bytes; SafeSampleDecoder: tensors it decoded; nothing declared:
    what the release does in training (its default decoding, tensors, on every release)."""
    release, python, _, _ = release_env
    script = tmp_path / "forms.py"
    script.write_text(_MEMBER_FORMS)
    run = _run(python, str(script), str(tmp_path / "data"), cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    forms = dict(
        line.split() for line in run.stdout.splitlines() if line.startswith(("Undeclared", "Bytes", "Safe"))
    )
    assert forms == {"Undeclared": "Tensor", "Bytes": "bytes", "Safe": "Tensor"}, (release, forms)


def test_the_compatibility_rules_hold_on_the_release(release_env: tuple) -> None:
    """tests/test_energon_compat.py, in the release's environment."""
    release, python, _, _ = release_env
    run = _run(
        python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_energon_compat.py", cwd=ROOT
    )
    assert run.returncode == 0, (release, run.stdout[-3000:], run.stderr[-2000:])
