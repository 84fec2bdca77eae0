"""Benchmarks of the reference data path against its ceilings and the alternatives, and of the conformance
suite's own speed. Not installed; run from the repository root (``python -m benchmarks.MODULE``).

Sessions (each a command; ``--help`` says how it measures):

* :mod:`benchmarks.throughput`: CPU throughput (``python -m benchmarks.throughput --json FILE [--quick]``):
  each pipeline in a fresh process, interleaved, warmed up, median of several passes.
* :mod:`benchmarks.gpu`: loader -> pinned memory -> device on a side stream, feeding a GPU step of
  fixed cost (``python -m benchmarks.gpu --json FILE``); skips where there is no GPU.
* :mod:`benchmarks.bench_conformance`: wall seconds of the conformance suite on each of the zoo's correct
  targets, in the ``ci`` and ``quick`` profiles (``python -m benchmarks.bench_conformance --out FILE``).
* ``bench_generate.py``, ``bench_validate.py``: dataset generation and validation beside a plain write /
  a raw read; ``bench_tensorfile.py`` and ``test_throughput.py``: pytest-benchmark files.

What the sessions share:

* :mod:`benchmarks.cli`: the command-line skeleton (output file, ``--check-targets``, ``--quick``,
  ``--data-dir``, the hidden ``--job``, the guard's options, the exit status);
* :mod:`benchmarks.jobs`: one measurement in a fresh interpreter (``--job JSON`` -> ``RESULT`` line);
* :mod:`benchmarks.guard`: the load guard (others' CPU use during a measurement; retries);
* :mod:`benchmarks.report`: the machine description and the summary files (JSON, markdown beside it).

The CPU session's parts: :mod:`benchmarks.plan` (the jobs, in order), :mod:`benchmarks.measure` (one
job), :mod:`benchmarks.analysis` (medians, ratios, target verdicts), :mod:`benchmarks.tables` (markdown,
also the GPU table), :mod:`benchmarks.plot` (the PNG). What is measured: :mod:`benchmarks.pipelines` (the
payload sizes, the generated datasets, every pipeline: reference, Energon floor, the baseline TaskEncoder
``guide``, plain webdataset, plain tarfile + ``torch.load``) and :mod:`benchmarks.ceilings` (raw read,
memcpy, decode cost per member); the GPU session's: :mod:`benchmarks.gpu_feed`. The raw read itself lives
in the installed package (:mod:`primus_energon.rawread`), which the conformance throughput property uses
too.

Results and the machine they were measured on: ``benchmarks/RESULTS.md``.
"""
