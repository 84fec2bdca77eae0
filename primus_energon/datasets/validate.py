"""`validate_dataset`: every check of a prepared CrudeWebdataset, on every sample (not a spot check).

Order of work: read ``.nv-meta`` (problems, not exceptions), scan every shard (in parallel over shards with
`workers` > 1; each shard is read once, member by member, with `primus_energon.datasets.tarscan`, never
through Energon, which stops at a truncated tar), then cross-check counts, indexes, splits and encodings
against what the scan found, and run the whole-dataset checks of `primus_energon.datasets.analysis`.

Contract: the report (problems, summaries, JSON) is the same for any `workers`; problems are ordered by
shard (metadata first), then by position in the shard. Consequences of one fault are folded into it: a
truncated or empty shard is not also reported as a count or index mismatch, a dotted key not also as
missing members.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..environment import release_writes_sqlite_index
from ..storage import DatasetPath, RemoteStorageError, dataset_dir
from .analysis import analyze
from .limits import ScanLimits, cap_address_space, capped, current_limits, worker_budget
from .metadata import META_DIR, DatasetMeta, list_shard_files, read_index, read_metadata
from .problems import CODES, Problem
from .report import DatasetReport, ShardSummary
from .scan import ShardScan, scan_shard

if TYPE_CHECKING:
    from .distributed import DistributedScanner

__all__ = [
    "ValidationError",
    "default_workers",
    "scan_shards",
    "shard_sizes",
    "shutdown_pools",
    "validate_dataset",
    "validate_path",
]

_BUILTIN = ("preencoded", "raw")


class ValidationError(Exception):
    """The path cannot be validated at all (it does not exist, is not a dataset or metadataset)."""


def default_workers() -> int:
    """What ``--workers auto`` means: the CPUs this process may use, at most 8; under torchrun, shared
    among the ranks on this node (``LOCAL_WORLD_SIZE``)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    try:
        local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local_ranks = 1
    return max(1, min(8, n // local_ranks))


# -- scanning, in process or in a pool --------------------------------------------------------------------------
def _init_worker(msc_config: str | None) -> None:
    import torch

    torch.set_num_threads(1)
    # the forkserver keeps the environment it started with; remote paths need the caller's profile file
    if msc_config is None:
        os.environ.pop("MSC_CONFIG", None)
    else:
        os.environ["MSC_CONFIG"] = msc_config


def _scan_task(args: tuple[int, str, str, bool, ScanLimits, int, int]) -> tuple[int, ShardScan]:
    """One shard in a worker: its address space capped at what it holds now + the shard's size + the
    worker's budget (`primus_energon.datasets.limits`), then `scan_shard`."""
    index, root, name, decode, limits, size, budget = args
    cap_address_space(size + budget)
    return index, scan_shard(root, name, decode=decode, limits=limits)


_POOLS: dict[tuple[int, str | None], Any] = {}
_AT_EXIT: list[bool] = []


def _pool(workers: int) -> Any:
    """A process pool of `workers` scanners, started once per process and reused (metadataset leaves, repeated
    calls); forkserver children with torch preloaded, one torch thread each. Closed at exit. A pool serves
    one ``MSC_CONFIG``: when it changes, the pools are replaced (their storage clients know the old one)."""
    msc_config = os.environ.get("MSC_CONFIG")
    pool = _POOLS.get((workers, msc_config))
    if pool is None:
        if any(key[1] != msc_config for key in _POOLS):
            shutdown_pools()
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["primus_energon.datasets.scan"])
        pool = _POOLS[(workers, msc_config)] = ctx.Pool(
            workers, initializer=_init_worker, initargs=(msc_config,)
        )
        if not _AT_EXIT:
            atexit.register(shutdown_pools)
            _AT_EXIT.append(True)
    return pool


def shutdown_pools() -> None:
    """Stop the scanner processes started by `scan_shards` (also done at interpreter exit)."""
    while _POOLS:
        _, pool = _POOLS.popitem()
        pool.terminate()
        pool.join()


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _progress_bar(total: int, desc: str, enabled: bool | None) -> Any:
    from tqdm.auto import tqdm

    if enabled is None:
        enabled = sys.stderr.isatty()
    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=desc,
        disable=not enabled,
        file=sys.stderr,
        dynamic_ncols=True,
        leave=False,
    )


