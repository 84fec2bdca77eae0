"""The throughput pipelines and ceilings under pytest-benchmark (in-process, one epoch per round).

    pytest benchmarks/test_throughput.py --benchmark-only --benchmark-json=out.json

Not part of the default test run (``testpaths = ["tests"]``). Each test builds one pipeline at
``num_workers=0`` on the ``--quick`` datasets of :mod:`benchmarks.pipelines`, takes one epoch to warm
up, then times rounds of one epoch; ``extra_info`` carries samples/s and GB/s. Processes are not fresh
and pipelines not interleaved here: the harness ``python -m benchmarks.throughput`` is the measurement of
record (see ``benchmarks/RESULTS.md``); this file tracks regressions with pytest-benchmark's tooling
(``--benchmark-compare``). ``test_gpu_feed`` runs one GPU configuration, or skips with the reason.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from benchmarks import ceilings
from benchmarks.pipelines import (
    PIPELINES,
    QUICK_PAYLOADS,
    batch_size_of,
    make_dataset,
    quiet_warnings,
    shard_paths,
)

SIZES = ("small", "flux")
BATCH_SIZE = 4
ROUNDS = 5


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The ``--quick`` datasets of each payload size, generated once for the module."""
    root = tmp_path_factory.mktemp("bench-data")
    return {size: make_dataset(root, QUICK_PAYLOADS[size]) for size in SIZES}


def _bytes_per_sample(path: Path, num_samples: int) -> float:
    return sum(s.stat().st_size for s in shard_paths(path)) / num_samples


@pytest.mark.parametrize("pipeline", list(PIPELINES))
@pytest.mark.parametrize("size", SIZES)
def test_pipeline(benchmark: BenchmarkFixture, datasets: dict[str, Path], size: str, pipeline: str) -> None:
    """One epoch of ``pipeline`` at nw=0 per round, after one warm-up epoch."""
    quiet_warnings()
    spec = QUICK_PAYLOADS[size]
    batches = math.ceil(spec.num_samples / BATCH_SIZE)
    iterator, close = PIPELINES[pipeline].build(datasets[size], 0, BATCH_SIZE, {})
    try:
        for _ in range(batches):
            next(iterator)

        def one_epoch() -> int:
            return sum(batch_size_of(next(iterator)) for _ in range(batches))

        benchmark.group = f"{size} nw=0"
        samples = benchmark.pedantic(one_epoch, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    finally:
        close()
    assert samples == spec.num_samples
    if benchmark.stats is not None:  # None under --benchmark-disable
        rate = samples / benchmark.stats.stats.median
        benchmark.extra_info.update(
            samples_per_s=rate, gb_per_s=rate * _bytes_per_sample(datasets[size], spec.num_samples) / 1e9
        )


@pytest.mark.parametrize("ceiling", ["raw_read", "memcpy"])
@pytest.mark.parametrize("size", SIZES)
def test_ceiling(benchmark: BenchmarkFixture, datasets: dict[str, Path], size: str, ceiling: str) -> None:
    """One pass of the raw sequential read, or of the memcpy of as many bytes, over the dataset's shards."""
    shards = shard_paths(datasets[size])
    measure = getattr(ceilings, ceiling)
    benchmark.group = f"{size} nw=0"
    result = benchmark.pedantic(
        lambda: measure(shards, passes=1, min_seconds=0.0), rounds=ROUNDS, iterations=1
    )
    benchmark.extra_info["gb_per_s"] = result["bytes_per_pass"] / min(result["seconds"]) / 1e9


def test_gpu_feed(datasets: dict[str, Path]) -> None:
    """One GPU configuration (FLUX-sized, nw=2, both pinning modes): stall % and H2D against the ceiling."""
    from benchmarks import gpu

    reason = gpu.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    spec = QUICK_PAYLOADS["flux"]
    result = gpu.run_config(
        {
            "path": str(datasets["flux"]),
            "num_samples": spec.num_samples,
            "num_workers": 2,
            "modes": ["loader", "ring"],
            "factors": [1.2],
            "min_batches": 40,
        }
    )
    for mode in result["modes"].values():
        (run,) = mode["runs"]
        assert run["h2d_gb_per_s_median"] > 0 and 0 <= run["stall_pct"] <= 100
