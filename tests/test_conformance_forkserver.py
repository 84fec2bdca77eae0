"""The fork servers the suite's fresh processes come from (primus_energon.conformance.processes.forkserver): a forked
child is fresh wherever a target can tell (its hash seed, its random state, its environment, its folder, its
streams), ends as an interpreter would (exit status, uncaught exception, signal), takes the loader workers it
forked with it when killed, and nothing outlives the servers; where no server can serve, the suite starts
interpreters as before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from primus_energon.conformance.processes import forkserver
from primus_energon.conformance.processes.children import (
    CHILD_TAG_VARIABLE,
    HASHSEEDS,
    child_env,
    fork_servers,
    rank_hashseeds,
    start_runner,
    stop,
    tagged_processes,
)
from primus_energon.conformance.processes.forkserver import (
    ForkedGroup,
    ForkServers,
    ForkUnavailable,
    rank_environments,
)

pytestmark = pytest.mark.skipif(not forkserver.supported(), reason="fork servers need Linux")
ENTRY = "tests.forkserver_entry"


@pytest.fixture
def servers() -> Iterator[ForkServers]:
    made = fork_servers()
    try:
        yield made
    finally:
        made.close()


def _fork(servers: ForkServers, hashseed: int, *argv: str, env: dict[str, str] | None = None, cwd: str = "/"):
    server = servers.server(hashseed)
    assert server is not None and server.ready(), server and server.problem
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    env = env if env is not None else child_env(hashseed)
    return server.fork(list(argv), env=env, cwd=cwd, stdout=out, stderr=err, entry=ENTRY), out, err


def _read(stream) -> str:
    stream.seek(0)
    return stream.read().decode()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_a_forked_child_is_fresh_where_a_target_can_tell(servers: ForkServers, tmp_path: Path) -> None:
    states = {}
    for name, hashseed in (("a", HASHSEEDS[0]), ("b", HASHSEEDS[0]), ("c", HASHSEEDS[1])):
        env = child_env(hashseed, OMP_NUM_THREADS="1", ONLY_IN_THE_REQUEST=name)
        env.pop("HOME", None)  # the server has it: the child must not
        child, out, err = _fork(
            servers, hashseed, "state", str(tmp_path / f"{name}.json"), env=env, cwd=str(tmp_path)
        )
        assert child.wait(120) == 0, _read(err)
        states[name] = json.loads((tmp_path / f"{name}.json").read_text())
        assert _read(out) == "to stdout\n" and "to stderr" in _read(err)
    a, b, c = states["a"], states["b"], states["c"]
    # the hash seed is the server's: the same in a and b (one server), another in c
    assert a["hash"] == b["hash"] != c["hash"]
    # the memory layout is inherited from the server (children of one server tend to place a new object
    # alike, which is why no claim compares two children of one server); children of two servers differ in
    # it as two new interpreters do
    layouts = [
        subprocess.run(
            [sys.executable, "-c", "import torch; print([id(object()), hash(object()), id(torch.empty(0))])"],
            capture_output=True,
            text=True,
        ).stdout
        for _ in range(2)
    ]
    assert (a["layout"] != c["layout"]) is (layouts[0] != layouts[1])
    # every global generator is seeded as a new interpreter seeds it: random and numpy from the OS, torch's
    # from the OS where a new interpreter's is (torch 2.13), else from torch's fixed default
    for generator in ("random", "numpy"):
        assert len({a[generator], b[generator], c[generator]}) == 3, generator
    draws = [
        subprocess.run(
            [sys.executable, "-c", "import torch; print(float(torch.rand(1)))"],
            capture_output=True,
            text=True,
        ).stdout
        for _ in range(2)
    ]
    fresh_differ = draws[0] != draws[1]
    assert (len({a["torch"], b["torch"], c["torch"]}) == 3) is fresh_differ
    # the request's environment (and only it), folder, command line and thread count
    assert a["env"]["ONLY_IN_THE_REQUEST"] == "a" and b["env"]["ONLY_IN_THE_REQUEST"] == "b"
    assert a["env"]["PYTHONHASHSEED"] == str(HASHSEEDS[0]) and c["env"]["PYTHONHASHSEED"] == str(HASHSEEDS[1])
    assert "HOME" not in a["env"] and "HOME" in os.environ
    entry_file = str(Path(__file__).with_name("forkserver_entry.py"))
    assert a["cwd"] == str(tmp_path) and a["argv"] == [entry_file, "state", str(tmp_path / "a.json")]
    assert a["threads"] == 1
    assert a["session_leader"] and len({a["pid"], b["pid"], c["pid"]}) == 3
    assert not a["zoo_imported"]  # a server imports no target module


def test_a_forked_child_ends_as_an_interpreter_would(servers: ForkServers) -> None:
    exits, _, _ = _fork(servers, HASHSEEDS[0], "exit", "3")
    raises, _, err = _fork(servers, HASHSEEDS[0], "raise")
    sleeps, _, _ = _fork(servers, HASHSEEDS[0], "sleep")
    assert exits.wait(60) == 3
    assert raises.wait(60) == 1
    assert "ValueError: raised in the child" in _read(err) and "Traceback" in _read(err)
    with pytest.raises(subprocess.TimeoutExpired):
        sleeps.wait(0.2)
    assert sleeps.poll() is None
    sleeps.kill()
    assert sleeps.wait(30) == -signal.SIGKILL and sleeps.poll() == -signal.SIGKILL


def test_killing_a_child_ends_the_loader_workers_it_forked(servers: ForkServers, tmp_path: Path) -> None:
    child, _, _ = _fork(servers, HASHSEEDS[0], "grandchild", str(tmp_path / "pid"))
    deadline = time.monotonic() + 60
    while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int((tmp_path / "pid").read_text())
    assert _alive(grandchild)
    child.kill()
    assert child.wait(30) == -signal.SIGKILL
    assert _wait_gone(grandchild)


def test_a_failing_rank_ends_its_group_with_its_status(servers: ForkServers) -> None:
    sleeping, _, _ = _fork(servers, HASHSEEDS[0], "sleep")
    failing, _, _ = _fork(servers, HASHSEEDS[0], "exit", "2")
    group = ForkedGroup([sleeping, failing])
    assert group.wait(60) == 2  # as torch.distributed.run: the first failure ends the others
    assert sleeping.wait(30) == -signal.SIGKILL and _wait_gone(sleeping.pid)


def test_rank_environments_are_those_of_a_standalone_torchrun() -> None:
    ranks = rank_environments(2, 29511, "run")
    assert [r["RANK"] for r in ranks] == ["0", "1"] and [r["LOCAL_RANK"] for r in ranks] == ["0", "1"]
    assert {r["WORLD_SIZE"] for r in ranks} == {r["LOCAL_WORLD_SIZE"] for r in ranks} == {"2"}
    assert {(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in ranks} == {("127.0.0.1", "29511")}
    assert {r["TORCHELASTIC_RUN_ID"] for r in ranks} == {"run"}


def test_closing_ends_every_server_and_child(tmp_path: Path) -> None:
    servers = fork_servers()
    child, _, _ = _fork(servers, HASHSEEDS[0], "grandchild", str(tmp_path / "pid"))
    server = servers.server(HASHSEEDS[0])
    assert server is not None
    deadline = time.monotonic() + 60
    while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int((tmp_path / "pid").read_text())
    servers.close()
    assert child.wait(30) == -signal.SIGKILL
    assert server.child.process.poll() is not None
    assert _wait_gone(child.pid) and _wait_gone(grandchild)
    assert tagged_processes(server.child.tag) == []
    assert servers.server(HASHSEEDS[0]) is None  # closed: callers start interpreters


def test_when_a_server_dies_its_children_die_and_the_suite_starts_interpreters(
    servers: ForkServers, tmp_path: Path
) -> None:
    child, _, _ = _fork(servers, HASHSEEDS[0], "sleep")
    server = servers.server(HASHSEEDS[0])
    assert server is not None and child.pid is not None
    os.killpg(server.child.process.pid, signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL  # the handle ends with its server
    assert _wait_gone(child.pid)  # and so does the process (PR_SET_PDEATHSIG)
    assert not server.ready(1)
    started = start_runner("probe", ["--help"], servers=servers)
    try:
        assert isinstance(started.process, subprocess.Popen)  # a new interpreter instead
        assert started.command[-2:] == ["probe", "--help"]
    finally:
        stop(started)


def test_without_fork_servers_start_runner_starts_interpreters(monkeypatch, servers: ForkServers) -> None:
    monkeypatch.setattr(forkserver, "supported", lambda: False)
    ranks = start_runner("shard", ["--help"], servers=servers, world=2, OMP_NUM_THREADS="1")
    try:
        assert isinstance(ranks.process, subprocess.Popen)
        assert ranks.command[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    finally:
        stop(ranks)


def test_start_runner_forks_with_the_command_that_reproduces_it(servers: ForkServers) -> None:
    child = start_runner(
        "probe", ["--help"], servers=servers, hashseed=HASHSEEDS[1], show_env=["PYTHONHASHSEED"]
    )
    try:
        assert not isinstance(child.process, subprocess.Popen)
        assert child.process.wait(60) == 0  # argparse's --help
        child.stdout.seek(0)
        assert "usage:" in child.stdout.read().decode()
        assert child.describe().startswith(f"PYTHONHASHSEED={HASHSEEDS[1]} ")
        assert child.command[1:3] == ["-m", "primus_energon.conformance.processes.runner"]
        assert child.tag and child.tag != servers.server(HASHSEEDS[1]).child.tag
        assert CHILD_TAG_VARIABLE == "PRIMUS_CONFORMANCE_CHILD"
    finally:
        stop(child)


def test_the_loader_workers_a_child_leaves_running_end_with_it(servers: ForkServers, tmp_path: Path) -> None:
    child, _, _ = _fork(servers, HASHSEEDS[0], "orphan", str(tmp_path / "pid"))
    assert child.wait(60) == 0
    orphan = int((tmp_path / "pid").read_text())
    assert _wait_gone(orphan)  # its session is ended when the child is reaped


def test_ranks_run_under_hash_seeds_of_their_own() -> None:
    """As torchrun's ranks, each in a new interpreter, do; restoring ranks each under another one than the
    rank that saved."""
    assert rank_hashseeds(None, 1) == [HASHSEEDS[0]] and rank_hashseeds(HASHSEEDS[1], 1) == [HASHSEEDS[1]]
    assert rank_hashseeds(None, 2) == [HASHSEEDS[0], HASHSEEDS[1]]
    assert rank_hashseeds(HASHSEEDS[1], 2) == [HASHSEEDS[1], HASHSEEDS[0]]
    for world in (3, 4, 8):  # each rank a server of its own, however many there are
        for first in (None, HASHSEEDS[1]):
            assert len(set(rank_hashseeds(first, world))) == world


def test_a_request_a_server_cannot_take_starts_an_interpreter(servers: ForkServers) -> None:
    """A request larger than the server's socket takes (an environment of hundreds of kilobytes)."""
    large = {f"LARGE_{i}": "x" * 100_000 for i in range(4)}
    with pytest.raises(ForkUnavailable):
        _fork(servers, HASHSEEDS[0], "exit", "0", env={**child_env(HASHSEEDS[0]), **large})
    child = start_runner("probe", ["--help"], servers=servers, **large)
    try:
        assert isinstance(child.process, subprocess.Popen)
        assert child.process.wait(120) == 0
    finally:
        stop(child)
    exits, _, _ = _fork(servers, HASHSEEDS[0], "exit", "0")  # the server serves on
    assert exits.wait(60) == 0


def test_a_child_whose_server_ends_says_so(servers: ForkServers) -> None:
    child, _, err = _fork(servers, HASHSEEDS[0], "sleep")
    server = servers.server(HASHSEEDS[0])
    assert server is not None and child.pid is not None
    os.kill(server.child.process.pid, signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL
    assert "the fork server ended while this process ran" in _read(err)
