"""Declarations of deliberate transforms: parsing (with errors that say what is wrong), what each kind
explains, what an undeclared change is recognised as, and the binomial bound the rate claim uses."""

from __future__ import annotations

import pytest
import torch

from primus_energon.conformance.core.declarations import (
    Transform,
    declaration_hint,
    parse_transform,
    parse_transforms,
)
from primus_energon.conformance.oracles.declared import always, outcome, recognise
from primus_energon.conformance.oracles.fields import field_at
from primus_energon.conformance.oracles.stats import binomial_p_value, binomial_range


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('caption: dropout rate=0.1 to=""', Transform("caption", "dropout", rate=0.1, to="")),
        (
            "prompt_embeds: dropout rate=0.25 to=zeros",
            Transform("prompt_embeds", "dropout", rate=0.25, to="zeros"),
        ),
        ("x: dropout rate=0.1 to=constant", Transform("x", "dropout", rate=0.1, to="constant")),
        ("x: dropout rate=0.1 to=None", Transform("x", "dropout", rate=0.1, to=None)),
        ("x: dropout rate=0.1 to=-1.0", Transform("x", "dropout", rate=0.1, to=-1.0)),
        ("latents: flip", Transform("latents", "flip", rate=0.5, axis=-1)),
        ("latents: flip axis=-2 rate=0.3", Transform("latents", "flip", rate=0.3, axis=-2)),
        (
            "prompt_embeds: truncate axis=0 length=77",
            Transform("prompt_embeds", "truncate", axis=0, length=77),
        ),
        ("latents: cast dtype=bfloat16", Transform("latents", "cast", dtype="bfloat16")),
        ("metadata.caption: dropout rate=1 to=''", Transform("metadata.caption", "dropout", rate=1.0, to="")),
    ],
)
def test_declarations_parse_and_print_back(line: str, expected: Transform) -> None:
    parsed = parse_transform(line)
    assert {**parsed.__dict__, "text": ""} == {**expected.__dict__, "text": ""}
    canonical = str(Transform(**{**parsed.__dict__, "text": ""}))
    again = parse_transform(canonical)
    assert {**again.__dict__, "text": ""} == {**expected.__dict__, "text": ""}, canonical


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("caption dropout", "write FIELD: KIND"),
        ("caption: drop rate=0.1", "unknown kind 'drop'; use one of dropout, flip, truncate, cast"),
        ('caption: dropout rate=2 to=""', "rate must be a number in (0, 1], not 2"),
        ('caption: dropout rate=0 to=""', "rate must be a number in (0, 1]"),
        ("caption: dropout rate=0.1", "dropout needs to="),
        (
            "caption: dropout rate=0.1 to=empty",
            'neither a quoted text (to="empty") nor one of zeros, constant',
        ),
        ("x: cast dtype=int8", "dtype must be one of float16, bfloat16, float32, float64"),
        ("x: flip colour=1", "flip takes no 'colour' (it takes axis, rate)"),
        ("x: truncate length=-3", "length must be a non-negative integer"),
        ("x: flip axis", "'axis' is not NAME=VALUE"),
    ],
)
def test_a_bad_declaration_says_what_is_wrong(line: str, says: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_transform(line)
    assert says in str(raised.value) and repr(line) in str(raised.value)


def test_lines_comments_and_a_field_declared_twice() -> None:
    text = '# CFG\ncaption: dropout rate=0.1 to=""  # ten percent\n\nlatents: flip\n'
    assert [t.field for t in parse_transforms(text)] == ["caption", "latents"]
    assert parse_transforms('caption: dropout rate=0.1 to="#"')[0].to == "#"
    with pytest.raises(ValueError, match=r"field\(s\) \['latents'\] declared more than once"):
        parse_transforms(["latents: flip", "latents: cast dtype=float16"])


def test_what_each_kind_explains() -> None:
    clean = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    flip = parse_transform("latents: flip axis=-1")
    assert outcome(flip, clean, clean.clone()) == "kept"
    assert outcome(flip, clean, clean.flip(-1)) == "applied"
    assert outcome(flip, clean, clean.flip(-2)) is None  # another axis is another transform
    truncate = parse_transform("e: truncate axis=1 length=2")
    assert outcome(truncate, clean, clean[:, :2]) == "applied"
    assert outcome(truncate, clean, clean[:, 1:]) is None  # the tail is not a truncation
    assert always(truncate, clean) and not always(truncate, clean[:, :2])
    cast = parse_transform("latents: cast dtype=bfloat16")
    assert outcome(cast, clean, clean.to(torch.bfloat16)) == "applied"
    assert outcome(cast, clean, clean.to(torch.float16)) is None
    zeros = parse_transform("e: dropout rate=0.1 to=zeros")
    assert outcome(zeros, clean, torch.zeros_like(clean)) == "applied"
    assert outcome(zeros, clean, torch.zeros(2, 3)) is None  # another shape
    assert outcome(zeros, clean, clean + 1) is None
    text = parse_transform('caption: dropout rate=0.1 to=""')
    assert outcome(text, "a cat", "") == "applied" and outcome(text, "a cat", "a dog") is None
    assert outcome(parse_transform("caption: truncate length=3"), "a cat", "a c") == "applied"


def test_an_undeclared_change_is_recognised_as_the_declaration_that_expresses_it() -> None:
    clean = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(0))
    assert recognise(clean, clean.flip(-1)) == "flip axis=-1 rate=RATE"
    assert recognise(clean, clean.flip(-2)) == "flip axis=-2 rate=RATE"
    assert recognise(clean, clean.to(torch.float16)) == "cast dtype=float16"
    assert recognise(clean, clean[:, :3]) == "truncate axis=1 length=3"
    assert recognise(clean, torch.zeros_like(clean)) == "dropout rate=RATE to=zeros"
    assert recognise("a cat on a mat", "") == 'dropout rate=RATE to=""'
    assert recognise("a cat on a mat", "a cat") == "truncate length=5"
    assert recognise("a cat on a mat \t", "a cat on a mat") is None  # stripped, not truncated
    assert recognise(clean, clean * 2) is None  # no declaration expresses a corruption
    assert recognise(clean, clean) is None
    hint = declaration_hint("caption", 'dropout rate=RATE to=""')
    assert "--conformance-transform 'caption: dropout rate=RATE to=\"\"'" in hint
    assert "RATE the share of samples" in hint and "conformance_transforms" in hint


