"""Targets as their projects build them: ``MODULE:ATTR(NAME=VALUE, ...)`` on the command line and ``kwargs=``
in the Python API, literal values only; and the loader settings a target needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from primus_energon.conformance import check_cooker, check_task_encoder, check_wrapper
from primus_energon.conformance.core.specs import format_spec, parse_spec
from primus_energon.conformance.engine.target import resolve_target
from tests.helpers import run_pytest

CONFIGURED = "tests.conformance_zoo.configured:ConfiguredPackingTaskEncoder"
ARGS = "(seq_length=16, packing_buffer_size=4)"
FACTORIES = "tests.conformance_zoo.factories:"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("m.n:A", ("m.n:A", {})),
        ("m.n:A.b()", ("m.n:A.b", {})),
        (
            "m.n:A(x=1, y=-2.5, s='a', t=(1, [2]), d={'k': None}, f=True, b=b'x')",
            ("m.n:A", {"x": 1, "y": -2.5, "s": "a", "t": (1, [2]), "d": {"k": None}, "f": True, "b": b"x"}),
        ),
    ],
)
def test_spec_arguments_are_read_as_literals(spec: str, expected: tuple) -> None:
    assert parse_spec(spec) == expected
    assert parse_spec(format_spec(*expected)) == expected


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("m:A(x=len('a'))", "x=len('a') is not a literal value"),
        ("m:A(x=__import__('os').system('true'))", "is not a literal value"),
        ("m:A(x=y)", "x=y is not a literal value"),
        ("m:A(1)", "positional argument 1 not allowed"),
        ("m:A(**k)", "**-unpacking is not allowed"),
        ("m:A(x=", "do not parse"),
        ("m:A(x=1)(y=2)", "expected one argument list"),
    ],
)
def test_anything_but_literal_keyword_arguments_is_refused(spec: str, expected: str) -> None:
    with pytest.raises(ValueError, match=None) as raised:
        parse_spec(spec)
    assert expected in str(raised.value) and "\n" not in str(raised.value)


def test_resolve_target_builds_with_the_arguments_and_refuses_what_cannot_take_them() -> None:
    target = resolve_target(CONFIGURED + ARGS, kind="task_encoder")
    built = target.make_task_encoder()
    assert (built.capacity, built.packing_buffer_size) == (16, 4)
    assert target.make_task_encoder() is not built  # a fresh TaskEncoder for every loader
    assert target.spec == CONFIGURED + ARGS and target.name == "ConfiguredPackingTaskEncoder" + ARGS
    same = resolve_target(
        CONFIGURED, kind="task_encoder", kwargs={"seq_length": 16, "packing_buffer_size": 4}
    )
    assert same.spec == target.spec
    with pytest.raises(ValueError, match="cannot be built with no arguments .*missing 2 required"):
        resolve_target(CONFIGURED, kind="task_encoder")
    with pytest.raises(ValueError, match="cannot be built with seq_length=16"):
        resolve_target(CONFIGURED + "(seq_length=16)", kind="task_encoder")
    with pytest.raises(ValueError, match="is not a literal value"):
        resolve_target(CONFIGURED, kind="task_encoder", kwargs={"seq_length": object()})
    with pytest.raises(ValueError, match="a Cooker, which takes no arguments"):
        resolve_target("primus_energon:PREENCODED_COOKER(x=1)", kind="cooker")
    cooker = resolve_target("tests.conformance_zoo.configured:make_cooker(encoding='preencoded')")
    assert cooker.kind == "cooker" and cooker.cookers[0].has_subflavors == {"encoding": "preencoded"}
    wrapper = resolve_target("tests.conformance_zoo.configured:StepsWrapper(name='w')", kind="wrapper")
    assert wrapper.make_wrapper([]).name == "w"


def test_python_api_takes_kwargs_and_loader_settings(tmp_path: Path) -> None:
    """check_task_encoder(spec, kwargs=...) builds the class with them; batch_size sets the loaders that
    pack (this TaskEncoder takes one pack per batch); a non-literal argument is a ValueError."""
    results = check_task_encoder(
        CONFIGURED,
        kwargs={"seq_length": 16, "packing_buffer_size": 4},
        batch_size=1,
        properties=["accepted", "packing"],
        profile="quick",
        workdir=tmp_path,
    )
    assert {r.property: r.verdict for r in results} == {"accepted": "pass", "packing": "pass"}, [
        r.message for r in results
    ]
    cooker = check_cooker(
        "tests.conformance_zoo.configured:make_cooker",
        kwargs={"encoding": "preencoded"},
        properties=["accepted", "keys"],
        profile="quick",
    )
    assert [r.verdict for r in cooker] == ["pass", "pass"], [r.message for r in cooker]
    wrapper = check_wrapper(
        "tests.conformance_zoo.configured:StepsWrapper",
        kwargs={"name": "w"},
        profile="quick",
        properties=["wrapper"],
    )
    assert [r.verdict for r in wrapper] == ["pass"], [r.message for r in wrapper]
    with pytest.raises(ValueError, match="not a literal value"):
        check_task_encoder(CONFIGURED, kwargs={"seq_length": len}, properties=["accepted"])


def test_a_task_encoder_that_does_not_pack_as_built_is_not_judged_packed(tmp_path: Path) -> None:
    """A TaskEncoder with packing methods that says nothing of its configuration (no packing_buffer_size
    attribute) and whose packer refuses clean samples as built (NeMo's, without max_seq_length): packing is
    inconclusive, naming why, and determinism judges it unpacked; built to pack, it is judged packed."""
    spec = "tests.conformance_zoo.packing:PacksOnlyWithMaxLengthTaskEncoder"
    results = check_task_encoder(
        spec, properties=["accepted", "determinism", "packing"], profile="quick", workdir=tmp_path / "a"
    )
    verdicts = {r.property: r.verdict for r in results}
    assert verdicts == {"accepted": "pass", "determinism": "pass", "packing": "inconclusive"}, [
        r.message for r in results
    ]
    packing = next(r for r in results if r.property == "packing")
    assert {c.verdict for c in packing.claims} == {"inconclusive"}
    loads = next(c for c in packing.claims if c.id == "packing/loads")
    assert "as built, its select_samples_to_pack raised TypeError" in loads.message
    packed = check_task_encoder(
        spec,
        kwargs={"max_seq_length": 16},
        batch_size=1,
        properties=["packing"],
        profile="quick",
        workdir=tmp_path / "b",
    )
    assert [r.verdict for r in packed] == ["pass"], [r.message for r in packed]


@pytest.mark.slow
def test_a_task_encoder_built_with_arguments_on_the_command_line_passes(tmp_path: Path) -> None:
    """The arguments given only on the command line build the TaskEncoder here and in every fresh process
    (determinism, sharding); --conformance-batch-size 1 is what its batch() needs; the packing buffer is
    the one it was built with (4, not the suite's 8, which its select_samples_to_pack refuses)."""
    report = tmp_path / "report"
    properties = ["accepted", "fidelity", "determinism", "sharding", "packing"]
    run = run_pytest(
        tmp_path,
        "--task-encoder",
        CONFIGURED + ARGS,
        "--conformance-batch-size",
        "1",
        "--conformance-profile",
        "quick",
        *[arg for p in properties for arg in ("--conformance-property", p)],
        f"--conformance-report={report}",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert "5 passed" in run.stdout
    document = json.loads((report / "report.json").read_text())
    assert {r["property"]: r["verdict"] for r in document["results"]} == dict.fromkeys(properties, "pass")
    claims = {c["id"]: c["verdict"] for r in document["results"] for c in r["claims"]}
    assert claims["determinism/fresh_processes"] == "pass" and claims["packing/loads"] == "pass"
    assert document["results"][0]["target"] == CONFIGURED + ARGS
    # Without the batch size it needs, packing fails, and the reproduce command keeps the arguments.
    failing = run_pytest(
        tmp_path,
        "--task-encoder",
        CONFIGURED + ARGS,
        "--conformance-profile",
        "quick",
        "--conformance-property",
        "packing",
    )
    assert failing.returncode == 1, failing.stdout[-3000:]
    assert "2 packs in one batch" in failing.stdout
    assert (
        f"reproduce: pytest --task-encoder '{CONFIGURED}{ARGS}' --conformance-profile quick" in failing.stdout
    )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            CONFIGURED + "(seq_length=len('abc'), packing_buffer_size=4)",
            "seq_length=len('abc') is not a literal",
        ),
        (CONFIGURED, "cannot be built with no arguments"),
        (CONFIGURED + "(seq_length=16)", "cannot be built with seq_length=16"),
        (
            FACTORIES + "returns_text",
            f"{FACTORIES}returns_text() returned a str, not a TaskEncoder class or instance",
        ),
    ],
)
def test_bad_target_arguments_are_one_line_and_exit_4(tmp_path: Path, spec: str, expected: str) -> None:
    run = run_pytest(tmp_path, "--task-encoder", spec, "--conformance-profile", "quick")
    output = run.stdout + run.stderr
    assert run.returncode == 4, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and expected in errors[0], output[-3000:]
    assert "Traceback" not in output and "test_property" not in output and len(output.splitlines()) < 6


