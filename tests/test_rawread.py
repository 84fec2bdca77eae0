"""primus_energon.rawread: the raw read reads every byte of every file, and times the passes its contract
promises (counts of passes and bytes only; no timing is asserted)."""

from __future__ import annotations

from pathlib import Path

from primus_energon.rawread import MAX_BUFFER_BYTES, read_buffer, read_once, time_reads, timed_passes


def _files(tmp_path: Path, sizes: list[int]) -> list[Path]:
    paths = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"shard-{i}.tar"
        path.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        paths.append(path)
    return paths


def test_read_once_reads_every_byte_of_every_file(tmp_path: Path) -> None:
    paths = _files(tmp_path, [0, 1, 5000, 70_001])
    assert read_once(paths) == 75_002
    small = memoryview(bytearray(7))  # a buffer smaller than the files: still every byte
    assert read_once(paths, small) == 75_002


def test_the_buffer_is_the_largest_file_within_bounds(tmp_path: Path) -> None:
    assert len(read_buffer(_files(tmp_path, [10, 300]))) == 300
    empty = tmp_path / "empty"
    empty.mkdir()
    assert len(read_buffer(_files(empty, [0]))) == 1
    assert len(read_buffer([])) == 1
    assert MAX_BUFFER_BYTES == 1 << 24


def test_time_reads_times_at_least_min_passes_of_every_byte(tmp_path: Path) -> None:
    paths = _files(tmp_path, [4096, 1000])
    measured = time_reads(paths, min_passes=4, min_seconds=0.0, max_passes=50)
    assert len(measured.seconds) == 4 and measured.bytes_per_pass == 5096
    assert measured.bytes_per_s > 0


def test_timed_passes_calls_once_untimed_then_between_min_and_max() -> None:
    calls: list[int] = []
    assert len(timed_passes(lambda: calls.append(1), 3, 0.0, 50)) == 3 and len(calls) == 4
    calls.clear()
    # min_seconds far off: the cap ends it
    assert len(timed_passes(lambda: calls.append(1), 2, 1e9, 6)) == 6 and len(calls) == 7
