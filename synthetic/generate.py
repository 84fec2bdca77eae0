"""`generate_dataset`: options -> plan -> shards (processes, ranks) -> Energon preparation -> faults -> manifest.

Everything that can refuse the request (options, output directory) runs before torch is imported.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .distributed import Coordinator, SingleProcess, coordinator_from_env
from .errors import SyntheticError
from .faults import FAULT_KINDS
from .manifest import MANIFEST_FILENAME, FaultRecord, Manifest, ShardRecord
from .plan import DatasetPlan, build_plan, fingerprint, positive_int
from .preparation import prepare_with_energon, write_dataset_yaml
from .schema import Schema

if TYPE_CHECKING:  # the writer pulls in torch; it is imported when shards are written
    from .writer import ShardResult

__all__ = ["generate_dataset"]

# What the generator itself puts in a dataset directory; `overwrite` removes only these.
_OWN_ENTRY_RE = re.compile(r"^(shard-\d+\.tar(\.idx)?(\.tmp)?|\.nv-meta|manifest\.json(\.tmp)?)$")


def _prepare_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise SyntheticError(
            f"output path {str(out)!r} exists and is not a directory; choose a directory path"
        )
    if not out.exists():
        out.mkdir(parents=True)
        return
    entries = sorted(out.iterdir())
    if not entries:
        return
    if not overwrite:
        raise SyntheticError(
            f"output directory {str(out)!r} is not empty; to replace the dataset in it use --overwrite "
            "(Python: overwrite=True), or choose an empty directory"
        )
    foreign = [e.name for e in entries if not _OWN_ENTRY_RE.match(e.name)]
    if foreign:
        raise SyntheticError(
            f"refusing to overwrite {str(out)!r}: it holds files the generator did not make "
            f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); delete them or choose another directory"
        )
    for e in entries:
        if e.is_dir() and not e.is_symlink():
            shutil.rmtree(e)
        else:
            e.unlink()


def _write_shards(plan: DatasetPlan, shards: list[int], workers: int, progress: bool) -> list[ShardResult]:
    from tqdm.auto import tqdm

    from .writer import write_shard

    total = sum(len(plan.shard_range(s)) for s in shards)
    bar = tqdm(
        total=total,
        unit="sample",
        desc=f"synthetic {Path(plan.out_dir).name}",
        disable=not progress,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    results: list[ShardResult] = []
    try:
        if workers <= 1 or len(shards) <= 1:
            for s in shards:
                results.append(write_shard(plan, s, (lambda: bar.update(1)) if progress else None))
        else:
            # spawn, not fork: the parent may hold threads (torch, tqdm) that fork would copy mid-flight.
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=min(workers, len(shards)), mp_context=ctx) as pool:
                futures = [pool.submit(write_shard, plan, s) for s in shards]
                for future in as_completed(futures):
                    result = future.result()
                    bar.update(len(result.samples))
                    results.append(result)
    finally:
        bar.close()
    return sorted(results, key=lambda r: r.shard)


def _finalize(
    plan: DatasetPlan, options: dict[str, Any], results: list[ShardResult], workers: int
) -> Manifest:
    from .damage import apply_post_prepare_faults

    root = Path(plan.out_dir)
    results = sorted(results, key=lambda r: r.shard)
    if [r.shard for r in results] != list(range(plan.num_shards)):  # pragma: no cover - a coordination bug
        raise AssertionError("not every shard was written exactly once")
    prepare_with_energon(root, plan.shard_names, plan.shard_splits, workers=workers)
    write_dataset_yaml(root, plan.schema.dataset_subflavors)
    samples = [s for r in results for s in r.samples]
    key_of = {s.index: s.key for s in samples}
    shard_of = {s.index: s.shard for s in samples}
    shard_keys = [[plan.key(i) for i in plan.shard_range(s)] for s in range(plan.num_shards)]
    post = apply_post_prepare_faults(
        root, plan.fault_plan, list(plan.shard_names), shard_keys, key_of, shard_of
    )
    position = {key: i for i, key in enumerate(key_of[i] for i in sorted(key_of))}

    def order(f: FaultRecord) -> tuple[int, int, int, str]:
        return (
            plan.shard_names.index(f.shard),
            -1 if f.key is None or f.kind == "truncated-shard" else position[f.key],
            FAULT_KINDS.index(f.kind),
            f.member or "",
        )

    faults = sorted([f for r in results for f in r.faults] + post, key=order)
    shards = [
        ShardRecord(name, split, len(plan.shard_range(s)), (root / name).stat().st_size)
        for s, (name, split) in enumerate(zip(plan.shard_names, plan.shard_splits, strict=True))
    ]
    manifest = Manifest(
        encoding=plan.schema.encoding,
        seed=plan.seed,
        num_samples=plan.num_samples,
        shard_size=plan.shard_size,
        schema=plan.schema,
        subflavors=plan.schema.dataset_subflavors,
        options=options,
        shards=shards,
        samples=samples,
        faults=faults,
        marker_path=plan.marker_path,
    )
    manifest.save(root / MANIFEST_FILENAME)
    return manifest


def _run_distributed(
    plan: DatasetPlan,
    options: dict[str, Any],
    coord: Coordinator,
    workers: int,
    overwrite: bool,
    progress: bool,
) -> Manifest:
    out = Path(plan.out_dir)
    status: tuple[str, str] = ("ok", fingerprint(plan, options))
    if coord.rank == 0:
        try:
            _prepare_out_dir(out, overwrite)
        except SyntheticError as exc:
            status = ("error", str(exc))
    status = coord.broadcast(status)
    if status[0] == "error":
        raise SyntheticError(status[1])
    if status[1] != fingerprint(plan, options):
        raise SyntheticError(
            f"rank {coord.rank} was started with other options than rank 0; start every rank alike"
        )
    mine = [s for s in range(plan.num_shards) if s % coord.world_size == coord.rank]
    try:
        part: tuple[str, Any] = ("ok", _write_shards(plan, mine, workers, progress and coord.rank == 0))
    except Exception as exc:
        part = ("error", f"rank {coord.rank}: {type(exc).__name__}: {exc}")
    gathered = coord.gather(part)
    final: tuple[str, str] = ("ok", "")
    manifest: Manifest | None = None
    if coord.rank == 0:
        assert gathered is not None
        errors = [p[1] for p in gathered if p[0] == "error"]
        if errors:
            final = ("error", "; ".join(errors))
        else:
            try:
                manifest = _finalize(plan, options, [r for p in gathered for r in p[1]], workers)
            except Exception as exc:
                final = ("error", f"rank 0 finalizing: {type(exc).__name__}: {exc}")
    final = coord.broadcast(final)
    if final[0] == "error":
        raise SyntheticError(f"distributed generation of {str(out)!r} failed: {final[1]}")
    return manifest if manifest is not None else Manifest.load(out)


def generate_dataset(
    out_dir: str | PathLike[str],
    *,
    encoding: str | None = None,
    schema: Schema | str | PathLike[str] | None = None,
    num_samples: int = 64,
    shard_size: int = 16,
    seed: int = 0,
    dtype: str | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    image_format: str | None = None,
    image_size: tuple[int, int] | None = None,
    variable_shapes: bool = False,
    split: Sequence[float] = (1.0, 0.0, 0.0),
    faults: Mapping[str, int] | Iterable[str] | None = None,
    marker_path: str | PathLike[str] | None = None,
    key_prefix: str | None = None,
    workers: int = 1,
    overwrite: bool = False,
    progress: bool = False,
    distributed: bool | None = None,
) -> Manifest:
    """Generate a prepared CrudeWebdataset in `out_dir` and return its manifest (also saved as manifest.json).

    Contract: the shards and ``manifest.json`` are a pure function of the options (not of `workers`, the rank
    split or `progress`); Energon loads the result as it is; every injected fault is in ``manifest.faults``.

    * `encoding`: ``"preencoded"`` (default) or ``"raw"``; with `schema`, it must match the schema's encoding.
    * `schema`: a `Schema` or a YAML/JSON schema file; replaces the built-in schema of `encoding`.
    * `dtype`: dtype of every floating tensor (float32, bfloat16, float16); default: the schema's (float32).
    * `shapes`: tensor shapes by member name or stem, e.g. ``{"latents": (4, 8, 8)}``.
    * `image_format` (``jpg``/``jpeg``/``png``/``webp``) and `image_size` (height, width): the raw image.
    * `variable_shapes`: each sample gets a resolution bucket (bucketed tensors and images change H, W).
    * `split`: (train, val, test) ratios, applied to whole shards in order.
    * `faults`: ``{"missing-member": 2}`` or ``["missing-member:2", "nan-tensor"]``; kinds in `FAULT_KINDS`.
    * `marker_path`: the file a ``malicious-pickle`` payload creates if unpickled (default:
      ``<out_dir>.PWNED`` beside `out_dir`); it is stored in the payload, so it is part of the content.
    * `key_prefix`: keys are ``<key_prefix>_<index>`` (default ``s<seed>``); letters, digits, ``_``, ``-``.
    * `workers`: processes writing shards in parallel. With ``RANK``/``WORLD_SIZE`` set (torchrun), ranks
      split the shards and rank 0 finalizes; every rank returns the manifest.
    * `overwrite`: replace the dataset in a non-empty `out_dir` (only generator-made files may be there).
    * `progress`: show a progress bar on stderr.
    * `distributed`: None (default) splits the work across ranks when ``WORLD_SIZE`` > 1 is set, and then every
      rank must make the same call; False ignores ``RANK``/``WORLD_SIZE`` (one rank generates alone); True
      requires them.

    Raises `SyntheticError` for bad options, with a message that says what to change.
    """
    out = Path(out_dir).absolute()
    workers = positive_int(workers, "workers")
    plan, options = build_plan(
        out,
        encoding=encoding,
        schema=schema,
        num_samples=num_samples,
        shard_size=shard_size,
        seed=seed,
        dtype=dtype,
        shapes=shapes,
        image_format=image_format,
        image_size=image_size,
        variable_shapes=variable_shapes,
        split=split,
        faults=faults,
        marker_path=marker_path,
        key_prefix=key_prefix,
    )
    if distributed is False:
        coord: SingleProcess | Coordinator = SingleProcess()
    else:
        coord = coordinator_from_env()
        if distributed and isinstance(coord, SingleProcess) and "WORLD_SIZE" not in os.environ:
            raise SyntheticError(
                "distributed=True needs RANK and WORLD_SIZE in the environment; launch with torchrun"
            )
    try:
        if isinstance(coord, SingleProcess):
            _prepare_out_dir(out, overwrite)
            results = _write_shards(plan, list(range(plan.num_shards)), workers, progress)
            return _finalize(plan, options, results, workers)
        return _run_distributed(plan, options, coord, workers, overwrite, progress)
    finally:
        coord.close()