def test_a_task_encoder_factory_is_called_for_every_loader(tmp_path: Path) -> None:
    """``MODULE:factory`` (no arguments) names a TaskEncoder factory: called where a class would be built,
    for every loader; a factory may return the class; one that hands out a single instance gets a copy per
    loader (checks instrument what they get)."""
    from primus_energon import EncodedDiffusionTaskEncoder
    from tests.conformance_zoo import factories

    for kind in ("task_encoder", None):
        target = resolve_target(FACTORIES + "make_task_encoder", kind=kind)
        assert target.kind == "task_encoder" and target.obj is factories.make_task_encoder
        before = factories.BUILT["task_encoders"]
        first, second = target.make_task_encoder(), target.make_task_encoder()
        assert isinstance(first, EncodedDiffusionTaskEncoder) and first is not second
        assert factories.BUILT["task_encoders"] == before + 2
    built = resolve_target(FACTORIES + "make_task_encoder_class", kind="task_encoder").make_task_encoder()
    assert type(built) is EncodedDiffusionTaskEncoder
    shared = resolve_target(FACTORIES + "shared_task_encoder", kind="task_encoder")
    assert isinstance(shared.make_task_encoder(), EncodedDiffusionTaskEncoder)
    assert shared.make_task_encoder() is not factories.shared_task_encoder()
    results = check_task_encoder(
        FACTORIES + "make_task_encoder", properties=["keys", "purity"], profile="quick", workdir=tmp_path
    )
    assert {r.property: r.verdict for r in results} == {"keys": "pass", "purity": "pass"}, [
        r.message for r in results
    ]


