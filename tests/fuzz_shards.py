"""Hypothesis-driven mutation of real shards, held to the hostile corpus's invariants.

Not collected by default (the name does not start with ``test_``): `tests/test_fuzz.py` runs it in a
subprocess capped in time and address space with a CI-sized budget, and ``nox -s fuzz`` runs it for longer
(``FUZZ_SECONDS``). Budget: ``FUZZ_EXAMPLES`` examples (default 40, derandomized), or, with
``FUZZ_SECONDS`` set, fresh random searches of ``FUZZ_EXAMPLES`` examples each until that many seconds
have passed.

Base shards are real: a preencoded and a raw shard from the synthetic generator, and one with pickle, npy,
JSON and tensor members. A mutation rebuilds the shard from its entries (members renamed to hostile names,
payloads truncated, replaced by hostile payloads, dropped or duplicated) and then damages its bytes (bytes
flipped, header fields rewritten with or without a valid checksum, the file cut short).

Invariants, for every mutated shard: ``validate_dataset`` returns a report (no exception), every problem
has a known code and names this shard or none, a problem with a key names a key or no key at all; the
readers of the safe decoding path (``read_tensor``, ``safe_loads``, ``SafeSampleDecoder``'s member
checks) raise nothing but ``ValueError``s; no payload ran (the marker is absent); nothing was written
beside the shard; each example finishes within `EXAMPLE_SECONDS`.
"""

from __future__ import annotations

import io
import os
import random
import tarfile
import time
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from primus_energon.datasets.limits import ScanLimits, set_limits
from primus_energon.datasets.problems import CODES
from primus_energon.datasets.validate import validate_dataset
from primus_energon.safepickle import safe_loads
from primus_energon.synthetic import generate_dataset
from primus_energon.tensorfile import read_tensor
from tests.hostile_corpus import (
    Entry,
    _exec_tensor,
    _lying_tensor,
    _npy,
    _os_system,
    _png_bomb,
    _shared_lists,
    clean_entries,
    snapshot,
    tar_bytes,
)

#: wall-clock seconds one example may take (its members' checks have a 5 s budget each)
EXAMPLE_SECONDS = 60.0
SHARD = "shard-000000.tar"
HOSTILE_NAMES = [
    "../escape.txt",
    "../../k.latents.pth",
    "/abs/k.txt",
    "k\n1.txt",
    "k\x001.json",
    "k.",
    ".hidden",
    "",
    "a/b/c/k.pyd",
    "k..txt",
    "k.__key__",
    "__key__.txt",
    "k\x7f.npy",
    "k" * 300 + ".txt",
    "ké.png",
]


def _entries(shard: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(shard) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]


_BASES: dict[str, list[tuple[str, bytes]]] = {}


def bases() -> dict[str, list[tuple[str, bytes]]]:
    """The base shards' entries, generated once per process."""
    if not _BASES:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            generate_dataset(
                root / "pre",
                encoding="preencoded",
                num_samples=3,
                shard_size=3,
                seed=1,
                shapes={"latents": (2, 4, 4), "prompt_embeds": (3, 8), "pooled_prompt_embeds": (8,)},
            )
            generate_dataset(
                root / "raw", encoding="raw", num_samples=3, shard_size=3, seed=2, image_size=(8, 8)
            )
            _BASES["preencoded"] = _entries(root / "pre" / SHARD)
            _BASES["raw"] = _entries(root / "raw" / SHARD)
        import pickle

        import numpy as np

        mixed = [(e.name, e.data) for e in clean_entries(2)]
        mixed += [
            ("s0009.pyd", pickle.dumps({"a": [1, 2], "t": np.zeros(3)})),
            ("s0009.npy", _npy(np.ones((2, 2)))),
        ]
        _BASES["mixed"] = mixed
    return _BASES


def hostile_payloads(marker: Path) -> list[bytes]:
    import pickle

    import numpy as np

    return [
        _os_system(marker),
        _exec_tensor(marker),
        _lying_tensor(),
        pickle.dumps(_shared_lists(30)),
        b"\x80\x05\x8e" + (1 << 40).to_bytes(8, "little") + b"abc.",
        _npy(np.zeros(4)).replace(b"(4,)", b"(100000000000, 1000)"),
        _npy(np.array([None], dtype=object)),
        b"[" * 5000 + b"]" * 5000,
        _png_bomb(60_000, 60_000),
        b"",
        b"\xff" * 40,
    ]


