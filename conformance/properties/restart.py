"""Property 15, restart: resume as training resumes. Each rank of a gloo job (the ranks get what
``torch.distributed.run`` gives them) saves its loader state, and the states are restored in fresh
processes under another ``PYTHONHASHSEED``: with the same configuration
the run continues exactly; with a changed one (another data-parallel world size, seed, worker count,
micro batch size, a shard added or removed) the restore is refused loudly or continues exactly, never
with samples silently repeated or never delivered.

Energon 7.4.1 itself refuses only a changed worker count and some micro batch sizes: a state of 2 ranks
restored into 1, under a new seed or over a grown dataset is accepted without a word. So the changed
configurations judge the code between the training loop and Energon's loader: a wrapper target
(``--wrapper``), and the user's checkpoint functions (``--resume-hooks SAVE,LOAD``), which a trainer calls
as ``save(loader, directory, rank)`` / ``load(loader, directory, rank)`` with ``loader`` the object the
training loop iterates (the wrapper target, else ``MegatronDataloaderWrapper`` around Energon's loader).
A cooker or TaskEncoder target is checked for the exact continuation in fresh processes; the changed
configurations do not depend on it.

How the changed configurations are judged: a restore refused loudly (an exception at the restore or at the
first batch after it, on any rank: the job stops) passes; the advice claim ``says_why`` asks that the
refusal name the change. An accepted restore is counted over one epoch: the keys every old rank delivered
before the save, then the restored ranks' batches step by step (every rank's batch ``i`` before any rank's
``i + 1``, as the training loop consumes them) up to the epoch's size. A key in it twice was repeated, a key
of the dataset not in it never came; either fails the claim with both counted. A redistribution that
leaves the ranks uneven is counted per rank as well (each rank's epoch ends where it delivers a key again):
it passes when no key comes twice and every key comes, and a key that comes only in the step after the
epoch was reordered across the epoch's end (advice).

Runs: a save run at world size 2 and one at world size 1 start ahead of the checks (``prestart``); when they
end, a thread of the parent starts the restore runs, so all four overlap the properties checked before this
one. Each process is forked from the fork server of its hash seed
(:func:`~primus_energon.conformance.processes.children.start_runner`); the commands in messages reproduce them with
``torch.distributed.run``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..core.results import PropertySkipped
from ..engine.context import CheckContext
from ..processes.children import HASHSEEDS, Background, Child, child_target_args, finish
from ..processes.forkserver import ForkServers
from ._common import fail

__all__ = ["check", "prestart", "CLAIMS", "add_child_arguments", "run_child"]

CLAIMS = claims_of(
    "restart",
    (
        "fresh_processes",
        "per-rank states saved under torch.distributed (2 ranks) and restored in fresh processes with the same "
        "configuration continue exactly: each rank's next batches are the uninterrupted run's",
        Harm.RESUME,
        "save every rank's state (save_state_rank(), or the wrapper's save_state()) after the step, restore it "
        "into a fresh loader of the same rank before its first batch, and keep no state outside it "
        "(draw randomness from Energon's per-sample seed, not from hash(), the pid or the time)",
    ),
    (
        "world_size",
        "a state restored at another data-parallel world size (2 -> 1, 1 -> 2) is refused loudly or continues "
        "exactly: over the epoch no sample comes twice and none is never delivered",
        Harm.RESUME,
        "save the data-parallel world size and rank beside the loader state and refuse a restore where they "
        "differ (primus_energon.MegatronDataloaderWrapper does): Energon 7.4.1 accepts the state silently",
    ),
    (
        "seed",
        "a state restored with another seed is refused loudly or continues exactly",
        Harm.RESUME,
        "save the seed beside the loader state and refuse another one: Energon restores the saved random "
        "state, so a new seed is silently ignored",
    ),
    (
        "num_workers",
        "a state restored with another worker count is refused loudly or continues exactly",
        Harm.RESUME,
        "save num_workers beside the loader state and refuse another one with a message that names it; where "
        "Energon refuses it (an AssertionError), let the error through instead of starting the data over",
    ),
    (
        "micro_batch_size",
        "a state restored with another micro batch size is refused loudly or continues exactly",
        Harm.RESUME,
        "save the micro batch size beside the loader state and refuse another one, or allow only a divisor "
        "with workers (Energon scales the positions); where Energon refuses it, let the error through instead "
        "of starting the data over",
    ),
    (
        "shards",
        "a state restored over the dataset with a shard added or removed is refused loudly or continues "
        "exactly",
        Harm.RESUME,
        "save the shard names and sample counts beside the loader state and refuse a restore where they "
        "differ: Energon's saved positions index the shard table and land on other samples",
    ),
    (
        "says_why",
        "a refused restore names what changed (not a bare AssertionError, or an IndexError from a worker), and "
        "no change is accepted while being ignored (a new seed)",
        Harm.ADVICE,
        "compare a record of the configuration before restoring and raise one error naming each difference "
        "(see primus_energon.resume)",
    ),
)

BATCH_SIZE = 4
NUM_SAMPLES = 48
SHARD_SIZE = 6
#: batches each rank reads before saving, at world size 2 and 1 (>= num_workers: see resume._steps_for)
SAVE_AT = {2: 2, 1: 3}
NUM_WORKERS = 1
#: batches compared after an unchanged restore
CONTINUATION = 4
#: batches each rank reads past the epoch's worth; a key missing from the epoch that comes in the first
#: step after it (one batch of every rank) was reordered across the epoch's end, not lost
TAIL = 2
CHANGED = ("world_size", "seed", "num_workers", "micro_batch_size", "shards")
_KEY_PREFIX = "rs"
_HASHSEEDS = {"save": HASHSEEDS[0], "restore": HASHSEEDS[1]}


@dataclasses.dataclass(frozen=True)
class _Scenario:
    """One restore: which saved states, into which configuration, judged under which claim."""

    name: str
    claim: str
    what: str
    saved_world: int
    world: int
    seed_delta: int = 0
    num_workers: int = NUM_WORKERS
    batch_size: int = BATCH_SIZE
    variant: str | None = None  # "plus" / "minus": the dataset with a shard added / removed


def _scenarios(changed: bool, world: int = 2) -> list[_Scenario]:
    """The restores: the unchanged one at ``world`` (2: torch.distributed ranks), then the changed ones."""
    out = [_Scenario("unchanged", "fresh_processes", "the same configuration", world, world)]
    if not changed:
        return out
    return out + [
        _Scenario("world_2_to_1", "world_size", "world size 2 -> 1 (rank 0's state)", 2, 1),
        _Scenario("world_1_to_2", "world_size", "world size 1 -> 2 (rank 1 finds no state)", 1, 2),
        _Scenario("seed", "seed", "seed +1", 1, 1, seed_delta=1),
        _Scenario("num_workers", "num_workers", f"num_workers {NUM_WORKERS} -> 0", 1, 1, num_workers=0),
        _Scenario(
            "micro_batch_size",
            "micro_batch_size",
            f"micro batch size {BATCH_SIZE} -> {BATCH_SIZE // 2}",
            1,
            1,
            batch_size=BATCH_SIZE // 2,
        ),
        _Scenario(
            "micro_batch_size_up",
            "micro_batch_size",
            f"micro batch size {BATCH_SIZE} -> {BATCH_SIZE * 2}",
            1,
            1,
            batch_size=BATCH_SIZE * 2,
        ),
        _Scenario("shard_added", "shards", f"a shard of {SHARD_SIZE} samples added", 1, 1, variant="plus"),
        _Scenario("shard_removed", "shards", "the last shard removed", 1, 1, variant="minus"),
    ]


def _changed_applies(ctx: CheckContext) -> str | None:
    """Why the changed configurations are not judged for this target (None: they are)."""
    if ctx.target.kind == "wrapper" or ctx.resume_hooks:
        return None
    return (
        "what a restore under a changed configuration does is decided by the loader, its wrapper and the "
        "trainer's checkpoint code, not by a cooker or TaskEncoder; check those with --wrapper and "
        "--resume-hooks SAVE,LOAD"
    )


# --- the parent half -----------------------------------------------------------------------------------


class _Runs:
    """The save runs (started by :func:`prestart`) and the restore runs a thread starts when they end."""

    def __init__(self, background: Background, servers: ForkServers) -> None:
        self.background = background
        self.servers = servers
        self.lock = threading.Lock()
        self.closed = False
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def info(self) -> dict[str, Any]:
        return self.background.info

    def start(self, name: str, args: list[str], **options: Any) -> None:
        """:func:`~primus_energon.conformance.processes.children.start_runner` the restart subcommand as ``name``
        (not once :meth:`close` began)."""
        with self.lock:
            if not self.closed:
                self.background.start_runner(name, "restart", args, servers=self.servers, **options)

    def close(self) -> None:
        with self.lock:
            self.closed = True
        self.background.close()
        if self.thread is not None:
            self.thread.join(5)


def _data(ctx: CheckContext, root: Path, changed: bool) -> dict[str, str]:
    """Copies of the datasets under ``root``: ``base`` (what the target reads), and for the changed
    configurations ``config`` (the built-in preencoded format the reference TaskEncoder reads) with its
    ``plus`` and ``minus`` variants, which the restore run swaps in at ``config``'s path."""
    from primus_energon.synthetic import builtin_schema

    from ..data.workspace import SMALL_SHAPES

    out: dict[str, str] = {}
    if ctx.target.kind == "wrapper":
        base = None
    else:
        base = ctx.generated(ctx.encodings()[0], "restart", num_samples=NUM_SAMPLES, shard_size=SHARD_SIZE)
        out["base"] = str(base)
    if changed or base is None:
        schema = builtin_schema("preencoded", shapes=SMALL_SHAPES)
        sizes = {"config": NUM_SAMPLES, "plus": NUM_SAMPLES + SHARD_SIZE, "minus": NUM_SAMPLES - SHARD_SIZE}
        for name, count in sizes.items():
            made = ctx.workspace.generated(
                None,
                f"restart-{name}",
                schema=schema,
                derive=False,
                num_samples=count,
                shard_size=SHARD_SIZE,
                key_prefix=_KEY_PREFIX,
            )
            copy = root / name
            shutil.copytree(made, copy)
            out[name] = str(copy)
        if base is None:
            out["base"] = out["config"]
    return out