def shard_sizes(location: DatasetPath, names: Sequence[str]) -> list[int]:
    """The size of each shard in bytes (0 for one that cannot be looked up)."""
    sizes = []
    for n in names:
        try:
            sizes.append((location / n).stat().st_size)
        except OSError:
            sizes.append(0)
    return sizes


def scan_shards(
    root: str | os.PathLike[str] | DatasetPath,
    names: Sequence[str],
    *,
    workers: int = 1,
    decode: bool = True,
    progress: bool | None = False,
    desc: str = "validate",
    on_bytes: Callable[[int], None] | None = None,
) -> list[ShardScan]:
    """`scan_shard` for each of `names` (in that order in the result), over `workers` processes.
    `on_bytes(n)`: called as bytes are scanned (per few MiB in process, per shard from a pool). The limits
    of `primus_energon.datasets.limits.current_limits` apply: a time budget per member, and in worker
    processes an address-space cap per shard."""
    location = dataset_dir(root)
    sizes = shard_sizes(location, names)
    workers = max(1, min(workers, len(names)))
    limits = current_limits()
    bar = _progress_bar(sum(sizes), desc, progress)
    results: list[ShardScan | None] = [None] * len(names)

    def advance(n: int) -> None:
        bar.update(n)
        if on_bytes is not None:
            on_bytes(n)

    try:
        if workers == 1:
            update: Callable[[int], None] | None = advance if on_bytes or not bar.disable else None
            with _one_thread():
                budget = worker_budget(limits, 1) if limits.cap_in_process else None
                for i, n in enumerate(names):
                    with capped(None if budget is None else budget + sizes[i]):
                        results[i] = scan_shard(location, n, decode=decode, on_bytes=update, limits=limits)
        else:
            # a worker gets the location as a string (a remote one then looks up only its own shards)
            budget = worker_budget(limits, workers)
            tasks = [(i, str(location), n, decode, limits, sizes[i], budget) for i, n in enumerate(names)]
            # largest shards first keeps the pool busy; results are put back in shard order
            tasks.sort(key=lambda t: -sizes[t[0]])
            for i, scan in _pool(workers).imap_unordered(_scan_task, tasks, chunksize=1):
                results[i] = scan
                advance(sizes[i])
    finally:
        bar.close()
    return [r for r in results if r is not None]


# -- the checks that compare metadata with the scan ---------------------------------------------------------
def _shard_order(meta: DatasetMeta, tars: list[str], root: DatasetPath) -> tuple[list[str], list[Problem]]:
    problems: list[Problem] = []
    if meta.shard_counts is None:
        return list(tars), problems
    listed = list(meta.shard_counts)
    present = [n for n in listed if (root / n).is_file()]
    for n in listed:
        if n not in present:
            problems.append(
                Problem(
                    "missing-shard",
                    n,
                    None,
                    None,
                    f"{META_DIR}/{meta.info_file} lists {n} ({meta.shard_counts[n]} samples), but the file is missing",
                )
            )
    listed_set = set(listed)
    unlisted = [n for n in tars if n not in listed_set]
    for n in unlisted:
        problems.append(
            Problem("unlisted-shard", n, None, None, f"{n} is not listed in {META_DIR}/{meta.info_file}")
        )
    return present + unlisted, problems


def _split_problems(meta: DatasetMeta) -> list[Problem]:
    if meta.split_parts is None or meta.shard_counts is None:
        return []
    problems: list[Problem] = []
    f = f"{META_DIR}/{meta.split_file}"
    for part, names in meta.split_parts.items():
        for n in names:
            if n not in meta.shard_counts:
                problems.append(
                    Problem(
                        "split-mismatch",
                        n,
                        None,
                        None,
                        f"{f} lists {n} in split {part!r}, but {META_DIR}/{meta.info_file} does not know it "
                        "(Energon raises KeyError when loading this split)",
                    )
                )
    owners = meta.split_of()
    for n, parts in owners.items():
        if len(parts) > 1:
            problems.append(
                Problem(
                    "split-mismatch",
                    n,
                    None,
                    None,
                    f"{f} lists {n} in several splits ({', '.join(parts)}): its samples leak between them",
                )
            )
    for n in meta.shard_counts:
        if n not in owners and n not in meta.exclude_shards:
            problems.append(
                Problem(
                    "split-mismatch",
                    n,
                    None,
                    None,
                    f"{f} puts {n} in no split, so Energon never reads it",
                    severity="warning",
                )
            )
    if not any(meta.split_parts.values()):
        problems.append(Problem("split-mismatch", None, None, None, f"{f}: every split is empty"))
    return problems


