"""Whole-dataset checks over the shard scans: duplicate and dotted keys, missing members, dtype and shape
consistency (with resolution buckets), and the per-member summary.

Rules (each a pure function of the scans in shard order, so the result does not depend on worker count):

* **Expected members** are the encoding's required members plus every member present in more than half of
  the samples. A sample lacking one is ``missing-member`` (not for a dotted-key sample or the cut-off last
  sample of a truncated shard, which are reported as such).
* **Dotted key**: Energon cuts ``key.v2.latents.pth`` into key ``key`` and member ``v2.latents.pth``. A
  sample none of whose members is expected, but whose members all read ``<prefix>.<expected member>``, is
  reported once as ``dotted-key``.
* **Duplicate key**: the second and later samples with a key already seen (in shard order) are reported.
* **Dtype**: per member, the most common dtype is the reference; others are ``wrong-dtype``.
* **Shape**: per member, the most common shape gives the layout (rank, leading dims); a shape of another
  layout is ``wrong-shape`` (the synthetic generator's fault adds one to dim 0). Members whose last two
  (spatial) dims vary while their layout holds are resolution-bucket candidates. A sample's bucket is the
  spatial size of its *primary* member (the largest candidate of rank >= 3, or image). Every other candidate
  must have, in each bucket, the spatial size most samples of that bucket give it (when one size is strictly
  most common there); a rank-2 candidate that mostly keeps its size in bucketed samples is not bucketed and
  must keep it everywhere. So buckets validate clean, and a member off its sample's bucket is reported.
  (Limitations: a dataset whose only varying members are rank-2 tensors has no bucket evidence, so their
  off-mode shapes are reported; a member in a bucket seen only once, or the primary's own spatial size, is
  not checked against a bucket.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .problems import Problem
from .scan import SampleRecord, ShardScan

__all__ = ["Analysis", "MemberSummary", "analyze", "detect_encoding", "encoding_requirements"]

# The reference cookers' members (primus_energon.cookers), repeated here so this module stays import-light.
PREENCODED_REQUIRED: tuple[str, ...] = ("latents.pth", "prompt_embeds.pth", "pooled_prompt_embeds.pth")
RAW_IMAGE_MEMBERS: tuple[str, ...] = ("images", "jpg", "jpeg", "png", "webp")
RAW_TEXT_MEMBER = "txt"


def encoding_requirements(encoding: str | None) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """(members every sample needs, groups of which each sample needs one) for a reference encoding."""
    if encoding == "preencoded":
        return PREENCODED_REQUIRED, ()
    if encoding == "raw":
        return (RAW_TEXT_MEMBER,), (RAW_IMAGE_MEMBERS,)
    return (), ()


def detect_encoding(member_counts: Counter[str], num_samples: int) -> str | None:
    """``preencoded`` / ``raw`` when most samples have that encoding's members, else None."""
    if num_samples == 0:
        return None

    def most(name: str) -> bool:
        return member_counts.get(name, 0) * 2 > num_samples

    if all(most(m) for m in PREENCODED_REQUIRED):
        return "preencoded"
    if most(RAW_TEXT_MEMBER) and sum(member_counts.get(m, 0) for m in RAW_IMAGE_MEMBERS) * 2 > num_samples:
        return "raw"
    return None


@dataclass
class MemberSummary:
    """One member across the dataset: how many samples have it, its kind, dtypes and distinct shapes with
    their counts (most common first), whether its spatial dims follow resolution buckets, value range."""

    name: str
    kind: str
    count: int = 0
    dtypes: dict[str, int] = field(default_factory=dict)
    shapes: dict[tuple[int, ...], int] = field(default_factory=dict)
    bucketed: bool = False
    vmin: float | None = None
    vmax: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "samples": self.count,
            "dtypes": dict(self.dtypes),
            "shapes": [{"shape": list(s), "samples": n} for s, n in self.shapes.items()],
            "bucketed": self.bucketed,
            "min": self.vmin,
            "max": self.vmax,
        }


@dataclass
class Analysis:
    problems: list[Problem]
    members: dict[str, MemberSummary]
    expected: list[str]
    detected_encoding: str | None
    num_samples: int


@dataclass(slots=True)
class _Sample:
    shard: str
    rec: SampleRecord
    names: dict[str, tuple[str, str | None, tuple[int, ...] | None]]  # effective name -> (kind, dtype, shape)
    dotted: bool = False