def test_a_cooker_factory_is_called_once_and_a_cook_function_never() -> None:
    """``--cooker MODULE:factory``: a function that requires no argument is a factory, called once; a cook
    function (``@stateless``, or taking the sample) is told apart by its signature and not called."""
    from primus_energon import PREENCODED_COOKER, cook_preencoded_diffusion
    from tests.conformance_zoo import factories

    for kind in ("cooker", None):
        target = resolve_target(FACTORIES + "make_cooker", kind=kind)
        assert target.kind == "cooker" and target.obj is PREENCODED_COOKER
        assert target.named is factories.make_cooker and target.spec == FACTORIES + "make_cooker"
    for spec in ("make_cook_function", "make_cook_function(encoding='preencoded')"):
        target = resolve_target(FACTORIES + spec, kind="cooker")
        assert target.obj is PREENCODED_COOKER.cook and target.spec == FACTORIES + spec
    cook = resolve_target("primus_energon:cook_preencoded_diffusion")
    assert cook.kind == "cooker" and cook.obj is cook_preencoded_diffusion and cook.source is None
    results = check_cooker(FACTORIES + "make_cooker", properties=["accepted", "keys"], profile="quick")
    assert [r.verdict for r in results] == ["pass", "pass"], [r.message for r in results]


@pytest.mark.parametrize(
    ("spec", "kind", "expected"),
    [
        (
            "returns_text",
            "task_encoder",
            "returns_text() returned a str, not a TaskEncoder class or instance; a factory given to "
            "--task-encoder must return the TaskEncoder to check",
        ),
        (
            "returns_text",
            "cooker",
            "returns_text() returned a str, not an Energon Cooker or a cook function; a factory given to "
            "--cooker must return the cooker to check",
        ),
        (
            "make_cooker",
            "task_encoder",
            "make_cooker() returned a Cooker, not a TaskEncoder class or instance; check it with --cooker "
            f"{FACTORIES}make_cooker",
        ),
        (
            "make_task_encoder",
            "cooker",
            "make_task_encoder() returned a TaskEncoder instance, not an Energon Cooker or a cook function; "
            f"check it with --task-encoder {FACTORIES}make_task_encoder",
        ),
        ("raises", "task_encoder", "raises() failed (OSError: tokenizer.json not found)"),
        ("raises", "cooker", "raises() failed (OSError: tokenizer.json not found)"),
        ("make_cooker(size=3)", "cooker", "make_cooker(size=3) failed (TypeError: "),
        (
            "returns_text",
            "wrapper",
            "returns_text is a str, not a wrapper class (built as Wrapper(loader), like "
            "primus_energon.MegatronDataloaderWrapper) or a zero-argument factory returning one",
        ),
    ],
)
def test_a_factory_that_fails_or_returns_the_wrong_kind_is_refused(
    spec: str, kind: str, expected: str
) -> None:
    with pytest.raises(ValueError) as raised:
        resolve_target(FACTORIES + spec, kind=kind)
    message = str(raised.value)
    assert message.startswith(FACTORIES) and expected in message and "\n" not in message, message


