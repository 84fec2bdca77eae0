"""nox sessions. Each session installs torch pinned to the CPU build on disk (constraints/test.txt).

nox -s tests       the test suite, in parallel (pytest-xdist), with a junit report
nox -s lint        ruff check and ruff format --check
nox -s energon_matrix   tests and the quick conformance profile on Energon 7.0.0, 7.3.2 and 7.4.1
nox -s energon_msc_trap Energon 7.0.0 with multi-storage-client 1.x: the suite exits 4 with one line naming the fix
nox -s energon_releases the project in its users' environments: Energon 5.2.0, 6.0.1 (DFM's lock) and 7.0.0
                   (tests/test_energon_releases.py, also in the slow tier)
nox -s demo        the end-to-end demo (examples/demo.py)
nox -s fuzz        mutated shards against validate and the safe readers for 10 minutes (-- SECONDS)
nox -s docs        the documentation, built offline with mkdocs --strict into site/
nox -s remote_speed     validate over object storage vs a plain boto3 read, and torchrun scaling 1 -> 4 ranks
nox -s mutation    mutation analysis: defects put into copies of the reference targets, killed by which claims
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox
from nox.virtualenv import PassthroughEnv

nox.options.sessions = ["lint", "tests"]

#: The reference targets `nox -s conformance` checks when it is given no target of its own.
REFERENCE_TARGETS = (
    "--cooker=primus_energon:PREENCODED_COOKER",
    "--cooker=primus_energon:PREENCODED_ZERO_COPY_COOKER",
    "--cooker=primus_energon:RAW_COOKER",
    "--task-encoder=primus_energon:EncodedDiffusionTaskEncoder",
    "--task-encoder=primus_energon:RawDiffusionTaskEncoder",
    "--task-encoder=primus_energon:MultiFormatTaskEncoder",
    "--wrapper=primus_energon:MegatronDataloaderWrapper",
)
nox.options.reuse_existing_virtualenvs = True

CONSTRAINTS = ("-c", "constraints/test.txt")


def _install(session: nox.Session, extras: str = "test") -> None:
    if not _own_venv(session):
        return  # nox --no-venv --no-install: the interpreter nox runs in has everything (make conformance)
    session.install(*CONSTRAINTS, "torch")
    session.install(*CONSTRAINTS, "-e", f".[{extras}]")


def _own_venv(session: nox.Session) -> bool:
    """False under ``nox --no-venv`` (``make conformance``): the session runs in nox's own interpreter,
    the project's ``.venv``, which already has torch and this project; nothing is installed again."""
    return not isinstance(session.virtualenv, PassthroughEnv)


def _python(session: nox.Session) -> str:
    """The interpreter of the session: its virtualenv's, or nox's own under ``--no-venv``."""
    return "python" if _own_venv(session) else sys.executable


