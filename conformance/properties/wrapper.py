"""Property 13, the dataloader wrapper (``--wrapper``): a class that wraps a loader for Megatron's training
loop (a ``MegatronDataloaderWrapper(loader)``) iterates cyclically past the end of an epoch;
raises, instead of spinning forever, on an empty loader and on a one-shot iterable that is exhausted;
continues exactly after ``save_state()`` / ``restore_state(state)`` (duck typed) with 0 and 2 workers, also
when the same state object is restored twice (Energon consumes parts of the state it restores) and when
restoring into a wrapper that has read batches (or refuses that with an error); and a deprecated alias
of the class, if its module has one, warns.

The loaders it wraps are Energon savable loaders over the suite's generated preencoded data with the
reference ``EncodedDiffusionTaskEncoder``; batches are compared by their sample keys. The spin checks run
in a child process that is killed (with its process tree) after a timeout.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

from primus_energon.synthetic import builtin_schema

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..data.workspace import SMALL_SHAPES
from ..engine import rngs
from ..engine.calls import build_loader, closing, target_call
from ..engine.context import CheckContext
from ..processes.children import child_env, start, stop
from ._common import batch_keys, fail

CLAIMS = claims_of(
    "wrapper",
    (
        "cyclic",
        "iterating past the end of an epoch continues with the next epoch, batch for batch",
        Harm.CRASH,
        "start a new pass over the wrapped loader when one ends (never let StopIteration out of next())",
    ),
    (
        "empty",
        "next() on a wrapper of an empty loader raises (it does not spin forever)",
        Harm.CRASH,
        "raise an error when a pass over the wrapped loader yields nothing (see primus_energon.cyclic_iter)",
    ),
    (
        "exhausted",
        "next() on a wrapper of an exhausted one-shot iterable (a generator) raises or cycles what it saw; "
        "it does not spin forever",
        Harm.CRASH,
        "raise an error when a pass yields nothing: an exhausted iterator yields nothing on every later pass",
    ),
    (
        "resume",
        "restore_state(save_state()) on a fresh wrapper of a fresh loader continues exactly where the saved "
        "run went on (0 and 2 workers)",
        Harm.RESUME,
        "save with the loader's save_state_rank() and restore with restore_state_rank() before iterating",
    ),
    (
        "restore_twice",
        "restoring the same state object a second time (another fresh loader) continues exactly too",
        Harm.RESUME,
        "restore a copy.deepcopy of the state: Energon consumes parts of the state object it restores",
    ),
    (
        "restore_after_batches",
        "restore_state() on a wrapper that has read batches continues exactly from the state, or raises",
        Harm.RESUME,
        "close the running pass before restoring (Energon applies a state to the next iterator it makes), or "
        "refuse with an error when the loader cannot be restored (workers running)",
    ),
    (
        "deprecated_alias",
        "a deprecated alias of the wrapper class in its module warns (DeprecationWarning) when used",
        Harm.ADVICE,
        "warn in the alias's __init__: warnings.warn('X is deprecated; use Y', DeprecationWarning, stacklevel=2)",
    ),
)

BATCH_SIZE = 4
NUM_SAMPLES = 16  # 4 batches per epoch
SAVE_AT = 4  # >= num_workers: Energon 7.4.1 races for 0 < k < num_workers (see resume._steps_for)
CONTINUATION = 5
#: seconds the child may take to import the wrapper's module (torch: a few seconds) and construct it
START_TIMEOUT_S = 120.0
#: seconds a wrapper's next() may take on empty input once called (the child says when it calls it)
SPIN_TIMEOUT_S = 10.0
_CALLING = b"CALLING next()"

#: the child half of the spin checks: wraps [] or an exhausted iterator and calls next() once too often
_CHILD = """
import sys
from primus_energon.conformance.engine.target import resolve_target
target = resolve_target(sys.argv[1], kind="wrapper")  # a class, or a factory returning one
source = [] if sys.argv[2] == "empty" else iter([1, 2])
wrapped = target.make_wrapper(source)
if sys.argv[2] == "exhausted":
    next(wrapped), next(wrapped)
print("CALLING next()", flush=True)
try:
    value = next(wrapped)
except BaseException as error:
    print("RAISED", type(error).__name__, " ".join(str(error).split())[:300])
    sys.exit(0)
