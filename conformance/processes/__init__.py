"""The processes of a run: the supervisor (in pytest's process) and the supervised worker that runs a
target, the fork servers, and the child processes properties start (fresh interpreters' stand-ins, ranks)
with their entry point."""