def _shard_problems(meta: DatasetMeta, root: DatasetPath, scan: ShardScan) -> list[Problem]:
    problems: list[Problem] = []
    listed = None if meta.shard_counts is None else meta.shard_counts.get(scan.name)
    empty = any(p.code == "empty-shard" for p in scan.problems)
    for p in scan.problems:
        if listed is not None and p.code in ("empty-shard", "truncated-shard", "corrupt-shard"):
            p = Problem(
                p.code,
                p.shard,
                p.key,
                p.member,
                f"{p.message} ({META_DIR}/{meta.info_file} lists {listed} samples)",
                detail={**p.detail, "listed": listed},
            )
        problems.append(p)
    if not meta.has_meta_dir or (meta.shard_counts is not None and listed is None):
        return problems  # no metadata, or an unlisted shard (reported as such): no index to expect
    idx_path = root / (scan.name + ".idx")
    index: list[int] | None = None
    if not idx_path.is_file():
        problems.append(
            Problem(
                "missing-index",
                scan.name,
                None,
                None,
                f"{scan.name}.idx is missing (Energon raises FileNotFoundError when it opens this shard)",
            )
        )
    else:
        index = read_index(idx_path)
        if index is None and not scan.broken:
            problems.append(
                Problem(
                    "index-mismatch",
                    scan.name,
                    None,
                    None,
                    f"{scan.name}.idx is {idx_path.stat().st_size} bytes, not a whole number of uint64 offsets",
                )
            )
    if scan.broken or empty:
        return problems  # the shard's own problem explains any count or index difference
    count = len(scan.samples)
    if listed is not None and listed != count:
        problems.append(
            Problem(
                "count-mismatch",
                scan.name,
                None,
                None,
                f"{META_DIR}/{meta.info_file} lists {listed} samples, the shard holds {count}",
                detail={"listed": listed, "actual": count},
            )
        )
    if index is not None and scan.end_offset is not None:
        actual = [s.offset for s in scan.samples] + [scan.end_offset]
        if index != actual:
            where = next(
                (i for i, (a, b) in enumerate(zip(index, actual, strict=False)) if a != b),
                min(len(index), len(actual)),
            )
            key = scan.samples[where].key if where < len(scan.samples) else None
            problems.append(
                Problem(
                    "index-mismatch",
                    scan.name,
                    key,
                    None,
                    f"{scan.name}.idx has {len(index) - 1} sample offsets, the shard {count}; first difference at "
                    f"entry {where} ({index[where] if where < len(index) else 'none'} vs "
                    f"{actual[where] if where < len(actual) else 'none'})",
                    detail={"entry": where, "index_entries": len(index), "expected_entries": len(actual)},
                )
            )
    return problems


def _encoding_problems(
    meta: DatasetMeta, requested: str | None, detected: str | None, num_samples: int, source: str
) -> tuple[str | None, list[Problem]]:
    declared = meta.declared_encoding
    problems: list[Problem] = []
    if requested and declared and requested != declared and source == "--encoding":
        problems.append(
            Problem(
                "encoding-mismatch",
                None,
                None,
                None,
                f"{META_DIR}/dataset.yaml declares encoding {declared!r}, but --encoding is {requested!r}",
                detail={"declared": declared, "requested": requested},
            )
        )
    used = requested or declared or detected
    if used in _BUILTIN and detected is not None and detected != used and num_samples:
        problems.append(
            Problem(
                "encoding-mismatch",
                None,
                None,
                None,
                f"the data holds {detected} samples, but the encoding in use is {used!r} "
                f"({source if requested else 'dataset.yaml'}): its cooker would reject every sample",
                detail={"used": used, "detected": detected},
            )
        )
    return used, problems


