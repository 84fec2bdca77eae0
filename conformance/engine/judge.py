"""The data judge: whether each member of a sample reaches what the per-sample pipeline returns, and in what
form. Flow first, then form:

1. **Identity.** A member found as it was (by its field name, by value, nested, stacked, as its bytes) is
   kept: nothing more to ask.
2. **Flow.** Otherwise the fields that depend on the member are found by changing it
   (:class:`~primus_energon.conformance.engine.flow.Flow`): a member no field depends on is lost.
3. **Form.** Each dependent field's value is compared with the member by its kind
   (:func:`~primus_energon.conformance.oracles.members.member_form`): kept through a recognised transform
   (a normalisation, a layout, a resize or crop, a widening cast, a tokenisation), declared, a change a
   declaration would express (a flip, a cut, a lossy cast: loss unless declared), damage shown (values
   wrapped, colour lost, normalised twice, a fill), or a transform the suite does not recognise (advice,
   never loss).

Across samples: distinct members that reach one field as the same value are collapsed (a caption cut to
one token); captions whose appended words change nothing are cut at the tokeniser's length (advice, with
the share); a mask must describe the padding of the field it sits beside.

Findings are grouped by member, field and cause, and each is reported once with the samples it was seen in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.claims import ClaimRecorder
from ..core.declarations import Transform, declaration_hint, field_transform
from ..oracles.compare import as_tensor
from ..oracles.declared import outcome, recognise
from ..oracles.expectations import NESTED, STACKED, Expectation, claim_of, difference, locate
from ..oracles.fields import MISSING, fields
from ..oracles.fingerprint import fingerprint
from ..oracles.forms import Form
from ..oracles.members import member_form
from ..oracles.plain import type_name
from ..oracles.tokens import is_mask, mask_fields, mask_problem, pad_value, position_markers
from .flow import Flow

__all__ = ["MemberJudge", "FLOW_SAMPLES"]

#: samples of a dataset whose members' flow is measured, by profile (each costs a run per variant of every
#: member it needs); the fields found depending on a member there stand for the member in later samples
FLOW_SAMPLES = {"quick": 8, "ci": 12, "thorough": 32}

#: samples in a row whose member reaches a field in no form the suite knows, after which that member and field
#: are not searched again (the first one's form stands for the rest)
UNRECOGNISED_STREAK = 6

#: captions that differ within this many characters must get different token ids (a tokeniser that cuts
#: at its maximum length keeps at least this much of every caption)
DISTINCT_PREFIX = 16

#: the causes of damage a dataset of another dtype is judged for (the others are the main dataset's)
_DTYPE_CAUSES = frozenset({"lossy cast", "bytes reinterpreted"})

_SEVERITY = {"corrupted": 3, "undeclared": 2, "unrecognised": 1, "kept": 0, "declared": 0}


@dataclass
class _Finding:
    claim: str
    message: str
    keys: list[str] = field(default_factory=list)
    #: a declaration to name at the end (``RATE`` is filled in with the share of samples seen)
    declaration: tuple[str, str] | None = None  # (field, declaration)

    def rendered(self, judged: int) -> str:
        """The message, with the share of samples it was seen in and the declaration that would express
        the change (its rate the share seen)."""
        if self.declaration is None:
            return self.message
        holder, declaration = self.declaration
        share = len(self.keys) / judged if judged else None
        if share == 1 and declaration.startswith("dropout"):
            # a dropout of every sample is no dropout: the data is gone
            return f"{self.message} in every sample ({judged} of {judged}): the member's values are lost"
        return (
            f"{self.message} in {len(self.keys)} of {judged} samples; "
            f"{declaration_hint(holder, declaration, rate=share)}"
        )


@dataclass
class _Held:
    """How one member reached one field in each sample (for the checks across samples)."""

    claim: str
    member: str
    field: str
    form: str
    #: (key, fingerprint of the member's value, fingerprint of the field's value, the member's value)
    pairs: list[tuple[str, Any, Any, Any]] = field(default_factory=list)
    #: (key, the form's parameters) where samples must agree on them (one scale for every sample)
    params: list[tuple[str, tuple]] = field(default_factory=list)


class MemberJudge:
    """Judges the members of one dataset's samples against what the per-sample pipeline returned."""

    def __init__(
        self,
        claims: ClaimRecorder,
        flow: Flow | None,
        where: str,
        transforms: Sequence[Transform],
        profile: str,
    ) -> None:
        self.claims = claims
        self.flow = flow
        self.where = where
        self.transforms = tuple(transforms)
        self.flow_samples = FLOW_SAMPLES.get(profile, 12)
        #: member -> the fields found depending on it in the samples flow was measured on
        self.known: dict[str, set[str]] = {}
        self._findings: dict[tuple[str, str], _Finding] = {}
        self._held: dict[tuple[str, str], _Held] = {}
        self._tokenised: dict[str, str] = {}  # text member -> the field holding its ids
        #: "member 'txt'" -> (distinct captions, distinct ids, the shortest beginning colliding captions share)
        self._alike: dict[str, tuple[int, int, int]] = {}
        #: fields that changed between two runs of one sample (not a function of the sample: no collapse
        #: can be read from them; purity and determinism judge them)
        self._unstable_fields: set[str] = set()
        #: (member, field) -> (samples in a row with no known form, the first such form)
        self._unrecognised: dict[tuple[str, str], tuple[int, Form | None]] = {}
        self._outputs: list[tuple[str, Any]] = []
        self.transformed: dict[str, str] = {}  # "member -> field" -> how (for the report's details)

    # -- one expectation -------------------------------------------------------------------------------------

    def expectation(
        self,
        index: int,
        key: str,
        expected: Expectation,
        output: Any,
        claim_name: str | None = None,
        lost_because: str = "",
        *,
        cooked: Any = None,
        stage: str = "",
    ) -> None:
        """Judge where one member (or leaf) went in sample ``key``'s output and record the verdict
        (``cooked``: what the cooker returned, where ``stage``, the first encode stage, made ``output`` of it)."""
        name = claim_of(expected.spec) if claim_name is None else claim_name
        present = fields(output)
        field_name, how = locate(expected, output)
        if field_name is not None and how in ("by raw bytes", NESTED, STACKED):
            self._pass(name)
            return
        declared_here = self._declared_holds(expected, present)
        if declared_here:
            self._pass(name)
            return
        observed = present.get(field_name) if field_name is not None else None
        if field_name is not None:
            problem = difference(expected, observed)
            if problem is None:
                self._pass(name)
                return
            if isinstance(expected.value, str) and isinstance(observed, str):
                # text is kept exactly: a strip, a cut or a filter is lost text (no flow needed to say so)
                form = member_form(expected.spec, expected.value, observed, self._declared(field_name))
                if form is not None and form.verdict in ("kept", "declared"):
                    self._pass(name)
                    return
                self._problem(
                    name,
                    f"{self.where}: field {field_name!r} ({how}) does not equal {expected.what}: {problem}"
                    + self._hint(expected.value, observed, field_name),
                    key,
                )
                return
        if expected.value is MISSING:
            self._lost(name, expected, key, present, lost_because, None)
            return
        candidates = [field_name] if field_name is not None else []
        # a mask depends on the caption it describes, but holds none of it (the masks check judges it)
        dependents = {f for f in self._dependents(index, expected.member) if not is_mask(f, present.get(f))}
        candidates += sorted(f for f in dependents if f not in candidates and f in present)
        forms = {f: self._form(expected, f, present[f]) for f in candidates}
        forms = {f: form for f, form in forms.items() if form is not None or f in dependents}
        for f, form in list(forms.items()):
            # Dependence is measured member by member: a field that depends on a structured member may hold
            # another of its leaves, and a text field that depends on a caption may be derived from it (a hash,
            # a template). Damage is only shown where the field is the member's own (found by name or value),
            # or by a form no other value takes (a cut, a fill, normalised twice).
            if (
                f != field_name
                and form is not None
                and form.defect
                and (expected.leaf is not None or form.cause == "text changed")
            ):
                forms[f] = None
        kept = [
            (f, form)
            for f, form in forms.items()
            if form is not None and form.verdict in ("kept", "declared")
        ]
        if kept:
            holder, form = kept[0]
            if (
                field_name is not None
                and holder != field_name
                and how in ("by name", "by field:")
                and self.flow is not None
                and name != "dtypes"  # the main dataset says it (one root cause once)
                and field_name not in dependents
                and forms.get(field_name) is None
            ):
                # the field named for the member holds something that does not change with it, and the member
                # sits elsewhere: two fields swapped, or another value under the member's name
                self._grouped(
                    name,
                    (expected.what, field_name, "swapped"),
                    f"{self.where}: field {field_name!r} ({how}) does not hold {expected.what} and does not change "
                    f"with it; the member reaches field {holder!r} instead: fields swapped, or another value under "
                    "the member's name",
                    key,
                    f"{field_name!r} holds {_kind_of(present.get(field_name))}",
                )
                return
            self._pass(name)
            self._note_held(name, expected, holder, form, key, present[holder])
            return
        damaged = sorted(
            ((f, form) for f, form in forms.items() if form is not None and form.defect),
            key=lambda item: -_SEVERITY[item[1].verdict],
        )
        if name == "dtypes":
            # a dataset of another dtype: what depends on the dtype is judged here; everything else was on
            # the main dataset (one root cause once)
            damaged = [(f, form) for f, form in damaged if form.cause in _DTYPE_CAUSES]
            if not damaged and dependents:
                self._pass(name)
                return
        if damaged and self._declared(damaged[0][0]) is not None:
            # a declared field that holds neither the value nor its declared transform: transforms/observed
            # judges it, with the declaration (one root cause once)
            self._pass(name)
            return
        if damaged:
            holder, form = damaged[0]
            declaration = None
            if form.verdict == "undeclared" and form.declaration:
                declaration = (holder, form.declaration)
            self._grouped(
                name,
                (expected.what, holder, form.cause or form.how),
                f"{self.where}: {expected.what} reaches field {holder!r} {_damage_words(form)}"
                + self._stage(expected, cooked, stage),
                key,
                form.how,
                declaration=declaration,
            )
            return
        if dependents:
            shown = sorted(f for f in forms if f in dependents) or sorted(dependents)
            holder = shown[0]
            form = forms.get(holder)
            how_text = form.how if form is not None else _kind_of(present.get(holder))
            declaration = form.declaration if form is not None else None
            self._pass(name)
            self._grouped(
                "transformed",
                (expected.what, holder),
                f"{self.where}: {expected.what} reaches field(s) {shown} through a transform the suite does not "
                "recognise",
                key,
                how_text,
                f"; {declaration_hint(holder, declaration)}" if declaration else "",
            )
            return
        if self.flow_samples and self._unstable(index):
            self._pass(name)  # not judged here: determinism and purity judge what changes on its own
            return
        self._lost(name, expected, key, present, lost_because, field_name, observed)

    def _form(self, expected: Expectation, holder: str, value: Any) -> Form | None:
        """:func:`member_form` of one member in one field; once the first :data:`UNRECOGNISED_STREAK`
        samples found no form the suite knows for that pair, the later ones are not searched again (an image
        search that finds nothing tries every candidate: the cost of a random resized crop on every sample)."""
        pair = (expected.what, holder)
        known = self._unrecognised.get(pair)
        if known is not None and known[0] >= UNRECOGNISED_STREAK:
            return known[1]
        form = member_form(expected.spec, expected.value, value, self._declared(holder))
        if form is None or form.verdict == "unrecognised":
            count = known[0] + 1 if known is not None else 1
            self._unrecognised[pair] = (count, form if known is None else known[1])
        else:
            self._unrecognised[pair] = (-(10**9), None)  # a known form was found: search every sample
        return form

    # -- flow ------------------------------------------------------------------------------------------------

    def _flowed(self, index: int, member: str) -> bool:
        return member in self.known

    def _dependents(self, index: int, member: str) -> set[str]:
        """The fields that depend on ``member``: measured on this sample while within the flow budget,
        else those measured on the samples before (none without a flow: identity and form alone)."""
        if self.flow is None:
            return set()
        if index < self.flow_samples or member not in self.known:
            found = self.flow.dependents(index, member)
            self.known.setdefault(member, set()).update(found)
            self._unstable_fields |= self.flow.unstable_fields(index)
            return found
        return set(self.known[member])

    def _unstable(self, index: int) -> bool:
        if self.flow is None:
            return False
        try:
            return bool(self.flow.unstable_fields(index))
        except Exception:  # the second run failed: that is the determinism property's to say
            return True

    # -- declarations ----------------------------------------------------------------------------------------

    def _declared(self, field_name: str) -> Transform | None:
        return field_transform(self.transforms, field_name)

    def _declared_holds(self, expected: Expectation, present: Mapping[str, Any]) -> bool:
        """A declared field holds the expectation as its declaration allows (kept, or transformed)."""
        for transform in self.transforms:
            value = present.get(transform.field)
            if value is None or transform.kind not in ("dropout", "flip", "truncate", "cast"):
                continue
            try:
                if outcome(transform, expected.value, value) is not None:
                    return True
            except Exception:  # a declaration of another kind of value
                continue
        return False

    def _hint(self, clean: Any, observed: Any, field_name: str) -> str:
        recognised = recognise(clean, observed)
        return f"; {declaration_hint(field_name, recognised)}" if recognised else ""

    # -- recording -------------------------------------------------------------------------------------------

    def _pass(self, name: str) -> None:
        with self.claims.claim(name) as claim:
            claim.examined()
        with self.claims.claim("unmatched") as claim:
            claim.examined()

    def _problem(self, name: str, message: str, key: str) -> None:
        with self.claims.claim(name) as claim:
            claim.examined()
            claim.problem(message, sample=key)
        with self.claims.claim("unmatched") as claim:
            claim.examined()

    def _finding(self, claim_name: str, message: str, key: str | None) -> None:
        finding = self._findings.setdefault((claim_name, message), _Finding(claim_name, message))
        finding.keys.append(key)

    def _grouped(
        self,
        name: str,
        group: tuple,
        head: str,
        key: str,
        how: str,
        tail: str = "",
        declaration: tuple[str, str] | None = None,
    ) -> None:
        """One finding per ``group`` (member, field, cause: one root cause once), its message made from the
        first sample seen (``head (e.g. sample KEY: HOW)TAIL``), with every sample it was seen in (and, with
        ``declaration``, the share of samples and the declaration that would express the change)."""
        finding = self._findings.get((name, *group))
        if finding is None:
            finding = self._findings[(name, *group)] = _Finding(
                name, f"{head} (e.g. sample {key!r}: {how}){tail}", declaration=declaration
            )
        finding.keys.append(key)
        with self.claims.claim(name) as claim:
            claim.examined()
        if name != "transformed":
            with self.claims.claim("unmatched") as claim:
                claim.examined()

    def _stage(self, expected: Expectation, cooked: Any, stage: str) -> str:
        """Which stage made the change: " (by encode_sample: the cooker returned it as it was)" where the
        cooked sample still holds the member exactly, else ""."""
        if not stage or cooked is None:
            return ""
        holder, how = locate(expected, cooked)
        if holder is None:
            return ""
        if (
            how in ("by raw bytes", NESTED, STACKED)
            or difference(expected, fields(cooked).get(holder)) is None
        ):
            return f" by {stage} (the cooker returned it as it was)"
        return ""

    def _lost(
        self,
        name: str,
        expected: Expectation,
        key: str,
        present: Mapping[str, Any],
        lost_because: str,
        located: str | None,
        observed: Any = None,
    ) -> None:
        shown = sorted(present)
        flowed = self.flow is not None and expected.member in self.known
        if located is not None:
            what = f"{self.where}: field {located!r} does not equal {expected.what}: {difference(expected, observed)}"
            if flowed:
                what += (
                    " (and no output field depends on it: changing it changes nothing the pipeline returns)"
                )
        elif flowed:
            what = (
                f"{self.where}: no output field holds {expected.what} or depends on it (changing it changes "
                f"nothing the pipeline returns; fields: {shown})"
            )
        else:
            what = f"{self.where}: no output field holds {expected.what} (fields: {shown})"
        if (
            located is not None
        ):  # a field of its name (or value) holds something else: the member's claim says so
            self._problem(name, what + lost_because, key)
        elif expected.required or lost_because:
            self._problem(name, f"{what}, so it is lost{lost_because}", key)
        else:
            with self.claims.claim("unmatched") as claim:
                claim.examined()
                claim.problem(what, sample=key)

    def _note_held(
        self, claim_name: str, expected: Expectation, holder: str, form: Form, key: str, value: Any
    ) -> None:
        if form.how != "as it is":
            self.transformed.setdefault(f"{expected.what} -> {holder}", form.how)
        if form.cause == "tokenised" and expected.leaf is None and form.verdict != "declared":
            self._tokenised.setdefault(expected.member, holder)
        if form.how == "as it is" or (form.verdict == "declared" and form.cause != "tokenised"):
            return
        held = self._held.setdefault(
            (expected.what, holder), _Held(claim_name, expected.what, holder, form.how)
        )
        held.pairs.append((key, fingerprint(expected.value), fingerprint(value), expected.value))
        if form.params:
            held.params.append((key, form.params))

    # -- across samples --------------------------------------------------------------------------------------

    def output(self, key: str, output: Any) -> None:
        """Record one sample's output for the checks across samples (masks)."""
        self._outputs.append((key, output))

    def finish(self, flow_indices: Sequence[int] = (), *, across: bool = True) -> None:
        """The checks across samples (``across``: collapses, cut captions, masks), then every grouped
        finding reported."""
        if across:
            self._scales()
            self._collapses()
            self._truncation(flow_indices)
            self._masks()
        judged = len(self._outputs)
        for finding in self._findings.values():
            message = finding.rendered(judged)
            with self.claims.claim(finding.claim) as claim:
                claim.examined()
                if finding.declaration is not None:
                    claim.problem(message)  # the share says how many; the keys would repeat it
                    continue
                for key in finding.keys:
                    claim.problem(message, sample=key)

    def _scales(self) -> None:
        """A scale (and shift) a member reaches its field with must be the same for every sample (a VAE's
        scaling factor): one of each sample's own (a per-sample standardisation) loses what told samples
        apart, their scale."""
        for held in self._held.values():
            distinct = {tuple(float(f"{v:.4g}") for v in params): key for key, params in held.params}
            if len(distinct) < 2:
                continue
            (a, first), (b, second) = list(distinct.items())[:2]
            self._finding(
                held.claim,
                f"{self.where}: {held.member} reaches field {held.field!r} scaled by a factor of each sample's own "
                f"(e.g. sample {first!r}: scaled by {a[0]:.4g}, shifted by {a[1]:.4g}; sample {second!r}: scaled "
                f"by {b[0]:.4g}, shifted by {b[1]:.4g}): a per-sample normalisation loses the scale that tells "
                "samples apart; scale every sample alike (a fixed factor) or not at all",
                first,
            )

    def _collapses(self) -> None:
        """Distinct members that reach a field as one value: the model cannot tell them apart. For captions,
        a tokeniser's maximum length makes captions that share a long beginning alike: only captions that
        differ within their first :data:`DISTINCT_PREFIX` characters and still get the same ids are a
        collapse (a cut to one token, a caption replaced); the others are cut captions (advice)."""
        for held in self._held.values():
            if held.field in self._unstable_fields:
                continue
            by_output: dict[Any, dict[Any, tuple[str, Any]]] = {}
            for key, member_print, output_print, value in held.pairs:
                by_output.setdefault(output_print, {}).setdefault(member_print, (key, value))
            collapsed = [list(group.values()) for group in by_output.values() if len(group) > 1]
            if not collapsed:
                continue
            distinct = len({m for _, m, _, _ in held.pairs})
            outputs = len({o for _, _, o, _ in held.pairs})
            texts = all(isinstance(v, str) for group in collapsed for _, v in group)
            shared = min(_shared_prefix([v for _, v in group]) for group in collapsed) if texts else 0
            (first, first_value), (second, second_value) = next(
                (g[0], g[1]) for g in collapsed if not texts or _shared_prefix([v for _, v in g]) == shared
            )
            summary = (
                f"{self.where}: {distinct} distinct values of {held.member} reach field {held.field!r} as only "
                f"{outputs} distinct values ({held.form}; e.g. samples {first!r} and {second!r} give the same"
            )
            if texts and shared >= DISTINCT_PREFIX:
                self._alike[held.member] = (distinct, outputs, shared)
                continue
            example = (
                f": {first_value[:40]!r} and {second_value[:40]!r}, which differ after {shared} characters"
                if texts
                else ""
            )
            self._finding(held.claim, f"{summary}{example}): the model cannot tell them apart", first)

    def _truncation(self, flow_indices: Sequence[int]) -> None:
        """Captions whose appended words change no field, and captions alike in a long beginning that get the
        same ids: cut at the tokeniser's length (advice, with the share of captions cut)."""
        for member, holder in self._tokenised.items():
            checked = cut = 0
            for index in flow_indices:
                tails = self.flow.changed(index, member).get("tail")
                if tails is None:
                    continue
                checked += 1
                cut += not tails
            alike = self._alike.get(f"member {member!r}")
            if not cut and not alike:
                continue
            parts = []
            if cut:
                parts.append(
                    f"{cut} of {checked} captions checked are cut to the tokeniser's maximum length (words appended "
                    "to them change nothing): the model never sees their end"
                )
            if alike:
                distinct, outputs, shared = alike
                parts.append(
                    f"{distinct} distinct captions give {outputs} distinct id sequences: captions that share their "
                    f"first {shared} characters get the same ids"
                )
            self._finding(
                "transformed",
                f"{self.where}: member {member!r} reaches field {holder!r} tokenised, and "
                + "; ".join(parts),
                None,
            )

    def _masks(self) -> None:
        """Every padding mask beside the ids or embeddings it describes marks exactly their padding (it may
        describe any field of its shape: it is wrong when it describes none)."""
        rows: dict[str, list[tuple[str, Any, dict[str, Any]]]] = {}
        targets: dict[str, tuple[str, ...]] = {}
        for key, output in self._outputs:
            present = fields(output)
            for pair in mask_fields(present):
                mask = as_tensor(present[pair.mask])
                values = {t: as_tensor(present[t]) for t in pair.targets}
                if mask is None or any(v is None for v in values.values()):
                    continue
                rows.setdefault(pair.mask, []).append((key, mask, values))
                targets.setdefault(pair.mask, pair.targets)
        for mask_name, samples in rows.items():
            pads = {}
            for target in targets[mask_name]:
                sequences = [
                    v[target].reshape(-1)
                    for _, m, v in samples
                    if target in v and v[target].numel() == m.numel() and not v[target].is_floating_point()
                ]
                pads[target] = pad_value(sequences)
            with self.claims.claim("masks") as claim:
                wrong: list[tuple[str, str, str]] = []
                for key, mask, values in samples:
                    claim.examined()
                    problems = {t: _mask_problem(v, mask, pads.get(t)) for t, v in values.items()}
                    if all(problems.values()):
                        first = next(iter(problems))
                        wrong.append((key, first, problems[first]))
                if wrong:
                    key, first, problem = wrong[0]
                    claim.problem(
                        f"{self.where}: field {mask_name!r} does not describe the padding of {first!r} in "
                        f"{len(wrong)} of {len(samples)} samples (e.g. sample {key!r}: {problem})"
                    )


def _mask_problem(target: Any, mask: Any, pad: int | None) -> str | None:
    mask_flat = mask.reshape(-1)
    if target.numel() == mask.numel() and not target.is_floating_point():
        if pad is None:
            return None  # no sample shows a run of padding: where the padding is cannot be told
        return mask_problem(target.reshape(-1), mask_flat, pad)
    rows = position_markers(target.reshape(mask_flat.numel(), -1), 1)
    if rows is None:
        return None
    return mask_problem(rows, mask_flat, None)


def _shared_prefix(texts: Sequence[str]) -> int:
    """The number of characters every one of ``texts`` begins with."""
    shortest = min(len(t) for t in texts)
    for index in range(shortest):
        if len({t[index] for t in texts}) > 1:
            return index
    return shortest


def _kind_of(value: Any) -> str:
    tensor = as_tensor(value)
    if tensor is not None:
        return f"a {str(tensor.dtype).removeprefix('torch.')} tensor of shape {list(tensor.shape)}"
    return f"a {type_name(value)}"


def _damage_words(form: Form) -> str:
    if form.verdict == "undeclared":
        return "changed"
    return "damaged"