#: what the decoding path may raise for bad bytes: refusals, never MemoryError, RecursionError or a crash
_REFUSALS: tuple[type[BaseException], ...] = (ValueError, OSError, SyntaxError, Image.DecompressionBombError)

_HEADER_FIELDS = [
    (0, 100),
    (100, 8),
    (124, 12),
    (136, 12),
    (148, 8),
    (156, 1),
    (157, 100),
    (257, 8),
    (345, 155),
]


def _fix_checksum(block: bytearray) -> None:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)


@st.composite
def mutated_shards(draw: Any, marker: Path) -> bytes:
    base = draw(st.sampled_from(sorted(bases())), label="base")
    entries = list(bases()[base])
    payloads = hostile_payloads(marker)
    for _ in range(draw(st.integers(0, 3), label="entry edits")):
        if not entries:
            break
        i = draw(st.integers(0, len(entries) - 1), label="entry")
        name, data = entries[i]
        edit = draw(
            st.sampled_from(["rename", "truncate", "payload", "drop", "duplicate", "special"]), label="edit"
        )
        if edit == "rename":
            new = draw(
                st.sampled_from(HOSTILE_NAMES) | st.text(max_size=12).map(lambda t: t + ".txt"), label="name"
            )
            entries[i] = (new, data)
        elif edit == "truncate":
            entries[i] = (name, data[: draw(st.integers(0, max(0, len(data) - 1)), label="cut")])
        elif edit == "payload":
            entries[i] = (name, draw(st.sampled_from(payloads), label="hostile"))
        elif edit == "drop":
            del entries[i]
        elif edit == "duplicate":
            entries.insert(i, (name, data))
        else:
            kind = draw(
                st.sampled_from([tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE])
            )
            entries[i] = (name, b"\0" + kind)  # marker for tar building below
    tar_entries = []
    for name, data in entries:
        if data[:1] == b"\0" and len(data) == 2 and data[1:] in (b"1", b"2", b"3", b"6"):
            tar_entries.append(Entry(name, type=data[1:], linkname="../../etc/passwd"))
        else:
            tar_entries.append(Entry(name, data))
    try:
        raw = bytearray(tar_bytes(tar_entries))
    except (ValueError, UnicodeError, tarfile.TarError):
        raw = bytearray(tar_bytes([Entry(n, d) for n, d in entries if "\0" not in n and n]))
    headers = [0]
    pos = 0
    while pos + 512 <= len(raw) and raw[pos : pos + 512] != bytes(512):
        try:
            size = int(raw[pos + 124 : pos + 136].split(b"\0", 1)[0].strip() or b"0", 8)
        except ValueError:
            break
        pos += 512 + size + (-size % 512)
        headers.append(pos)
    for _ in range(draw(st.integers(0, 3), label="byte edits")):
        edit = draw(st.sampled_from(["flip", "header", "cut"]), label="byte edit")
        if not raw:
            break
        if edit == "flip":
            for _ in range(draw(st.integers(1, 8), label="flips")):
                at = draw(st.integers(0, len(raw) - 1), label="at")
                raw[at] = draw(st.integers(0, 255), label="byte")
        elif edit == "header":
            at = draw(st.sampled_from(headers), label="header")
            if at + 512 > len(raw):
                continue
            start, length = draw(st.sampled_from(_HEADER_FIELDS), label="field")
            value = draw(
                st.binary(min_size=1, max_size=length)
                | st.sampled_from([b"77777777777\0", b"-1\0", b"99999999999\0", b"\x80" + b"\xff" * 11]),
                label="value",
            )[:length]
            block = bytearray(raw[at : at + 512])
            block[start : start + len(value)] = value
            if draw(st.booleans(), label="fix checksum"):
                _fix_checksum(block)
            raw[at : at + 512] = block
        else:
            del raw[draw(st.integers(0, len(raw) - 1), label="cut at") :]
    return bytes(raw)