def test_the_binomial_bound() -> None:
    assert binomial_p_value(19, 192, 0.1) > 0.5  # the expected count
    assert binomial_p_value(96, 192, 0.1) < 1e-20  # half, declared a tenth
    assert binomial_p_value(0, 192, 0.1) < 1e-4  # never
    low, high = binomial_range(192, 0.1, 1e-4)
    assert 0 < low < 19 < high < 50
    assert binomial_p_value(low, 192, 0.1) >= 1e-4 > binomial_p_value(low - 1, 192, 0.1)
    assert binomial_p_value(192, 192, 1.0) == 1.0


def test_field_at_reads_dotted_paths() -> None:
    from primus_energon.conformance.oracles.expectations import MISSING

    sample = {"metadata": {"captions": ["a", "b"]}, "x": 1}
    assert field_at(sample, "metadata.captions[1]") == "b"
    assert field_at(sample, "metadata.missing") is MISSING
    assert field_at(sample, "x") == 1


# -- the transforms property and the data claims, on the zoo ------------------------------------------------

ZOO = "tests.conformance_zoo.transforms"


def _check(name: str, workdir, declared: bool, properties: tuple[str, ...]):
    from primus_energon.conformance import check_cooker, check_task_encoder
    from tests.conformance_zoo.transforms import DECLARATIONS

    check = check_cooker if name.startswith("cook_") else check_task_encoder
    return check(
        f"{ZOO}:{name}",
        properties=list(properties),
        profile="quick",
        workdir=workdir,
        transforms=[DECLARATIONS[name]] if declared else None,
    )


def _claims(results) -> dict[str, object]:
    return {claim.id: claim for result in results for claim in result.claims}


CORRECT = [
    "CfgDropoutTaskEncoder",
    "cook_cfg_dropout",
    "EmbeddingDropoutTaskEncoder",
    "FlipTaskEncoder",
    "TruncateTaskEncoder",
    "CastTaskEncoder",
]


@pytest.mark.parametrize("name", CORRECT)
def test_a_deliberate_transform_passes_once_declared(name: str, workdir) -> None:
    properties = ("fidelity", "transforms") + (() if name.startswith("cook_") else ("batch",))
    claims = _claims(_check(name, workdir, True, properties))
    failed = {i: c.message for i, c in claims.items() if c.verdict in ("fail", "error")}
    assert not failed, failed
    for claim_id in ("transforms/observed", "transforms/rate", "transforms/deterministic"):
        assert claims[claim_id].verdict == "pass", (claim_id, claims[claim_id].message)
        assert claims[claim_id].examined > 0
    redrawn, only = claims["transforms/redrawn"], claims["transforms/only_declared"]
    if name in ("TruncateTaskEncoder", "CastTaskEncoder"):  # applies to every sample alike
        assert redrawn.verdict == only.verdict == "skip", (redrawn, only)
    else:
        assert redrawn.verdict == only.verdict == "pass", (redrawn.message, only.message)


