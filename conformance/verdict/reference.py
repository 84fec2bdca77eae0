"""The claim reference, generated from the claims' own definitions (each property module's ``CLAIMS`` and
docstring, :class:`~primus_energon.conformance.core.claims.Harm`), so the documentation cannot drift from the
code. ``docs/claims.md`` holds a marker that the mkdocs hook ``docs/hooks/claims.py`` replaces with
:func:`claim_reference_markdown`; ``python -m primus_energon.conformance.verdict.reference`` prints it."""

from __future__ import annotations

import re

from ..core.claims import Claim, Harm
from ..properties import PROPERTIES, Property

__all__ = ["claim_reference_markdown", "claim_anchor", "MARKER"]

#: Where ``docs/claims.md`` wants the generated reference.
MARKER = "<!-- generated: claim reference -->"

#: What a failing claim of each harm does to a training run (the suite lists failures in this order).
_HARM_MEANING = {
    Harm.SECURITY: "code from a shard runs",
    Harm.DATA: "samples are lost, duplicated, reordered or corrupted",
    Harm.BAD_INPUT: "a faulty sample becomes a training sample",
    Harm.CRASH: "training stops or never starts (an error on clean data, a hang), loudly",
    Harm.DETERMINISM: "two identical runs differ",
    Harm.RESUME: "a resumed run continues elsewhere",
    Harm.PERFORMANCE: "slower than the rate asked for with --min-samples-per-s",
    Harm.ADVICE: "an opinion: reported, never failing unless --conformance-strict",
}
_KINDS = {"cooker": "cookers", "task_encoder": "TaskEncoders", "wrapper": "dataloader wrappers"}


def claim_anchor(claim_id: str) -> str:
    """The HTML id of a claim's row (``bad_input/names_sample`` -> ``claim:bad_input/names_sample``): a link
    to ``claims.md#claim:ID`` lands on it."""
    return "claim:" + claim_id


def _text(docstring: str) -> str:
    """A reST docstring as Markdown prose: ``code`` -> `code`, roles -> their target's last name."""
    text = re.sub(r":\w+:`~?([\w.]+)`", lambda m: f"`{m.group(1).rpartition('.')[2]}`", docstring)
    text = text.replace("``", "`")
    return _code_dunders(" ".join(text.split()))


def _code_dunders(text: str) -> str:
    """``__key__`` outside backticks as code (Markdown would read it as bold)."""
    parts = text.split("`")
    parts[::2] = [re.sub(r"(?<![\w])(__\w+?__)(?![\w])", r"`\1`", part) for part in parts[::2]]
    return "`".join(parts)


def _cell(text: str) -> str:
    return _code_dunders(" ".join(text.split())).replace("|", "\\|")


def _kinds(kinds: frozenset[str]) -> str:
    return " and ".join(_KINDS[k] for k in sorted(kinds, key=list(_KINDS).index))


def _row(prop: Property, claim: Claim) -> str:
    verdict = "advice" if claim.advice else f"fails ({claim.harm.label})"
    notes = []
    if claim.always:
        notes.append("runs even when the target is blocked")
    if claim.applies_to != prop.applies_to and claim.applies_to:
        notes.append(f"{_kinds(claim.applies_to)} only")
    title = claim.title + (f" ({'; '.join(notes)})" if notes else "")
    return (
        f'| <span id="{claim_anchor(claim.id)}"></span>`{claim.id}` | {verdict} | {_cell(title)} | '
        f"{_cell(claim.fix) or '-'} |"
    )


def claim_reference_markdown() -> str:
    """Every property and claim the suite defines: id, verdict when it fails, what it states, the fix."""
    total = sum(len(p.claims) for p in PROPERTIES)
    out = [
        f"{len(PROPERTIES)} properties, {total} claims. A claim **fails** the run only for a defect; its "
        "harm says what the defect does to training, and failures are listed worst first:",
        "",
        "| harm | what it means |",
        "|---|---|",
    ]
    out += [f"| {harm.label} | {_HARM_MEANING.get(harm, harm.label)} |" for harm in Harm]
    for prop in PROPERTIES:
        doc = (prop._module.__doc__ or "").strip()
        out += ["", f"## {prop.number}. {prop.title} (`{prop.id}`)", ""]
        out.append(f"Checks {_kinds(prop.applies_to)}." + (f" {_text(doc)}" if doc else ""))
        if prop.needs_loader:
            out.append("Blocked (skipped once, naming the cause) when `accepted` fails.")
        out += ["", "| claim | when it fails | what it states | fix |", "|---|---|---|---|"]
        out += [_row(prop, claim) for claim in prop.claims]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(claim_reference_markdown(), end="")
