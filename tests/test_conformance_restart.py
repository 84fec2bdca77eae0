"""Property 15 (restart): per-rank states saved by a 2-rank torch.distributed job and restored in fresh
processes. The reference wrapper and a wrapper that records Energon's own description of the loader pass
every claim, refusing each changed configuration; a wrapper or hook pair passing Energon's bare state
through fails restart/world_size and restart/shards (samples repeated and never delivered) with advice on
the refusals that do not say what changed; a state that carries no position, another rank's state and
hash()-seeded cooking fail restart/fresh_processes and block the changed claims; cooker and TaskEncoder
targets without hooks are judged in fresh processes only; a bad --resume-hooks is a usage error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from primus_energon.conformance import check_cooker, check_task_encoder, check_wrapper
from primus_energon.conformance.core.results import PropertyResult
from primus_energon.conformance.engine.session import parse_resume_hooks
from tests.helpers import run_pytest

pytestmark = pytest.mark.slow

WRAPPERS = "tests.conformance_zoo.wrappers"
HOOKS = "tests.conformance_zoo.resume_hooks"
REFERENCE = "primus_energon:MegatronDataloaderWrapper"
CHANGED = (
    "restart/world_size",
    "restart/seed",
    "restart/num_workers",
    "restart/micro_batch_size",
    "restart/shards",
    "restart/says_why",
)
CLAIMS = ("restart/fresh_processes", *CHANGED)
SCENARIOS = (
    "unchanged",
    "world_2_to_1",
    "world_1_to_2",
    "seed",
    "num_workers",
    "micro_batch_size",
    "micro_batch_size_up",
    "shard_added",
    "shard_removed",
)
#: what each claim examines when every scenario is judged: 4 batches of 2 ranks after the unchanged
#: restore, one scenario per changed claim (two for world size and shards), and all 7 for the advice
EXAMINED = {
    "restart/fresh_processes": 8,
    "restart/world_size": 2,
    "restart/seed": 1,
    "restart/num_workers": 1,
    "restart/micro_batch_size": 2,
    "restart/shards": 2,
    "restart/says_why": 8,
}
BLOCKED = "blocked by restart/fresh_processes: "


def _hooks(save: str, load: str) -> str:
    return f"{HOOKS}:{save},{HOOKS}:{load}"


def _restart(
    check: Callable[..., list[PropertyResult]], spec: str, workdir: Path, hooks: str | None = None
) -> PropertyResult:
    options = {"resume_hooks": hooks} if hooks else {}
    (result,) = check(spec, properties=["restart"], workdir=workdir, **options)
    assert result.property == "restart"
    assert tuple(result.verdicts()) == CLAIMS, result.verdicts()
    expected_hooks = hooks.split(",") if hooks else []
    assert result.details["hooks"] == expected_hooks, result.details
    return result


def _claim(result: PropertyResult, claim_id: str, verdict: str) -> str:
    """``claim_id`` has ``verdict``; returns its message."""
    claim = result.claim(claim_id)
    assert claim.verdict == verdict, f"{claim_id}: {claim.verdict}: {claim.message}\n{result.verdicts()}"
    return claim.message


def _only_fresh_processes_judged(result: PropertyResult, reason: str) -> None:
    """Every changed claim skipped with ``reason`` in its message, nothing examined, no outcomes."""
    for claim_id in CHANGED:
        message = _claim(result, claim_id, "skip")
        assert reason in message, f"{claim_id}: {message}"
        assert result.claim(claim_id).examined == 0, claim_id
    assert "outcomes" not in result.details


@pytest.mark.parametrize(
    ("spec", "hooks", "refusal"),
    [
        pytest.param(REFERENCE, None, "ResumeMismatchError", id="reference-wrapper"),
        pytest.param(REFERENCE, _hooks("save", "load"), "ResumeMismatchError", id="reference-with-hooks"),
        pytest.param(f"{WRAPPERS}:RecordingWrapper", None, "ValueError", id="recording-wrapper"),
    ],
)
def test_wrappers_that_refuse_every_change_pass(
    spec: str, hooks: str | None, refusal: str, workdir: Path
) -> None:
    result = _restart(check_wrapper, spec, workdir, hooks)
    assert result.verdict == "pass", result.message
    assert result.verdicts() == dict.fromkeys(CLAIMS, "pass")
    assert result.message == "" and not result.advice and result.reproduce == ""
    assert {claim_id: result.claim(claim_id).examined for claim_id in CLAIMS} == EXAMINED
    assert "2-rank gloo job" in result.claim("restart/fresh_processes").message
    assert result.details["outcomes"] == {
        "unchanged": "accepted",
        **{name: f"refused: {refusal}" for name in SCENARIOS[1:]},
    }
    # The save and restore runs at both world sizes ran.
    assert {"save_w2_s", "save_w1_s", "restore_w2_s", "restore_w1_s"} <= set(result.details)


@pytest.mark.parametrize(
    "hooks",
    [
        pytest.param(None, id="plain-wrapper"),
        pytest.param(_hooks("save_raw", "load_raw"), id="hooks-save_raw-load_raw"),
    ],
)
def test_a_bare_energon_state_is_accepted_silently(hooks: str | None, workdir: Path) -> None:
    """Energon's own state, passed through without a record of the configuration: continues exactly with
    the same configuration, but a state of 2 ranks restored into 1 and a grown dataset silently repeat
    and drop samples; the restores Energon refuses itself do not say what changed, and a new seed is
    ignored."""
    spec = f"{WRAPPERS}:PlainWrapper" if hooks is None else REFERENCE
    result = _restart(check_wrapper, spec, workdir, hooks)
    assert _claim(result, "restart/fresh_processes", "pass").startswith("48 samples in shards of 6")
    assert result.claim("restart/fresh_processes").examined == 8
    for claim_id in ("restart/seed", "restart/num_workers", "restart/micro_batch_size"):
        assert _claim(result, claim_id, "pass") == "", claim_id

    world = _claim(result, "restart/world_size", "fail")
    assert world.startswith("world size 2 -> 1 (rank 0's state): the restore raised no error"), world
    assert "over the epoch (48 samples: 16 delivered before the save, 32 due after)" in world
    assert "16 sample(s) came twice (rs_" in world and "16 never came (rs_" in world, world
    assert "world size 1 -> 2" not in world  # refused loudly (by an IndexError): the advice's business
    shards = _claim(result, "restart/shards", "fail")
    assert shards.startswith("a shard of 6 samples added: the restore raised no error"), shards
    assert "over the epoch (54 samples: 12 delivered before the save, 42 due after)" in shards
    assert "came twice (rs_" in shards and "never came (rs_" in shards, shards
    assert "the last shard removed" not in shards
    for claim_id in ("restart/world_size", "restart/shards"):
        assert result.claim(claim_id).examined == 2 and result.claim(claim_id).fix, claim_id

    advice = _claim(result, "restart/says_why", "advice")
    lines = advice.splitlines()
    assert len(lines) == 4, advice
    assert lines[0].startswith("- world size 1 -> 2 (rank 1 finds no state): refused, but only by IndexError")
    assert "the first batch after the restore" in lines[0]
    assert lines[1].startswith("- seed +1: accepted, and the new seed was ignored"), lines[1]
    assert lines[2].startswith("- num_workers 1 -> 0: refused, but only by AssertionError (no message)")
    assert lines[3].startswith("- the last shard removed: refused, but only by IndexError"), lines[3]
    assert result.advice == [result.claim("restart/says_why")]

    assert result.verdict == "fail"
    assert "] restart/world_size: " in result.message and "] restart/shards: " in result.message
    assert "restart/says_why" not in result.message  # advice, not a failure unless strict
    assert result.details["outcomes"] == {
        "unchanged": "accepted",
        "world_2_to_1": "accepted",
        "world_1_to_2": "refused: IndexError",
        "seed": "accepted",
        "num_workers": "refused: AssertionError",
        "micro_batch_size": "accepted",
        "micro_batch_size_up": "refused: ValueError",
        "shard_added": "accepted",
        "shard_removed": "refused: IndexError",
    }
    assert result.reproduce.startswith(f"pytest --wrapper {spec} "), result.reproduce
    assert result.reproduce.endswith("--conformance-property restart"), result.reproduce
    assert (f"--resume-hooks {hooks}" in result.reproduce) == bool(hooks), result.reproduce


@pytest.mark.parametrize(
    ("spec", "hooks", "saved"),
    [
        pytest.param(f"{WRAPPERS}:StatelessWrapper", None, "(None)", id="stateless-wrapper"),
        pytest.param(
            REFERENCE,
            _hooks("save_after_iter", "load_raw"),
            "(written by the save hook)",
            id="hooks-save_after_iter",
        ),
        pytest.param(
            REFERENCE,
            _hooks("save_nothing", "load_if_present"),
            "(written by the save hook)",
            id="hooks-save_nothing",
        ),
    ],
)
def test_a_state_without_a_position_starts_over_and_blocks_the_changed_claims(
    spec: str, hooks: str | None, saved: str, workdir: Path
) -> None:
    result = _restart(check_wrapper, spec, workdir, hooks)
    message = _claim(result, "restart/fresh_processes", "fail")
    lines = message.splitlines()
    assert len(lines) == 2, message
    for rank, line in enumerate(lines):
        assert line.startswith(
            f"- rank {rank}: restored in a fresh process, the loader started from the beginning"
        )
        assert f"the state saved after 2 batches {saved}" in line, line
        assert line.endswith("carries no position, or the restore ignored it"), line
    assert result.claim("restart/fresh_processes").fix
    _only_fresh_processes_judged(result, BLOCKED)
    assert result.verdict == "fail" and "] restart/fresh_processes: " in result.message, result.message
    assert result.message.count("] restart/") == 1, result.message


def test_a_refusal_swallowed_into_a_fresh_start_fails(workdir: Path) -> None:
    """Energon refuses another worker count and a larger micro batch size; a wrapper that catches the
    refusal and starts the data over repeats the epoch so far, without a word."""
    result = _restart(check_wrapper, f"{WRAPPERS}:StartsFreshOnErrorWrapper", workdir)
    _claim(result, "restart/fresh_processes", "pass")
    workers = _claim(result, "restart/num_workers", "fail")
    assert workers.startswith("num_workers 1 -> 0: the restore raised no error"), workers
    assert "12 sample(s) came twice" in workers and "never came" in workers, workers
    # what the wrapper logged while it swallowed Energon's refusal is quoted
    assert "it wrote: 'could not restore the loader (" in workers and "starting fresh'" in workers, workers
    batch = _claim(result, "restart/micro_batch_size", "fail")
    assert batch.startswith("micro batch size 4 -> 8: the restore raised no error"), batch
    assert "micro batch size 4 -> 2" not in batch, batch  # Energon continues that one exactly
    assert result.details["outcomes"]["num_workers"] == "accepted", result.details


def test_a_new_seed_applied_by_starting_over_fails_seed(workdir: Path) -> None:
    """A wrapper that applies a restart's new seed by starting a fresh pass: the samples delivered before
    the save come again."""
    result = _restart(check_wrapper, f"{WRAPPERS}:NewSeedStartsFreshWrapper", workdir)
    _claim(result, "restart/fresh_processes", "pass")
    seed = _claim(result, "restart/seed", "fail")
    assert seed.startswith("seed +1: the restore raised no error"), seed
    assert "came twice" in seed and "never came" in seed, seed
    _claim(result, "restart/num_workers", "pass")  # Energon refuses it (a bare AssertionError: advice)


def test_every_rank_loading_rank_0s_file_fails_on_rank_1(workdir: Path) -> None:
    result = _restart(check_wrapper, REFERENCE, workdir, _hooks("save_raw", "load_rank0"))
    message = _claim(result, "restart/fresh_processes", "fail")
    assert message.startswith(
        "rank 1 of 2, restored in a fresh process: batch 0 after the restore holds samples ['rs_"
    ), message
    assert "where the uninterrupted run went on with ['rs_" in message
    assert "another rank's state" in message
    assert "rank 0" not in message  # rank 0 loads its own file and continues exactly
    _only_fresh_processes_judged(result, BLOCKED)
    assert result.verdict == "fail" and result.message.count("] restart/") == 1, result.message
    assert "--resume-hooks " in result.reproduce and result.reproduce.endswith(
        "--conformance-property restart"
    )


@pytest.mark.parametrize(
    ("check", "spec"),
    [
        pytest.param(check_task_encoder, "primus_energon:EncodedDiffusionTaskEncoder", id="task-encoder"),
        pytest.param(check_cooker, "primus_energon:PREENCODED_COOKER", id="cooker"),
    ],
)
def test_cookers_and_task_encoders_without_hooks_are_judged_in_fresh_processes_only(
    check: Callable[..., list[PropertyResult]], spec: str, workdir: Path
) -> None:
    result = _restart(check, spec, workdir)
    assert result.verdict == "pass", result.message
    assert _claim(result, "restart/fresh_processes", "pass").startswith("48 samples in shards of 6")
    assert result.claim("restart/fresh_processes").examined == 8
    _only_fresh_processes_judged(result, "check those with --wrapper and --resume-hooks SAVE,LOAD")
    assert "not by a cooker or TaskEncoder" in result.claim("restart/world_size").message
    # Only the world-size-2 save and restore ran: nothing at world size 1 without the changed claims.
    assert {"save_w2_s", "restore_w2_s"} <= set(result.details)
    assert not {"save_w1_s", "restore_w1_s"} & set(result.details), result.details


def test_hash_seeded_cooking_fails_in_fresh_processes(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """str hashing is salted per process: the restored process cooks other noise than the saving one. The
    property gives the restoring processes another PYTHONHASHSEED than the saving ones, so a fixed one in
    the caller's environment does not hide the defect."""
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    spec = "tests.conformance_zoo.determinism_broken:HASH_NOISE_COOKER"
    result = _restart(check_cooker, spec, workdir)
    message = _claim(result, "restart/fresh_processes", "fail")
    lines = message.splitlines()
    assert len(lines) == 2, message
    for rank, line in enumerate(lines):
        assert line.startswith(
            f"- rank {rank} of 2, restored in a fresh process: batch 0 after the restore differs from the "
            "uninterrupted run's (keys ['restart_"
        ), line
        assert "DiffusionSample.latents" in line and "hash() or set order" in line, line
    _only_fresh_processes_judged(result, "--resume-hooks SAVE,LOAD")
    assert result.verdict == "fail" and "] restart/fresh_processes: " in result.message, result.message
    assert (
        result.reproduce == f"pytest --cooker {spec} --conformance-profile ci --conformance-property restart"
    )


