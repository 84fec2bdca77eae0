"""A corpus of hostile and pathological shards, one per class of attack or accident, and the harness that
runs the dataset tools on them in a capped subprocess.

Each `Case` builds one shard (a real tar, written here byte for byte where `tarfile` would refuse) and
says which problems `validate` must report, as ``(code, key, member)`` of shard ``shard-000000.tar``.
`run_tool` runs ``python -m primus_energon COMMAND ...`` with a wall-clock timeout and an address-space
cap (``RLIMIT_AS``), so a hang or a runaway allocation fails the test instead of the machine. The
invariants every case is held to (`check_invariants`): the tool exits with status 0 or 1 and no
traceback, its JSON report parses, no payload ran (the marker file that every code-running payload would
create is absent), and nothing was written outside the output file (the case directory holds the same
files before and after, byte for byte).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import resource
import struct
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
SHARD = "shard-000000.tar"
#: wall-clock seconds and address space one tool run may take
TIME_CAP_S = 120
MEMORY_CAP = 6 << 30

Expected = tuple[str, str | None, str | None]


class _Reduces:
    """An object whose pickle calls ``fn(*args)`` when loaded (the classic pickle payload)."""

    def __init__(self, fn: Any, args: tuple) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple:
        return self.fn, self.args


def _tensor_bytes(t: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    return buf.getvalue()


def clean_members(index: int) -> dict[str, bytes]:
    """A well-formed raw sample's members (caption, JSON, tensor)."""
    return {
        "txt": f"caption {index}".encode(),
        "json": json.dumps({"index": index}).encode(),
        "latents.pth": _tensor_bytes(torch.arange(8, dtype=torch.float32).reshape(2, 4) + index),
    }


@dataclass
class Entry:
    """One tar entry: a regular file by default; `type` a tarfile type byte for links, devices, FIFOs."""

    name: str
    data: bytes = b""
    type: bytes = tarfile.REGTYPE
    linkname: str = ""
    pax: dict[str, str] | None = None


def tar_bytes(entries: list[Entry], *, end: bool = True) -> bytes:
    """The archive of `entries` (pax headers where given), with the end-of-archive marker if `end`."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.type = e.type
            info.linkname = e.linkname
            info.size = len(e.data) if e.type == tarfile.REGTYPE else 0
            info.mtime = 0
            if e.pax:
                info.pax_headers = dict(e.pax)
                tar.format = tarfile.PAX_FORMAT
            tar.addfile(info, io.BytesIO(e.data) if info.size else None)
            tar.format = tarfile.GNU_FORMAT
    raw = out.getvalue()
    if not end:
        raw = raw.rstrip(b"\0")
        raw += b"\0" * (-len(raw) % 512)
    return raw


def sample_entries(key: str, members: dict[str, bytes]) -> list[Entry]:
    return [Entry(f"{key}.{part}", data) for part, data in members.items()]


def clean_entries(n: int = 2, start: int = 0) -> list[Entry]:
    out: list[Entry] = []
    for i in range(start, start + n):
        out += sample_entries(f"s{i:04d}", clean_members(i))
    return out


def _header_with(raw: bytes, offset: int, field_at: int, value: bytes) -> bytes:
    """`raw` with the header at `offset` changed at `field_at` (to `value`) and its checksum fixed."""
    block = bytearray(raw[offset : offset + 512])
    block[field_at : field_at + len(value)] = value
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return raw[:offset] + bytes(block) + raw[offset + 512 :]


def _png_bomb(width: int, height: int) -> bytes:
    """A tiny PNG declaring `width` x `height` grey pixels (its data decompresses to almost nothing)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


@dataclass
class Case:
    """One hostile shard. `build(marker)` returns the shard's bytes; `expected` the problems validate must
    report; `args` extra validate arguments; `ok`: the shard must show no problem at all (the dataset is
    unprepared, so validate still exits 1 for ``missing-metadata``)."""

    name: str
    build: Callable[[Path], bytes]
    expected: list[Expected]
    args: list[str] = field(default_factory=list)
    ok: bool = False
    #: a class that only writing tools refuse (finalize exits 2 and writes nothing)
    finalize_refuses: bool = False
    #: clean shards written beside it (so that several workers scan)
    more_shards: int = 0


def _shared_lists(levels: int) -> list:
    a: list = []
    for _ in range(levels):
        a = [a, a]
    return a


def _nested(depth: int) -> list:
    top: list = []
    node = top
    for _ in range(depth):
        node.append([])
        node = node[0]
    return top


def _with(member: str, data: bytes, key: str = "s0001") -> Callable[[Path], bytes]:
    """A shard of two clean samples, then sample `key` whose member `member` is `data`."""

    def build(marker: Path) -> bytes:
        members = clean_members(1)
        members[member] = data
        return tar_bytes(clean_entries(1) + sample_entries(key, members))

    return build