@pytest.mark.parametrize(
    ("name", "claim_id", "declaration"),
    [
        ("CfgDropoutTaskEncoder", "fidelity/text", "'caption: dropout rate="),
        ("cook_cfg_dropout", "fidelity/text", "'caption: dropout rate=RATE to=\"\"'"),
        ("EmbeddingDropoutTaskEncoder", "fidelity/tensors", "'prompt_embeds: dropout rate="),
        ("FlipTaskEncoder", "fidelity/tensors", "'latents: flip axis=-1 rate="),
        ("TruncateTaskEncoder", "fidelity/tensors", "'prompt_embeds: truncate axis=0 length=4'"),
        ("CastTaskEncoder", "fidelity/tensors", "'latents: cast dtype=bfloat16'"),
    ],
)
def test_undeclared_the_change_fails_and_the_message_names_the_declaration(
    name: str, claim_id: str, declaration: str, workdir
) -> None:
    claims = _claims(_check(name, workdir, False, (claim_id.split("/")[0], "transforms")))
    claim = claims[claim_id]
    assert claim.verdict == "fail", (claim.verdict, claim.message)
    assert f"declare it: --conformance-transform {declaration}" in claim.message, claim.message
    assert claims["transforms/observed"].verdict == "skip"  # nothing declared


def test_a_change_in_encode_sample_names_the_stage_and_the_share(workdir) -> None:
    claims = _claims(_check("ZerosLatentsTaskEncoder", workdir, False, ("fidelity", "batch")))
    claim = claims["fidelity/tensors"]
    assert claim.verdict == "fail"
    assert (
        "reaches field 'latents' changed by encode_sample (the cooker returned it as it was)" in claim.message
    )
    assert "filled with zeros" in claim.message, claim.message
    # zeros in every sample are no dropout to declare: the data is lost
    assert "in every sample (48 of 48): the member's values are lost" in claim.message, claim.message
    assert "--conformance-transform" not in claim.message
    assert claims["batch/delivered"].verdict == "pass"  # one root cause once: the first stage is fidelity's


@pytest.mark.parametrize(
    ("name", "claim_id", "says"),
    [
        ("DropsHalfTaskEncoder", "transforms/rate", "at the declared rate 0.1 between"),
        (
            "ConstantSeedDropoutTaskEncoder",
            "transforms/rate",
            "it never applied: a draw seeded from a constant",
        ),
        ("PerKeySeedDropoutTaskEncoder", "transforms/redrawn", "the draw is fixed per sample key"),
        ("UnseededDropoutTaskEncoder", "transforms/deterministic", "got another draw of ['caption']"),
        (
            "DropsEmbeddingsTooTaskEncoder",
            "transforms/only_declared",
            "field 'pooled_prompt_embeds' changes too",
        ),
        ("TruncatesToFiveTaskEncoder", "transforms/observed", "is neither member 'prompt_embeds.pth'"),
        ("ZerosLatentsTaskEncoder", "transforms/observed", "is neither member 'latents.pth'"),
    ],
)
def test_a_declaration_the_target_does_not_keep_fails_the_claim_meant_for_it(
    name: str, claim_id: str, says: str, workdir
) -> None:
    claims = _claims(_check(name, workdir, True, ("transforms",)))
    claim = claims[claim_id]
    assert claim.verdict == "fail", (claim.verdict, claim.message)
    assert says in claim.message, claim.message
    others = {i: c.verdict for i, c in claims.items() if c.verdict == "fail" and i != claim_id}
    assert not others, others  # one root cause, one claim


def test_without_declarations_the_property_examines_nothing_and_says_why(workdir) -> None:
    (result,) = _check("CfgDropoutTaskEncoder", workdir, False, ("transforms",))
    assert {c.verdict for c in result.claims} == {"skip"}
    assert all("no transform is declared" in c.message for c in result.claims)


def test_a_bad_declaration_is_refused_before_anything_runs(workdir) -> None:
    from primus_energon.conformance import check_task_encoder

    with pytest.raises(ValueError, match="unknown kind 'drop'"):
        check_task_encoder(
            f"{ZOO}:CfgDropoutTaskEncoder", transforms=["caption: drop rate=0.1"], workdir=workdir
        )


def test_a_dropout_in_batch_is_judged_on_the_delivered_rows(workdir) -> None:
    """CFG dropout written into batch(): no per-sample stage shows it, the real loader's rows do; declared, the
    rate is judged there and nothing fails; undeclared, batch/rows names the declaration."""
    claims = _claims(_check("CfgInBatchTaskEncoder", workdir, True, ("transforms", "batch")))
    failed = {i: c.message for i, c in claims.items() if c.verdict in ("fail", "error")}
    assert not failed, failed
    assert claims["transforms/rate"].verdict == "pass" and claims["transforms/rate"].examined >= 64
    assert "after the per-sample stages" in claims["transforms/redrawn"].message
    claims = _claims(_check("CfgInBatchTaskEncoder", workdir, False, ("batch",)))
    assert claims["batch/rows"].verdict == "fail"
    assert '(its row holds "" (a dropout))' in claims["batch/rows"].message
    assert (
        "declare it: --conformance-transform 'caption: dropout rate=RATE to=\"\"'"
        in claims["batch/rows"].message
    )
