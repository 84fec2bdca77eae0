"""The hostile corpus (`tests/hostile_corpus.py`): each class of damaged, lying or malicious shard makes
`validate` exit with its verdict and name the problem's kind, shard, key and member, within a time and
memory cap, running nothing and writing nothing but its report; the writing command (`finalize`) refuses
the names and entry types that escape or confuse, and writes nothing."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from primus_energon.datasets.limits import MemberTimeout, failure_problem_fields, member_deadline
from primus_energon.datasets.scan import scan_shard
from primus_energon.datasets.tarscan import TarReader, control_characters, unsafe_path
from tests.hostile_corpus import (
    CASES,
    SHARD,
    Entry,
    check_invariants,
    run_tool,
    snapshot,
    tar_bytes,
    write_case,
)


def _located(doc: dict) -> set[tuple[str, str | None, str | None, str | None]]:
    return {(p["code"], p["shard"], p["key"], p["member"]) for p in doc["problems"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_validate_names_each_hostile_case(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    marker = tmp_path / "MARKER_payload_ran"
    shard = case.build(marker)
    ds = write_case(tmp_path, shard, case.more_shards)
    before = snapshot(tmp_path)
    proc = run_tool(
        ["validate", str(ds), "--json", "report.json", "--no-progress", *(case.args or ["--workers", "1"])],
        tmp_path,
    )
    check_invariants(proc, tmp_path, before, marker, allowed_new={"report.json"})
    import json

    doc = json.loads((tmp_path / "report.json").read_text())
    assert proc.returncode == 1, proc.stdout[-3000:]  # the dataset is not prepared: missing-metadata
    found = _located(doc)
    if case.ok:
        assert not [f for f in found if f[1] is not None], found
    for code, key, member in case.expected:
        shard_name = None if code == "pickle-members" else SHARD
        matches = {f for f in found if f[0] == code and f[1] == shard_name}
        if code not in ("truncated-shard", "corrupt-shard") or key is not None:
            matches = {f for f in matches if f[2] == key and f[3] == member}
        assert matches, f"{name}: expected {(code, shard_name, key, member)}, got {sorted(found, key=repr)}"
    assert "Traceback" not in proc.stdout
    if any(code == "limit-exceeded" for code, _, _ in case.expected):
        (problem,) = [p for p in doc["problems"] if p["code"] == "limit-exceeded"]
        assert problem["detail"]["limit"] in ("objects", "depth", "bytes", "time", "memory")
        assert problem["detail"]["limit"] in problem["message"] or "levels" in problem["message"]
        if name in BUDGET_NAMED:  # the budget that was hit is the one named
            limit, text = BUDGET_NAMED[name]
            assert problem["detail"]["limit"] == limit and text in problem["message"], problem


#: the cases that hit a time or memory budget: the limit named, and how the message names it
BUDGET_NAMED = {
    "time-budget": ("time", "0.5-second time budget"),
    "memory-budget": ("memory", "address-space cap"),
    "memory-budget-workers": ("memory", "address-space cap"),
}


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.finalize_refuses))
def test_finalize_refuses_entries_that_escape_or_confuse(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    ds = write_case(tmp_path, case.build(tmp_path / "marker"))
    before = snapshot(tmp_path)
    proc = run_tool(["finalize", str(ds), "--encoding", "raw", "--no-progress"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "refusing to prepare shards with entries that escape or confuse" in proc.stderr
    assert SHARD in proc.stderr
    assert snapshot(tmp_path) == before, "finalize wrote something"


def test_a_clean_shard_still_finalizes(tmp_path: Path) -> None:
    """The refusal is about the entries: the same shard without them is prepared."""
    ds = write_case(tmp_path, tar_bytes([Entry("s0000.txt", b"a"), Entry("s0001.txt", b"b")]))
    proc = run_tool(["finalize", str(ds), "--encoding", "raw", "--no-progress"], tmp_path)
    assert (ds / ".nv-meta" / ".info.json").is_file(), proc.stderr[-3000:]


def test_tar_reader_names_special_entries(tmp_path: Path) -> None:
    raw = tar_bytes(
        [
            Entry("a.txt", b"x"),
            Entry("d", type=tarfile.DIRTYPE),
            Entry("b.txt", type=tarfile.SYMTYPE, linkname="/etc/passwd"),
            Entry("c.txt", type=tarfile.FIFOTYPE),
        ]
    )
    plain = [(m.name, m.type) for m, _ in TarReader(raw)]
    assert plain == [("a.txt", "file")]  # what Energon reads; the conformance suite's reader is unchanged
    special = [(m.name, m.type, m.linkname) for m, _ in TarReader(raw, special=True)]
    assert special == [
        ("a.txt", "file", None),
        ("d/", "directory", None),
        ("b.txt", "symlink", "/etc/passwd"),
        ("c.txt", "fifo", None),
    ]


def test_name_rules() -> None:
    assert unsafe_path("/etc/x.txt") == "absolute path"
    assert unsafe_path("a/../../x.txt") == "'..' component"
    assert unsafe_path("..") == "'..' component"
    assert unsafe_path("a/..b/c..d.txt") is None and unsafe_path("dir/key.latents.pth") is None
    assert control_characters("a\nb\x00c\n") == ["\\n", "\\x00"]
    assert control_characters("plain key_01") == []


def test_one_problem_per_control_character_key(tmp_path: Path) -> None:
    """A sample key with a newline is one problem (not one per member), and the sample is still read."""
    members = [Entry(f"s\n1.{part}", b"x") for part in ("txt", "json", "cls")]
    ds = write_case(tmp_path, tar_bytes(members))
    scan = scan_shard(ds, SHARD, decode=False)
    assert [(p.code, p.key, p.member) for p in scan.problems] == [("control-character", "s\n1", None)]
    assert [s.key for s in scan.samples] == ["s\n1"]


def test_failures_become_named_problems() -> None:
    """What the net around each member check makes of each kind of exception."""
    assert failure_problem_fields(MemberTimeout(2.5))[0:2] == (
        "limit-exceeded",
        "checking the member took longer than its 2.5-second time budget; the check was stopped and nothing from the member was used",
    )
    code, message, detail = failure_problem_fields(MemoryError("no"))
    assert code == "limit-exceeded" and detail["limit"] == "memory" and "MemoryError" in message
    code, _, detail = failure_problem_fields(
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried")
    )
    assert code == "limit-exceeded" and detail["limit"] == "memory"
    assert failure_problem_fields(RecursionError("deep"))[2]["limit"] == "depth"
    code, message, detail = failure_problem_fields(OverflowError("int too large"))
    assert (
        code == "check-failed"
        and "OverflowError: int too large" in message
        and detail == {"exception": "OverflowError"}
    )


def test_member_deadline_interrupts_python_work() -> None:
    with pytest.raises(MemberTimeout):
        with member_deadline(0.05):
            while True:
                pass
    with member_deadline(5.0) as armed:
        assert armed
    import signal

    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL  # restored
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_safe_decoder_checks_declared_sizes_and_nesting() -> None:
    """SafeSampleDecoder reads `.npy` like np.load (order, values, writable) but checks the header's shape
    against the bytes first, and refuses JSON nested past the budget instead of recursing."""
    import io

    import numpy as np

    from primus_energon.boundedread import JsonDepthError, read_npy
    from primus_energon.decoding import SafeSampleDecoder

    buf = io.BytesIO()
    array = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    np.save(buf, array)
    out = SafeSampleDecoder()({"__key__": "k", "npy": buf.getvalue()})["npy"]
    assert out.flags.f_contiguous and out.flags.writeable and np.array_equal(out, array)
    lying = buf.getvalue().replace(b"(2, 3)", b"(200000000, 300000)")
    with pytest.raises(ValueError, match="480000000000000 bytes"):
        read_npy(lying)
    for member, data, error in (
        ("npy", lying, ValueError),
        ("json", b"[" * 10_000 + b"]" * 10_000, JsonDepthError),
    ):
        with pytest.raises(Exception) as raised:
            SafeSampleDecoder()({"__key__": "k", member: data})
        chain = [raised.value, raised.value.__cause__, raised.value.__context__]
        assert any(isinstance(e, error) for e in chain), chain