def _encoding_note(meta: DatasetMeta, requested: str | None, detected: str | None) -> str | None:
    """What validate says when dataset.yaml declares no ``subflavors.encoding`` (valid Energon, as ``energon
    prepare`` writes it) and none was given: the format was inferred from the members. None otherwise."""
    if requested or meta.declared_encoding or not meta.has_meta_dir:
        return None
    inferred = (
        f"the members are those of the {detected} encoding (inferred from the members)"
        if detected
        else "the members match no built-in encoding (a custom format; checked against the members most "
        "samples hold)"
    )
    use = f"subflavors: {{encoding: {detected}}}" if detected else "subflavors: {encoding: NAME}"
    return (
        f"{META_DIR}/dataset.yaml declares no subflavors.encoding, which Energon does not need; {inferred}. "
        f"Cookers that dispatch on the encoding (the reference ones) match the dataset once it has `{use}` "
        "in dataset.yaml or in its metadataset entry"
    )


def _pickle_note(scans: list[ShardScan]) -> list[Problem]:
    """One warning for a dataset with pickled members (each was read safely; see ``pickle-members``)."""
    parts = sorted(
        {sig[0] for scan in scans for rec in scan.samples for sig in rec.members if sig[1] == "pickle"}
    )
    if not parts:
        return []
    return [
        Problem(
            "pickle-members",
            None,
            None,
            None,
            f"members {', '.join(parts)} are pickles; they were read without unpickling anything but plain data",
            detail={"members": parts},
        )
    ]


def _sort_problems(
    problems: list[Problem], shard_index: dict[str, int], positions: dict[tuple[str, str], int]
) -> list[Problem]:
    codes = list(CODES)

    def key(p: Problem) -> tuple[int, int, int, str]:
        if p.shard is None or p.shard not in shard_index:
            return (-1, 0, codes.index(p.code) if p.code in codes else len(codes), p.member or "")
        pos = -1 if p.key is None else positions.get((p.shard, p.key), 1 << 40)
        return (
            shard_index[p.shard],
            pos,
            codes.index(p.code) if p.code in codes else len(codes),
            p.member or "",
        )

    return sorted(problems, key=key)


