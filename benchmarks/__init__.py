"""Throughput benchmarks of the reference data path against its ceilings and the alternatives.

Modules:

* :mod:`benchmarks.pipelines`: the payload sizes, the generated datasets and every pipeline measured
  (reference, Energon floor, guide-style, plain webdataset, plain tarfile + ``torch.load``).
* :mod:`benchmarks.ceilings`: the physical limits measured in the same run (raw sequential read,
  memcpy of the same bytes) and the decode cost of one member in each format.
* :mod:`benchmarks.throughput`: the CPU harness (``python -m benchmarks.throughput --json FILE [--quick]``):
  each pipeline in a fresh process, interleaved, warmed up, median of several passes.
* :mod:`benchmarks.gpu`: loader -> pinned memory -> device on a side stream, feeding a GPU step of
  fixed cost (``python -m benchmarks.gpu --json FILE``); skips where there is no GPU.
* :mod:`benchmarks.plot`: the PNG plot (throughput against workers, per pipeline).
* ``benchmarks/test_throughput.py``: the same pipelines under pytest-benchmark.

Results and the machine they were measured on: ``benchmarks/RESULTS.md``.
"""