def _read_members(shard: bytes) -> list[tuple[str, bytes]]:
    """The regular members `tarfile` finds (for the decoding-path readers), as far as it gets."""
    out = []
    try:
        with tarfile.open(fileobj=io.BytesIO(shard)) as tar:
            for m in tar:
                if m.isfile() and m.size <= len(shard):
                    f = tar.extractfile(m)
                    if f is not None:
                        out.append((m.name, f.read()))
    except Exception:  # noqa: BLE001 - tarfile (the oracle, not the code under test) fails in many ways
        pass
    return out


def check_shard(shard: bytes, directory: Path, marker: Path) -> None:
    """The invariants for one mutated shard (see the module docstring)."""
    ds = directory / "ds"
    ds.mkdir(parents=True, exist_ok=True)
    (ds / SHARD).write_bytes(shard)
    before = snapshot(directory)
    started = time.monotonic()
    report = validate_dataset(ds, workers=1)
    known_keys = {None}
    for p in report.problems:
        assert p.code in CODES, p
        assert p.shard in (None, SHARD), p
        assert p.severity in ("error", "warning"), p
        assert isinstance(p.message, str) and p.message, p
        known_keys.add(p.key)
    report.to_json()
    from primus_energon.decoding import SafeSampleDecoder

    decoder = SafeSampleDecoder()
    for name, data in _read_members(shard)[:16]:
        part = name.rsplit(".", 1)[-1]
        try:
            if part == "pth":
                read_tensor(data, copy=True, fallback=True)
            elif part in ("pyd", "pickle"):
                safe_loads(data)
        except ValueError:
            pass
        try:
            decoder({"__key__": "k", name.split(".", 1)[-1] if "." in name else "txt": data})
        except Exception as exc:  # webdataset wraps a decoder's error; the cause must be a refusal
            chain = [exc, exc.__cause__, exc.__context__]
            assert any(isinstance(e, _REFUSALS) for e in chain if e is not None), repr(chain)
    assert time.monotonic() - started < EXAMPLE_SECONDS, "an example ran past its time cap"
    assert not marker.exists(), "a payload ran"
    assert snapshot(directory) == before, "something was written beside the shard"
    (ds / SHARD).unlink()


_COUNTER = [0]


def _run(tmp: Path, seed: int | None, examples: int) -> None:
    marker = tmp / "MARKER_payload_ran"

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=seed is None,
        database=None,
        print_blob=True,
        report_multiple_bugs=False,
    )
    @given(data=st.data())
    def search(data: Any) -> None:
        shard = data.draw(mutated_shards(marker), label="shard")
        _COUNTER[0] += 1
        directory = tmp / f"ex{_COUNTER[0]}"
        directory.mkdir()
        try:
            check_shard(shard, directory, marker)
        except BaseException:
            findings = Path(os.environ.get("FUZZ_FINDINGS", "reports/fuzz"))
            findings.mkdir(parents=True, exist_ok=True)
            import hashlib

            (findings / f"finding-{hashlib.sha256(shard).hexdigest()[:16]}.tar").write_bytes(shard)
            raise

    if seed is not None:
        search = hypothesis.seed(seed)(search)
    tmp.mkdir(parents=True, exist_ok=True)
    search()


def test_mutated_shards_keep_the_invariants(tmp_path: Path) -> None:
    examples = int(os.environ.get("FUZZ_EXAMPLES", "40"))
    seconds = float(os.environ.get("FUZZ_SECONDS", "0"))
    previous = set_limits(ScanLimits(member_seconds=5.0))
    try:
        if not seconds:
            _run(tmp_path, None, examples)
            return
        deadline = time.monotonic() + seconds
        seed = int(os.environ.get("FUZZ_SEED", "0")) or random.SystemRandom().randrange(1, 1 << 30)
        rounds = 0
        while time.monotonic() < deadline:
            print(f"fuzz round {rounds}: seed {seed + rounds}", flush=True)
            _run(tmp_path / f"r{rounds}", seed + rounds, examples)
            rounds += 1
        print(f"fuzz: {rounds} rounds, {_COUNTER[0]} shards, no invariant broken", flush=True)
    finally:
        set_limits(previous)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q", "-p", "no:cacheprovider", "-s"]))
