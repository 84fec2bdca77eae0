"""The mutation machinery (``benchmarks.mutation``): every mutant applies to the current sources and names
claims that exist; a mutant's copy of the package imports under its own name with the defect in it; the
verdict logic (kills against the baseline, as meant or not); and one real session on two mutants, one
killed by the claim meant for it and one that survives, with the report's matrix and JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.mutation.operators import (
    MUTANT_PACKAGE,
    MUTANTS,
    REPO_ROOT,
    TARGETS,
    Edit,
    Mutant,
    MutationError,
    mutant_diff,
    mutated_source,
    select,
)
from benchmarks.mutation.report import EQUIVALENT_FILE, NOTES_FILE, read_marked, summarize
from benchmarks.mutation.session import RunResult, build_tree, judge


def test_every_mutant_applies_and_names_known_claims() -> None:
    from primus_energon.conformance.properties import all_claims

    claims = {c.id for c in all_claims()}
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids)), "mutant ids must be unique"
    for mutant in MUTANTS:
        original = (REPO_ROOT / mutant.file).read_text(encoding="utf-8")
        assert mutated_source(mutant) != original, mutant.id
        assert mutant.target in TARGETS, mutant.id
        assert mutant.meant and set(mutant.meant) <= claims, (mutant.id, set(mutant.meant) - claims)
        assert mutant_diff(mutant).startswith(f"--- a/{mutant.file}"), mutant.id


def test_a_snippet_that_is_not_in_the_file_is_refused() -> None:
    stale = Mutant(
        "stale",
        "op",
        "x",
        "primus_energon/batching.py",
        (Edit("no such code", "x"),),
        "RAW_COOKER",
        ("fidelity/text",),
    )
    with pytest.raises(MutationError, match="occurs 0 times"):
        mutated_source(stale)
    broken = Mutant(
        "broken",
        "op",
        "x",
        "primus_energon/batching.py",
        (Edit("import torch\n", "import torch(\n"),),
        "RAW_COOKER",
        ("fidelity/text",),
    )
    with pytest.raises(MutationError, match="does not parse"):
        mutated_source(broken)
    with pytest.raises(ValueError, match="unknown operator or mutant: nope"):
        select(["nope"])


def test_equivalents_and_notes_name_mutants_with_reasons(tmp_path: Path) -> None:
    known = {m.id for m in MUTANTS}
    for path in (EQUIVALENT_FILE, NOTES_FILE):
        assert all(reason for reason in read_marked(path, known).values())
    no_reason = tmp_path / "equivalent.txt"
    no_reason.write_text("cache_by_key\n")
    with pytest.raises(ValueError, match="has no reason"):
        read_marked(no_reason, known)
    no_reason.write_text("not_a_mutant  # why\n")
    with pytest.raises(ValueError, match="is not a mutant id"):
        read_marked(no_reason, known)


def test_the_mutant_copy_imports_under_its_own_name_with_the_defect(tmp_path: Path) -> None:
    mutant = next(m for m in MUTANTS if m.id == "caption_strip")
    build_tree(tmp_path, mutant)
    code = (
        f"import {MUTANT_PACKAGE} as m, primus_energon as real\n"
        "sample = {'__key__': 'k', '__restore_key__': (), '__subflavors__': {}, '__sources__': (),\n"
        "          'caption.txt': b'  a caption  '}\n"
        "import io, torch\n"
        "for name in ('latents.pth', 'prompt_embeds.pth', 'pooled_prompt_embeds.pth'):\n"
        "    buffer = io.BytesIO(); torch.save(torch.ones(2), buffer); sample[name] = buffer.getvalue()\n"
        "print(repr(m.PREENCODED_COOKER.cook(dict(sample)).caption))\n"
        "print(repr(real.PREENCODED_COOKER.cook(dict(sample)).caption))\n"
        "print(m.__file__ == real.__file__)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    mutated, real, same_place = done.stdout.split("\n")[:3]
    assert (mutated, real) == ("'a caption'", "'  a caption  '")
    assert same_place == "False", "the mutant copy must not be the real package"


def _run(status: str, claims: dict[str, str]) -> RunResult:
    return RunResult("r", "PREENCODED_COOKER", "quick", status, 1.0, 0, claims=claims)


def test_a_kill_counts_against_the_baseline_and_says_whether_it_was_meant() -> None:
    mutant = next(m for m in MUTANTS if m.id == "tensor_transpose")  # meant: fidelity/tensors
    baseline = _run(
        "completed", {"fidelity/tensors": "pass", "keys/key": "pass", "fidelity/unmatched": "advice"}
    )
    advice = {"fidelity/unmatched"}
    as_meant = judge(
        mutant,
        _run("completed", {"fidelity/tensors": "fail", "keys/key": "pass", "fidelity/unmatched": "advice"}),
        baseline,
        advice,
    )
    assert (as_meant["verdict"], as_meant["as_meant"], as_meant["killed_by"]) == (
        "killed",
        True,
        ["fidelity/tensors"],
    )
    assert as_meant["noise"] == ["fidelity/unmatched"], "a claim not passing on the baseline kills nothing"
    other = judge(
        mutant, _run("completed", {"fidelity/tensors": "pass", "keys/key": "fail"}), baseline, advice
    )
    assert (other["verdict"], other["as_meant"]) == ("killed", False)
    survived = judge(
        mutant,
        _run("completed", {"fidelity/tensors": "pass", "fidelity/unmatched": "advice"}),
        baseline,
        advice,
    )
    assert (survived["verdict"], survived["as_meant"]) == ("survived", False)
    hung = judge(mutant, _run("timeout", {}), baseline, advice)
    assert (hung["verdict"], hung["as_meant"]) == ("timeout", False)
    unjudged = judge(mutant, _run("completed", {"fidelity/tensors": "fail"}), _run("broken", {}), advice)
    assert unjudged["verdict"] == "unjudged"
    assert (as_meant["failed_as_meant"], other["failed_as_meant"]) == (True, False)
    summary = summarize([as_meant, other, survived, hung], {})["overall"]
    assert (summary["scored"], summary["killed_as_meant"], summary["killed"], summary["rate_as_meant"]) == (
        4,
        1,
        2,
        0.25,
    )
    assert (summary["scored_defects"], summary["failed_as_meant"], summary["rate_failed_as_meant"]) == (
        4,
        1,
        0.25,
    )
    # a mutant meant for an advice claim only is scored apart: advised as meant is no kill
    advised_mutant = dataclasses.replace(mutant, id="advice_only", meant=("fidelity/unmatched",))
    advised = judge(
        advised_mutant,
        _run("completed", {"fidelity/tensors": "pass", "fidelity/unmatched": "advice"}),
        _run("completed", {"fidelity/tensors": "pass", "fidelity/unmatched": "pass"}),
        advice,
    )
    assert (advised["verdict"], advised["as_meant"], advised["failed_as_meant"], advised["advice_meant"]) == (
        "advised",
        True,
        False,
        True,
    )
    both = summarize([as_meant, advised], {})["overall"]
    assert (
        both["scored_defects"],
        both["failed_as_meant"],
        both["scored_advice"],
        both["advised_as_meant"],
    ) == (
        1,
        1,
        1,
        1,
    )
    assert summarize([as_meant, survived], {"tensor_transpose": "why"})["overall"]["scored"] == 0


@pytest.mark.slow
def test_a_session_reports_the_killed_mutant_by_its_meant_claim_and_the_survivor(tmp_path: Path) -> None:
    # With only the `accepted` property run, removing @stateless is killed by accepted/stateless, and dropping
    # the caption (meant for fidelity, which does not run) survives: one of each, deterministically.
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "benchmarks.mutation", "--mutant", "stateless_removed_cooker",
        "--mutant", "field_drop_caption", "--property", "accepted", "--out", str(out), "--timeout", "300",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads((out / "mutation.json").read_text())
    assert document["subset"] is True and document["profile"] == "quick"
    assert document["baselines"]["PREENCODED_COOKER"]["status"] == "completed"
    assert document["baselines"]["PREENCODED_COOKER"]["claims"]["accepted/stateless"] == "pass"
    rows = {m["id"]: m for m in document["mutants"]}
    killed = rows["stateless_removed_cooker"]
    assert (killed["verdict"], killed["as_meant"], killed["by_meant"]) == (
        "killed",
        True,
        ["accepted/stateless"],
    )
    assert killed["detected_by"]["accepted/stateless"] == "fail"
    survivor = rows["field_drop_caption"]
    assert (survivor["verdict"], survivor["as_meant"], survivor["detected_by"]) == ("survived", False, {})
    overall = document["summary"]["overall"]
    assert (overall["scored"], overall["killed_as_meant"], overall["rate_as_meant"]) == (2, 1, 0.5)
    assert (overall["failed_as_meant"], overall["rate_failed_as_meant"]) == (1, 0.5)
    assert document["summary"]["per_operator"]["remove_stateless"]["rate_as_meant"] == 1.0
    markdown = (out / "REPORT.md").read_text()
    assert "### `field_drop_caption` (drop_field, survived)" in markdown
    assert "-    return DiffusionSample(**basic_sample_keys(sample), **tensors, caption=caption)" in markdown
    assert "| `stateless_removed_cooker` | killed | **K** |" in markdown