def _bytecode_cache(session: nox.Session) -> dict[str, str]:
    """Environment for sessions that start many Python processes: bytecode (and pytest's rewritten
    modules) cached in the session's virtualenv, even where PYTHONDONTWRITEBYTECODE is set; without it,
    each process compiles the project and rewrites hypothesis afresh (about 2 s a pytest process)."""
    location = session.virtualenv.location if _own_venv(session) else sys.prefix
    return {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": f"{location}/pycache"}


@nox.session(python="3.11")
def conformance(session: nox.Session) -> None:
    """Check the reference targets, or the targets given after `--`; report in reports/conformance/."""
    _install(session)
    own_targets = any(a.startswith(("--cooker", "--task-encoder", "--wrapper")) for a in session.posargs)
    targets = () if own_targets else REFERENCE_TARGETS
    session.run(
        _python(session),
        "-m",
        "pytest",
        "-n",
        "2",
        "-p",
        "no:cacheprovider",
        "--conformance-report=reports/conformance",
        *targets,
        *session.posargs,
        env=_bytecode_cache(session),
    )


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """Run the test suite, both tiers (as CI does), with xdist; extra arguments go to pytest
    (`nox -s tests -- -m "not slow"`: the fast tier, as `make test`)."""
    _install(session)
    session.run(
        "pytest", "-n", "auto", "--junitxml=reports/junit.xml", *session.posargs, env=_bytecode_cache(session)
    )


#: Energon releases the library and the suite are tested on; 7.0-7.2 resolve local paths through
#: multi-storage-client's "default" profile, which multi-storage-client 1.0 removed.
ENERGON_MATRIX = {
    "7.0.0": ("multi-storage-client<1",),
    "7.3.2": (),
    "7.4.1": (),
}


@nox.session(python="3.11")
@nox.parametrize("energon", list(ENERGON_MATRIX))
def energon_matrix(session: nox.Session, energon: str) -> None:
    """The test suite and the quick conformance profile on one Energon release (7.0.0, 7.3.2, 7.4.1)."""
    _install(session)
    session.install(*CONSTRAINTS, f"megatron-energon=={energon}", *ENERGON_MATRIX[energon])
    session.run(
        "pytest", "-n", "auto", "-p", "no:cacheprovider", *session.posargs, env=_bytecode_cache(session)
    )
    session.run(
        "pytest",
        "-p",
        "no:cacheprovider",
        "--conformance-profile=quick",
        "--task-encoder=primus_energon:EncodedDiffusionTaskEncoder",
        "--cooker=primus_energon:RAW_COOKER",
    )


@nox.session(python="3.11")
def energon_releases(session: nox.Session) -> None:
    """The project in environments that hold Energon 5.2.0, 6.0.1 or 7.0.0 first (each built once and cached
    under .venv/energon-releases/): installing keeps the release; the reference targets pass the quick
    profile; the dataset tools work; a 6.x DiT-style TaskEncoder gets its real findings only."""
    _install(session)
    session.run(
        _python(session),
        "-m",
        "pytest",
        "-n",
        "2",
        "-p",
        "no:cacheprovider",
        "tests/test_energon_releases.py",
        *session.posargs,
        env=_bytecode_cache(session),
    )


@nox.session(python="3.11")
def fuzz(session: nox.Session) -> None:
    """The shard fuzzer (tests/fuzz_shards.py) for longer than CI runs it: `nox -s fuzz -- SECONDS [SEED]`
    (default 600 s, a random seed); a shard that breaks an invariant is kept in reports/fuzz/."""
    _install(session)
    seconds = session.posargs[0] if session.posargs else "600"
    env = {"FUZZ_SECONDS": seconds, "FUZZ_EXAMPLES": "100", "FUZZ_FINDINGS": "reports/fuzz"}
    if len(session.posargs) > 1:
        env["FUZZ_SEED"] = session.posargs[1]
    session.run("pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/fuzz_shards.py", env=env)


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """The documentation (docs/, mkdocs.yml) built offline with `mkdocs build --strict` into site/: any
    warning (a broken link or anchor, a page left out of the nav) fails; the claim reference is generated
    from the code at build time."""
    _install(session, "test,docs")
    session.run("mkdocs", "build", "--strict", "-d", "site", env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(python="3.11")
def energon_msc_trap(session: nox.Session) -> None:
    """megatron-energon 7.0.0 beside multi-storage-client 1.x (what an unconstrained install resolves), which
    cannot open local paths: the suite refuses in one line, exit 4, naming the fix."""
    _install(session)
    session.install(*CONSTRAINTS, "megatron-energon==7.0.0", "multi-storage-client>=1")
    output = session.run(
        "pytest",
        "-p",
        "no:cacheprovider",
        "--conformance-profile=quick",
        "--cooker=primus_energon:RAW_COOKER",
        success_codes=[4],
        silent=True,
    )
    errors = [line for line in (output or "").splitlines() if line.startswith("ERROR:")]
    if len(errors) != 1 or "pip install 'multi-storage-client<1'" not in errors[0]:
        session.error(f"expected one usage-error line naming the fix, got: {output}")


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff: lint rules and formatting."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    """The end-to-end demo on generated data; extra arguments go to `python examples/demo.py`."""
    _install(session)
    session.run("python", "examples/demo.py", *session.posargs)


@nox.session(python="3.11")
def benchmark(session: nox.Session) -> None:
    """CPU throughput: every pipeline against the ceilings, in fresh processes; results in reports/benchmarks/."""
    _install(session, extras="bench")
    session.run(
        "pytest",
        "benchmarks/test_throughput.py",
        "--benchmark-only",
        "--benchmark-json=reports/benchmarks/pytest-benchmark.json",
    )
    session.run(
        "python",
        "-m",
        "benchmarks.throughput",
        "--json",
        "reports/benchmarks/throughput.json",
        *session.posargs,
    )


@nox.session(venv_backend="none")
def gpu_benchmark(session: nox.Session) -> None:
    """Loader -> pinned -> device vs the pinned-copy ceiling, stall %. Runs in the current environment, which
    needs a CUDA build of torch; skips, with the reason, where torch sees no GPU."""
    Path("reports/benchmarks").mkdir(parents=True, exist_ok=True)
    session.run("python", "-m", "benchmarks.gpu", "--json", "reports/benchmarks/gpu.json", *session.posargs)


@nox.session(python="3.11")
def conformance_speed(session: nox.Session) -> None:
    """Wall seconds of the conformance suite on each of the zoo's correct targets, ci and quick profiles,
    against the speed targets (median 45 s / 20 s per target); results in reports/benchmarks/. Extra
    arguments go to `python -m benchmarks.bench_conformance` (e.g. `-- --profile quick`)."""
    _install(session)
    session.run(
        "python",
        "-m",
        "benchmarks.bench_conformance",
        "--out",
        "reports/benchmarks/conformance_speed.json",
        *session.posargs,
    )


@nox.session(python="3.11")
def remote_speed(session: nox.Session) -> None:
    """validate over msc:// (a loopback S3 server) beside a plain boto3 read of the same objects, and
    torchrun validate on 1, 2 and 4 ranks; results in reports/benchmarks/remote.json. Extra arguments go to
    `python -m benchmarks.bench_remote`."""
    _install(session)
    session.run(
        "python", "-m", "benchmarks.bench_remote", "--out", "reports/benchmarks/remote.json", *session.posargs
    )


@nox.session(python="3.11")
def mutation(session: nox.Session) -> None:
    """Mutation analysis of the reference targets: every mutant (a defect put into a temporary copy of a
    reference cooker, TaskEncoder or wrapper) checked by the suite in a fresh process, one at a time, quick
    profile; the matrix mutant x claim, the kill rates and the survivors in reports/mutation/REPORT.md.
    Extra arguments go to `python -m benchmarks.mutation` (e.g. `-- --operator cast_tensor`,
    `-- --out benchmarks/mutation` for the committed report)."""
    _install(session)
    session.run("python", "-m", "benchmarks.mutation", *session.posargs, env=_bytecode_cache(session))
