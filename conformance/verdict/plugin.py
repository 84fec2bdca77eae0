"""The pytest plugin (entry point ``pytest11``): ``pytest --cooker MODULE:ATTR`` / ``--task-encoder`` /
``--wrapper``.

Without those options it does nothing, and costs nothing: loading it imports pytest and the standard
library only (torch, Energon, hypothesis and the suite load when a target option is given). With them,
pytest collects the conformance suite (one test per property and target) instead of the current
directory's tests.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..core.options import RunOptions
from ..core.profiles import PROFILES

__all__ = [
    "pytest_addoption",
    "pytest_configure",
    "pytest_load_initial_conftests",
    "option_dest",
    "claim_expectations",
    "run_options",
    "supervised_target",
    "scratch_folder",
]

SUITE = Path(__file__).parent / "suite" / "test_conformance.py"
SUITE_MODULE = __name__.rpartition(".")[0] + ".suite.test_conformance"
#: the suite's packages, from its own folder to the package root (``suite/``, ``verdict/``, ``conformance/``)
_SUITE_FOLDERS = (SUITE.parent, SUITE.parent.parent, SUITE.parent.parent.parent)
_RESULTS_KEY = pytest.StashKey[list]()
#: the run's own temporary folder (hypothesis's cache, pytest-benchmark's storage), removed at the end
_SCRATCH_KEY = pytest.StashKey[Path]()
#: pytest-benchmark's default storage: a folder in the directory pytest runs in
_BENCHMARK_DEFAULT_STORAGE = "file://./.benchmarks"
_CLAIM_XFAILS_KEY = pytest.StashKey[dict]()
#: (kind, normalized spec) -> SupervisedTarget: the targets' supervised processes
_TARGETS_KEY = pytest.StashKey[dict]()
#: Results reported on this (controller) process, in report order.
_collected: list[dict[str, Any]] = []


_GROUP = ("conformance", "Energon cooker/TaskEncoder conformance (primus-energon)")

#: Options whose short names other plugins and conftests commonly use too (``--dataset`` above all). pytest
#: refuses to start when two plugins add one option name, so each is registered as ``--conformance-NAME``,
#: and as ``--NAME`` only if nothing else has taken that name by the time the initial conftests are loaded
#: (see :func:`pytest_load_initial_conftests`). Installing this package never breaks another test suite.
_SHORTENABLE: dict[str, dict[str, Any]] = {
    "encoding": {
        "default": None,
        "metavar": "NAME",
        "help": "generate data of this encoding instead of the one the cooker's has_subflavors asks for",
    },
    "schema": {
        "action": "append",
        "default": [],
        "metavar": "FILE",
        "help": "generate data from this YAML/JSON schema (a custom format; repeatable, one file per format "
        "a TaskEncoder cooks)",
    },
    "dataset": {
        "default": None,
        "metavar": "PATH",
        "help": "check on this prepared dataset (read only) instead of generated data",
    },
    "input-form": {
        "default": "bytes",
        "choices": ["bytes", "decoded"],
        "help": "what a cooker target receives: member bytes (default) or safely decoded values",
    },
    "xfails-file": {
        "default": None,
        "metavar": "FILE",
        "help": "property ids (substrings of test ids) expected to fail, one per line, '# reason' allowed",
    },
    "min-samples-per-s": {
        "default": None,
        "type": float,
        "metavar": "RATE",
        "help": "make the throughput property fail below this loader rate",
    },
}


def option_dest(name: str) -> str:
    """Where the value of ``--conformance-NAME`` (or its short form ``--NAME``) lands: ``config.getoption``."""
    return "conformance_" + name.replace("-", "_")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(*_GROUP)
    group.addoption(
        "--cooker",
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="check this Energon Cooker or @stateless cook function, or the one MODULE:FACTORY(NAME=VALUE, ...) "
        "returns (literal values only; repeatable)",
    )
    group.addoption(
        "--task-encoder",
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="check this TaskEncoder instance, or class built as MODULE:Class(NAME=VALUE, ...) (literal values "
        "only; no arguments: Class()); repeatable",
    )
    group.addoption(
        "--wrapper",
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="check this dataloader wrapper class, built as Wrapper(loader, NAME=VALUE, ...) from "
        "MODULE:Wrapper(NAME=VALUE, ...) (repeatable)",
    )
    for name, attrs in _SHORTENABLE.items():
        help_text = f"{attrs['help']} (also --{name} unless another plugin has taken it)"
        group.addoption(f"--conformance-{name}", dest=option_dest(name), **{**attrs, "help": help_text})
    group.addoption(
        "--conformance-profile",
        default="ci",
        choices=sorted(PROFILES),
        help="how hard to search: quick, ci (default; derandomized), thorough",
    )
    group.addoption(
        "--conformance-seed", default=0, type=int, metavar="N", help="seed for data and loaders (default 0)"
    )
    group.addoption(
        "--conformance-property",
        action="append",
        default=[],
        metavar="ID",
        help="run only this property (repeatable; e.g. bad_input); unlike -k it never matches target names",
    )
    group.addoption(
        "--conformance-strict",
        action="store_true",
        default=False,
        help="advice (opinions about style, e.g. an error message without the sample key) and inconclusive "
        "claims (the suite could not exercise them) fail the run too",
    )
    group.addoption(
        "--conformance-packing-buffer-size",
        default=None,
        type=int,
        metavar="N",
        help="packing_buffer_size of the loaders that pack (default: the TaskEncoder's own packing_buffer_size "
        "attribute, else 8)",
    )
    group.addoption(
        "--conformance-batch-size",
        default=None,
        type=int,
        metavar="N",
        help="batch size (packs per batch) of the loaders that pack, for a batch() that takes a fixed number "
        "of packs (default 2)",
    )
    group.addoption(
        "--conformance-report",
        default=None,
        metavar="DIR",
        help="write junit.xml, report.json and report.md into DIR",
    )
    group.addoption(
        "--resume-hooks",
        default=None,
        metavar="SAVE,LOAD",
        help="the checkpoint functions your trainer persists and reloads each rank's loader state with, "
        "MODULE:FUNC each, called as save(loader, directory, rank) and load(loader, directory, rank); the "
        "restart property then saves and restores through them, also across changed world sizes, seeds, "
        "worker counts, batch sizes and shards",
    )
    group.addoption(
        "--conformance-call-timeout",
        default=60.0,
        type=float,
        metavar="S",
        help="seconds one call into the target (a cook, a TaskEncoder stage, each batch of a loader, a wrapper's "
        "next()) may take; past it the call is reported as a hang, with the stack of the stuck thread (default 60)",
    )
    group.addoption(
        "--conformance-property-timeout",
        default=1200.0,
        type=float,
        metavar="S",
        help="seconds one property may take in all before it is reported as a hang (default 1200)",
    )
    group.addoption(
        "--conformance-transform",
        action="append",
        default=[],
        metavar="'FIELD: KIND ...'",
        help="a deliberate transform of an output field, checked as declared instead of failing as changed data: "
        "'caption: dropout rate=0.1 to=\"\"', 'latents: flip axis=-1 rate=0.5', 'prompt_embeds: truncate "
        "axis=0 length=77', 'latents: cast dtype=bfloat16' (repeatable; also conformance_transforms in "
        "[tool.pytest.ini_options], one per line; a field given here replaces the ini's)",
    )
    parser.addini(
        "conformance_transforms",
        type="linelist",
        default=[],
        help="deliberate transforms of output fields, one per line (see --conformance-transform)",
    )
    group.addoption(
        "--conformance-keep-data",
        action="store_true",
        default=False,
        help="keep the datasets the suite generated or derived from yours (under pytest's temporary folder) "
        "after the run; by default they are removed at the end of the run (derived from a large dataset, they "
        "can take gigabytes)",
    )


def _taken_option_names(parser: pytest.Parser) -> set[str]:
    # pytest has no public way to list registered options; these attributes have been stable since pytest 3.
    groups = [parser._anonymous, *parser._groups]
    return {name for group in groups for option in group.options for name in option.names()}


@pytest.hookimpl(hookwrapper=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Iterator[None]:
    """After the initial conftests have added their options, add the short forms nobody has taken."""
    yield
    taken = _taken_option_names(parser)
    group = parser.getgroup(*_GROUP)
    for name, attrs in _SHORTENABLE.items():
        if f"--{name}" not in taken:
            group.addoption(
                f"--{name}", dest=option_dest(name), **{**attrs, "help": f"= --conformance-{name}"}
            )


def _active(config: pytest.Config) -> bool:
    return any(config.getoption(option, None) for option in ("cooker", "task_encoder", "wrapper"))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _active(config):
        return
    _keep_out_of_the_users_folder(config)
    _end_on_sigterm()
    # The supervised processes start first: each checks the environment, imports torch and Energon and
    # builds its target while this process checks the options, on the other core.
    _launch_targets(config)
    try:
        _check_usage(config)
    except BaseException:
        _close_targets(config)
        raise
    problems = _targets_started(config)
    if problems:
        _close_targets(config)
        raise pytest.UsageError("\n".join(problems))
    config.stash[_RESULTS_KEY] = []
    # Collect the suite instead of the invocation directory's own tests.
    config.args[:] = [str(SUITE)]
    report_dir = config.getoption("conformance_report")
    if report_dir and not config.option.xmlpath:
        Path(report_dir).mkdir(parents=True, exist_ok=True)
        config.option.xmlpath = str(Path(report_dir) / "junit.xml")
    config.addinivalue_line("markers", "conformance_property(id): a conformance property check")
    config.addinivalue_line(
        "markers", "xdist_group(name): pytest-xdist --dist loadgroup keeps a group on one worker"
    )
    # Energon always asks for pinned memory; without an accelerator torch warns once per loader.
    config.addinivalue_line("filterwarnings", "ignore:.*pin_memory.*:UserWarning")


def _keep_out_of_the_users_folder(config: pytest.Config) -> None:
    """Nothing but the report asked for goes into the folder the user runs in: hypothesis's cache (the
    suite's profiles keep no example database; hypothesis still caches character tables in
    ``.hypothesis/``) and pytest-benchmark's storage (``.benchmarks/``, made at start-up even when no
    benchmark runs) go into a temporary folder, removed when pytest ends; also for the suite's child
    processes. A place the user chose (HYPOTHESIS_STORAGE_DIRECTORY, --benchmark-storage) is kept."""
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="conformance-scratch-"))
    config.stash[_SCRATCH_KEY] = scratch
    if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        # hypothesis reads the variable when it first needs its folder (in this process, and in every child);
        # where it was imported already, it may have read it: tell it directly. (Importing it only for this
        # would cost this process a second.)
        os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = str(scratch / "hypothesis")
        configuration = sys.modules.get("hypothesis.configuration")
        if configuration is not None:
            configuration.set_hypothesis_home_dir(scratch / "hypothesis")
    # pytest's temporary folder (the datasets) goes there too, unless the user chose one or asked to keep the
    # datasets. (The supervised processes have a temporary folder of their own: supervision.)
    if not config.getoption("conformance_keep_data") and not config.option.basetemp:
        config.option.basetemp = str(scratch / "basetemp")
    # pytest-benchmark (when installed) builds its storage in its own pytest_configure, after this one
    if getattr(config.option, "benchmark_storage", None) == _BENCHMARK_DEFAULT_STORAGE:
        config.option.benchmark_storage = f"file://{scratch / 'benchmarks'}"


def _end_on_sigterm() -> None:
    """SIGTERM (a CI runner cancelling the job) ends pytest as Ctrl-C does, so that its clean-up runs and
    no supervised process outlives it; a handler the user installed is kept."""
    import signal

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, interrupt)


def pytest_unconfigure(config: pytest.Config) -> None:
    _close_targets(config)
    scratch = config.stash.get(_SCRATCH_KEY, None)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)


class _SuiteModule(pytest.Module):
    """The suite's test module, imported under its installed name (``primus_energon.conformance.verdict.suite...``).

    pytest would import the file by its location instead; in a source checkout, where the folder is
    ``conformance/`` (installed as ``primus_energon.conformance``), that would give it the top-level name
    ``conformance``: a second copy of the suite, colliding with a user's own package of that name."""

    def _getobj(self) -> Any:
        # pytest.Module has no public hook for "this module is already importable by name"; _getobj has
        # been the import point since pytest 3.
        import importlib

        return importlib.import_module(SUITE_MODULE)


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    # The same for the suite's packages: as pytest.Package nodes they would import their __init__ by path.
    if path in _SUITE_FOLDERS and _active(parent.config):
        return pytest.Dir.from_parent(parent, path=path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if module_path == SUITE and _active(parent.config):
        return _SuiteModule.from_parent(parent, path=module_path)
    return None


def run_options(config: pytest.Config, *, transforms: bool = True) -> RunOptions:
    """The run's options from the command line and the ini file: one object for the targets' supervised
    processes (building each target) and for their check contexts. ``transforms=False`` leaves the declared
    transforms out (the targets are launched before the options are checked: a declaration that does not
    parse is a usage error then, :func:`_check_usage`)."""
    return RunOptions(
        profile=config.getoption("conformance_profile"),
        seed=config.getoption("conformance_seed"),
        encoding=config.getoption(option_dest("encoding")),
        schema=config.getoption(option_dest("schema")) or (),
        dataset=config.getoption(option_dest("dataset")),
        min_samples_per_s=config.getoption(option_dest("min-samples-per-s")),
        strict=config.getoption("conformance_strict"),
        resume_hooks=config.getoption("resume_hooks", None),
        transforms=declared_transforms(config) if transforms else (),
        call_timeout_s=config.getoption("conformance_call_timeout"),
        watch=str(config.invocation_params.dir),
        watch_exclude=(str(scratch_folder(config)),),
        keep_data=bool(config.getoption("conformance_keep_data")),
        input_form=config.getoption(option_dest("input-form")),
        packing_buffer_size=config.getoption("conformance_packing_buffer_size"),
        batch_size=config.getoption("conformance_batch_size"),
    )


def declared_transforms(config: pytest.Config) -> list[str]:
    """The declared transforms, one line each: ``conformance_transforms`` of the ini file (pyproject.toml),
    then ``--conformance-transform``; a field declared on the command line replaces the ini's declaration of
    it. ``ValueError`` names a line that does not parse (or a field declared twice in one place)."""
    from ..core.declarations import parse_transforms

    from_ini = parse_transforms(config.getini("conformance_transforms"))
    given = parse_transforms(config.getoption("conformance_transform", None) or [])
    replaced = {t.field for t in given}
    return [str(t) for t in from_ini if t.field not in replaced] + [str(t) for t in given]


def _check_usage(config: pytest.Config) -> None:
    """Refuse, in one line each and with pytest's usage-error status (4), what cannot run at all: an
    unreadable schema, dataset or xfails file, a declaration that does not parse. (What the environment
    lacks and a target that does not import are the supervised processes' answers: :func:`_targets_started`.)"""
    problems: list[str] = []
    try:
        declared_transforms(config)
    except ValueError as error:
        problems.append(f"--conformance-transform: {error}")
    schemas = config.getoption(option_dest("schema")) or []
    if schemas:
        from primus_energon.synthetic import load_schema

        encodings: dict[str, str] = {}
        for schema in schemas:
            try:
                encoding = load_schema(schema).encoding
            except Exception as error:
                problems.append(f"--conformance-schema {schema}: {' '.join(str(error).split())}")
                continue
            if encoding in encodings:
                problems.append(
                    f"--conformance-schema {schema}: encoding {encoding!r} is already described by "
                    f"{encodings[encoding]}; give one schema per format"
                )
            encodings.setdefault(encoding, schema)
    dataset = config.getoption(option_dest("dataset"))
    if dataset:
        from primus_energon.storage import RemoteStorageError, dataset_dir

        try:
            path = dataset_dir(
                dataset
            )  # local, or remote (msc://...): never through pathlib, which breaks URLs
            is_metadataset = path.suffix in (".yaml", ".yml")
            found = path.is_file() if is_metadataset else (path / ".nv-meta" / "dataset.yaml").is_file()
        except RemoteStorageError as error:
            problems.append(f"--conformance-dataset {dataset}: {error}")
            is_metadataset, found = False, True
        if is_metadataset and not found:
            problems.append(f"--conformance-dataset {dataset}: no such metadataset file")
        elif not found:
            problems.append(
                f"--conformance-dataset {dataset}: not a prepared dataset (no .nv-meta/dataset.yaml) and not a "
                "metadataset .yaml; prepare it with `primus-energon finalize DIR --encoding NAME`"
            )
    from ..properties import PROPERTIES

    known = [p.id for p in PROPERTIES]
    for wanted in config.getoption("conformance_property"):
        if wanted not in known:
            problems.append(
                f"--conformance-property {wanted}: no such property; use one of {', '.join(known)}"
            )
    xfails = config.getoption(option_dest("xfails-file"))
    if xfails and not Path(xfails).is_file():
        problems.append(f"--conformance-xfails-file {xfails}: no such file")
    if problems:
        raise pytest.UsageError("\n".join(problems))


def _launch_targets(config: pytest.Config) -> None:
    """Start one supervised process per target (the targets' code never runs in this one) and ask each to
    build its target (:func:`_targets_started` collects the answers)."""
    from ..processes.supervisor import SupervisedTarget

    resolve = run_options(config, transforms=False).target_request()
    folder = config.stash[_SCRATCH_KEY] / "targets"
    targets: dict[tuple[str, str], SupervisedTarget] = {}
    config.stash[_TARGETS_KEY] = targets
    for index, (kind, _, spec) in enumerate(_specs(config)):
        targets[(kind, _normalized(spec))] = SupervisedTarget(
            kind,
            spec,
            resolve=resolve,
            folder=folder / str(index),
            call_timeout_s=config.getoption("conformance_call_timeout"),
            property_timeout_s=config.getoption("conformance_property_timeout"),
        )
    for target in targets.values():  # the workers import in parallel
        target.launch()


def _targets_started(config: pytest.Config) -> list[str]:
    """The launched targets' usage problems, one line each: what the environment lacks to run the suite (a
    missing dependency, an Energon release beside a multi-storage-client that cannot open local paths), with
    its fix, once; else, in the order given, a target that does not import, is of the wrong kind, whose data
    format is unknown, whose resume hooks do not import. (The supervised processes check the environment:
    they import torch and Energon anyway, and this process need not.)"""
    problems, broken = [], []
    for target in config.stash[_TARGETS_KEY].values():
        problem = target.started()
        broken += [line for line in target.environment if line not in broken]
        if problem and not target.environment:
            option = {"cooker": "--cooker", "task_encoder": "--task-encoder", "wrapper": "--wrapper"}[
                target.kind
            ]
            problems.append(f"{option} {target.spec}: {' '.join(problem.split())}")
    return [f"broken environment: {line}" for line in broken] or problems


def _specs(config: pytest.Config) -> list[tuple[str, str, str]]:
    """``(kind, option, spec)`` of every target given."""
    return [
        (kind, option, spec)
        for kind, option in (
            ("cooker", "--cooker"),
            ("task_encoder", "--task-encoder"),
            ("wrapper", "--wrapper"),
        )
        for spec in config.getoption(kind)
    ]


def supervised_target(config: pytest.Config, kind: str, spec: str) -> Any:
    """The :class:`~primus_energon.conformance.processes.supervisor.SupervisedTarget` started for ``spec``."""
    return config.stash[_TARGETS_KEY][(kind, _normalized(spec))]


def scratch_folder(config: pytest.Config) -> Path:
    """The run's own temporary folder (removed when pytest ends)."""
    return config.stash[_SCRATCH_KEY]


def _close_targets(config: pytest.Config) -> None:
    for target in config.stash.get(_TARGETS_KEY, {}).values():
        target.close()


def _claim_ids() -> set[str]:
    from ..properties import all_claims

    return {claim.id for claim in all_claims()}


def claim_expectations(config: pytest.Config) -> dict[str, str]:
    """The ``--xfails-file`` entries that name a claim (``bad_input/names_sample``): claim id -> reason.
    Entries that name tests instead (substrings of test ids) become xfail markers at collection."""
    if _CLAIM_XFAILS_KEY not in config.stash:
        path = config.getoption(option_dest("xfails-file"))
        entries = _read_xfails(path) if path else {}
        known = _claim_ids() if entries else set()
        config.stash[_CLAIM_XFAILS_KEY] = {k: v for k, v in entries.items() if k in known}
    return config.stash[_CLAIM_XFAILS_KEY]


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if not _active(config):
        return None
    from primus_energon.environment import SUPPORTED_RANGE_TEXT, versions  # metadata only: imports nothing

    env = {name: value or "not installed" for name, value in versions().items()}
    return (
        [
            "conformance targets: "
            + ", ".join(
                [f"cooker {c}" for c in config.getoption("cooker")]
                + [f"TaskEncoder {t}" for t in config.getoption("task_encoder")]
                + [f"wrapper {w}" for w in config.getoption("wrapper")]
            ),
            f"conformance profile: {config.getoption('conformance_profile')}, seed {config.getoption('conformance_seed')}; "
            f"judged on megatron-energon {env['megatron-energon']} (supported: {SUPPORTED_RANGE_TEXT}); "
            f"primus-energon {env['primus-energon']}, torch {env['torch']}, "
            f"multi-storage-client {env['multi-storage-client']}, hypothesis {env['hypothesis']}",
        ]
        + _data_header(config)
        + _transforms_header(config)
    )


def _transforms_header(config: pytest.Config) -> list[str]:
    """The declared transforms the verdicts are given under, if any."""
    declared = declared_transforms(config)
    return [f"declared transforms: {'; '.join(declared)}"] if declared else []


def _data_header(config: pytest.Config) -> list[str]:
    dataset = config.getoption(option_dest("dataset"))
    if not dataset:
        return []
    schemas = config.getoption(option_dest("schema")) or []
    refined = f", its format refined by schema {schemas[0]}" if schemas else ""
    return [
        f"conformance data: your dataset {dataset}{refined}; every other dataset a check needs (more shards, "
        "faults, dtype variants, resume, sharding and blend sets) is derived from its samples: copied, re-keyed "
        "and resharded, never generated"
    ]


def _read_xfails(path: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    for raw in Path(path).read_text(encoding="utf-8").splitlines():
        ident, _, reason = raw.partition("#")
        ident = ident.strip()
        if ident:
            entries[ident] = reason.strip() or "listed in the xfails file"
    return entries


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _active(config):
        return
    if not config.getoption(option_dest("xfails-file")):
        return
    entries = _read_xfails(config.getoption(option_dest("xfails-file")))
    claims = claim_expectations(config)
    matched: set[str] = set(claims)
    for item in items:
        for ident, reason in entries.items():
            if ident not in claims and ident in item.nodeid:
                item.add_marker(pytest.mark.xfail(reason=reason, strict=False))
                matched.add(ident)
    unmatched = sorted(set(entries) - matched)
    if unmatched:
        warnings.warn(
            f"--xfails-file {config.getoption(option_dest('xfails-file'))}: these ids match no conformance test "
            f"and no claim: {', '.join(unmatched)}",
            pytest.PytestWarning,
            stacklevel=1,
        )


#: the junit.xml testcase property naming one inconclusive claim of the test (``claim-id: reason``)
JUNIT_INCONCLUSIVE = "conformance_inconclusive"


@pytest.hookimpl(tryfirst=True)  # before junitxml reads the teardown report's properties
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Runs on the controller for every test, also under xdist: results travel in user_properties.
    properties = getattr(report, "user_properties", [])
    if report.when == "teardown":
        _add_junit_inconclusive(properties)
    if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    for name, value in properties:
        if name == "conformance_result":
            _collected.append(json.loads(value))


def _add_junit_inconclusive(properties: list[tuple[str, object]]) -> None:
    """One ``conformance_inconclusive`` property per inconclusive claim of the test (once: under xdist the
    worker and the controller both see the report)."""
    if any(name == JUNIT_INCONCLUSIVE for name, _ in properties):
        return
    for name, value in list(properties):
        if name == "conformance_result":
            for c in json.loads(str(value)).get("claims", []):
                if c.get("verdict") == "inconclusive":
                    properties.append((JUNIT_INCONCLUSIVE, f"{c['id']}: {_one_line(c.get('message', ''))}"))


#: advice lines shown per claim after a run (all of them are in report.json)
ADVICE_LINES = 8


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(str(text or "").split())
    return flat[:limit] + ("..." if len(flat) > limit else "")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The claims' tally, the advice and the inconclusive claims: reported here, never failing unless
    --conformance-strict."""
    if not _active(config) or hasattr(config, "workerinput") or not _collected:
        return
    from ..core.specs import short_name

    claims = [(r["target"], c) for r in _collected for c in r.get("claims", [])]
    tally = Counter(c["verdict"] for _, c in claims)
    order = ("pass", "fail", "advice", "inconclusive", "xfail", "skip", "error")
    terminalreporter.write_sep("=", "conformance claims")
    terminalreporter.write_line(", ".join(f"{tally[v]} {v}" for v in order if tally[v]))
    for target, formats in _formats_by_target(_collected).items():
        checked = ", ".join(f"{f['encoding']} ({f['source']})" for f in formats.get("checked", []))
        terminalreporter.write_line(f"{short_name(target)}: formats checked: {checked or 'none'}")
        for missing in formats.get("not_checked", []):
            terminalreporter.write_line(f"    not checked: {missing['encoding']}: {missing['why']}")
        if formats.get("derived"):
            from .report import describe_derived

            terminalreporter.write_line(f"{short_name(target)}: {describe_derived(formats['derived'])}")
    strict = config.getoption("conformance_strict")
    advice = [(target, c) for target, c in claims if c["verdict"] == "advice"]
    if advice:
        terminalreporter.write_sep(
            "-",
            "advice (failures with --conformance-strict)" if strict else "advice (reported, not failures)",
        )
        for target, c in advice:
            # Every line of the advice (one per case, up to ADVICE_LINES), each cut to one terminal line.
            lines = (c["message"] or "").splitlines() or [""]
            terminalreporter.write_line(f"{short_name(target)}: {c['id']}: {_one_line(lines[0], 240)}")
            for line in lines[1:ADVICE_LINES]:
                terminalreporter.write_line(f"    {_one_line(line, 240)}")
            if len(lines) > ADVICE_LINES:
                terminalreporter.write_line(f"    ... and {len(lines) - ADVICE_LINES} more (report.json)")
            if c.get("fix"):
                terminalreporter.write_line(f"    fix: {c['fix']}")
    inconclusive = [(target, c) for target, c in claims if c["verdict"] == "inconclusive"]
    if inconclusive:
        why = "failures with --conformance-strict" if strict else "the suite could not exercise these claims"
        terminalreporter.write_sep("-", f"inconclusive (not verdicts; {why})")
        for target, c in inconclusive:
            terminalreporter.write_line(f"{short_name(target)}: {c['id']}: {_one_line(c['message'])}")


def _formats_by_target(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each target's data formats (the same in each of its results), with every dataset derived from the
    user's samples for any of its results (each result lists those derived so far in its process)."""
    out: dict[str, dict[str, Any]] = {}
    for result in results:
        formats = result.get("formats")
        if not formats:
            continue
        if result["target"] not in out:
            out[result["target"]] = {k: v for k, v in formats.items() if k != "derived"}
        if formats.get("derived"):
            merged = out[result["target"]].setdefault("derived", {**formats["derived"], "datasets": []})
            known = {d["path"] for d in merged["datasets"]}
            merged["datasets"] += [d for d in formats["derived"]["datasets"] if d["path"] not in known]
    return out


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not _active(config) or hasattr(config, "workerinput"):
        return
    report_dir = config.getoption("conformance_report")
    if not report_dir:
        return
    targets = [{"target": _normalized(c), "kind": "cooker"} for c in config.getoption("cooker")]
    targets += [{"target": _normalized(t), "kind": "task_encoder"} for t in config.getoption("task_encoder")]
    targets += [{"target": _normalized(w), "kind": "wrapper"} for w in config.getoption("wrapper")]
    formats = _formats_by_target(_collected)
    for target in targets:
        target["formats"] = formats.get(target["target"], {})
    from .report import write_reports

    write_reports(
        report_dir,
        results=list(_collected),
        targets=targets,
        profile=config.getoption("conformance_profile"),
        seed=config.getoption("conformance_seed"),
        exitstatus=int(exitstatus),
        strict=config.getoption("conformance_strict"),
        transforms=declared_transforms(config),
    )


def _normalized(spec: str) -> str:
    """``spec`` as its target spells it (arguments normalized), as results name it."""
    from ..core.specs import format_spec, parse_spec

    try:
        return format_spec(*parse_spec(spec))
    except ValueError:
        return spec
