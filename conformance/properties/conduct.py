"""Property 17, conduct: the target leaves nothing behind. After each property the suite looks at what the
target's code left running or wrote (:mod:`primus_energon.conformance.engine.leftovers`); this property, run last,
reports it, naming the property after which each was found:

* ``threads``: a non-daemon thread still running keeps a training process from exiting when training ends
  (the job hangs at its last step, holding its GPUs);
* ``processes``: a helper process never waited for outlives the work that started it; per call, they pile
  up until the node runs out of processes or memory;
* ``files``: files written into the folder the target runs in (debug dumps) are advice, with their paths.

A target that ends or hangs the process running it is named by the property it happened in (the
supervisor), not here.
"""

from __future__ import annotations

from typing import Any

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..core.results import Inconclusive
from ..engine.context import CheckContext

__all__ = ["check", "CLAIMS", "OBSERVATIONS"]

_ALL = {"applies_to": frozenset({"cooker", "task_encoder", "wrapper"})}
CLAIMS = claims_of(
    "conduct",
    (
        "threads",
        "no non-daemon thread the target starts is still running when the work that started it is done",
        Harm.CRASH,
        "make the thread a daemon (threading.Thread(..., daemon=True)) or stop and join it when its work ends "
        "(a close() the training loop calls, or a weakref.finalize)",
        _ALL,
    ),
    (
        "processes",
        "no process the target starts outlives the work that started it",
        Harm.CRASH,
        "wait for every helper process you start (subprocess.run, or Popen(...).wait() in a finally block), "
        "or run the work in the loader's own workers",
        _ALL,
    ),
    (
        "files",
        "writes nothing into the folder it runs in",
        Harm.ADVICE,
        "write debug output under a folder the user chooses (an option or environment variable), off by "
        "default; training jobs share their working folder across ranks",
        _ALL,
    ),
)

#: the context cache entry holding ``[(property id, Leftovers), ...]``, filled by the runner (api)
OBSERVATIONS = "conduct-observations"


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict[str, Any]:
    observed = ctx.cached(OBSERVATIONS, list)
    if not observed:
        raise Inconclusive(
            "no other property ran before it in this run (run it with the others: it reports what they saw)"
        )
    unwatched = next((left.unwatched for _, left in observed if left.unwatched), "")
    for name in ("threads", "processes", "files"):
        with claims.claim(name) as claim:
            if name == "files" and unwatched:
                raise Inconclusive(unwatched)
            for property_id, left in observed:
                claim.examined()
                for line in getattr(left, name):
                    claim.problem(f"after property {property_id}: {line}")
    return {"properties_observed": [pid for pid, _ in observed]}
