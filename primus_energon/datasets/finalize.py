"""`finalize_dataset`: turn a directory of ``.tar`` shards into a dataset Energon loads, without prompts.

Runs Energon's own ``WebdatasetPreparator.prepare_dataset`` (``.nv-meta/.info.json``, ``split.yaml``,
``index.sqlite``, ``index.uuid`` and a ``.tar.idx`` beside each shard), then writes ``.nv-meta/dataset.yaml``:
a ``CrudeWebdataset`` (module ``megatron.energon``) whose subflavors are ``encoding`` first, then any extra
ones, in their order (both through `primus_energon.datasets.preparation`)::

    __module__: megatron.energon
    __class__: CrudeWebdataset
    subflavors:
      encoding: preencoded

Refuses, with one line that says what to do (`FinalizeError`, exit status 2): split ratios that are not three
non-negative numbers summing to 1; compressed shards (``.tar.gz``: Energon reads shards by byte offset and
cannot seek in them; ``decompress=True`` writes the ``.tar`` beside each); a directory already prepared
(unless ``force``); shards holding entries that escape or confuse (a name that is absolute or climbs out
with ``..``, a link, a device or FIFO, a name with a control character): nothing is written for them. Energon's ``sys.exit(1)`` on duplicate keys becomes a `FinalizeError` (exit status 1)
naming the duplicate.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..storage import is_remote
from .metadata import META_DIR, list_shard_files
from .preparation import EnergonExited, prepare_shards, write_dataset_yaml

__all__ = ["FinalizeError", "FinalizeResult", "finalize_dataset", "parse_split", "decompress_shard"]

_ENCODING_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_META_FILES = (
    ".info.json",
    ".info.yaml",
    "split.yaml",
    "split.json",
    "index.sqlite",
    "index.uuid",
    "dataset.yaml",
)
_OPENERS = {".gz": "gzip", ".tgz": "gzip", ".bz2": "bz2", ".xz": "lzma"}


class FinalizeError(Exception):
    """Finalize refused or failed; `exit_code` is 2 for bad input, 1 when Energon's preparation failed."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class FinalizeResult:
    root: Path
    shards: list[str]
    split: tuple[float, float, float]
    parts: list[str]
    dataset_yaml: Path
    decompressed: list[str]


def parse_split(text: str | Sequence[float]) -> tuple[float, float, float]:
    """``"0.8,0.1,0.1"`` (or a sequence) -> (train, val, test); `FinalizeError` unless three non-negative
    finite numbers that sum to 1 (within 1e-6)."""
    what = text if isinstance(text, str) else ",".join(str(x) for x in text)
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        values = [float(x) for x in items]
    except (TypeError, ValueError):
        values = []
    if (
        len(values) != 3
        or not all(math.isfinite(v) and v >= 0 for v in values)
        or abs(sum(values) - 1.0) > 1e-6
    ):
        raise FinalizeError(
            f"--split must be three non-negative numbers TRAIN,VAL,TEST that sum to 1 (e.g. 0.9,0.05,0.05); "
            f"got {what!r}"
        )
    return values[0], values[1], values[2]


def decompress_shard(root: Path, name: str) -> str:
    """Write the uncompressed ``.tar`` beside compressed shard `name`; returns the new relative name."""
    import bz2
    import gzip
    import lzma

    src = root / name
    suffix = ".tgz" if name.endswith(".tgz") else Path(name).suffix
    module = _OPENERS.get(suffix)
    if module is None:
        raise FinalizeError(
            f"{name}: cannot decompress {suffix} shards here; decompress them yourself (e.g. `zstd -d`) and rerun"
        )
    target = name[: -len(".tgz")] + ".tar" if suffix == ".tgz" else name[: -len(suffix)]
    opener = {"gzip": gzip.open, "bz2": bz2.open, "lzma": lzma.open}[module]
    tmp = root / (target + ".tmp")
    try:
        with opener(src, "rb") as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    except (OSError, EOFError, lzma.LZMAError) as exc:
        tmp.unlink(missing_ok=True)
        raise FinalizeError(f"{name} cannot be decompressed ({exc}); fix or remove it", exit_code=1) from None
    os.replace(tmp, root / target)
    return target