def _common_args(ctx: CheckContext, runs: _Runs) -> list[str]:
    args = [*runs.info["target_args"], "--dataset", runs.info["data"]["base"]]
    args += ["--plan", str(runs.background.dir / "plan.json"), "--seed", str(ctx.seed)]
    for hook in ctx.resume_hooks or ():
        args += ["--hook", hook]
    return args


def _launch(runs: _Runs, phase: str, world: int, args: list[str]) -> None:
    out = runs.background.dir / f"{phase}-w{world}"
    out.mkdir(exist_ok=True)
    full = [*args, "--phase", phase, "--out", str(out)]
    # Another PYTHONHASHSEED in the restoring processes than in the saving ones, as a restarted job has:
    # hash() or set order that decides the data shows.
    runs.start(f"{phase}-w{world}", full, world=world, hashseed=_HASHSEEDS[phase], OMP_NUM_THREADS="1")


def _chain(ctx: CheckContext, runs: _Runs, args: list[str]) -> None:
    """Wait for the save runs, then run the restore runs one after the other (the world-size-1 run swaps
    datasets in place, which the other must not be reading), on a thread of the parent."""
    try:
        for world in runs.info["save_worlds"]:
            child = runs.background.children.get(f"save-w{world}")
            if child is not None:
                child.process.wait(ctx.timeout_s)
        for world in runs.info["restore_worlds"]:
            _launch(runs, "restore", world, args)
            child = runs.background.children.get(f"restore-w{world}")
            if child is not None:
                child.process.wait(ctx.timeout_s)
    except BaseException as error:  # reported by check()
        runs.error = error


