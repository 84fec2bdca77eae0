"""The conformance suite as pytest collects it: one test per (target, property), each running every claim
of its property in the target's supervised process (see primus_energon.conformance.verdict.plugin and
primus_energon.conformance.processes.supervisor); this process only gives the verdicts."""

from __future__ import annotations

import json
import shutil

import pytest

from primus_energon.conformance.core.specs import format_spec, parse_spec, short_name
from primus_energon.conformance.properties import Property, get_property, properties_for
from primus_energon.conformance.verdict.plugin import (
    claim_expectations,
    run_options,
    supervised_target,
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_target" not in metafunc.fixturenames:
        return
    config = metafunc.config
    specs = [
        (kind, spec)
        for kind, option in (("cooker", "cooker"), ("task_encoder", "task_encoder"), ("wrapper", "wrapper"))
        for spec in config.getoption(option)
    ]
    wanted = config.getoption("conformance_property")
    # one test per target and each property that checks its kind (a wrapper has a property of its own)
    pairs = [
        ((kind, spec), prop.id)
        for kind, spec in specs
        for prop in properties_for(kind)
        if not wanted or prop.id in wanted
    ]
    metafunc.parametrize(
        ("conformance_target", "property_id"),
        pairs,
        ids=[f"{short_name(spec)}-{pid}" for (_, spec), pid in pairs],
        indirect=["conformance_target"],
        scope="session",
    )


@pytest.fixture(scope="session")
def conformance_target(request: pytest.FixtureRequest):
    """The target's supervised process, started (and the target built there) when pytest was configured."""
    kind, spec = request.param
    return supervised_target(request.config, kind, spec)


@pytest.fixture(scope="session")
def conformance_context(
    conformance_target, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
):
    config = request.config
    workdir = tmp_path_factory.mktemp(f"conformance-{conformance_target.name}")
    context = run_options(config).context_request(str(workdir))
    try:
        # The properties collected for this target (after -k and --conformance-property) start their child
        # processes now, so those run while the properties before them are checked. Not under xdist: there a
        # worker runs only some of the collected tests (which, it learns one at a time), and the workers keep
        # the cores busy already.
        collected = [] if hasattr(config, "workerinput") else _collected_for(conformance_target, request)
        conformance_target.open(context, collected)
        yield conformance_target
    finally:
        conformance_target.release()  # the process stays for a later set-up; pytest ends it at exit
        if not config.getoption("conformance_keep_data"):
            # The datasets are a pure function of the options (a rerun makes them again); derived from a
            # user's large samples they take gigabytes, and pytest keeps its last three temporary folders.
            shutil.rmtree(workdir, ignore_errors=True)


def _collected_for(target, request: pytest.FixtureRequest) -> list[str]:
    """The property ids collected for ``target``, in run order."""
    mine = (target.kind, target.spec)
    return [
        item.callspec.params["property_id"]
        for item in request.session.items
        if hasattr(item, "callspec")
        and _normalized(item.callspec.params.get("conformance_target")) == _normalized(mine)
    ]


def test_property(conformance_context, property_id: str, request: pytest.FixtureRequest) -> None:
    """Every claim of one conformance property holds for the target (advice is reported, not failed)."""
    prop: Property = get_property(property_id)
    target = conformance_context
    collected = _collected_for(target, request)
    after = collected[collected.index(property_id) + 1 :] if property_id in collected else []
    result = target.run(property_id, claim_expectations(request.config), after)
    record = {**result.to_dict(), "number": prop.number, "title": prop.title, "kind": target.kind}
    request.node.user_properties.append(("conformance_result", json.dumps(record, default=str)))
    head = f"property {prop.number} ({prop.title})"
    if result.verdict == "skip":
        pytest.skip(f"{head}: {result.message}")
    if result.verdict == "xfail":
        pytest.xfail(f"{head}: {result.message}")
    if result.verdict in ("fail", "error"):
        counted = ("fail", "error", "advice", "inconclusive") if target.strict else ("fail", "error")
        failed = [c for c in result.claims if c.verdict in counted]
        count = f"{len(failed)} claim{'s' if len(failed) != 1 else ''}"
        what = "failed" if result.verdict == "fail" else "could not be checked (a defect of the suite)"
        text = f"{head}: {count} {what}, worst first:\n{result.message}"
        pytest.fail(text + (f"\nreproduce: {result.reproduce}" if result.reproduce else ""), pytrace=False)


def _normalized(param: object) -> object:
    """A ``(kind, spec)`` parameter with its spec as the target spells it (arguments normalized)."""
    if not isinstance(param, tuple):
        return param
    kind, spec = param
    try:
        return kind, format_spec(*parse_spec(spec))
    except ValueError:
        return param
