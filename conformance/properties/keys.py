"""Property 2, key forwarding: a cooked sample carries its input's ``__key__``, ``__restore_key__``,
``__subflavors__`` and ``__sources__`` (``basic_sample_keys``), without which Energon cannot restore it."""

from __future__ import annotations

from ..context import CheckContext
from ..data import read_crude
from ..execution import cook
from ._common import BASIC_KEYS, MISSING, fail, get_field


def check(ctx: CheckContext) -> dict:
    count = 0
    for encoding in ctx.encodings():
        crude = read_crude(ctx.main_dataset(encoding), decoded=ctx.target.wants_decoded)
        for index, sample in enumerate(crude[:16]):
            output = cook(ctx.target, sample, sample_index=index, seed=ctx.seed)
            for name in BASIC_KEYS:
                observed = get_field(output, name)
                if observed is MISSING or observed != sample.get(name):
                    shown = "nothing" if observed is MISSING else repr(observed)[:200]
                    fail(
                        f"sample {sample['__key__']!r}: output {name} is {shown}, the input had "
                        f"{sample.get(name)!r:.200}. Build the output with **basic_sample_keys(sample)",
                        ctx.reproduce("keys"),
                    )
            count += 1
    return {"samples": count}
