"""The verdict ``inconclusive``: a claim the suite could not judge. Never a defect, never a pass; it changes
the exit status only under --conformance-strict, and is listed after the run like advice."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from primus_energon.conformance.core.claims import ClaimRecorder, Harm, claims_of
from primus_energon.conformance.core.results import Inconclusive, PropertyResult, PropertySkipped
from primus_energon.conformance.engine.calls import TargetError, target_call
from primus_energon.conformance.engine.session import make_context, run_property
from primus_energon.conformance.engine.target import resolve_target
from primus_energon.conformance.properties import Property
from primus_energon.conformance.verdict.report import write_reports
from tests.helpers import run_pytest

CLAIMS = claims_of(
    "demo",
    ("first", "the first statement", Harm.DATA, "keep the data"),
    ("second", "the second statement", Harm.CRASH, "do not crash"),
    ("style", "an opinion", Harm.ADVICE, "say the key"),
)


def _recorder() -> ClaimRecorder:
    return ClaimRecorder(CLAIMS, kind="cooker", reproduce=lambda _: "")


def _verdicts(claims: ClaimRecorder) -> dict[str, tuple[str, str]]:
    return {r.id.partition("/")[2]: (r.verdict, r.message) for r in claims.results()}


# -- the ClaimRecorder ------------------------------------------------------------------------------------


def test_raised_inside_a_claim_makes_that_claim_inconclusive_and_the_check_goes_on() -> None:
    claims = _recorder()
    with claims.claim("first") as claim:
        claim.examined()
        raise Inconclusive("no sample has a caption to vary")
    with claims.claim("second") as claim:
        claim.examined()
    claims.not_applicable("style", "not here")
    results = {r.id: r for r in claims.results()}
    first = results["demo/first"]
    assert (first.verdict, first.message, first.fix) == (
        "inconclusive",
        "no sample has a caption to vary",
        "",
    )
    assert first.ok and first.examined == 1
    assert results["demo/second"].verdict == "pass"
    assert Inconclusive("why").reason == "why" and str(Inconclusive("why")) == "why"


def test_the_method_marks_the_claim_and_joins_every_reason() -> None:
    claims = _recorder()
    with claims.claim("first") as claim:
        claim.inconclusive("the target cannot cook the derived samples")
        claim.examined(3)  # the claim goes on
        claim.inconclusive("no image member")
        claim.inconclusive("no image member")
    with claims.claim("second") as claim:
        claim.inconclusive("nothing to vary")  # examined nothing: inconclusive, not the vacuous fail
    assert _verdicts(claims)["first"] == (
        "inconclusive",
        "the target cannot cook the derived samples; no image member",
    )
    assert _verdicts(claims)["second"] == ("inconclusive", "nothing to vary")


def test_a_claim_that_examined_nothing_still_fails_without_inconclusive() -> None:
    claims = _recorder()
    with claims.claim("first"):
        pass
    verdict, message = _verdicts(claims)["first"]
    assert verdict == "fail" and message.startswith("examined nothing, so this claim has not passed")


def test_problems_win_over_inconclusive() -> None:
    claims = _recorder()
    with claims.claim("first") as claim:
        claim.examined()
        claim.problem("sample 'a' lost its caption")
        raise Inconclusive("the rest could not be built")
    with claims.claim("second") as claim:
        claim.inconclusive("half of it")
        claim.problem("it crashed")
    with claims.claim("style") as claim:
        claim.problem("the message does not name the sample")
        claim.inconclusive("and some cases could not be built")
    verdicts = _verdicts(claims)
    assert verdicts["first"] == ("fail", "sample 'a' lost its caption")
    assert verdicts["second"] == ("fail", "it crashed")
    assert verdicts["style"][0] == "advice"


def test_a_claim_entered_once_per_format_keeps_a_fail_from_any_entry() -> None:
    claims = _recorder()
    with claims.claim("first") as claim:  # format 1: a defect
        claim.examined()
        claim.problem("format 1 loses data")
    with claims.claim("first") as claim:  # format 2: cannot be exercised
        raise Inconclusive("format 2 has no such member")
    with claims.claim("second") as claim:  # format 1: cannot be exercised
        raise Inconclusive("format 1 has no such member")
    with claims.claim("second") as claim:  # format 2: passes
        claim.examined()
    with claims.claim("second") as claim:  # format 3: does not apply
        raise PropertySkipped("format 3 is text only")
    verdicts = _verdicts(claims)
    assert verdicts["first"] == ("fail", "format 1 loses data")
    assert verdicts["second"] == ("inconclusive", "format 1 has no such member")


def test_the_recorder_marks_a_claim_the_check_does_not_run() -> None:
    claims = _recorder()
    with claims.claim("first") as claim:
        claim.examined()
    claims.inconclusive("first", "too late: it has run")
    claims.inconclusive("second", "no data the suite can build exercises it")
    claims.inconclusive("style", "the same")
    assert _verdicts(claims) == {
        "first": ("pass", ""),
        "second": ("inconclusive", "no data the suite can build exercises it"),
        "style": ("inconclusive", "the same"),
    }
    with pytest.raises(KeyError):
        claims.inconclusive("no_such_claim", "x")


def test_aborted_by_inconclusive_marks_every_unreached_claim() -> None:
    claims = _recorder()
    with claims.claim("first") as claim:
        claim.examined()
    claims.aborted(Inconclusive("the derived dataset does not cook"))
    results = {r.id: r for r in claims.results()}
    assert results["demo/first"].verdict == "pass"
    for claim_id in ("demo/second", "demo/style"):  # an advice claim too: inconclusive, not advice
        result = results[claim_id]
        assert result.verdict == "inconclusive" and result.fix == "" and result.ok
        assert result.message == "could not be checked: the derived dataset does not cook"


def test_inconclusive_passes_through_a_target_call() -> None:
    """Raised by the suite's own code inside ``target_call``, it is not the target's error."""
    with pytest.raises(Inconclusive), target_call("cooking"):
        raise Inconclusive("cannot build it")
    with pytest.raises(TargetError), target_call("cooking"):
        raise ValueError("the target's own error")


# -- the property verdict, through the API's run_property -------------------------------------------------


@dataclass(frozen=True)
class _Scripted(Property):
    """A property whose check and claims are given here (the suite's properties are fixed)."""

    script: Callable | None = None

    @property
    def check(self) -> Callable:
        return self.script  # type: ignore[return-value]

    @property
    def claims(self) -> tuple:
        return CLAIMS


def _run(tmp_path: Path, script: Callable, *, strict: bool = False) -> PropertyResult:
    target = resolve_target("primus_energon:PREENCODED_COOKER", kind="cooker")
    ctx = make_context(
        target, workdir=tmp_path / ("strict" if strict else "plain"), profile="quick", strict=strict
    )
    prop = _Scripted("demo", 99, "Demo", "keys", needs_loader=False, script=script)
    try:
        return run_property(prop, ctx)
    finally:
        ctx.close()


def _all_inconclusive(ctx, claims: ClaimRecorder) -> dict:
    with claims.claim("first") as claim:
        claim.examined()
        raise Inconclusive("no caption to vary")
    raise Inconclusive("the derived data does not cook")  # outside any claim: the property stops


def _pass_and_inconclusive(ctx, claims: ClaimRecorder) -> dict:
    with claims.claim("first") as claim:
        claim.examined()
    claims.inconclusive("second", "no data exercises it")
    claims.not_applicable("style", "no error to judge")
    return {}


def _fail_and_inconclusive(ctx, claims: ClaimRecorder) -> dict:
    claims.inconclusive("first", "no data exercises it")
    with claims.claim("second") as claim:
        claim.examined()
        claim.problem("it crashed")
    claims.not_applicable("style", "no error to judge")
    return {}


def test_property_verdicts_with_inconclusive_claims(tmp_path: Path) -> None:
    result = _run(tmp_path, _all_inconclusive)
    assert result.verdict == "inconclusive" and result.ok
    assert [c.id for c in result.inconclusive] == ["demo/first", "demo/second", "demo/style"]
    assert result.verdicts() == dict.fromkeys(("demo/first", "demo/second", "demo/style"), "inconclusive")
    assert "demo/first: no caption to vary" in result.message and "error" not in result.message
    assert result.reproduce == ""

    result = _run(tmp_path, _pass_and_inconclusive)
    assert result.verdict == "pass" and result.ok and [c.id for c in result.inconclusive] == ["demo/second"]

    result = _run(tmp_path, _fail_and_inconclusive)
    assert result.verdict == "fail" and not result.ok
    assert "[crash] demo/second: it crashed" in result.message and "demo/first" not in result.message


def test_strict_fails_an_inconclusive_claim_like_advice(tmp_path: Path) -> None:
    result = _run(tmp_path, _pass_and_inconclusive, strict=True)
    assert result.verdict == "fail" and not result.ok
    assert result.message.startswith("[inconclusive] demo/second: no data exercises it")
    assert result.reproduce

    result = _run(tmp_path, _fail_and_inconclusive, strict=True)
    lines = [line for line in result.message.splitlines() if line.startswith("[")]
    assert lines == ["[crash] demo/second: it crashed", "[inconclusive] demo/first: no data exercises it"]


# -- the reports ------------------------------------------------------------------------------------------


def _records(tmp_path: Path) -> list[dict]:
    out = []
    for number, script in enumerate((_pass_and_inconclusive, _all_inconclusive), start=1):
        record = _run(tmp_path, script).to_dict()
        record.update(number=number, title="Demo", kind="cooker", property=f"demo{number}")
        out.append(record)
    return out


def test_report_json_and_markdown_list_inconclusive_claims(tmp_path: Path) -> None:
    records = _records(tmp_path)
    target = records[0]["target"]
    for strict in (False, True):
        out = tmp_path / f"report-{strict}"
        document = write_reports(
            out,
            results=records,
            targets=[{"target": target, "kind": "cooker", "formats": {}}],
            profile="quick",
            seed=0,
            exitstatus=0,
            strict=strict,
        )
        saved = json.loads((out / "report.json").read_text())
        assert saved["inconclusive"] == document["inconclusive"]
        assert [i["claim"] for i in saved["inconclusive"]] == [
            "demo/second",
            "demo/first",
            "demo/second",
            "demo/style",
        ]
        assert saved["inconclusive"][0] == {
            "target": target,
            "claim": "demo/second",
            "message": "no data exercises it",
        }
        assert saved["claims"] == {"pass": 1, "inconclusive": 4, "skip": 1}
        assert saved["summary"] == {"pass": 1, "inconclusive": 1}
        assert saved["failures"] == [] and saved["advice"] == []
        markdown = (out / "report.md").read_text()
        heading = "## Inconclusive (not verdicts: the suite could not exercise these claims"
        assert heading + ("; failures under --conformance-strict)" if strict else ")") in markdown
        assert (
            f"- **demo/second** on `{target}`: could not be checked: the derived data does not cook"
            in markdown
        )


# -- end to end: the terminal summary, junit.xml and the exit status ---------------------------------------

_KEYED = textwrap.dedent(
    '''
    """A cooker that knows the keys of the user's own dataset only (it looks its captions up by key, say):
    it cooks every sample the user stored and none of the copies the suite derives, re-keyed, so the claims
    checked on derived data are inconclusive."""
    from megatron.energon import Cooker, stateless

    from primus_energon import cook_preencoded_diffusion


    @stateless
    def _cook(sample):
        if not sample["__key__"].startswith("user_"):
            raise KeyError(f"no caption is known for {sample['__key__']!r}")
        return cook_preencoded_diffusion(sample)


    KEYED_COOKER = Cooker(_cook, has_subflavors={"encoding": "preencoded"})
    '''
)


def test_the_plugin_lists_inconclusive_claims_and_fails_only_under_strict(tmp_path: Path) -> None:
    from primus_energon.synthetic import generate_dataset

    (tmp_path / "keyed_hook.py").write_text(_KEYED)
    user = tmp_path / "user"
    generate_dataset(user, encoding="preencoded", num_samples=8, shard_size=4, key_prefix="user")
    report = tmp_path / "report"
    args = ["--cooker", "keyed_hook:KEYED_COOKER", f"--conformance-dataset={user}"]
    args += ["--conformance-profile", "quick", "--conformance-property", "resume"]
    run = run_pytest(tmp_path, *args, f"--conformance-report={report}", pythonpath=str(tmp_path))
    assert run.returncode == 0, run.stdout[-3000:]
    assert "inconclusive (not verdicts; the suite could not exercise these claims)" in run.stdout
    said = "the target cooks your sample 'user_"
    assert f"KEYED_COOKER: resume/checkpoint: could not be checked: {said}" in run.stdout, run.stdout[-3000:]
    tally = run.stdout.split("conformance claims", 1)[1].splitlines()[1]
    assert " inconclusive" in tally and "fail" not in tally and "error" not in tally, tally
    document = json.loads((report / "report.json").read_text())
    assert "resume/checkpoint" in {i["claim"] for i in document["inconclusive"]}
    assert document["failures"] == [] and document["exitstatus"] == 0
    assert "## Inconclusive" in (report / "report.md").read_text()
    junit = (report / "junit.xml").read_text()
    assert f'name="conformance_inconclusive" value="resume/checkpoint: could not be checked: {said}' in junit

    strict = run_pytest(tmp_path, *args, "--conformance-strict", pythonpath=str(tmp_path))
    assert strict.returncode == 1, strict.stdout[-3000:]
    assert f"[inconclusive] resume/checkpoint: could not be checked: {said}" in strict.stdout
    assert "inconclusive (not verdicts; failures with --conformance-strict)" in strict.stdout
