"""Test helpers: an independent oracle for shard contents, and the crude samples Energon hands to a cooker.

The oracle reads the tar files with :mod:`tarfile` only, so the tests compare Energon's and the
cookers' output against something that shares no code with them.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import torch

from primus_energon.conformance.data.workspace import read_crude
from primus_energon.energon_compat import energon_key, release_default_decoder
from primus_energon.formats import MEMBER_NAME, SIZES

SMALL_SHAPES = SIZES["tiny"]


def read_members(dataset: str | Path) -> dict[str, dict[str, bytes]]:
    """``{key: {member: bytes}}`` for every sample in every ``*.tar`` of ``dataset``, keyed as Energon
    names the samples (``energon_key``: ``<shard>/<key>`` on Energon 7.0-7.2)."""
    samples: dict[str, dict[str, bytes]] = {}
    for shard in sorted(Path(dataset).glob("*.tar")):
        with tarfile.open(shard) as tar:
            for info in tar:
                if not info.isfile():
                    continue
                match = MEMBER_NAME.match(info.name)
                assert match, f"unexpected member name {info.name!r} in {shard}"
                key, member = match.groups()
                samples.setdefault(energon_key(shard.name, key), {})[member] = tar.extractfile(info).read()
    return samples


def tensor_from_bytes(data: bytes) -> torch.Tensor:
    """Oracle decode of a clean tensor member (the test's own data, so weights_only is enough)."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def assert_tensor_identical(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert torch.equal(actual, expected), f"{what}: values differ"


def crude_samples(
    dataset: str | Path, *, decoded: bool = False, split_part: str = "train"
) -> list[dict[str, Any]]:
    """The crude sample dicts Energon hands to a cooker, in dataset order. ``decoded=True``: behind
    Energon's own default decoder, which unpickles ``.pth`` members (use on clean data only)."""
    return read_crude(dataset, decoder=release_default_decoder() if decoded else None, split_part=split_part)


def live_processes(needle: str) -> list[str]:
    """Command lines of live (not zombie) processes other than this one that contain ``needle``."""
    import os

    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
                state = (entry / "stat").read_text().split(") ", 1)[1][:1]
            except (OSError, IndexError):
                continue
            if needle in cmdline and state != "Z":
                found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def live_descendants() -> list[str]:
    """Command lines of live (not zombie) processes descending from this one, except the helpers Python's
    multiprocessing keeps for the life of a process (the suite's forked children show their fork server's
    command line, so a target's spec does not find them)."""
    import os

    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except (OSError, IndexError):
            continue
        if stat[0] != "Z":
            parents[int(entry.name)] = int(stat[1])
            commands[int(entry.name)] = cmdline
    found, stack = [], [os.getpid()]
    while stack:
        parent = stack.pop()
        for pid, ppid in parents.items():
            if ppid == parent:
                stack.append(pid)
                if "multiprocessing.resource_tracker" not in commands[pid]:
                    found.append(f"{pid}: {commands[pid][:200]}")
    return found


def write_prepared_dataset(
    root: Path, samples: list[tuple[str, dict[str, bytes]]], subflavors: dict[str, Any]
) -> Path:
    """A one-shard dataset of exactly these ``(key, {member: bytes})`` samples, prepared by Energon, with
    ``dataset.yaml`` (for formats the generator does not write)."""
    from primus_energon.datasets.preparation import prepare_shards, write_dataset_yaml

    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(root / "shard-000000.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        for key, members in samples:
            for name, data in members.items():
                info = tarfile.TarInfo(f"{key}.{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    prepare_shards(root, ["shard-000000.tar"], shard_splits=["train"])
    write_dataset_yaml(root, subflavors)
    return root


def run_pytest(cwd: Path, *args: str, pythonpath: str = "") -> Any:
    """``python -m pytest -p no:cacheprovider ARGS`` in a fresh interpreter in ``cwd``, with the project
    (and ``pythonpath``) importable; returns the ``CompletedProcess``."""
    import os
    import subprocess
    import sys

    repo = str(Path(__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, repo) if p)}
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