def finalize_dataset(
    path: str | os.PathLike[str],
    encoding: str,
    *,
    split: str | Sequence[float] = (1.0, 0.0, 0.0),
    subflavors: Mapping[str, Any] | None = None,
    workers: int = 1,
    force: bool = False,
    decompress: bool = False,
    shuffle_seed: int | None = None,
) -> FinalizeResult:
    """Prepare the shards under `path` for Energon and write ``dataset.yaml``; see the module docstring.

    `split`: (train, val, test) ratios (Energon assigns whole shards, in shard order unless `shuffle_seed`).
    `subflavors`: extra ``dataset.yaml`` subflavors besides ``encoding``. `workers`: Energon's preparation
    processes. Does not validate; the CLI runs `validate_dataset` afterwards. A remote `path`
    (``msc://...``) is refused with what to do instead.
    """
    if is_remote(os.fspath(path)):
        raise FinalizeError(
            f"{path} is on object storage; finalize needs a writable local directory, because Energon's "
            "preparation writes .nv-meta/ and a .tar.idx beside each shard. Prepare a local copy "
            "(primus-energon finalize DIR --encoding NAME), then upload it with its hidden files, e.g. "
            f"`msc sync --no-ignore-hidden DIR --target-url {path}` (msc sync skips .nv-meta/ without "
            "--no-ignore-hidden); validate, info, preview and get_loader then read it where it is"
        )
    root = Path(path)
    ratios = parse_split(split)
    if not isinstance(encoding, str) or not _ENCODING_RE.match(encoding):
        raise FinalizeError(f"--encoding must be a name like preencoded or raw, got {encoding!r}")
    if not root.is_dir():
        raise FinalizeError(f"{str(root)!r} is not a directory")
    if not os.access(root, os.W_OK):
        raise FinalizeError(
            f"{str(root)!r} is not writable (Energon writes .nv-meta/ and a .tar.idx per shard)"
        )
    tars, compressed = list_shard_files(root)
    tar_set = set(tars)
    pending = [c for c in compressed if _plain_name(c) not in tar_set]
    decompressed: list[str] = []
    if pending and not decompress:
        shown = ", ".join(pending[:3]) + (f" and {len(pending) - 3} more" if len(pending) > 3 else "")
        raise FinalizeError(
            f"{len(pending)} compressed shard(s) ({shown}): Energon reads samples by byte offset and cannot use "
            "compressed tars (it would silently ignore them). Rerun with --decompress to write the .tar beside each, "
            "or decompress them yourself (gunzip -k DIR/*.tar.gz)"
        )
    for c in pending:
        decompressed.append(decompress_shard(root, c))
    tars = sorted(set(tars) | set(decompressed))
    if not tars:
        raise FinalizeError(f"no .tar shards under {str(root)!r}")
    _refuse_hostile_entries(root, tars)
    nv = root / META_DIR
    if (nv / ".info.json").exists() or (nv / ".info.yaml").exists():
        if not force:
            raise FinalizeError(
                f"{str(root)!r} is already prepared ({META_DIR}/.info.json exists); rerun with --force to prepare "
                "it again (splits are recomputed)"
            )
        for f in _META_FILES:
            (nv / f).unlink(missing_ok=True)
    parts = _prepare(root, tars, ratios, workers=workers, shuffle_seed=shuffle_seed)
    extra = {k: v for k, v in (subflavors or {}).items() if k != "encoding"}
    dataset_yaml = write_dataset_yaml(root, {"encoding": encoding, **extra})
    return FinalizeResult(root, tars, ratios, sorted(parts), dataset_yaml, decompressed)


def hostile_entries(root: Path, tars: Sequence[str], *, limit: int = 20) -> list[tuple[str, str, str]]:
    """``(shard, entry name, why)`` for entries of the shards whose name is absolute or has a ``..``
    component, that are links, devices or FIFOs, or whose name holds control characters (at most `limit`);
    headers only. A shard that cannot be read to its end is left to Energon's preparation to report."""
    from .tarscan import TarCorrupt, TarReader, TarTruncated, control_characters, open_shard, unsafe_path

    found: list[tuple[str, str, str]] = []
    for name in tars:
        try:
            data = open_shard(root / name)
        except OSError:
            continue
        try:
            for member, _ in TarReader(data, read_data=False, special=True):
                reasons = []
                why = unsafe_path(member.name)
                if why:
                    reasons.append(f"an {why}")
                if member.type not in ("file", "directory"):
                    reasons.append(
                        f"a {member.type}" + (f" to {member.linkname!r}" if member.linkname else "")
                    )
                chars = control_characters(member.name)
                if chars:
                    reasons.append(f"control character(s) {', '.join(chars)}")
                if reasons:
                    found.append((name, member.name, " and ".join(reasons)))
                    if len(found) >= limit:
                        return found
        except (TarTruncated, TarCorrupt, OSError):
            pass
        finally:
            close = getattr(data, "close", None)
            if close is not None:
                close()
    return found


def _refuse_hostile_entries(root: Path, tars: Sequence[str]) -> None:
    found = hostile_entries(root, tars)
    if not found:
        return
    shown = "; ".join(f"{shard}: {entry[:120]!r} is {why}" for shard, entry, why in found[:3])
    more = f" (and more: {len(found)}+ entries)" if len(found) > 3 else ""
    raise FinalizeError(
        f"refusing to prepare shards with entries that escape or confuse: {shown}{more}. Any tool that "
        "extracts such a shard writes outside its directory or creates links and devices, and control "
        "characters break index lookups. Rewrite the shards with relative key.member names and regular files "
        "only; `primus-energon validate DIR` lists every such entry"
    )


def _plain_name(name: str) -> str:
    if name.endswith(".tgz"):
        return name[: -len(".tgz")] + ".tar"
    return name[: name.rindex(".tar") + 4] if ".tar" in name else name


def _prepare(
    root: Path, tars: list[str], ratios: tuple[float, float, float], *, workers: int, shuffle_seed: int | None
) -> set[str]:
    """`prepare_shards` by ratios; Energon's exit or failure becomes a `FinalizeError` (exit status 1) that
    says what to run next."""
    try:
        return prepare_shards(root, tars, ratios=ratios, shuffle_seed=shuffle_seed, workers=workers)
    except EnergonExited as exc:  # duplicate keys: Energon prints the reason and calls sys.exit(1)
        example = next((ln for ln in exc.lines if "duplicate key" in ln.lower()), "")
        raise FinalizeError(
            f"Energon refused the shards (exit {exc.status}): sample keys are not unique across shards"
            + (f" ({example})" if example else "")
            + ". Run `primus-energon validate DIR` to list every duplicate, rename them, and rerun finalize",
            exit_code=1,
        ) from None
    except Exception as exc:  # noqa: BLE001 - e.g. AssertionError "Shard ... has no samples."
        raise FinalizeError(
            f"Energon's prepare_dataset failed: {type(exc).__name__}: {str(exc).rstrip('.')}. Run "
            "`primus-energon validate DIR` to see which shard is broken",
            exit_code=1,
        ) from None
