"""One test per conformance property, parametrized by target (see conformance.plugin)."""

from __future__ import annotations

import json

import pytest

from conformance.api import make_context, run_property
from conformance.plugin import option_dest
from conformance.properties import PROPERTIES, Property
from conformance.target import resolve_target


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_target" not in metafunc.fixturenames:
        return
    config = metafunc.config
    specs = [("cooker", s) for s in config.getoption("cooker")] + [
        ("task_encoder", s) for s in config.getoption("task_encoder")
    ]
    metafunc.parametrize(
        "conformance_target",
        specs,
        ids=[spec.rpartition(":")[2] or spec for _, spec in specs],
        indirect=True,
        scope="session",
    )


@pytest.fixture(scope="session")
def conformance_target(request: pytest.FixtureRequest):
    kind, spec = request.param
    return resolve_target(spec, kind=kind, input_form=request.config.getoption(option_dest("input-form")))


@pytest.fixture(scope="session")
def conformance_context(
    conformance_target, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
):
    config = request.config
    return make_context(
        conformance_target,
        workdir=tmp_path_factory.mktemp(f"conformance-{conformance_target.name}"),
        profile=config.getoption("conformance_profile"),
        seed=config.getoption("conformance_seed"),
        encoding=config.getoption(option_dest("encoding")),
        schema=config.getoption(option_dest("schema")),
        dataset=config.getoption(option_dest("dataset")),
        min_samples_per_s=config.getoption(option_dest("min-samples-per-s")),
    )


def _make_test(prop: Property):
    def test(conformance_context, request: pytest.FixtureRequest) -> None:
        result = run_property(prop, conformance_context)
        record = {
            **result.to_dict(),
            "number": prop.number,
            "title": prop.title,
            "kind": conformance_context.target.kind,
        }
        request.node.user_properties.append(("conformance_result", json.dumps(record, default=str)))
        if result.verdict == "skip":
            pytest.skip(result.message)
        if result.verdict in ("fail", "error"):
            text = f"property {prop.number} ({prop.title}) {'failed' if result.verdict == 'fail' else 'could not run'}: "
            text += result.message + (f"\nreproduce: {result.reproduce}" if result.reproduce else "")
            pytest.fail(text, pytrace=False)

    test.__name__ = f"test_{prop.id}"
    test.__doc__ = f"Property {prop.number}: {prop.title}."
    return test


for _prop in PROPERTIES:
    globals()[f"test_{_prop.id}"] = _make_test(_prop)
