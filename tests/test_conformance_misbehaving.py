"""Targets that misbehave in one way each (tests/conformance_zoo/misbehaving.py): the suite names the
misbehaviour on the claim it happened in, or passes it where it is harmless, and never reports a defect of
its own. Also the safe rendering every message that quotes a target's exception or value goes through."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from primus_energon.conformance import check_cooker
from primus_energon.conformance.core.rendering import describe_error, error_text, safe_repr
from primus_energon.conformance.oracles.fingerprint import digest, fingerprint

ZOO = "tests.conformance_zoo.misbehaving"


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise KeyError("no message")


class _Recursive:
    def __repr__(self) -> str:
        return repr(self)


class _Raising:
    def __repr__(self) -> str:
        raise RuntimeError("repr is broken")


def test_an_exception_whose_str_raises_is_described_by_its_type() -> None:
    assert describe_error(_Unprintable()) == "_Unprintable: <its str() raised KeyError>"
    assert error_text(ValueError("a\n  b " + "x" * 500), 20) == "a b xxxxxxxxxxxxx..."
    assert describe_error(ValueError()) == "ValueError"


def test_values_whose_repr_raises_or_recurses_are_rendered_safely() -> None:
    assert safe_repr(_Recursive()) == "<_Recursive whose repr() raised RecursionError>"
    assert safe_repr([_Raising(), {"k": 1}]) == "[<_Raising whose repr() raised RuntimeError>, {'k': 1}]"
    assert len(safe_repr("x" * 10_000, 50)) == 50


def test_fingerprints_survive_cycles_unprintable_values_and_deep_nesting() -> None:
    cycle: list = [1]
    cycle.append(cycle)
    deep: list = []
    inner = deep
    for _ in range(500):
        inner.append([])
        inner = inner[0]
    value = {"cycle": cycle, "odd": _Recursive(), "deep": deep, 3: "int key"}
    described = fingerprint(value)
    assert described[1][0] == ("cycle", ("list", (1, ("cycle", "list"))))
    assert described[1][1] == (
        "odd",
        ("object", "_Recursive", "<_Recursive whose repr() raised RecursionError>"),
    )
    assert "too deep" in repr(described[1][2])
    assert described[1][3] == ("3", "int key")
    assert digest(value) == digest(value)


def _verdicts(results: list) -> dict[str, str]:
    return {claim.id: claim.verdict for result in results for claim in result.claims}


def test_an_unprintable_error_on_every_sample_fails_loads_without_a_suite_error(workdir: Path) -> None:
    results = check_cooker(
        f"{ZOO}:cook_raises_unprintable_error",
        properties=["accepted", "fidelity"],
        encoding="preencoded",
        profile="quick",
        workdir=workdir,
    )
    verdicts = _verdicts(results)
    assert verdicts["accepted/loads"] == "fail", verdicts
    assert "error" not in verdicts.values(), verdicts
    assert all("conformance suite itself failed" not in r.message for r in results)


def test_a_field_whose_repr_recurses_is_no_defect_and_no_suite_error(workdir: Path) -> None:
    results = check_cooker(
        f"{ZOO}:cook_with_recursive_repr_field",
        properties=["accepted", "fidelity", "purity", "resume"],
        encoding="preencoded",
        profile="quick",
        workdir=workdir,
    )
    verdicts = _verdicts(results)
    assert set(verdicts.values()) <= {"pass", "advice", "skip"}, [(r.property, r.message) for r in results]


def test_a_decode_timeout_alarm_that_is_cancelled_passes(workdir: Path) -> None:
    results = check_cooker(
        f"{ZOO}:cook_with_decode_alarm",
        properties=["accepted", "fidelity", "resume"],
        encoding="preencoded",
        profile="quick",
        workdir=workdir,
    )
    assert all(r.verdict == "pass" for r in results), [(r.property, r.message) for r in results]


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="POSIX real-time alarms")
def test_an_alarm_left_armed_is_the_targets_defect_and_is_disarmed(workdir: Path) -> None:
    before = signal.getsignal(signal.SIGALRM)
    results = check_cooker(
        f"{ZOO}:cook_leaves_alarm_armed",
        properties=["accepted", "fidelity"],
        encoding="preencoded",
        profile="quick",
        workdir=workdir,
    )
    verdicts = _verdicts(results)
    assert verdicts["accepted/loads"] == "fail", verdicts
    assert "error" not in verdicts.values(), verdicts
    loads = next(c for r in results for c in r.claims if c.id == "accepted/loads")
    assert (
        "cooking the clean sample 'main_000000' raised RuntimeError: it left a real-time alarm armed"
        in loads.message
    )
    assert "cancel it (signal.alarm(0))" in loads.message
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0, "the suite disarms the target's alarm"
    assert signal.getsignal(signal.SIGALRM) is before, "and puts the handler back"