def validate_dataset(
    path: str | os.PathLike[str],
    *,
    encoding: str | None = None,
    workers: int = 1,
    progress: bool | None = False,
    strict: bool = False,
    decode: bool = True,
    encoding_source: str = "--encoding",
    scanner: DistributedScanner | None = None,
) -> DatasetReport:
    """Validate the dataset directory `path`; returns the report (``report.ok`` tells the verdict).

    `encoding`: the encoding to check against (default: dataset.yaml's ``subflavors.encoding``, else the one
    detected in the data). `workers`: processes scanning shards in parallel (the report does not depend on
    it). `progress`: a tqdm bar on stderr (None: only on a terminal). `strict`: warnings fail too.
    `decode=False` skips payload checks (structure, keys and metadata only). `encoding_source` names where
    `encoding` came from in messages; only ``"--encoding"`` reports a difference from dataset.yaml (a
    metadataset's subflavors override it legitimately). `path` may be remote (``msc://profile/prefix``): it
    is listed once and its shards are streamed. `scanner`: reads the shards instead of this process (the
    ranks of a torchrun job, `primus_energon.datasets.distributed`); the report is the same, plus which
    rank read which shard. Raises `ValidationError` if `path` is not a directory.

    With `workers` > 1 the shards are scanned by a pool of forkserver processes that stays up for later calls
    (`shutdown_pools` stops it); as with any multiprocessing code, a script calling this must guard its
    entry point with ``if __name__ == "__main__":``.
    """
    t0 = time.perf_counter()
    try:
        root = dataset_dir(path)
        if not root.is_dir():
            raise ValidationError(f"{str(root)!r} is not a directory")
    except RemoteStorageError as error:
        raise ValidationError(str(error)) from error
    meta = read_metadata(root)
    tars, compressed = list_shard_files(root)
    problems: list[Problem] = list(meta.problems)
    tar_set = set(tars)
    for c in compressed:
        stem = c[: c.rindex(".tar") + 4] if ".tar" in c else c.rsplit(".", 1)[0] + ".tar"
        if stem in tar_set:
            continue  # already decompressed beside it; Energon ignores the compressed copy
        problems.append(
            Problem(
                "compressed-shard",
                c,
                None,
                None,
                f"{c} is compressed; Energon ignores it (it reads shards by byte offset), so its samples are not "
                "part of the dataset",
            )
        )
    order, shard_list_problems = _shard_order(meta, tars, root)
    problems += shard_list_problems
    if not order:
        problems.append(
            Problem("missing-shard", None, None, None, f"no .tar shards in {root} (nothing to train on)")
        )
    problems += _split_problems(meta)
    scans = (scanner or scan_shards)(
        root, order, workers=workers, decode=decode, progress=progress, desc=f"validate {root.name}"
    )
    for scan in scans:
        problems += _shard_problems(meta, root, scan)
    requested = encoding
    analysis = analyze(scans, encoding=requested or meta.declared_encoding)
    used, enc_problems = _encoding_problems(
        meta, requested, analysis.detected_encoding, analysis.num_samples, encoding_source
    )
    problems += enc_problems
    problems += analysis.problems
    problems += _pickle_note(scans)
    if meta.has_meta_dir and not meta.has_sqlite and release_writes_sqlite_index():  # 5.x writes none
        problems.append(Problem("missing-sqlite", None, None, None, f"{META_DIR}/index.sqlite is missing"))
    # problems in data that split.yaml excludes do not stop training: downgrade them
    if meta.exclude_shards or meta.exclude_samples:
        relabelled = []
        for p in problems:
            if p.shard in meta.exclude_shards or (
                p.key is not None and f"{p.shard}/{p.key}" in meta.exclude_samples
            ):
                p = Problem(
                    p.code,
                    p.shard,
                    p.key,
                    p.member,
                    p.message + " (excluded in split.yaml)",
                    p.hint,
                    "warning",
                    p.dataset,
                    p.detail,
                )
            relabelled.append(p)
        problems = relabelled
    shard_index = {s.name: i for i, s in enumerate(scans)}
    shard_index.update({n: len(shard_index) + i for i, n in enumerate(compressed)})
    positions: dict[tuple[str, str], int] = {}
    for scan in scans:
        for i, rec in enumerate(scan.samples):
            positions.setdefault((scan.name, rec.key), i)
    problems = _sort_problems(problems, shard_index, positions)
    owners = meta.split_of()
    shards = [
        ShardSummary(
            s.name,
            s.size,
            sum(not r.partial for r in s.samples),
            None if meta.shard_counts is None else meta.shard_counts.get(s.name),
            owners.get(s.name, []),
        )
        for s in scans
    ]
    splits: dict[str, dict[str, int]] = {}
    if meta.split_parts is not None:
        by_name = {s.name: s for s in shards}
        for part, names in meta.split_parts.items():
            use = [by_name[n] for n in names if n in by_name and n not in meta.exclude_shards]
            splits[part] = {"shards": len(use), "samples": sum(s.samples for s in use)}
    return DatasetReport(
        path=str(root),
        encoding={
            "requested": requested,
            "declared": meta.declared_encoding,
            "detected": analysis.detected_encoding,
            "used": used,
            "note": _encoding_note(meta, requested, analysis.detected_encoding),
        },
        subflavors=meta.subflavors,
        shards=shards,
        splits=splits,
        members=analysis.members,
        problems=problems,
        strict=strict,
        elapsed_s=time.perf_counter() - t0,
        bytes_scanned=sum(s.size for s in scans),
        distributed=None if scanner is None else scanner.placement(root, order),
    )


def validate_path(
    path: str | os.PathLike[str] | DatasetPath,
    *,
    encoding: str | None = None,
    workers: int = 1,
    progress: bool | None = False,
    strict: bool = False,
    scanner: DistributedScanner | None = None,
) -> Any:
    """A dataset directory -> `validate_dataset`; a ``.yaml`` file -> `validate_metadataset`. Either may be
    remote (``msc://profile/prefix``). `scanner`: see `validate_dataset`."""
    try:
        p = dataset_dir(path)
        if p.suffix in (".yaml", ".yml") and p.is_file():
            from .metadataset import validate_metadataset

            return validate_metadataset(
                p, encoding=encoding, workers=workers, progress=progress, strict=strict, scanner=scanner
            )
        if p.is_dir():
            return validate_dataset(
                p, encoding=encoding, workers=workers, progress=progress, strict=strict, scanner=scanner
            )
        exists = p.exists()
    except RemoteStorageError as error:
        raise ValidationError(str(error)) from error
    if exists:
        raise ValidationError(f"{str(p)!r} is neither a dataset directory nor a metadataset .yaml file")
    raise ValidationError(f"{str(p)!r} does not exist")
