"""Token ids and the masks that describe their padding.

A tokenised caption is judged by what a tokeniser guarantees, never by decoding it back: the same caption
gives the same ids (determinism, judged by the flow), distinct captions give distinct ids (no collapse), an
edit of the caption changes them, and a caption longer than the maximum length is cut (reported with the
share of captions cut). A mask is judged against the padding it describes: the padded positions of the ids
(a trailing or leading run of the pad id, found over the samples at hand) are exactly its zeros, give or
take the one end-of-text token a tokeniser that pads with it marks as a token.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .compare import as_tensor

__all__ = [
    "is_token_ids",
    "is_mask",
    "mask_fields",
    "pad_value",
    "content_length",
    "mask_problem",
    "batch_mask_problems",
    "pair_problems",
    "batch_pad_values",
    "MaskPair",
    "position_markers",
]

_MASK_NAME = re.compile(r"mask", re.IGNORECASE)


def is_token_ids(value: Any) -> bool:
    """Integer values laid out as a sequence (a 1-D tensor or list, or 2-D with a unit axis)."""
    tensor = _ints(value)
    return tensor is not None and tensor.numel() > 0 and sum(1 for n in tensor.shape if n != 1) <= 1


def _ints(value: Any) -> torch.Tensor | None:
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return torch.tensor(value)
    tensor = as_tensor(value)
    if tensor is None or tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        return None
    return tensor


#: masks named so mark where a loss is computed, not where padding is: they may leave out real positions
#: (conditioning frames, a prompt) on purpose, so they are not judged against padding
_NOT_PADDING = re.compile(r"loss|label", re.IGNORECASE)


def is_mask(name: str, value: Any) -> bool:
    """A field named like a mask whose values are all 0 or 1 (bool, integer or float)."""
    tensor = as_tensor(value)
    if not _MASK_NAME.search(name) or tensor is None or not tensor.numel():
        return False
    flat = tensor.reshape(-1)
    if tensor.dtype == torch.bool:
        return True
    return bool(((flat == 0) | (flat == 1)).all())


@dataclass(frozen=True)
class MaskPair:
    """A padding mask and the fields whose padding it may describe (the same shape, or the same leading
    shape), nearest name first: it is right when it describes one of them."""

    mask: str
    targets: tuple[str, ...]

    @property
    def target(self) -> str:
        return self.targets[0]


def mask_fields(output: Mapping[str, Any]) -> list[MaskPair]:
    """Each padding mask of an output with the fields it may describe: those of the same shape (or whose
    leading axes are the mask's, for padded embeddings), nearest name first. A loss mask is no padding mask
    (it may leave real positions out on purpose) and is not judged."""
    pairs = []
    names = [n for n in output if not n.startswith("__")]
    for name in names:
        value = output[name]
        if not is_mask(name, value) or _NOT_PADDING.search(name):
            continue
        mask = as_tensor(value)
        candidates = []
        for other in names:
            if other == name or is_mask(other, output[other]):
                continue
            tensor = as_tensor(output[other])
            if tensor is None or tensor.dim() < mask.dim():
                continue
            if tuple(tensor.shape[: mask.dim()]) == tuple(mask.shape) or (
                tensor.numel() == mask.numel()
                and [n for n in tensor.shape if n != 1] == [n for n in mask.shape if n != 1]
            ):
                candidates.append(other)
        if candidates:
            stem = _MASK_NAME.sub("", name).strip("_")
            candidates.sort(key=lambda c: (-_common_prefix(c, stem), c))
            pairs.append(MaskPair(name, tuple(candidates)))
    return pairs


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def position_markers(value: Any, mask_dims: int) -> torch.Tensor | None:
    """The values as positions along the mask's last axis: ints stay as they are; a float embedding's
    rows become one marker per position (1 where the row is all zeros, else 0)."""
    tensor = as_tensor(value)
    if tensor is None:
        return None
    if tensor.dim() > mask_dims:  # rows of values (embeddings, position ids): a row of zeros is padding
        flat = tensor.reshape(*tensor.shape[:mask_dims], -1)
        return (flat == 0).all(dim=-1).to(torch.int64) - 2  # -1: a zero row (padding), -2: a row of data
    return tensor


def pad_value(sequences: Sequence[torch.Tensor]) -> int | None:
    """The pad id of 1-D id sequences of one length: the value the most sequences end (or start) with in a
    run of at least two, or None where no sequence is padded."""
    counts: Counter[int] = Counter()
    for seq in sequences:
        if seq.dim() != 1 or seq.numel() < 2:
            continue
        for end in (seq.flip(0), seq):
            run = _run(end)
            if run >= 2:
                counts[int(end[0])] += 1
    return counts.most_common(1)[0][0] if counts else None


def _run(seq: torch.Tensor) -> int:
    """Length of the run of the first value at the start of ``seq``."""
    first = seq[0]
    differs = (seq != first).nonzero()
    return int(differs[0, 0]) if differs.numel() else int(seq.numel())


def content_length(seq: torch.Tensor, pad: int | None) -> tuple[int, str]:
    """(positions that are not padding, "end" or "start": where the padding is) of a 1-D sequence."""
    if pad is None or seq.numel() == 0:
        return int(seq.numel()), "end"
    tail = _run(seq.flip(0)) if int(seq[-1]) == pad else 0
    head = _run(seq) if int(seq[0]) == pad else 0
    if head > tail:
        return int(seq.numel()) - head, "start"
    return int(seq.numel()) - tail, "end"


def mask_problem(seq: torch.Tensor, mask: torch.Tensor, pad: int | None) -> str | None:
    """What is wrong with ``mask`` (1-D, 0/1) as the padding mask of ``seq`` (1-D ids, or -1/-2 row
    markers of a float embedding), or None: its ones must be the positions that are not padding, in one
    run at the padded side's opposite end; a tokeniser that pads with its end-of-text id may mark one more."""
    if mask.shape != seq.shape:
        return f"the mask has shape {list(mask.shape)}, the values it describes {list(seq.shape)}"
    flat = mask.reshape(-1).to(torch.int64)
    n = int(seq.numel())
    if seq.min() < -0.5 and seq.max() < -0.5:  # float rows: -1 padding, -2 data
        data = (seq == -2).to(torch.int64)
        length = _run(data.flip(0))
        content, side = (n - length if int(data[-1]) == 0 else n), "end"
    else:
        content, side = content_length(seq, pad)
    ones = int(flat.sum())
    want = torch.zeros(n, dtype=torch.int64)
    if side == "end":
        want[:content] = 1
    else:
        want[n - content :] = 1
    if torch.equal(flat, want):
        return None
    if (
        side == "end"
        and content < n
        and ones == content + 1
        and torch.equal(flat[: content + 1], torch.ones(content + 1, dtype=torch.int64))
    ):
        return None  # the end-of-text token the padding repeats is marked as a token
    if ones == n and content < n:
        return (
            f"the mask marks all {n} positions as tokens, but {n - content} of them are padding"
            + (f" (pad id {pad})" if pad is not None else " (rows of zeros)")
            + ": the model attends to padding as if it were text"
        )
    return f"the mask has {ones} ones, the values it describes have {content} positions that are not padding"


def batch_mask_problems(ids: Any, mask: Any, pad: int | None = None) -> list[tuple[int, str, int | None]]:
    """For a batch (rows along axis 0): ``(row, problem, row whose padding the mask row describes)`` for
    each row whose mask is wrong; the third item says where a mask row came from when it describes another
    row's padding exactly (masks built from another order of the samples)."""
    ids_t, mask_t = as_tensor(ids), as_tensor(mask)
    if ids_t is None or mask_t is None or mask_t.dim() != 2 or ids_t.shape[0] != mask_t.shape[0]:
        return []
    rows = position_markers(ids_t, mask_t.dim())
    if rows is None or tuple(rows.shape) != tuple(mask_t.shape):
        return []
    if pad is None and not rows.is_floating_point() and rows.min() >= 0:
        pad = pad_value(list(rows))
        if pad is None:
            return []  # no row shows a run of padding: where the padding is cannot be told
    out = []
    for row in range(rows.shape[0]):
        problem = mask_problem(rows[row], mask_t[row], pad)
        if problem is None:
            continue
        source = next(
            (
                other
                for other in range(rows.shape[0])
                if other != row and mask_problem(rows[other], mask_t[row], pad) is None
            ),
            None,
        )
        out.append((row, problem, source))
    return out


def pair_problems(
    present: Mapping[str, Any], pair: MaskPair, pads: Mapping[str, int | None] | None = None
) -> list[tuple[int, str, int | None]]:
    """:func:`batch_mask_problems` of a batch's mask against every field it may describe (``pads``: the pad
    id of each, found over every batch; else over this one): a row is wrong only when it describes none of
    them (the problem named is the nearest-named field's)."""
    pads = pads or {}
    found = [batch_mask_problems(present[t], present[pair.mask], pads.get(t)) for t in pair.targets]
    wrong = set.intersection(*({row for row, _, _ in problems} for problems in found)) if found else set()
    return [item for item in found[0] if item[0] in wrong] if found else []


def batch_pad_values(batches: Sequence[Mapping[str, Any]], pair: MaskPair) -> dict[str, int | None]:
    """The pad id of each field a mask may describe, over the rows of every batch (one batch of four rows
    may hold no row padded by two or more)."""
    out: dict[str, int | None] = {}
    for target in pair.targets:
        rows = []
        for present in batches:
            ids = as_tensor(present.get(target))
            mask = as_tensor(present.get(pair.mask))
            if ids is None or mask is None or ids.shape != mask.shape or ids.dim() != 2:
                continue
            if ids.is_floating_point() or ids.dtype == torch.bool:
                continue
            rows.extend(ids)
        out[target] = pad_value(rows) if rows else None
    return out
