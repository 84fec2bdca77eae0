"""``torchrun ... -m primus_energon validate``: real torchrun jobs on this machine (2 and 4 ranks), on local and
on object-storage datasets; a rank that hangs (SIGSTOP) or dies (SIGKILL) fails the run, naming the rank."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from primus_energon.datasets.distributed import assign_shards
from primus_energon.synthetic import LoopbackObjectStore, generate_dataset, write_metadataset
from tests.helpers import SMALL_SHAPES

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dist-validate")
    generate_dataset(root / "clean", num_samples=40, shard_size=4, seed=5, shapes=SMALL_SHAPES)
    generate_dataset(
        root / "faulty",
        num_samples=40,
        shard_size=4,
        seed=6,
        shapes=SMALL_SHAPES,
        faults={"missing-member": 2, "truncated-shard": 1, "nan-tensor": 1, "duplicate-key": 1},
    )
    mix = write_metadataset(root / "mix.yaml", [(root / "clean", 0.5), (root / "faulty", 0.5)])
    return {"clean": root / "clean", "faulty": root / "faulty", "mix": mix, "root": root}


def _env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }


def validate_cmd(path: str | Path, report: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "primus_energon", "validate", str(path), "--json", str(report), *extra]


def torchrun_cmd(ranks: int, path: str | Path, report: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        *validate_cmd(path, report, *extra)[1:],
    ]


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=_env(), timeout=300, check=False)


def without_placement(doc: dict) -> dict:
    doc = dict(doc)
    doc.pop("distributed", None)
    if "leaves" in doc:
        doc["leaves"] = [dict(leaf, report=without_placement(leaf["report"])) for leaf in doc["leaves"]]
    return doc


def test_assign_shards_balances_bytes_and_is_deterministic() -> None:
    names = [f"s{i}" for i in range(7)]
    sizes = [10, 70, 30, 30, 20, 50, 40]
    plan = assign_shards(names, sizes, 3)
    assert plan == assign_shards(names, sizes, 3)
    assert sorted(n for part in plan for n in part) == names  # every shard once
    loads = [sum(sizes[names.index(n)] for n in part) for part in plan]
    assert max(loads) - min(loads) <= max(sizes) and all(part == sorted(part) for part in plan)
    assert assign_shards(names, sizes, 8)[7] == []  # more ranks than shards: some read nothing


@pytest.mark.slow
@pytest.mark.parametrize(("name", "ranks"), [("faulty", 2), ("faulty", 4), ("mix", 2)])
def test_torchrun_report_equals_the_single_process_report(
    data: dict[str, Path], tmp_path: Path, name: str, ranks: int
) -> None:
    single = run(validate_cmd(data[name], tmp_path / "single.json", "--workers", "1"))
    dist = run(torchrun_cmd(ranks, data[name], tmp_path / "dist.json", "--workers", "1"))
    assert single.returncode == 1, single.stderr
    assert dist.returncode != 0 and "FAILED:" in dist.stdout, dist.stdout + dist.stderr  # problems found
    one = json.loads((tmp_path / "single.json").read_text())
    many = json.loads((tmp_path / "dist.json").read_text())
    assert without_placement(many) == one
    placements = (
        [many["distributed"]] if name != "mix" else [leaf["report"]["distributed"] for leaf in many["leaves"]]
    )
    for placement in placements:
        assert placement["world_size"] == ranks
        assert set(placement["ranks"].values()) == set(range(ranks))  # every rank read some shards
    if name != "mix":
        assert sorted(placement["ranks"]) == sorted(s["name"] for s in one["shards"])
    assert dist.stdout.count("Dataset ") == (1 if name != "mix" else dist.stdout.count("Dataset "))
    assert "Dataset" in dist.stdout and dist.stdout.count("FAILED:") == 1  # rank 0 reports, once


@pytest.mark.slow
def test_torchrun_over_object_storage_equals_the_local_report(data: dict[str, Path], tmp_path: Path) -> None:
    local = run(validate_cmd(data["faulty"], tmp_path / "local.json", "--workers", "1"))
    assert local.returncode == 1
    with LoopbackObjectStore() as store:
        url = store.upload(data["faulty"], "faulty")
        dist = run(torchrun_cmd(2, url, tmp_path / "remote.json", "--workers", "1"))
    remote = json.loads((tmp_path / "remote.json").read_text())
    assert remote.pop("path") == url
    expected = json.loads((tmp_path / "local.json").read_text())
    expected.pop("path")
    assert without_placement(remote) == expected, dist.stderr


def _rank_pid(rank: int, report: Path, deadline: float) -> int:
    """The pid of the validate process torchrun started as `rank` for the job writing `report` (found in
    /proc by its command line and environment; other tests' jobs may be running beside it)."""
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            mine = b"primus_energon\0validate" in cmdline and str(report).encode() in cmdline
            if mine and f"RANK={rank}".encode() in environ:
                if b"torch.distributed.run" not in cmdline:
                    return int(entry.name)
        time.sleep(0.01)
    raise AssertionError(f"rank {rank} never started")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["hangs", "dies"])
def test_a_rank_that_hangs_or_dies_fails_the_run_naming_it(
    data: dict[str, Path], tmp_path: Path, how: str
) -> None:
    cmd = torchrun_cmd(2, data["clean"], tmp_path / "r.json", "--workers", "1", "--rank-timeout", "4")
    started = time.monotonic()
    job = subprocess.Popen(  # its own process group: cleanup ends torchrun and every rank it started
        cmd,
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    victim = None
    try:
        victim = _rank_pid(1, tmp_path / "r.json", started + 60)
        os.kill(victim, signal.SIGSTOP)
        if how == "hangs":  # rank 0 gives up on it; the stopped process is then ours to end
            _rank_gone(0, tmp_path / "r.json", started + 120)
        else:  # let rank 0 get to its shards, then the rank dies (as under the OOM killer)
            time.sleep(3)
        os.kill(victim, signal.SIGKILL)
        out, _ = job.communicate(timeout=120)
    finally:  # the stopped rank first (a stopped process ignores all but SIGKILL), then torchrun's group
        for pid in (victim,) if victim is not None else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        if job.returncode is None:
            job.communicate(timeout=60)
    elapsed = time.monotonic() - started
    assert job.returncode != 0, out
    if how == "hangs":
        assert "rank 1 of 2 stopped responding" in out and "shard-0000" in out, out
        assert "--rank-timeout 4" in out
    else:  # named by rank 0 (with its shards) when it was reading, else by torchrun's own summary
        ours = "torchrun stops every rank when one exits" in out
        assert (
            ("rank 1 had not reported its shards" in out and "shard-0000" in out)
            if ours
            else re.search(r"rank\s*:\s*1 \(local_rank: 1\)", out)
        ), out
    assert not (tmp_path / "r.json").exists()  # no report pretends the dataset was checked
    assert elapsed < 120


def _rank_gone(rank: int, report: Path, deadline: float) -> None:
    pid = _rank_pid(rank, report, deadline)
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or "Z" in _state(pid):
            return
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} did not exit")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"
