"""Property 2, key forwarding: a cooked sample carries its input's ``__key__`` (a different key makes the
sample claim to be another one: logs, skip lists and de-duplication by key point at the wrong data), and,
as advice, the rest of the installed release's sample fields that the input carries (``basic_sample_keys``:
``__restore_key__``, ``__subflavors__``, and ``__sources__`` on 7.x or ``__subflavor__`` on 5.x/6.x), which
``restore_sample``, per-source handling and Energon's error messages use."""

from __future__ import annotations

from ..core.claims import ClaimRecorder, Harm, claims_of
from ..engine.calls import cook
from ..engine.context import CheckContext
from ..oracles.plain import plain
from ._common import BASIC_KEYS, MISSING, get_field

CLAIMS = claims_of(
    "keys",
    (
        "key",
        "a cooked sample's __key__, when it has one, is its input's",
        Harm.DATA,
        "build the output with **basic_sample_keys(sample)",
    ),
    (
        "basic_keys",
        "a cooked sample carries the sample fields its input has (basic_sample_keys: __key__, "
        "__restore_key__, __subflavors__, and __sources__ on Energon 7 or __subflavor__ on 5 and 6)",
        Harm.ADVICE,
        "build the output with **basic_sample_keys(sample) (restore_sample, per-source subflavors and "
        "Energon's error messages need them)",
    ),
)

SAMPLES = 16


def check(ctx: CheckContext, claims: ClaimRecorder) -> dict:
    count = 0
    for encoding in ctx.encodings():
        crude = ctx.crude(ctx.main_dataset(encoding), limit=SAMPLES)
        outputs = [
            cook(ctx.target, sample, sample_index=i, seed=ctx.seed, as_plain=True)
            for i, sample in enumerate(crude)
        ]
        with claims.claim("key") as claim:
            for sample, output in zip(crude, outputs, strict=True):
                claim.examined()
                observed = get_field(output, "__key__")
                if observed is not MISSING and observed != sample["__key__"]:
                    claim.problem(
                        f"sample {sample['__key__']!r}: the output's __key__ is {observed!r:.200}, another key "
                        "than its input's"
                    )
        with claims.claim("basic_keys") as claim:
            lost: dict[str, list[str]] = {}
            for sample, output in zip(crude, outputs, strict=True):
                claim.examined()
                for name in (name for name in BASIC_KEYS if name in sample):
                    observed = get_field(output, name)
                    if name == "__key__" and observed is not MISSING:
                        continue  # a wrong key is the `key` claim
                    # both sides plain data (the output is: read inside the timed call)
                    if observed is MISSING or observed != plain(sample.get(name)):
                        shown = "missing" if observed is MISSING else f"{observed!r:.120}"
                        lost.setdefault(name, []).append(f"{sample['__key__']!r} ({shown})")
            for name, where in lost.items():
                claim.problem(
                    f"{name} is not the input's in {len(where)} of {len(crude)} cooked samples "
                    f"(e.g. {', '.join(where[:3])}); the input had e.g. {crude[0].get(name)!r:.160}"
                )
        count += len(crude)
    return {"samples": count}
