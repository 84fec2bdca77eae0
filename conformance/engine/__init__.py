"""The engine, in the process that runs the target: the check context, the target and the calls into it,
the per-sample flow and the data judge, the delivered-batch trace, planted generators, the seal on the
suite's own code, leftovers, and the session that runs properties."""