def _mode(values: Iterable[Any]) -> Any:
    """Most common value; ties go to the value seen first."""
    counts: Counter[Any] = Counter()
    first: dict[Any, int] = {}
    for i, v in enumerate(values):
        counts[v] += 1
        first.setdefault(v, i)
    return max(counts, key=lambda v: (counts[v], -first[v]))


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _problem_at(
    samples: Sequence[_Sample], i: int, code: str, member: str, message: str, **detail: Any
) -> Problem:
    s = samples[i]
    return Problem(code, s.shard, s.rec.key, member, message, detail=detail)


def _dtype_problems(
    samples: Sequence[_Sample], entries: dict[str, list[tuple[int, str, str, tuple[int, ...]]]]
) -> list[Problem]:
    """Rule *dtype* (``wrong-dtype``): per tensor member, the most common dtype (ties: the first seen) is the
    reference; each sample holding it with another dtype is reported. Images are not checked."""
    out = []
    for name, es in entries.items():
        if es[0][1] == "image":
            continue  # decoded images are always uint8 (the raw cooker converts them to RGB)
        ref = _mode(e[2] for e in es)
        n_ref = sum(1 for e in es if e[2] == ref)
        for i, _, dtype, _shape in es:
            if dtype != ref:
                out.append(
                    _problem_at(
                        samples,
                        i,
                        "wrong-dtype",
                        name,
                        f"dtype {dtype}, but {ref} in {n_ref} of {len(es)} samples",
                        expected=ref,
                        actual=dtype,
                    )
                )
    return out


def _layout(kind: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, int]]:
    """(non-spatial dims, (H, W)). Images are (H, W, C) and only their (H, W) matter (the raw cooker converts
    every image to RGB); tensors are (..., H, W)."""
    if kind == "image":
        return (), (shape[0], shape[1])
    return shape[:-2], (shape[-2], shape[-1])


def _strict_mode(counts: Counter[Any]) -> Any:
    """The most common value if it is strictly more common than any other, else None."""
    top = counts.most_common(2)
    if not top or (len(top) == 2 and top[0][1] == top[1][1]):
        return None
    return top[0][0]


#: a primary spatial size is "rare" when at most this share of samples has it (at least 1 sample) while
#: one other size covers at least _DOMINANT of them: one odd sample, not a resolution bucket
_RARE, _DOMINANT = 0.02, 0.9


def _rare_buckets(primary: str | None, key_of: dict[int, tuple[int, int]]) -> list[tuple[int, str, str]]:
    """Samples whose primary member has a spatial size that almost no other sample has, where nearly all
    share one: a stacking batch() crashes on them, a bucketing one gives them a batch of their own."""
    if primary is None or not key_of:
        return []
    counts = Counter(key_of.values())
    total = len(key_of)
    top, top_count = counts.most_common(1)[0]
    if top_count < _DOMINANT * total:
        return []  # resolution buckets: several sizes, each common
    limit = max(1, int(_RARE * total))
    return [
        (
            i,
            primary,
            f"spatial size {list(size)}, which only {counts[size]} of {total} samples have ({list(top)} in "
            f"{top_count}): a batch() that stacks fails on it",
        )
        for i, size in sorted(key_of.items())
        if size != top and counts[size] <= limit
    ]