def prestart(ctx: CheckContext) -> _Runs:
    """Make the data, write the plan, start the save runs and the thread that starts the restore runs."""
    runs = _Runs(Background("conformance-restart-"), ctx.fork_servers)
    try:
        try:
            runs.info["target_args"] = child_target_args(ctx.target)
        except PropertySkipped as skipped:
            runs.info["skipped"] = str(skipped)
            return runs
        changed = _changed_applies(ctx) is None
        if not changed and ctx.profile.name == "quick":
            # For a cooker or TaskEncoder, quick leaves these runs to ci (resume/checkpoint restores in process,
            # determinism/fresh_processes runs the target under two hash seeds). They were a third of a quick
            # run on 2 cores when each process was a new interpreter (they are forked now: not re-measured).
            runs.info["skipped"] = (
                "the quick profile leaves the restore in fresh processes under torch.distributed to ci "
                "(resume/checkpoint restored in process; determinism/fresh_processes ran the target in fresh "
                "processes)"
            )
            return runs
        data = _data(ctx, runs.background.dir, changed)
        scenarios = _scenarios(changed)
        plan = {
            "data": data,
            "scenarios": [dataclasses.asdict(s) for s in scenarios],
            "states": str(runs.background.dir / "states"),
            "reference_te": ctx.target.kind == "wrapper",
        }
        (runs.background.dir / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
        runs.info.update(
            {
                "plan": plan,
                "data": data,
                "scenarios": scenarios,
                "save_worlds": sorted({s.saved_world for s in scenarios}, reverse=True),
                "restore_worlds": sorted({s.world for s in scenarios}, reverse=True),
            }
        )
        args = _common_args(ctx, runs)
        for world in runs.info["save_worlds"]:
            _launch(runs, "save", world, args)
        runs.thread = threading.Thread(
            target=_chain, args=(ctx, runs, args), daemon=True, name="restart-chain"
        )
        runs.thread.start()
    except BaseException:
        runs.close()
        raise
    return runs


def _finish(ctx: CheckContext, runs: _Runs, name: str) -> Child:
    child = runs.background.children.get(name)
    if child is None:
        fail(f"the {name} run was never started ({runs.error or 'the save runs did not end'})")
    finish(
        child, what=f"the {name.replace('-w', ' run at world size ')}", reproduce="", timeout=ctx.timeout_s
    )
    return child


def _records(runs: _Runs, phase: str, world: int) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for rank in range(world):
        file = runs.background.dir / f"{phase}-w{world}" / f"rank{rank}.json"
        if not file.exists():
            fail(f"the {phase} run at world size {world} ended without rank {rank}'s results ({file})")
        out[rank] = json.loads(file.read_text(encoding="utf-8"))
    return out


def _expected_keys(path: str) -> list[str]:
    from primus_energon.synthetic import Manifest

    return [s.key for s in Manifest.load(Path(path)).samples if s.split == "train"]


def _some(keys: list[str], limit: int = 6) -> str:
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _refusal(results: dict[int, dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The refusal of a scenario that says most: one with a message of its own on any rank, else the first."""
    found = [
        {"rank": rank, **outcome["refused"]}
        for rank in sorted(results)
        if (outcome := results[rank].get(name) or {}).get("refused")
    ]
    named = [r for r in found if r["type"] not in _UNNAMED and r["message"].strip()]
    return (named or found or [None])[0]


_UNNAMED = ("AssertionError", "IndexError", "KeyError", "AttributeError", "TypeError")


def _judge_unchanged(
    claim: Any, saved: dict[int, dict[str, Any]], restored: dict[int, dict[str, Any]]
) -> None:
    """``saved``: each rank's save record of the target's data; ``restored``: each rank's restore results."""
    from ..oracles.fingerprint import first_difference, parse_fingerprint

    for rank in sorted(saved):
        save = saved[rank]
        if save.get("error"):
            claim.problem(
                f"rank {rank} could not save its state after {save.get('steps')} batches: {save['error']}"
            )
            continue
        outcome = restored[rank].get("unchanged") or {}
        if outcome.get("refused"):
            r = outcome["refused"]
            claim.problem(
                f"rank {rank}: restoring its own state in a fresh process with the same configuration failed at "
                f"{r['at']} ({r['type']}: {r['message']}); a training job could not resume"
            )
            continue
        batches = outcome.get("batches") or []
        claim.examined(len(batches))
        expected = save["continuation"]
        for index, (want, got) in enumerate(zip(expected, batches, strict=False)):
            if want["digest"] == got["digest"]:
                continue
            if [b["digest"] for b in batches[: len(save["before"])]] == [b["digest"] for b in save["before"]]:
                empty = (
                    "None"
                    if save.get("state_is_none")
                    else "written by the save hook"
                    if save.get("hooks")
                    else f"a {save.get('state_type')}"
                )
                claim.problem(
                    f"rank {rank}: restored in a fresh process, the loader started from the beginning (its first "
                    f"batches are the run's first batches, keys {want.get('keys') and got.get('keys')}): the state "
                    f"saved after {len(save['before'])} batches ({empty}) carries no position, or the restore "
                    f"ignored it{_said(save.get('said') or []) or _said(outcome.get('said'))}"
                )
                break
            if want.get("keys") and got.get("keys") and want["keys"] != got["keys"]:
                claim.problem(
                    f"rank {rank} of {len(saved)}, restored in a fresh process: batch {index} after the restore holds samples "
                    f"{got['keys']}, where the uninterrupted run went on with {want['keys']}. The restore continued "
                    "elsewhere: another rank's state, a state saved at another point, or an order that depends on "
                    "something outside the saved state (state kept in the TaskEncoder or wrapper, hash() or set "
                    "order under another PYTHONHASHSEED, the pid or the time)"
                )
                break
            where = first_difference(
                parse_fingerprint(want["fingerprint"]), parse_fingerprint(got["fingerprint"])
            )
            keys = f" (keys {want['keys']})" if want.get("keys") else ""
            claim.problem(
                f"rank {rank} of {len(saved)}, restored in a fresh process: batch {index} after the restore differs from the "
                f"uninterrupted run's{keys}: {where or 'the batches differ'}. Something outside the saved state "
                "decides the data: state kept in the TaskEncoder or wrapper, hash() or set order (another "
                "PYTHONHASHSEED in the fresh process), the pid or the time"
            )
            break
        if len(batches) < len(expected) and not outcome.get("refused"):
            claim.problem(
                f"rank {rank}: the restored loader gave {len(batches)} batches, expected {len(expected)}"
            )


def _window(streams: dict[int, list[list[str]]], need: int, tail: int) -> tuple[list[str], list[str]]:
    """The first ``need`` keys of the restored ranks' batches taken step by step (every rank's batch ``i``
    before any rank's ``i + 1``, as a training loop consumes them), and the ``tail`` keys after."""
    ordered: list[str] = []
    steps = max((len(s) for s in streams.values()), default=0)
    for step in range(steps):
        for rank in sorted(streams):
            if step < len(streams[rank]):
                ordered += streams[rank][step]
    return ordered[:need], ordered[need : need + tail]


def _windows(
    streams: dict[int, list[list[str]]], before: list[str], tail: int
) -> tuple[dict[int, list[str]], set[str]]:
    """Each restored rank's rest of the epoch: its keys up to the first one already delivered (before the
    save, or earlier by the same rank), where its next epoch begins; and the keys each rank delivers in
    the ``tail`` keys after that (a sample of the epoch that comes there was reordered, not lost)."""
    windows: dict[int, list[str]] = {}
    after: set[str] = set()
    for rank, batches in streams.items():
        seen = set(before)
        keys = [key for batch in batches for key in batch]
        cut = len(keys)
        for index, key in enumerate(keys):
            if key in seen:
                cut = index
                break
            seen.add(key)
        windows[rank] = keys[:cut]
        after.update(keys[cut : cut + tail])
    return windows, after


def _judge_changed(
    claim: Any,
    advice: list[str],
    scenario: _Scenario,
    before: list[str],
    restored: dict[int, dict[str, Any]],
    expected: list[str],
    unchanged_stream: list[list[str]] | None,
) -> None:
    refused = _refusal(restored, scenario.name)
    claim.examined()
    if refused:
        if refused["type"] in _UNNAMED or not refused["message"].strip():
            advice.append(
                f"{scenario.what}: refused, but only by {refused['type']}"
                f"{(': ' + refused['message'][:160]) if refused['message'].strip() else ' (no message)'} at "
                f"{refused['at']} (rank {refused['rank']}), which does not say what changed"
            )
        return
    streams: dict[int, list[list[str]]] = {}
    for rank, record in restored.items():
        outcome = record.get(scenario.name) or {}
        if outcome.get("error"):
            return  # failed loudly after some batches: not silent
        batches = outcome.get("batches") or []
        if any(b.get("keys") is None for b in batches):
            claim.inconclusive(
                f"{scenario.what}: the batches do not expose their sample keys (__key__), so the suite cannot count "
                "repeated and missing samples"
            )
            return
        streams[rank] = [b["keys"] for b in batches]
    need = len(expected) - len(before)
    known = set(expected)
    # Counted as the training loop consumes the batches: one epoch's worth, step by step.
    window, tail = _window(streams, need, scenario.batch_size * scenario.world)
    counts = Counter(before + window)
    repeated = sorted(k for k, c in counts.items() if c > 1 and k in known)
    missing = [k for k in expected if k not in counts]
    extra = sum(counts[k] - 1 for k in repeated)
    # Counted per rank: a redistribution may leave the ranks uneven; each rank's epoch ends where it
    # delivers a key again.
    windows, after = _windows(streams, before, scenario.batch_size)
    per_rank = Counter(before + [key for keys in windows.values() for key in keys])
    rank_missing = [k for k in expected if k not in per_rank]
    late = [k for k in rank_missing if k in after]
    exact = not repeated and not missing
    reordered = not any(c > 1 for k, c in per_rank.items() if k in known) and len(late) == len(rank_missing)
    if exact or reordered:
        if not exact and late:
            advice.append(
                f"{scenario.what}: accepted; every sample of the epoch came, but {len(late)} only after samples of "
                f"the next epoch ({_some(late)})"
            )
        elif (
            scenario.name == "seed"
            and unchanged_stream is not None
            and streams.get(0, [])[: len(unchanged_stream)] == unchanged_stream
        ):
            advice.append(
                "seed +1: accepted, and the new seed was ignored: the stream is the old seed's continuation. "
                "Refuse it, or say so: a run restarted to change its seed keeps the old order"
            )
        return
    soon = set(tail)
    still = [k for k in missing if k not in soon]
    said = [
        line
        for rank in sorted(restored)
        for line in (restored[rank].get(scenario.name) or {}).get("said") or []
    ]
    claim.problem(
        f"{scenario.what}: the restore raised no error, and over the epoch ({len(expected)} samples: "
        f"{len(before)} delivered before the save, {need} due after) {extra} sample(s) came twice "
        f"({_some(repeated) or '-'}) and {len(missing)} never came ({_some(missing) or '-'})"
        + (f", {len(still)} of them not in the next step either" if missing else "")
        + ". The training run silently sees some data twice and misses other data"
        + _said(said)
    )


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    runs: _Runs = ctx.started("restart", lambda: prestart(ctx))
    if "skipped" in runs.info:
        raise PropertySkipped(runs.info["skipped"])
    details: dict[str, Any] = {
        "samples": NUM_SAMPLES,
        "batch_size": BATCH_SIZE,
        "num_workers": NUM_WORKERS,
        "save_at": SAVE_AT,
        "hooks": list(ctx.resume_hooks or ()),
    }
    plan = runs.info["plan"]
    scenarios: list[_Scenario] = runs.info["scenarios"]
    why_not = _changed_applies(ctx)
    if why_not:
        for name in (*CHANGED, "says_why"):
            claims.not_applicable(name, why_not)
    saved: dict[int, dict[int, dict[str, Any]]] = {}
    restored: dict[int, dict[int, dict[str, Any]]] = {}
    unchanged_world = scenarios[0].world
    with claims.claim("fresh_processes") as claim:
        how = "each rank of a 2-rank gloo job (as torch.distributed.run starts them) saved"
        claim.note(
            f"{NUM_SAMPLES} samples in shards of {SHARD_SIZE}, batch size {BATCH_SIZE}, num_workers={NUM_WORKERS}; "
            f"{how} after {SAVE_AT[unchanged_world]} batches"
        )
        for world in runs.info["save_worlds"]:
            details[f"save_w{world}_s"] = _finish(ctx, runs, f"save-w{world}").seconds
            saved[world] = _records(runs, "save", world)
        if runs.thread is not None:
            runs.thread.join(ctx.timeout_s)
        for world in runs.info["restore_worlds"]:
            details[f"restore_w{world}_s"] = _finish(ctx, runs, f"restore-w{world}").seconds
            restored[world] = _records(runs, "restore", world)
        _judge_unchanged(
            claim,
            {rank: record["base"] for rank, record in saved[unchanged_world].items()},
            restored[unchanged_world],
        )
    if why_not:
        return details
    if set(restored) != set(runs.info["restore_worlds"]) or claims.failed("fresh_processes"):
        # One root cause once: a state that does not continue exactly with the same configuration would
        # fail every changed configuration for the same reason.
        for name in (*CHANGED, "says_why"):
            claims.not_applicable(
                name,
                "blocked by restart/fresh_processes: a state that does not continue exactly with the same "
                "configuration cannot be judged under a changed one",
            )
        return details
    advice: list[str] = []
    judged = 0
    for scenario in scenarios[1:]:
        name = _states_name(plan, scenario)
        old = {rank: record[name] for rank, record in saved[scenario.saved_world].items()}
        before = [k for rank in sorted(old) for b in old[rank]["before"] for k in (b.get("keys") or [])]
        dataset = plan["data"][scenario.variant or name]
        with claims.claim(scenario.claim) as claim:
            if any(record.get("error") for record in old.values()):
                claim.nothing_because(
                    f"the save at world size {scenario.saved_world} failed (see restart/fresh_processes)"
                )
                continue
            unchanged = [b["keys"] for b in old[0]["continuation"]] if scenario.name == "seed" else None
            _judge_changed(
                claim, advice, scenario, before, restored[scenario.world], _expected_keys(dataset), unchanged
            )
            judged += 1
    with claims.claim("says_why") as claim:
        claim.examined(judged)
        for line in advice:
            claim.problem(line)
    details["outcomes"] = {
        s.name: ("refused: " + r["type"]) if (r := _refusal(restored[s.world], s.name)) else "accepted"
        for s in scenarios
    }
    return details


# --- the child half: python -m primus_energon.conformance.processes.runner restart --phase save|restore ... --------


def add_child_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--phase", choices=["save", "restore"], required=True)
    parser.add_argument("--plan", required=True, help="plan.json written by the parent")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hook", action="append", default=[], help="MODULE:FUNC of the save, then load hook")
    parser.add_argument("--out", required=True, help="directory for rank<r>.json")


def _safe_text(error: BaseException, limit: int = 300) -> str:
    """``str(error)`` on one line, bounded; for a traceback carried in the message (an error from a loader
    worker), its first line and the error it ends with."""
    try:
        text = str(error)
    except Exception:  # an exception whose __str__ raises
        return f"<{type(error).__name__} whose str() failed>"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 2:
        lines = [lines[0], "...", lines[-1]]
    return " ".join(" ".join(lines).split())[:limit]


@contextlib.contextmanager
def _captured(limit: int = 4) -> Iterator[list[str]]:
    """What the target prints or logs (warnings and up) while saving or restoring: its last ``limit``
    lines, so that a restore that quietly failed ("loading dataset state failed. Skipping.") is named."""
    import io
    import logging

    lines: list[str] = []
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
            yield lines
    finally:
        root.removeHandler(handler)
        said = [" ".join(line.split()) for line in stream.getvalue().splitlines() if line.strip()]
        lines[:] = [line[:200] for line in said[-limit:]]


def _said(lines: list[str] | None) -> str:
    """``"; it wrote: '...' | '...'"`` for the target's last lines, or ""."""
    return "; it wrote: " + " | ".join(repr(line) for line in lines) if lines else ""


class _Subject:
    """What the training loop holds for one loader, and how its state is saved and restored: the wrapper
    target; else, with hooks, ``MegatronDataloaderWrapper`` around the loader; else Energon's loader itself
    (``save_state_rank()`` / ``restore_state_rank()``)."""

    def __init__(self, target: Any, loader: Any, hooks: list[Any]) -> None:
        from primus_energon import MegatronDataloaderWrapper

        self.loader = loader
        self.hooks = hooks
        self.holder: Any = None
        if target.kind == "wrapper":
            self.holder = target.make_wrapper(loader)
        elif hooks:
            self.holder = MegatronDataloaderWrapper(loader)
        self._iterator: Any = None

    def next(self) -> Any:
        if self.holder is not None:
            return next(self.holder)
        if self._iterator is None:
            self._iterator = iter(self.loader)
        return next(self._iterator)

    def save(self, directory: Path, rank: int) -> Any:
        """Save this rank's state into ``directory``; returns the state (None under hooks)."""
        import torch

        directory.mkdir(parents=True, exist_ok=True)
        if self.hooks:
            self.hooks[0](self.holder, str(directory), rank)
            return None
        state = self.holder.save_state() if self.holder is not None else self.loader.save_state_rank()
        torch.save(state, directory / f"rank{rank}.pt")
        return state

    def restore(self, directory: Path, rank: int) -> None:
        import torch

        if self.hooks:
            self.hooks[1](self.holder, str(directory), rank)
            return
        file = directory / f"rank{rank}.pt"
        if not file.exists():
            return  # as a trainer does where no state was saved for this rank: start fresh
        # The suite's own file, written by this check's save run into its temporary folder (not shard data);
        # Energon's state classes need the full unpickler.
        state = torch.load(file, weights_only=False)
        if self.holder is not None:
            self.holder.restore_state(state)
        else:
            self.loader.restore_state_rank(state)

    def close(self) -> None:
        close = getattr(self.holder, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # the wrapper's own close failing is not what this property judges
                pass


def _batch_record(batch: Any, full: bool) -> dict[str, Any]:
    from ..oracles.fingerprint import digest, fingerprint
    from ._common import batch_keys

    record: dict[str, Any] = {"keys": batch_keys(batch), "digest": digest(batch)}
    if full:
        record["fingerprint"] = repr(fingerprint(batch))
    return record


def _jobs(plan: dict, world: int) -> list[tuple[str, str, bool]]:
    """What a save run at ``world`` saves: ``(name, dataset, reference TaskEncoder)`` for the target's data
    (``base``, at world size 2) and for the changed configurations' data (``config``, when it is other data)."""
    data = plan["data"]
    separate = "config" in data and data["config"] != data["base"]
    changed = any(s["claim"] != "fresh_processes" for s in plan["scenarios"])
    unchanged = next(s for s in plan["scenarios"] if s["claim"] == "fresh_processes")
    jobs = [("base", data["base"], False)] if world == unchanged["saved_world"] else []
    if changed and (separate or world == 1):
        jobs.append(("config", data["config"], True) if separate else ("base", data["base"], False))
    return jobs


def _states_name(plan: dict, scenario: _Scenario) -> str:
    data = plan["data"]
    separate = "config" in data and data["config"] != data["base"]
    return "config" if separate and scenario.claim != "fresh_processes" else "base"


def _save_phase(
    target: Any, options: argparse.Namespace, plan: dict, rank: int, world: int, hooks: list
) -> dict:
    from primus_energon import EncodedDiffusionTaskEncoder

    from ..engine.calls import build_loader, closing

    out: dict[str, Any] = {}
    for name, path, reference in _jobs(plan, world):
        loader = build_loader(
            target,
            path,
            batch_size=BATCH_SIZE,
            num_workers=NUM_WORKERS,
            seed=options.seed,
            rank=rank,
            world_size=world,
            task_encoder=EncodedDiffusionTaskEncoder() if reference else None,
        )
        record: dict[str, Any] = {"steps": SAVE_AT[world], "before": [], "continuation": []}
        with closing(loader):
            subject = _Subject(target, loader, hooks)
            try:
                for _ in range(SAVE_AT[world]):
                    record["before"].append(_batch_record(subject.next(), True))
                try:
                    with _captured() as said:
                        state = subject.save(Path(plan["states"]) / f"{name}-w{world}", rank)
                except Exception as error:
                    record["error"] = f"{type(error).__name__}: {_safe_text(error)}"
                else:
                    record["state_is_none"] = state is None and not hooks
                    record["state_type"] = type(state).__name__
                    record["hooks"] = bool(hooks)
                record["said"] = said
                for _ in range(CONTINUATION):
                    record["continuation"].append(_batch_record(subject.next(), True))
            finally:
                subject.close()
        out[name] = record
    return out


def _failure(error: BaseException, at: str) -> dict[str, str]:
    return {"at": at, "type": type(error).__name__, "message": _safe_text(error)}


def _restore_phase(
    target: Any, options: argparse.Namespace, plan: dict, rank: int, world: int, hooks: list
) -> dict:
    from primus_energon import EncodedDiffusionTaskEncoder

    from ..engine.calls import build_loader, closing

    out: dict[str, Any] = {}
    data = plan["data"]
    for entry in plan["scenarios"]:
        scenario = _Scenario(**entry)
        if scenario.world != world:
            continue
        name = _states_name(plan, scenario)
        path = data[name]
        changed = scenario.claim != "fresh_processes"
        swapped = None
        if scenario.variant:  # the dataset changed in place: the variant takes the saved dataset's path
            swapped = Path(path + ".saved")
            Path(path).rename(swapped)
            Path(data[scenario.variant]).rename(path)
        outcome: dict[str, Any] = {"batches": []}
        try:
            total = len(_expected_keys(path))
            count = -(-total // (world * scenario.batch_size)) + TAIL if changed else CONTINUATION
            loader = build_loader(
                target,
                path,
                batch_size=scenario.batch_size,
                num_workers=scenario.num_workers,
                seed=options.seed + scenario.seed_delta,
                rank=rank,
                world_size=world,
                task_encoder=EncodedDiffusionTaskEncoder() if name == "config" else None,
            )
            with closing(loader):
                subject = _Subject(target, loader, hooks)
                try:
                    with _captured() as outcome["said"]:
                        subject.restore(Path(plan["states"]) / f"{name}-w{scenario.saved_world}", rank)
                except Exception as error:
                    outcome["refused"] = _failure(error, "the restore")
                else:
                    for index in range(count):
                        try:
                            batch = subject.next()
                        except Exception as error:
                            if index == 0:
                                outcome["refused"] = _failure(error, "the first batch after the restore")
                            else:
                                outcome["error"] = _failure(error, f"batch {index} after the restore")
                            break
                        outcome["batches"].append(_batch_record(batch, not changed))
                finally:
                    subject.close()
        finally:
            if swapped is not None:
                Path(path).rename(data[scenario.variant])
                swapped.rename(path)
        out[scenario.name] = outcome
    return out


def run_child(target: Any, options: argparse.Namespace) -> None:
    """One rank (of a torch.distributed job) or the one process of a world of 1: save or restore as the
    plan says, writing ``rank<r>.json`` into ``--out``."""
    import os

    from ..engine.target import load_object

    plan = json.loads(Path(options.plan).read_text(encoding="utf-8"))
    hooks = [load_object(spec) for spec in options.hook]
    distributed = "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    try:
        phase = _save_phase if options.phase == "save" else _restore_phase
        result = phase(target, options, plan, rank, world, hooks)
        (Path(options.out) / f"rank{rank}.json").write_text(json.dumps(result), encoding="utf-8")
        if distributed:
            dist.barrier()
    finally:
        if distributed:
            dist.destroy_process_group()
