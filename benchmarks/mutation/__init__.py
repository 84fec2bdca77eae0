"""Mutation analysis: how strong is the conformance suite? Realistic defects (mutants) are put into copies
of the reference cookers, TaskEncoders and wrapper, each copy is checked by the suite in a fresh process,
and the report says which claims killed which mutant, the kill rates, and every survivor with its diff.

* :mod:`benchmarks.mutation.operators`: the mutants (source edits), each with the claims meant to kill it;
* :mod:`benchmarks.mutation.session`: one mutant in a temporary copy of the package, run by pytest;
* :mod:`benchmarks.mutation.report`: ``REPORT.md`` and ``mutation.json`` (matrix, rates, survivors);
* ``equivalent.txt``: mutants marked equivalent by hand, each with its reason; ``notes.txt``: why a
  survivor survives (shown in the report).

Run: ``python -m benchmarks.mutation`` (or ``nox -s mutation``); ``--help`` for the options.
"""