def _shape_problems(
    samples: Sequence[_Sample], entries: dict[str, list[tuple[int, str, str, tuple[int, ...]]]]
) -> tuple[list[Problem], set[str]]:
    """Rule *shape* (``wrong-shape``, see the module docstring): per member, a shape off the most common
    layout, a spatial size off the sample's resolution bucket, or a primary spatial size almost no sample
    shares. Also returns the members whose spatial dims follow resolution buckets."""
    kinds = {name: es[0][1] for name, es in entries.items()}
    ref: dict[str, tuple[int, ...]] = {name: _mode(e[3] for e in es) for name, es in entries.items()}

    def good_layout(name: str, shape: tuple[int, ...]) -> bool:
        r = ref[name]
        return (
            len(shape) == len(r)
            and len(r) >= 2
            and _layout(kinds[name], shape)[0] == _layout(kinds[name], r)[0]
        )

    # members whose spatial size varies while the rest of their layout holds: resolution-bucket candidates
    spatial: dict[str, dict[int, tuple[int, int]]] = {}
    for name, es in entries.items():
        if len(ref[name]) < 2:
            continue
        sp = {i: _layout(kinds[name], shape)[1] for i, _, _, shape in es if good_layout(name, shape)}
        if len(set(sp.values())) > 1:
            spatial[name] = sp
    evidence = [n for n in spatial if kinds[n] == "image" or len(ref[n]) >= 3]
    followers = [n for n in spatial if n not in evidence]
    ref_spatial = {n: _mode(sp.values()) for n, sp in spatial.items()}
    # the sample's bucket is the spatial size of its primary member (the largest bucketed one)
    primary = max(
        evidence, key=lambda n: (ref_spatial[n][0] * ref_spatial[n][1], -evidence.index(n)), default=None
    )
    key_of: dict[int, tuple[int, int]] = dict(spatial[primary]) if primary is not None else {}
    ref_key = ref_spatial[primary] if primary is not None else None
    expected: dict[str, dict[tuple[int, int], Any]] = {}
    for n, sp in spatial.items():
        table: dict[tuple[int, int], Counter[tuple[int, int]]] = {}
        for i, v in sp.items():
            if i in key_of:
                table.setdefault(key_of[i], Counter())[v] += 1
        expected[n] = {k: _strict_mode(c) for k, c in table.items()}
    follows: dict[str, bool] = {}
    for n in followers:
        moved = still = 0
        for i, v in spatial[n].items():
            if i in key_of and key_of[i] != ref_key:
                if v == ref_spatial[n]:
                    still += 1
                else:
                    moved += 1
        follows[n] = moved > still

    wrong: list[tuple[int, str, str]] = _rare_buckets(primary, key_of)
    for i, s in enumerate(samples):
        for name, (kind, dtype, shape) in s.names.items():
            if dtype is None or shape is None or name not in ref:
                continue
            if kind == "image" and name not in spatial:
                continue  # images of one size, or of sizes the raw batch() lists anyway
            r = ref[name]
            if not good_layout(name, shape):
                if shape == r:
                    continue
                why = (
                    f"rank {len(shape)} instead of {len(r)}"
                    if len(shape) != len(r)
                    else "its leading (non-spatial) dims differ"
                    if len(r) >= 2
                    else "a 1-D tensor cannot follow a resolution bucket"
                )
                wrong.append((i, name, f"shape {_fmt(shape)}, but {_fmt(r)} in most samples ({why})"))
                continue
            if name not in spatial or name == primary:
                continue
            v = spatial[name][i]
            if name in follows and not follows[name]:
                if v != ref_spatial[name]:
                    wrong.append(
                        (
                            i,
                            name,
                            f"shape {_fmt(shape)}, but {_fmt(r)} in most samples (no resolution bucket of "
                            "the sample explains it)",
                        )
                    )
                continue
            want = expected[name].get(key_of[i]) if i in key_of else None
            if want is not None and v != want:
                wrong.append(
                    (
                        i,
                        name,
                        f"spatial size {list(v)}, but {list(want)} in the other samples of its resolution bucket "
                        f"({primary} {list(key_of[i])})",
                    )
                )
    out = [
        _problem_at(
            samples,
            i,
            "wrong-shape",
            name,
            message,
            expected=list(ref[name]),
            actual=list(samples[i].names[name][2] or ()),
        )
        for i, name, message in sorted(wrong, key=lambda w: (w[0], w[1]))
    ]
    return out, set(evidence) | {n for n in followers if follows[n]}


@dataclass
class _Expectation:
    """What every sample should hold: the members of most complete samples plus the encoding's required
    ones (`expected`, in first-seen order), and the encoding's groups of which a sample needs one."""

    used: str | None  # the encoding the samples are checked against
    required: tuple[str, ...]
    any_of: tuple[tuple[str, ...], ...]
    expected: list[str]
    counts: Counter[str]  # member -> complete samples holding it
    n_complete: int
    order: dict[str, int]  # member -> position of its first appearance

    @property
    def expected_set(self) -> set[str]:
        return set(self.expected)