BAD_HOOKS = [
    pytest.param("nope", "--resume-hooks 'nope': expected SAVE,LOAD, two MODULE:FUNC", id="one-spec"),
    pytest.param(
        f"{HOOKS}:save,primus_energon.conformance.properties.restart:BATCH_SIZE",
        "the load hook 'primus_energon.conformance.properties.restart:BATCH_SIZE' is not callable",
        id="not-callable",
    ),
    pytest.param(
        "no_such_module:save,no_such_module:load",
        "cannot import module 'no_such_module' of 'no_such_module:save'",
        id="missing-module",
    ),
]


def test_resume_hooks_are_parsed_as_a_pair() -> None:
    assert parse_resume_hooks(None) == () and parse_resume_hooks("") == ()
    pair = (f"{HOOKS}:save", f"{HOOKS}:load")
    assert parse_resume_hooks(f" {pair[0]} , {pair[1]} ") == pair
    assert parse_resume_hooks(list(pair)) == pair


@pytest.mark.parametrize(("hooks", "expected"), BAD_HOOKS)
def test_bad_resume_hooks_raise_value_error(hooks: str, expected: str, workdir: Path) -> None:
    with pytest.raises(ValueError) as raised:
        check_wrapper(REFERENCE, properties=["restart"], workdir=workdir, resume_hooks=hooks)
    assert expected in str(raised.value), str(raised.value)


@pytest.mark.parametrize(("hooks", "expected"), BAD_HOOKS)
def test_bad_resume_hooks_are_one_line_and_exit_4(tmp_path: Path, hooks: str, expected: str) -> None:
    run = run_pytest(
        tmp_path, "--wrapper", REFERENCE, "--resume-hooks", hooks, "--conformance-profile", "quick"
    )
    output = run.stdout + run.stderr
    assert run.returncode == 4, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and expected in errors[0], output[-3000:]
    assert "Traceback" not in output and "test_property" not in output and len(output.splitlines()) < 6


def test_quick_leaves_the_fresh_process_restore_of_a_task_encoder_to_ci(workdir: Path) -> None:
    (result,) = check_task_encoder(
        "primus_energon:EncodedDiffusionTaskEncoder", properties=["restart"], profile="quick", workdir=workdir
    )
    assert result.verdict == "skip", result.verdicts()
    assert "the quick profile leaves the restore in fresh processes under torch.distributed to ci" in (
        result.message
    )
