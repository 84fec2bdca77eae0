"""Running a target in fresh processes: the child entry point and the parent's helpers.

Child side (``python -m primus_energon.conformance.runner ...``; the target is rebuilt from its spec in the child)::

    python -m primus_energon.conformance.runner determinism --spec M:A --kind cooker --input-form bytes --seed 0 \\
        --dataset DIR [--dataset DIR ...] --workers 0,1,2 --batches 6 --batch-size 4 --out FILE.json
    python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2 -m primus_energon.conformance.runner \\
        shard --spec M:A --kind task_encoder --dataset DIR [...] --batch-size 3 --out DIR
    python -m primus_energon.conformance.runner probe --spec M:A --kind task_encoder --dataset DIR [...] --markers DIR \\
        --out FILE.json

``determinism`` (``--seed`` is repeatable) writes ``{"results": {seed: {dataset: {num_workers:
{"batches": [{"digest", "keys", "fingerprint"}], "cook_order": [[key, ...] per process]}}}}}``;
``shard`` (one process per rank, under ``torch.distributed``) writes ``rank<r>.json`` with
``{"rank", "world_size", "keys": {dataset: [...]}, "source": {dataset: "batch"|"cooker"}}``;
``probe`` reads each code-execution probe dataset through the target once per environment
(:func:`primus_energon.conformance.probe.probe_all`) and writes ``{dataset index: {environment: outcome}}``.

Parent side: :func:`child_target_args` (raises ``PropertySkipped`` when the target cannot be rebuilt in
another process), :func:`child_env`, :func:`start` and :func:`finish` (time-limited, failure with the
command on timeout or a non-zero exit), :func:`batch_keys`.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from megatron.energon import Cooker, TaskEncoder, stateless
from megatron.energon.task_encoder.base import get_stateless

from .results import PropertyFailure, PropertySkipped
from .target import Target, load_object

__all__ = [
    "REPO",
    "DEFAULT_TIMEOUT_S",
    "Child",
    "batch_keys",
    "child_target_args",
    "child_env",
    "start",
    "finish",
    "stop",
    "tagged_processes",
    "CHILD_TAG_VARIABLE",
    "cook_order",
    "record_cooked",
    "runner_command",
    "torchrun_command",
    "parse_fingerprint",
    "main",
]

REPO = Path(__file__).resolve().parents[1]
#: Every child process is killed after this many seconds and the property fails, naming the command.
DEFAULT_TIMEOUT_S = 300.0
#: Every process the suite starts (and everything those start: workers, torch.distributed ranks, which
#: torchrun puts in sessions of their own) inherits this variable with a value unique to its check, so
#: :func:`stop` can find and end all of them, whatever process group or session they moved to.
CHILD_TAG_VARIABLE = "PRIMUS_CONFORMANCE_CHILD"
_DIST_VARS = ("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_", "GROUP_", "ROLE_", "TORCHELASTIC_")


# -- shared: keys of a batch -------------------------------------------------------------------------------


def _key_of(sample: Any) -> Any:
    if isinstance(sample, Mapping):
        return sample.get("__key__")
    return getattr(sample, "__key__", None)


def batch_keys(batch: Any) -> list[str] | None:
    """The sample keys a batch exposes, in batch order: a ``__key__`` list (dict or ``Batch``), or the
    ``__key__`` of each sample of a list batch. None when the batch does not say."""
    keys = _key_of(batch) if not isinstance(batch, (list, tuple)) else None
    if isinstance(keys, (list, tuple)) and all(isinstance(k, str) for k in keys):
        return [str(k) for k in keys]
    if isinstance(batch, (list, tuple)) and batch:
        keys = [_key_of(sample) for sample in batch]
        if all(isinstance(k, str) for k in keys):
            return keys
    return None


def _recording_after(cook_fn: Any, sink: str) -> Any:
    @functools.wraps(cook_fn)
    def record(sample: dict, **aux: Any) -> Any:
        key = sample.get("__key__")
        cooked = cook_fn(sample, **aux)
        with open(sink, "a", encoding="utf-8") as out:
            out.write(json.dumps({"key": key, "pid": os.getpid()}, default=str) + "\n")
        return cooked

    return stateless(record) if get_stateless(cook_fn) else record


def record_cooked(task_encoder: TaskEncoder, sink: str | os.PathLike) -> TaskEncoder:
    """Make every cooker of ``task_encoder`` append ``{key, pid}`` to ``sink`` after it returned (unlike
    :func:`~primus_energon.conformance.execution.instrument`, a sample the cooker skipped or failed is not recorded).
    Sets ``cookers`` on the given TaskEncoder and returns it."""
    cookers = list(getattr(task_encoder, "cookers", None) or [])
    task_encoder.cookers = [
        Cooker(_recording_after(c.cook, str(sink)), has_subflavors=c.has_subflavors) for c in cookers
    ]
    return task_encoder


def cook_order(records: Sequence[Mapping[str, Any]], per_process: int | None = None) -> list[list[str]]:
    """Key order seen by the cookers, one list per process (main or worker), in a canonical order of
    processes; each list cut to ``per_process`` keys (what was delivered, not what was prefetched)."""
    by_pid: dict[Any, list[str]] = {}
    for record in records:
        by_pid.setdefault(record.get("pid"), []).append(str(record.get("key")))
    return sorted(keys[:per_process] if per_process is not None else keys for keys in by_pid.values())


# -- parent side ---------------------------------------------------------------------------------------------


def child_target_args(target: Target) -> list[str]:
    """Arguments that rebuild ``target`` in a fresh process, or ``PropertySkipped`` when its spec does
    not import to the same object there (an object defined in ``__main__``, in a function, ...)."""
    module = target.spec.partition(":")[0]
    reason = None
    if module == "__main__":
        reason = "it is defined in __main__, which a fresh process does not run"
    else:
        try:
            loaded = load_object(target.spec)
        except Exception as error:  # not importable: say why
            reason = f"{target.spec!r} is not importable ({error})"
        else:
            same = loaded is target.obj or loaded is getattr(target.obj, "cook", object())
            if not same:
                reason = f"{target.spec!r} imports to another object than the one given"
    if reason:
        raise PropertySkipped(
            f"{target.describe()} cannot be rebuilt in a fresh process: {reason}. Pass it as MODULE:ATTR "
            "of an importable module (defined at module level) to run this property"
        )
    return ["--spec", target.spec, "--kind", target.kind, "--input-form", target.input_form]


def _search_path() -> list[str]:
    """The parent's import path (and this package's root) without the interpreter's own directories and
    site-packages, which the child has anyway; ``python -m`` adds the working directory itself."""
    skip = tuple(
        os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    )
    out: list[str] = []
    for entry in [str(REPO), *sys.path]:
        path = os.path.realpath(entry or os.getcwd())
        if not os.path.isdir(path) or path.startswith(skip) or "-packages" in path:
            continue
        if path not in out:
            out.append(path)
    return out


def child_env(hashseed: int | None = None, **extra: str) -> dict[str, str]:
    """The parent's environment without torch.distributed variables, with the parent's import path on
    ``PYTHONPATH`` (so the target's module imports in the child) and ``PYTHONHASHSEED`` if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DIST_VARS)}
    paths = _search_path() + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if hashseed is not None:
        env["PYTHONHASHSEED"] = str(hashseed)
    env.update(extra)
    return env


@dataclass
class Child:
    """A started child process; its output goes to temporary files (no pipe can fill up)."""

    command: list[str]
    env_shown: dict[str, str]
    process: subprocess.Popen
    stdout: IO[bytes]
    stderr: IO[bytes]
    tag: str = ""
    started: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0

    def describe(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env_shown.items())
        return (prefix + " " if prefix else "") + shlex.join(self.command)

    def stderr_tail(self, limit: int = 2000) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode("utf-8", "replace")
        lines = [line for line in text.splitlines() if "Warning" not in line and "warnings.warn" not in line]
        text = "\n".join(lines)
        return text[-limit:]


def start(
    args: Sequence[str], *, env: dict[str, str], show_env: Sequence[str] = (), cwd: str | None = None
) -> Child:
    """Start ``args`` (a full command) in a new session, tagged (see :data:`CHILD_TAG_VARIABLE`) so that
    :func:`stop` can end it and every process it starts."""
    stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    tag = uuid.uuid4().hex
    process = subprocess.Popen(
        list(args),
        env={**env, CHILD_TAG_VARIABLE: tag},
        cwd=cwd or os.getcwd(),
        stdout=stdout,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    return Child(list(args), {k: env[k] for k in show_env if k in env}, process, stdout, stderr, tag)


def tagged_processes(tag: str) -> list[int]:
    """Process ids whose environment holds ``CHILD_TAG_VARIABLE=tag`` (Linux ``/proc``; elsewhere [])."""
    needle = f"{CHILD_TAG_VARIABLE}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def stop(child: Child) -> None:
    """Kill ``child``, every process of its session, and every process that inherited its tag (workers,
    torch.distributed ranks in sessions of their own); returns when none is left."""
    if child.process.poll() is None:
        try:
            os.killpg(child.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            child.process.kill()
    child.process.wait()
    if not child.tag:
        return
    for _ in range(50):
        left = tagged_processes(child.tag)
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def finish(child: Child, *, what: str, reproduce: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Wait for ``child``; a timeout or a non-zero exit is a :class:`PropertyFailure` naming the command."""
    remaining = max(1.0, timeout - (time.perf_counter() - child.started))
    try:
        child.process.wait(remaining)
    except subprocess.TimeoutExpired:
        stop(child)
        raise PropertyFailure(
            f"{what} did not finish within {timeout:.0f} s (killed); a loader must not hang. Command: "
            f"{child.describe()}\n{child.stderr_tail()}",
            reproduce=reproduce,
        ) from None
    child.seconds = round(time.perf_counter() - child.started, 2)
    if child.process.returncode != 0:
        raise PropertyFailure(
            f"{what} exited with status {child.process.returncode}; expected it to load the target and "
            f"finish. Command: {child.describe()}\nlast lines of its stderr:\n{child.stderr_tail()}",
            reproduce=reproduce,
        )


def runner_command(subcommand: str, args: Sequence[str]) -> list[str]:
    """``python -m primus_energon.conformance.runner SUBCOMMAND ARGS`` with this interpreter."""
    return [sys.executable, "-m", "primus_energon.conformance.runner", subcommand, *args]


def torchrun_command(nproc: int, subcommand: str, args: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone`` with ``nproc`` ranks running the runner."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "-m",
        "primus_energon.conformance.runner",
        subcommand,
        *args,
    ]


def parse_fingerprint(text: str | None) -> Any:
    """A fingerprint back from its ``repr`` (as the determinism child writes it), or None."""
    if text is None:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


# -- child side ----------------------------------------------------------------------------------------------


def _target(options: argparse.Namespace) -> Target:
    from .target import resolve_target

    return resolve_target(options.spec, kind=options.kind, input_form=options.input_form)


def _determinism(options: argparse.Namespace) -> None:
    from .execution import build_loader, closing, read_records
    from .fingerprint import digest, fingerprint

    target = _target(options)
    workers = [int(w) for w in options.workers.split(",") if w != ""]
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="conformance-determinism-") as tmp:
        for seed in options.seed:
            per_seed: dict[str, dict[str, Any]] = {}
            for d_index, dataset in enumerate(options.dataset):
                per_dataset: dict[str, Any] = {}
                for num_workers in workers:
                    sink = Path(tmp) / f"cooked-{seed}-{d_index}-{num_workers}.jsonl"
                    task_encoder = record_cooked(target.make_task_encoder(), sink)
                    loader = build_loader(
                        target,
                        dataset,
                        batch_size=options.batch_size,
                        num_workers=num_workers,
                        seed=seed,
                        mode="train",
                        task_encoder=task_encoder,
                    )
                    batches = []
                    with closing(loader):
                        for batch in loader:
                            batches.append(
                                {
                                    "digest": digest(batch),
                                    "keys": batch_keys(batch),
                                    "fingerprint": repr(fingerprint(batch)),
                                }
                            )
                            if len(batches) >= options.batches:
                                break
                    per_process = (len(batches) // max(num_workers, 1)) * options.batch_size
                    per_dataset[str(num_workers)] = {
                        "batches": batches,
                        "cook_order": cook_order(read_records(sink), per_process),
                    }
                per_seed[str(dataset)] = per_dataset
            results[str(seed)] = per_seed
    record = {"pid": os.getpid(), "hashseed": os.environ.get("PYTHONHASHSEED")}
    Path(options.out).write_text(json.dumps({**record, "results": results}), encoding="utf-8")


def _shard(options: argparse.Namespace) -> None:
    import torch.distributed as dist

    from .execution import build_loader, closing, read_records

    dist.init_process_group("gloo")
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        target = _target(options)
        out = Path(options.out)
        keys: dict[str, list[str]] = {}
        source: dict[str, str] = {}
        for d_index, dataset in enumerate(options.dataset):
            sink = out / f"cooked-rank{rank}-{d_index}.jsonl"
            task_encoder = record_cooked(target.make_task_encoder(), sink)
            loader = build_loader(
                target,
                dataset,
                batch_size=options.batch_size,
                num_workers=options.num_workers,
                seed=options.seed,
                mode="train",
                rank=rank,
                world_size=world_size,
                repeat=False,
                task_encoder=task_encoder,
            )
            delivered: list[str] | None = []
            with closing(loader):
                for batch in loader:
                    got = batch_keys(batch)
                    if got is None or delivered is None:
                        delivered = None
                    else:
                        delivered.extend(got)
            if delivered is None:
                keys[str(dataset)] = [str(r["key"]) for r in read_records(sink)]
                source[str(dataset)] = "cooker"
            else:
                keys[str(dataset)] = delivered
                source[str(dataset)] = "batch"
        record = {"rank": rank, "world_size": world_size, "keys": keys, "source": source}
        (out / f"rank{rank}.json").write_text(json.dumps(record), encoding="utf-8")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _probe(options: argparse.Namespace) -> None:
    from .probe import probe_all

    probe_all(_target(options), options.dataset, Path(options.markers), Path(options.out))


def main(argv: Sequence[str] | None = None) -> None:
    """The child entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m primus_energon.conformance.runner", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("determinism", "shard", "probe"):
        p = sub.add_parser(name)
        p.add_argument("--spec", required=True, help="MODULE:ATTR of the target")
        p.add_argument("--kind", required=True, choices=["cooker", "task_encoder"])
        p.add_argument("--input-form", default="bytes", choices=["bytes", "decoded"])
        p.add_argument("--dataset", action="append", required=True, help="prepared dataset (repeatable)")
        if name == "probe":
            p.add_argument("--markers", required=True, help="directory the hostile payloads write into")
            p.add_argument("--out", required=True)
            continue
        if name == "determinism":
            p.add_argument(
                "--seed", type=int, action="append", required=True, help="loader seed (repeatable)"
            )
        else:
            p.add_argument("--seed", type=int, default=0)
        p.add_argument("--batch-size", type=int, default=4)
        p.add_argument("--out", required=True)
        if name == "determinism":
            p.add_argument("--workers", default="0,1,2", help="comma-separated num_workers values")
            p.add_argument("--batches", type=int, default=6)
        else:
            p.add_argument("--num-workers", type=int, default=0)
    options = parser.parse_args(argv)
    if options.command == "determinism":
        _determinism(options)
    elif options.command == "probe":
        _probe(options)
    else:
        _shard(options)


if __name__ == "__main__":
    main()