def _gather(scans: Sequence[ShardScan]) -> list[_Sample]:
    """Every sample of `scans`, in shard order, with its members by name."""
    samples: list[_Sample] = []
    layouts: dict[int, dict[str, tuple[str, str | None, tuple[int, ...] | None]]] = {}
    for scan in scans:
        for rec in scan.samples:
            # samples with one member layout share one (read-only) dict; `names` is replaced, never mutated
            names = layouts.get(id(rec.members))
            if names is None:
                names = layouts[id(rec.members)] = {m[0]: (m[1], m[2], m[3]) for m in rec.members}
            samples.append(_Sample(scan.name, rec, names))
    return samples


def _expectation(samples: Sequence[_Sample], encoding: str | None) -> tuple[_Expectation, str | None]:
    """Rule *expected members*: the members present in more than half of the complete (not cut-off) samples,
    plus the required members of the encoding checked against: `encoding`, or the one detected from the data
    (also when `encoding` names the other reference encoding: the caller reports that mismatch once). Also
    returns the detected encoding. Reports nothing itself."""
    complete = [s for s in samples if not s.rec.partial]
    counts: Counter[str] = Counter(n for s in complete for n in s.names)
    detected = detect_encoding(counts, len(complete))
    used = encoding or detected
    if detected is not None and used != detected and used in ("preencoded", "raw"):
        used = detected  # the caller reports the encoding mismatch; do not also flag every sample's members
    required, any_of = encoding_requirements(used)
    order: dict[str, int] = {}
    for s in samples:
        for n in s.names:
            order.setdefault(n, len(order))
    expected = [n for n in sorted(order, key=order.__getitem__) if counts[n] * 2 > len(complete)]
    expected += [n for n in required if n not in expected]
    return _Expectation(used, required, any_of, expected, counts, len(complete), order), detected


def _dotted_keys(samples: Sequence[_Sample], exp: _Expectation) -> list[Problem]:
    """Rule *dotted key* (``dotted-key``): a sample none of whose members is expected, but whose members all
    read ``<prefix>.<member>`` with some ``<member>`` expected (or of the encoding's groups), was stored under
    a key with a dot, which Energon cut short. Reported once per sample; the sample is marked `dotted` and its
    members renamed to what they were meant to be, for the rules after this one."""
    expected_set = exp.expected_set
    vocab = expected_set | {n for g in exp.any_of for n in g}
    problems: list[Problem] = []
    for s in samples:
        names = list(s.names)
        if not names or any(n in expected_set for n in names) or not all("." in n for n in names):
            continue
        split = [n.split(".", 1) for n in names]
        if not any(rest in vocab for _, rest in split):
            continue
        s.dotted = True
        stored = sorted({f"{s.rec.key}.{prefix}" for prefix, _ in split})
        problems.append(
            Problem(
                "dotted-key",
                s.shard,
                s.rec.key,
                None,
                f"stored key {', '.join(repr(k) for k in stored)} contains a dot, so Energon sees key "
                f"{s.rec.key!r} with members {', '.join(names)} instead of {', '.join(r for _, r in split)}",
                detail={"stored_keys": stored, "energon_members": names},
            )
        )
        s.names = {rest: s.names[n] for n, (_, rest) in zip(names, split, strict=True)}
    return problems


def _duplicate_keys(samples: Sequence[_Sample]) -> list[Problem]:
    """Rule *duplicate key* (``duplicate-key``): each sample, in shard order, whose key an earlier sample
    already has; the problem names where that first sample is."""
    problems: list[Problem] = []
    first_seen: dict[str, tuple[str, int]] = {}
    for i, s in enumerate(samples):
        seen = first_seen.get(s.rec.key)
        if seen is None:
            first_seen[s.rec.key] = (s.shard, i)
            continue
        problems.append(
            Problem(
                "duplicate-key",
                s.shard,
                s.rec.key,
                None,
                f"key {s.rec.key!r} was already used by an earlier sample in {seen[0]} (byte offset "
                f"{samples[seen[1]].rec.offset}); this one starts at byte {s.rec.offset}",
                detail={
                    "first_shard": seen[0],
                    "first_offset": samples[seen[1]].rec.offset,
                    "offset": s.rec.offset,
                },
            )
        )
    return problems