def _os_system(marker: Path) -> bytes:
    return pickle.dumps(_Reduces(os.system, (f"touch {marker}",)))


def _exec_tensor(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save({"t": torch.zeros(2), "x": _Reduces(exec, (f"open({str(marker)!r}, 'w').write('ran')",))}, buf)
    return buf.getvalue()


def _lying_tensor() -> bytes:
    """A torch.save archive whose pickle declares 2**40 elements for a 32-byte storage."""
    raw = _tensor_bytes(torch.zeros(8))
    return raw.replace(b"K\x08\x85", b"J\x00\x00\x00\x40\x85", 1)


def _cases() -> list[Case]:
    cases = [
        # -- pickles ------------------------------------------------------------------------------------
        Case(
            "pickle-shared-references",  # a = [a, a] forty times: 41 lists, 2**40 paths (was a hang)
            _with("pyd", pickle.dumps(_shared_lists(40))),
            [("pickle-members", None, None)],
            ok=True,
        ),
        Case(
            "pickle-too-deep", _with("pyd", pickle.dumps(_nested(200))), [("limit-exceeded", "s0001", "pyd")]
        ),
        Case(
            "pickle-opcode-nesting",  # 50,000 nested lists by opcodes, deeper than Python's recursion limit
            _with("pyd", b"\x80\x02" + b"]" * 50_000 + b"a" * 49_999 + b"."),
            [("limit-exceeded", "s0001", "pyd")],
        ),
        Case(
            "pickle-bytes8-bomb",  # declares a terabyte in 13 bytes
            _with("pyd", b"\x80\x05\x8e" + (1 << 40).to_bytes(8, "little") + b"abc."),
            [("garbage-payload", "s0001", "pyd")],
        ),
        Case(
            "pickle-os-system",
            lambda m: _with("pyd", _os_system(m))(m),
            [("malicious-pickle", "s0001", "pyd")],
        ),
        Case(
            "pth-exec",
            lambda m: _with("latents.pth", _exec_tensor(m))(m),
            [("malicious-pickle", "s0001", "latents.pth")],
        ),
        Case(
            "pth-lying-storage",
            _with("latents.pth", _lying_tensor()),
            [("garbage-payload", "s0001", "latents.pth")],
        ),
        # -- npy, JSON, images ---------------------------------------------------------------------------
        Case(
            "npy-shape-larger-than-bytes",  # was an attempt to allocate 800 TB
            _with("npy", _npy(np.zeros(4)).replace(b"(4,)", b"(100000000000, 1000)")),
            [("garbage-payload", "s0001", "npy")],
        ),
        Case(
            "npy-object-dtype",
            _with("npy", _npy(np.array([None, 1], dtype=object))),
            [("malicious-pickle", "s0001", "npy")],
        ),
        Case(
            "json-deep",  # was a RecursionError traceback
            _with("json", b"[" * 100_000 + b"]" * 100_000),
            [("limit-exceeded", "s0001", "json")],
        ),
        Case(
            "png-decompression-bomb",
            _with("png", _png_bomb(100_000, 100_000)),
            [("garbage-payload", "s0001", "png")],
        ),
        # -- names that escape or confuse ----------------------------------------------------------------
        Case(
            "dotdot-member",
            lambda m: tar_bytes(clean_entries(1) + sample_entries("../escaped/s0001", clean_members(1))),
            [("unsafe-path", "../escaped/s0001", "txt")],
            finalize_refuses=True,
        ),
        Case(
            "absolute-member",
            lambda m: tar_bytes(clean_entries(1) + sample_entries("/tmp/escaped/s0001", clean_members(1))),
            [("unsafe-path", "/tmp/escaped/s0001", "txt")],
            finalize_refuses=True,
        ),
        Case(
            "symlink",
            lambda m: tar_bytes(
                clean_entries(1) + [Entry("s0001.txt", type=tarfile.SYMTYPE, linkname="/etc/passwd")]
            ),
            [("link-member", "s0001", "txt")],
            finalize_refuses=True,
        ),
        Case(
            "hardlink",
            lambda m: tar_bytes(
                clean_entries(1) + [Entry("s0001.txt", type=tarfile.LNKTYPE, linkname="../../x")]
            ),
            [("link-member", "s0001", "txt")],
            finalize_refuses=True,
        ),
        Case(
            "char-device",
            lambda m: tar_bytes(clean_entries(1) + [Entry("s0001.txt", type=tarfile.CHRTYPE)]),
            [("special-member", "s0001", "txt")],
            finalize_refuses=True,
        ),
        Case(
            "fifo",
            lambda m: tar_bytes(clean_entries(1) + [Entry("s0001.txt", type=tarfile.FIFOTYPE)]),
            [("special-member", "s0001", "txt")],
            finalize_refuses=True,
        ),
        Case(
            "newline-key",
            lambda m: tar_bytes(clean_entries(1) + sample_entries("s\n0001", clean_members(1))),
            [("control-character", "s\n0001", None)],
            finalize_refuses=True,
        ),
        Case(
            "nul-key",  # a NUL inside a pax path record (ustar names end at the first NUL)
            lambda m: tar_bytes(
                clean_entries(1) + [Entry("s0001.txt", b"caption", pax={"path": "s\x000001.txt"})]
            ),
            [("control-character", "s\x000001", None)],
            finalize_refuses=True,
        ),
        # -- damaged tars --------------------------------------------------------------------------------
        Case(
            "truncated-tar",
            lambda m: tar_bytes(clean_entries(2))[:2500],
            [("truncated-shard", None, None)],
        ),
        Case(
            "garbage-header",
            lambda m: (lambda raw: raw[:2048] + b"\xff" * 512 + raw[2560:])(tar_bytes(clean_entries(2))),
            [("corrupt-shard", None, None)],
        ),
        Case(
            "pax-size-not-a-number",  # was a ValueError traceback
            lambda m: tar_bytes(clean_entries(1) + [Entry("s0001.txt", b"caption", pax={"size": "lots"})]),
            [("corrupt-shard", None, None)],
        ),
        Case(
            "size-larger-than-file",
            lambda m: _header_with(tar_bytes(clean_entries(1), end=False), 0, 124, b"77777777777\0"),
            [("truncated-shard", "s0000", "txt")],
        ),
        # -- budgets -------------------------------------------------------------------------------------
        Case(
            "time-budget",  # a legitimate but slow member: 400,000 lists, checked with a 0.5 s budget
            _with("pyd", pickle.dumps([[i] for i in range(400_000)])),
            [("limit-exceeded", "s0001", "pyd")],
            args=["--member-timeout", "0.5"],
        ),
        Case(
            "memory-budget",  # a 64 MB pickle checked by workers allowed 16 MiB besides the shard
            _with("pyd", pickle.dumps(b"\1" * (64 << 20), protocol=4)),
            [("limit-exceeded", "s0001", "pyd")],
            args=["--workers", "1", "--worker-memory", str(16 / 1024)],
        ),
        Case(
            "memory-budget-workers",  # the same in a pool of two worker processes
            _with("pyd", pickle.dumps(b"\1" * (64 << 20), protocol=4)),
            [("limit-exceeded", "s0001", "pyd")],
            args=["--workers", "2", "--worker-memory", str(16 / 1024)],
            more_shards=1,
        ),
    ]
    return cases


CASES: dict[str, Case] = {c.name: c for c in _cases()}


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` (relative path -> sha256), links and all."""
    out = {}
    for path in sorted(directory.rglob("*")):
        rel = str(path.relative_to(directory))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def _cap_memory() -> None:  # pragma: no cover - runs in the child
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_tool(args: list[str], cwd: Path, timeout: float = TIME_CAP_S) -> subprocess.CompletedProcess:
    """``python -m primus_energon ARGS`` in `cwd`, capped at `timeout` seconds and `MEMORY_CAP` bytes of
    address space; `subprocess.TimeoutExpired` if it runs past the timeout."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run(
        [sys.executable, "-m", "primus_energon", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_cap_memory,
        start_new_session=True,
    )


def write_case(directory: Path, shard: bytes, more_shards: int = 0) -> Path:
    """The dataset directory ``directory/ds`` holding `shard` as its first shard (and `more_shards` clean
    ones after it); returns it."""
    ds = directory / "ds"
    ds.mkdir(parents=True)
    (ds / SHARD).write_bytes(shard)
    for i in range(more_shards):
        (ds / f"shard-{i + 1:06d}.tar").write_bytes(tar_bytes(clean_entries(2, start=1000 * (i + 1))))
    return ds


def validate_case(directory: Path, shard: bytes, extra: list[str] = ()) -> tuple[int, dict[str, Any], str]:
    """Validate the one-shard dataset of `shard` under `directory` in a capped subprocess, holding it to the
    invariants; (exit status, JSON report, stderr)."""
    ds = write_case(directory, shard)
    marker = directory / "MARKER_payload_ran"
    before = snapshot(directory)
    out = directory / "report.json"
    proc = run_tool(
        ["validate", str(ds), "--json", str(out), "--workers", "1", "--no-progress", *extra], directory
    )
    check_invariants(proc, directory, before, marker, allowed_new={"report.json"})
    return proc.returncode, json.loads(out.read_text()), proc.stderr


def check_invariants(
    proc: subprocess.CompletedProcess,
    directory: Path,
    before: dict[str, str],
    marker: Path,
    allowed_new: set[str],
) -> None:
    assert proc.returncode in (0, 1), f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert not marker.exists(), "a payload ran"
    after = snapshot(directory)
    added = set(after) - set(before)
    assert added <= allowed_new, f"written outside the output: {sorted(added - allowed_new)}"
    assert {k: v for k, v in after.items() if k in before} == before, "a file of the case changed"