print("RETURNED", repr(value)[:100])
sys.exit(3)
"""


def _keys(wrapper: Any, count: int, what: str) -> list[list[str] | None]:
    out = []
    for index in range(count):
        with target_call(f"next() of the wrapper ({what}, batch {index})"):
            out.append(batch_keys(next(wrapper)))
    return out


def _loader(ctx: CheckContext, num_workers: int, *, mode: str = "train") -> Any:
    # The wrapper is checked around the reference TaskEncoder, which reads the built-in preencoded format,
    # whatever a user's dataset holds.
    path = ctx.workspace.generated(
        None,
        "wrapper",
        schema=builtin_schema("preencoded", shapes=SMALL_SHAPES),
        derive=False,
        num_samples=NUM_SAMPLES,
        shard_size=BATCH_SIZE,
    )
    return build_loader(
        ctx.target, path, batch_size=BATCH_SIZE, num_workers=num_workers, seed=ctx.seed, mode=mode
    )


@contextlib.contextmanager
def _wrapped(ctx: CheckContext, loader: Any) -> Iterator[Any]:
    with closing(loader):
        with target_call(f"building {ctx.target.describe()} around an Energon loader"):
            wrapper = ctx.target.make_wrapper(loader)
        try:
            yield wrapper
        finally:
            close = getattr(wrapper, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()


def _method(wrapper: Any, name: str) -> Any:
    method = getattr(wrapper, name, None)
    if not callable(method):
        fail(
            f"the wrapper has no {name}() method: a training loop checkpoints the loader through the wrapper's save_state()/restore_state()"
        )
    return method


def _cyclic(ctx: CheckContext, claims: ClaimRecorder) -> None:
    with claims.claim("cyclic") as claim:
        with closing(_loader(ctx, 0, mode="val")) as plain:
            epoch = [batch_keys(batch) for batch in plain]
        if not epoch:
            fail("the suite's validation loader yielded no batch")  # a defect of the data, not the target
        with _wrapped(ctx, _loader(ctx, 0, mode="val")) as wrapper:
            want = epoch + epoch + epoch[:1]
            try:
                got = _keys(wrapper, len(want), "iterating past the end of an epoch")
            except StopIteration:
                fail(
                    f"next() raised StopIteration after the {len(epoch)} batches of one epoch: Megatron's training "
                    "loop calls next() forever, so training stops (or crashes) at the first epoch end"
                )
        claim.examined(len(want))
        if got != want:
            at = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
            fail(
                f"batch {at} (epoch {at // len(epoch) + 1}) holds samples {got[at]}, expected {want[at]}: the next "
                "epoch must be a full new pass over the wrapped loader"
            )


def _spins(ctx: CheckContext, claims: ClaimRecorder) -> list[dict[str, Any]]:
    """Both spin checks, each in a child process of its own, side by side."""
    cases = ("empty", "exhausted")
    children = {
        case: start(
            [sys.executable, "-c", _CHILD, ctx.target.spec, case],
            env=child_env(),
            cwd=str(ctx.workspace.root),
        )
        for case in cases
    }
    try:
        _await_spins(list(children.values()))
        return [_spin_verdict(claims, case, children[case]) for case in cases]
    finally:
        for child in children.values():
            stop(child)


def _called(child: Any) -> bool:
    """Whether the child has reached the next() call under test (it prints a line first)."""
    child.stdout.seek(0)
    return _CALLING in child.stdout.read()


def _await_spins(children: list[Any]) -> None:
    """Wait until every child ended, or ran :data:`SPIN_TIMEOUT_S` past its call of next(), or never got there
    within :data:`START_TIMEOUT_S` (the clock of the spin starts at the call, not at the import)."""
    started = time.monotonic()
    called_at: dict[int, float] = {}
    while True:
        now = time.monotonic()
        waiting = False
        for index, child in enumerate(children):
            if child.process.poll() is not None:
                continue
            if index not in called_at and _called(child):
                called_at[index] = now
            limit = called_at[index] + SPIN_TIMEOUT_S if index in called_at else started + START_TIMEOUT_S
            waiting = waiting or now < limit
        if not waiting:
            return
        time.sleep(0.05)


def _spin_verdict(claims: ClaimRecorder, case: str, child: Any) -> dict[str, Any]:
    with claims.claim(case) as claim:
        claim.examined()
        if child.process.poll() is None and not _called(child):
            fail(
                f"the wrapper could not be tried on {case} input: the child process did not import and construct "
                f"it within {START_TIMEOUT_S:.0f} s (killed); its output: {child.stderr_tail(600)}"
            )
        if child.process.poll() is None:
            what = "an empty loader" if case == "empty" else "an exhausted one-shot iterator (iter([1, 2]))"
            fail(
                f"next() on a wrapper of {what} neither returned nor raised within {SPIN_TIMEOUT_S:.0f} s: it "
                "spins forever (killed), so a rank with no data hangs the whole job instead of failing"
            )
        child.stdout.seek(0)
        out = child.stdout.read().decode("utf-8", "replace").strip().splitlines()
        last = out[-1] if out else ""
        if child.process.returncode == 3 and case == "empty":
            fail(
                f"next() on a wrapper of an empty loader returned a value ({last.removeprefix('RETURNED ')})"
            )
        if child.process.returncode not in (0, 3):
            fail(
                f"the wrapper could not be tried on {case} input in a child process (exit status "
                f"{child.process.returncode}): {child.stderr_tail(600)}"
            )
        return {"case": case, "outcome": last}


#: the planted global-generator states (:mod:`~primus_energon.conformance.engine.rngs`) of the resume claims' runs
_PLANT = 40_000


def _resume(ctx: CheckContext, claims: ClaimRecorder, num_workers: int) -> dict[str, Any]:
    label = f"{num_workers} workers"
    # Each run in a planted global-generator state of its own: a draw from them that nobody seeded (a
    # wrapper shuffling with ``random``) differs between the saved run and its restores in every run.
    with rngs.planted(_PLANT + num_workers), _wrapped(ctx, _loader(ctx, num_workers)) as wrapper:
        _keys(wrapper, SAVE_AT, f"{label}, before the save")
        with target_call(f"save_state() after {SAVE_AT} batches ({label})"):
            state = _method(wrapper, "save_state")()
        expected = _keys(wrapper, CONTINUATION, f"{label}, after the save")
    results: dict[str, Any] = {}
    for attempt, name in ((1, "resume"), (2, "restore_twice")):
        with claims.claim(name) as claim:
            with (
                rngs.planted(_PLANT + 10 * attempt + num_workers),
                _wrapped(ctx, _loader(ctx, num_workers)) as wrapper,
            ):
                with target_call(f"restore_state() on a fresh wrapper ({label}, restore {attempt})"):
                    _method(wrapper, "restore_state")(state)
                got = _keys(wrapper, CONTINUATION, f"{label}, restore {attempt}")
            claim.examined()
            results[name] = got == expected
            if got != expected:
                which = (
                    "a second restore_state() of the state object already restored once"
                    if attempt == 2
                    else "restore_state()"
                )
                fail(
                    f"{label}: after {which} (saved at batch {SAVE_AT}) on a fresh wrapper, the next "
                    f"{CONTINUATION} batches hold {got}; the saved run went on with {expected}"
                )
    with claims.claim("restore_after_batches") as claim:
        with _wrapped(ctx, _loader(ctx, num_workers)) as wrapper:
            _keys(wrapper, SAVE_AT, f"{label}, before the save")
            state = _method(wrapper, "save_state")()
            expected = _keys(wrapper, CONTINUATION, f"{label}, after the save")
            claim.examined()
            try:
                _method(wrapper, "restore_state")(state)
            except Exception as error:  # refused: loud, nothing continues from the wrong place
                results["restore_after_batches"] = f"refused: {type(error).__name__}"
                return results
            got = _keys(wrapper, CONTINUATION, f"{label}, after restoring into the running wrapper")
        if got != expected:
            fail(
                f"{label}: restore_state() on a wrapper that had read {SAVE_AT + CONTINUATION} batches returned "
                f"without an error, and the next {CONTINUATION} batches hold {got} instead of the state's "
                f"continuation {expected}: a restore that silently continues elsewhere"
            )
        results["restore_after_batches"] = "continued exactly"
    return results


def _aliases(ctx: CheckContext) -> list[tuple[str, Any]]:
    """Names in the wrapper's module that are the wrapper class under another name, or a subclass whose
    docstring calls it deprecated."""
    cls = ctx.target.obj
    module = sys.modules.get(getattr(cls, "__module__", ""))
    out = []
    for name, value in sorted(vars(module).items()) if module else ():
        if name.startswith("_") or not inspect.isclass(value) or name == cls.__name__:
            continue
        if value is cls or (issubclass(value, cls) and "deprecated" in (inspect.getdoc(value) or "").lower()):
            out.append((name, value))
    return out


def _deprecated_alias(ctx: CheckContext, claims: ClaimRecorder) -> None:
    aliases = _aliases(ctx)
    if not aliases:
        claims.not_applicable("deprecated_alias", "the wrapper's module has no alias of the class")
        return
    with claims.claim("deprecated_alias") as claim:
        for name, alias in aliases:
            claim.examined()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with target_call(f"building the alias {name} around a list"):
                    alias([1])
            if not any(issubclass(w.category, (DeprecationWarning, FutureWarning)) for w in caught):
                same = "the same class as" if alias is ctx.target.obj else "a subclass of"
                claim.problem(
                    f"{name} ({same} {ctx.target.obj.__name__}) builds without a DeprecationWarning, so its "
                    "users never learn to move to the new name"
                )


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    details: dict[str, Any] = {}
    _cyclic(ctx, claims)
    details["spin"] = _spins(ctx, claims)
    for num_workers in (0, 2):
        details[f"num_workers={num_workers}"] = _resume(ctx, claims, num_workers)
    _deprecated_alias(ctx, claims)
    return details