def test_a_cook_function_given_as_a_task_encoder_is_not_called() -> None:
    with pytest.raises(ValueError, match="a function that takes the sample .*; check it with --cooker"):
        resolve_target("primus_energon:cook_preencoded_diffusion", kind="task_encoder")


@pytest.mark.slow
def test_factory_targets_are_rebuilt_in_fresh_processes(tmp_path: Path) -> None:
    """determinism runs the target in fresh processes, which rebuild it from its spec: the factory is
    called there as here."""
    for check, spec in ((check_task_encoder, "make_task_encoder"), (check_cooker, "make_cooker")):
        results = check(
            FACTORIES + spec, properties=["determinism"], profile="quick", workdir=tmp_path / spec
        )
        assert [r.verdict for r in results] == ["pass"], [r.message for r in results]
        claims = {c.id: c.verdict for c in results[0].claims}
        assert claims["determinism/fresh_processes"] == "pass", claims


def test_a_wrapper_factory_returns_the_wrapper_class() -> None:
    from primus_energon import MegatronDataloaderWrapper

    target = resolve_target(FACTORIES + "make_wrapper", kind="wrapper")
    assert target.obj is MegatronDataloaderWrapper
    wrapped = target.make_wrapper(iter([1, 2]))
    assert isinstance(wrapped, MegatronDataloaderWrapper)


@pytest.mark.slow
def test_a_wrapper_factory_passes_the_wrapper_property(tmp_path: Path) -> None:
    """The wrapper property's child processes (the spin checks) rebuild the wrapper from the factory too."""
    from primus_energon.conformance import check_wrapper

    (result,) = check_wrapper(
        FACTORIES + "make_wrapper", properties=["wrapper"], profile="quick", workdir=tmp_path
    )
    assert result.ok and {c.verdict for c in result.claims} <= {"pass", "skip"}, result.message
    assert result.claim("wrapper/empty").verdict == "pass"