def _missing_members(samples: Sequence[_Sample], exp: _Expectation) -> list[Problem]:
    """Rule *missing member* (``missing-member``): a sample lacking an expected member (one of an encoding
    group counts for the whole group), or holding none of a group the encoding needs one of. Dotted-key
    samples and the cut-off last sample of a truncated shard are not checked (reported as such)."""
    expected_set = exp.expected_set
    problems: list[Problem] = []
    for s in samples:
        if s.dotted or s.rec.partial:
            continue
        for m in exp.expected:
            if m not in s.names and not any(m in g and any(x in s.names for x in g) for g in exp.any_of):
                why = (
                    "required by the encoding"
                    if m in exp.required and exp.counts[m] * 2 <= exp.n_complete
                    else (f"present in {exp.counts[m]} of {exp.n_complete} samples")
                )
                problems.append(
                    Problem(
                        "missing-member",
                        s.shard,
                        s.rec.key,
                        m,
                        f"the sample has no {m!r} ({why}); it has {', '.join(s.names) or 'no members'}",
                    )
                )
        for group in exp.any_of:
            if not any(g in s.names for g in group) and not any(g in expected_set for g in group):
                problems.append(
                    Problem(
                        "missing-member",
                        s.shard,
                        s.rec.key,
                        group[0],
                        f"the sample has none of {', '.join(group)} (the {exp.used} encoding needs one); it "
                        f"has {', '.join(s.names) or 'no members'}",
                    )
                )
    return problems


def _tensor_entries(samples: Sequence[_Sample]) -> dict[str, list[tuple[int, str, str, tuple[int, ...]]]]:
    """Per member, ``(sample index, kind, dtype, shape)`` of every sample where both dtype and shape are known
    (the input of the dtype and shape rules)."""
    entries: dict[str, list[tuple[int, str, str, tuple[int, ...]]]] = {}
    for i, s in enumerate(samples):
        for name, (kind, dtype, shape) in s.names.items():
            if dtype is not None and shape is not None:
                entries.setdefault(name, []).append((i, kind, dtype, shape))
    return entries


def _member_summary(
    samples: Sequence[_Sample], scans: Sequence[ShardScan], bucketed: set[str], order: dict[str, int]
) -> dict[str, MemberSummary]:
    """Each member across the dataset (in first-seen order): sample count, dtypes and shapes (most common
    first), whether it follows resolution buckets, and its value range over the scans. Reports nothing."""
    members: dict[str, MemberSummary] = {}
    for s in samples:
        for name, (kind, dtype, shape) in s.names.items():
            ms = members.get(name)
            if ms is None:
                ms = members[name] = MemberSummary(name, kind)
            ms.count += 1
            if dtype is not None:
                ms.dtypes[dtype] = ms.dtypes.get(dtype, 0) + 1
            if shape is not None:
                ms.shapes[shape] = ms.shapes.get(shape, 0) + 1
    for name, ms in members.items():
        ms.bucketed = name in bucketed
        ms.shapes = dict(sorted(ms.shapes.items(), key=lambda kv: (-kv[1], kv[0])))
        ms.dtypes = dict(sorted(ms.dtypes.items(), key=lambda kv: (-kv[1], kv[0])))
    for scan in scans:
        for name, (lo, hi) in scan.ranges.items():
            ms = members.get(name)
            if ms is None:
                continue
            ms.vmin = lo if ms.vmin is None else min(ms.vmin, lo)
            ms.vmax = hi if ms.vmax is None else max(ms.vmax, hi)
    return dict(sorted(members.items(), key=lambda kv: order.get(kv[0], len(order))))


def analyze(scans: Sequence[ShardScan], *, encoding: str | None) -> Analysis:
    """Cross-sample checks over `scans` (in shard order) for `encoding` (None: detect it from the data).

    The rules run in this order, and their problems are reported in it: dotted keys (which rename the members
    the later rules see), duplicate keys, missing members, dtypes, shapes."""
    samples = _gather(scans)
    exp, detected = _expectation(samples, encoding)
    problems = _dotted_keys(samples, exp)
    problems += _duplicate_keys(samples)
    problems += _missing_members(samples, exp)
    entries = _tensor_entries(samples)
    problems += _dtype_problems(samples, entries)
    shape_problems, bucketed = _shape_problems(samples, entries)
    problems += shape_problems
    members = _member_summary(samples, scans, bucketed, exp.order)
    return Analysis(problems, members, exp.expected, detected, len(samples))
