"""What became of a tensor member in an output field: kept (as it was, cast without loss, laid out anew,
padded, scaled), changed in a way a declaration expresses (a lossy cast, a flip, a cut along an axis), or
damaged (filled with zeros, NaN or a constant).

Every comparison is made on plain CPU tensors (the one comparison of :mod:`.compare`), never on the
target's own objects.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from .compare import as_tensor, same
from .forms import Form

__all__ = ["tensor_form", "padding_of"]

#: axes of a tensor permuted at most (beyond this, a permuted layout is not searched)
MAX_PERMUTED_DIMS = 5


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _values(want: torch.Tensor, got: torch.Tensor) -> str | None:
    """How ``got`` holds ``want``'s values, both of one shape: "" exactly, "cast to X" without loss, or
    None (other values). A lossy cast is judged by the caller."""
    if got.dtype == want.dtype:
        return "" if same(want, got) else None
    if want.is_floating_point() != got.is_floating_point() and not (
        got.is_floating_point() and not want.is_floating_point() and want.dtype != torch.bool
    ):
        return None
    try:
        widened = want.to(got.dtype)
    except (RuntimeError, TypeError):
        return None
    if same(widened, got) and same(widened.to(want.dtype), want):
        return f"cast to {_name(got.dtype)} (no value changed)"
    return None


def _lossy_cast(want: torch.Tensor, got: torch.Tensor) -> bool:
    return (
        want.is_floating_point()
        and got.is_floating_point()
        and got.dtype != want.dtype
        and got.shape == want.shape
        and same(want.to(got.dtype), got)
    )


def padding_of(want: torch.Tensor, got: torch.Tensor) -> tuple[int, int, str] | None:
    """(axis, length, fill) when ``got`` is ``want`` padded at the end (or the start) of one axis with one
    fill value, else None."""
    if got.dim() != want.dim() or got.dtype != want.dtype or not want.numel():
        return None
    longer = [a for a in range(want.dim()) if got.shape[a] > want.shape[a]]
    if len(longer) != 1 or any(got.shape[a] < want.shape[a] for a in range(want.dim())):
        return None
    axis = longer[0]
    n, total = want.shape[axis], got.shape[axis]
    for start, where in ((0, "end"), (total - n, "start")):
        if not same(got.narrow(axis, start, n), want):
            continue
        rest = got.narrow(axis, n, total - n) if start == 0 else got.narrow(axis, 0, total - n)
        flat = rest.reshape(-1)
        if flat.numel() and bool((flat == flat[0]).all()):
            fill = flat[0].item()
            return (
                axis,
                total,
                f"{fill:g} at the {where}" if isinstance(fill, float) else f"{fill} at the {where}",
            )
    return None


def _cut(want: torch.Tensor, got: torch.Tensor) -> tuple[int, int, int] | None:
    """(axis, offset, length) when ``got`` is a slice of ``want`` along one axis, else None."""
    if got.dim() != want.dim() or got.dtype != want.dtype:
        return None
    shorter = [a for a in range(want.dim()) if got.shape[a] < want.shape[a]]
    if len(shorter) != 1 or any(got.shape[a] != want.shape[a] for a in range(want.dim()) if a not in shorter):
        return None
    axis = shorter[0]
    n = got.shape[axis]
    for offset in (0, want.shape[axis] - n, (want.shape[axis] - n) // 2):
        if same(want.narrow(axis, offset, n), got):
            return axis, offset, n
    return None


def _layouts(want: torch.Tensor, got: torch.Tensor) -> str | None:
    """How ``got`` lays ``want``'s values out anew ("" for none), exact values or a lossless cast: unit
    axes added or dropped, a reshape keeping the order, axes permuted."""
    if got.numel() != want.numel():
        return None
    squeezed_want = [n for n in want.shape if n != 1]
    squeezed_got = [n for n in got.shape if n != 1]
    if squeezed_want == squeezed_got:
        values = _values(want.reshape(got.shape), got)
        if values is not None:
            return (
                "unit axes "
                + ("dropped" if got.dim() < want.dim() else "added")
                + (f", {values}" if values else "")
            )
    if (
        want.dim() <= MAX_PERMUTED_DIMS
        and sorted(want.shape) == sorted(got.shape)
        and want.shape != got.shape
    ):
        # a permutation that changes the shape is a layout (a consumer reads it by its shape); one that keeps
        # it swaps axes of one size, which no consumer can tell: _transposed judges that
        for order in itertools.permutations(range(want.dim())):
            if order == tuple(range(want.dim())):
                continue
            if tuple(want.shape[i] for i in order) != tuple(got.shape):
                continue
            values = _values(want.permute(order), got)
            if values is not None:
                return f"axes permuted to {list(order)}" + (f", {values}" if values else "")
    values = _values(want.reshape(got.shape), got)
    if values is not None:
        return f"reshaped to {list(got.shape)}" + (f", {values}" if values else "")
    return None


def _affine(want: torch.Tensor, got: torch.Tensor) -> tuple[float, float] | None:
    """(scale, shift) when ``got`` is ``scale * want + shift`` (floats, one shape) up to rounding."""
    if got.shape != want.shape or not got.is_floating_point() or want.numel() < 2:
        return None
    x, y = want.double().reshape(-1), got.double().reshape(-1)
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        return None
    var = float(x.var(unbiased=False))
    if var < 1e-12:
        return None
    scale = float(((x - x.mean()) * (y - y.mean())).mean()) / var
    shift = float(y.mean()) - scale * float(x.mean())
    if abs(scale) < 1e-9:
        return None
    residual = float((y - (scale * x + shift)).abs().max())
    spread = float((y - y.mean()).abs().max()) or 1.0
    eps = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(got.dtype, 1e-5)
    return (scale, shift) if residual <= eps * spread * 4 else None


def tensor_form(member: Any, observed: Any, *, declared: Any = None) -> Form | None:
    """How ``observed`` holds the tensor ``member`` (a tensor or numeric array), or None where the suite
    sees no relation (then the caller decides: unrecognised, if the field depends on the member). Unit axes
    (a batch axis of 1 stored with the data) are looked through: a cut or a padding of ``[1, 512, D]`` into
    ``[128, D]`` is the cut it is."""
    want, got = as_tensor(member), as_tensor(observed)
    if want is None or got is None:
        return None
    form = _form(want, got, declared)
    if form is not None:
        return form
    squeezed_want, squeezed_got = _squeezed(want), _squeezed(got)
    if squeezed_want.shape != want.shape or squeezed_got.shape != got.shape:
        form = _form(squeezed_want, squeezed_got, declared)
        if form is not None:
            return Form(
                form.verdict, f"unit axes dropped, {form.how}", form.declaration, form.cause, form.params
            )
    rearranged = _rearranged(want, got)
    if rearranged:
        return Form("kept", rearranged, cause="rearranged")
    return None


def _squeezed(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape([n for n in tensor.shape if n != 1]) if 1 in tensor.shape else tensor


#: values compared as multisets at most (a bigger tensor is not searched for a re-layout)
MAX_REARRANGED = 1 << 22


def _rearranged(want: torch.Tensor, got: torch.Tensor) -> str:
    """Words for an output that holds exactly the member's values in another layout (a patchify, an
    einops rearrange), perhaps padded with one value: the same multiset of values ("" otherwise). Which
    layout the model expects is its own business; no value is lost or changed."""
    if (
        got.dtype != want.dtype
        or got.numel() < want.numel()
        or want.numel() < 2
        or got.numel() > MAX_REARRANGED
    ):
        return ""
    from .fingerprint import tensor_bytes

    width = want.element_size()
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(width)
    if as_int is None:
        return ""
    a = torch.frombuffer(bytearray(tensor_bytes(want)), dtype=as_int).sort().values
    b = torch.frombuffer(bytearray(tensor_bytes(got)), dtype=as_int)
    if got.numel() == want.numel():
        return (
            f"rearranged to shape {list(got.shape)} (the same values in another layout)"
            if torch.equal(a, b.sort().values)
            else ""
        )
    values, counts = torch.unique(b, return_counts=True)
    mine_values, mine_counts = torch.unique(a, return_counts=True)
    index = torch.searchsorted(values, mine_values).clamp(max=len(values) - 1)
    if not torch.equal(values[index], mine_values) or bool((counts[index] < mine_counts).any()):
        return ""
    rest = counts.clone()
    rest[index] -= mine_counts
    if int((rest > 0).sum()) != 1:
        return ""
    return (
        f"rearranged to shape {list(got.shape)} and padded with one value (the same values in another layout, "
        f"{got.numel() - want.numel()} values of padding)"
    )


def _form(want: torch.Tensor, got: torch.Tensor, declared: Any) -> Form | None:
    if same(want, got):
        return Form("kept", "as it is")
    if got.shape == want.shape:
        values = _values(want, got)
        if values is not None:
            return Form("kept", values)
        if _lossy_cast(want, got):
            if declared is not None and declared.kind == "cast" and declared.dtype == _name(got.dtype):
                return Form("declared", f"cast to {_name(got.dtype)} as declared")
            return Form(
                "undeclared",
                f"cast to {_name(got.dtype)}, which rounds its values",
                declaration=f"cast dtype={_name(got.dtype)}",
                cause="lossy cast",
            )
        if want.numel() and got.numel():
            for axis in range(-1, -want.dim() - 1, -1):
                if want.shape[axis] > 1 and same(want.flip(axis), got):
                    if declared is not None and declared.kind == "flip" and declared.axis == axis:
                        return Form("declared", f"flipped along axis {axis} as declared")
                    return Form(
                        "undeclared",
                        f"flipped along axis {axis}",
                        declaration=f"flip axis={axis} rate=RATE",
                        cause="flipped",
                    )
    swapped = _transposed(want, got)
    if swapped:
        return Form("corrupted", swapped, cause="transposed")
    fill = _fill(want, got)
    if fill:
        if got.shape == want.shape and fill.startswith("filled with zeros"):
            # the usual deliberate form of this is a dropout (CFG on embeddings): a declaration expresses it
            return Form("undeclared", fill, declaration="dropout rate=RATE to=zeros", cause="filled")
        return Form("corrupted", fill, cause="filled")
    reinterpreted = _reinterpreted(want, got)
    if reinterpreted:
        return Form("corrupted", reinterpreted, cause="bytes reinterpreted")
    layout = _layouts(want, got)
    if layout is not None:
        return Form("kept", layout)
    padded = padding_of(want, got)
    if padded is not None:
        axis, length, fill_value = padded
        return Form("kept", f"padded to {length} along axis {axis} with {fill_value}")
    cut = _cut(want, got)
    if cut is not None:
        axis, offset, length = cut
        if declared is not None and declared.kind == "truncate" and declared.length == length:
            return Form("declared", f"truncated to {length} along axis {axis} as declared")
        where = "its first" if offset == 0 else f"{length} from offset {offset} of its"
        return Form(
            "undeclared",
            f"cut along axis {axis} to {where} {length} of {want.shape[axis]} (the rest is lost)",
            declaration=f"truncate axis={axis} length={length}" if offset == 0 else None,
            cause="cut",
        )
    if want.is_floating_point() or got.is_floating_point():
        if got.shape == want.shape:
            affine = _affine(want.to(got.dtype) if got.is_floating_point() else want, got)
            if affine is not None:
                scale, shift = affine
                return Form(
                    "kept",
                    f"scaled by {scale:.6g}" + (f", shifted by {shift:.6g}" if shift else ""),
                    cause="scaled",
                    params=(scale, shift),
                )
    return None


def _transposed(want: torch.Tensor, got: torch.Tensor) -> str:
    """Words for an output of the member's very shape whose values are the member's with two axes of one size
    swapped (the spatial axes of square latents): the shape says nothing, the content is transposed ("" otherwise)."""
    if got.shape != want.shape or want.dim() < 2 or want.dim() > MAX_PERMUTED_DIMS or same(want, got):
        return ""
    for a, b in itertools.combinations(range(want.dim()), 2):
        if want.shape[a] == want.shape[b] > 1 and _values(want.transpose(a, b), got) is not None:
            return (
                f"axes {a} and {b} swapped (both of size {want.shape[a]}, so the shape is the same and the "
                "content is transposed)"
            )
    return ""


def _reinterpreted(want: torch.Tensor, got: torch.Tensor) -> str:
    """Words for an output that holds the member's bytes read as another dtype of the same size (float16
    for bfloat16 data): every value is wrong though every bit is there ("" otherwise)."""
    if got.dtype == want.dtype or got.element_size() != want.element_size() or got.numel() != want.numel():
        return ""
    from .fingerprint import tensor_bytes

    if tensor_bytes(got) != tensor_bytes(want):
        return ""
    held = _name(want.dtype)
    if want.dtype == torch.uint16 and got.is_floating_point():
        held = "bfloat16 values stored as uint16 (numpy has no bfloat16)"
    else:
        held += " values"
    return (
        f"its bytes read as {_name(got.dtype)}, where they hold {held}: every value is another number (a "
        "view or frombuffer with the wrong dtype)"
    )


def _fill(want: torch.Tensor, got: torch.Tensor) -> str:
    """Words for an output that is a fill and not the member's values ("" otherwise): zeros, NaN or one
    constant where the member varies."""
    if not got.numel() or not want.numel():
        return ""
    flat = got.reshape(-1)
    if got.is_floating_point() and bool(torch.isnan(flat).all()) and not bool(torch.isnan(want).all()):
        return f"filled with NaN (shape {list(got.shape)})"
    varies = want.numel() > 1 and not bool((want.reshape(-1) == want.reshape(-1)[0]).all())
    if flat.numel() > 1 and bool((flat == flat[0]).all()) and varies:
        value = flat[0].item()
        return f"filled with {'zeros' if value == 0 else f'the constant {value:g}'} (shape {list(got.shape)})"
    return ""
