"""What became of an image member in an output field, recognised by re-doing the common transforms.

An image pipeline decodes, resizes, crops, flips, changes the layout (HWC to CHW, a unit batch axis), casts
and normalises on purpose. To tell those from damage, the member's pixels are put through each candidate
geometry (identity, a flip, a transpose, a centre or offset crop, a resize by each common interpolation of
Pillow and torch, a resize that covers the size followed by a crop) and the output is compared with each,
after fitting a per-channel affine map (the normalisation). The best candidate within
:data:`TOLERANCE` names the form: the geometry, the layout and the normalisation, each recognised or not:

- **kept**: a layout change, a cast, a resize or crop that keeps the content's aspect, a normalisation of a
  known family ([0, 1], [-1, 1], ImageNet's or CLIP's mean and std, or the declared one);
- **corrupted**: normalised twice (or divided by 255 twice), values that wrap around (uint8 arithmetic),
  colour lost to a grey conversion, height and width swapped, an image resized along its colour axis;
- **undeclared**: a flip (a declaration would express it);
- **unrecognised**: another normalisation (its mean and std are given for a declaration), a channel order
  other than RGB, a stretched aspect ratio, or a value the suite cannot explain (advice).

Comparisons are made on plain numpy arrays in pixel units (0-255): never on the target's own objects.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .forms import Form

__all__ = [
    "TOLERANCE",
    "KNOWN_NORMALISATIONS",
    "image_form",
    "image_planes",
    "Normalisation",
    "fit_normalisation",
]

#: The mean absolute difference, in pixel units of 0-255 after the fitted normalisation is undone, within
#: which an output is taken to be a candidate transform of the member. Pillow's and torch's versions of
#: one interpolation differ by about 0.3 (rounding); two different interpolations by 0.6 to 8.
TOLERANCE = 1.5

#: mean and std (on [0, 1] pixels, as torchvision's Normalize after ToTensor) of the normalisations
#: recognised without a declaration
KNOWN_NORMALISATIONS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "[-1, 1]": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "ImageNet's mean and std": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "CLIP's mean and std": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
}

#: ITU-R 601-2 luma, as Pillow's convert("L")
_LUMA = np.array([0.299, 0.587, 0.114])


@dataclass(frozen=True)
class Plane:
    """An output value read as an image: pixels ``[h, w, c]`` (float64) and how it was laid out."""

    pixels: np.ndarray
    layout: str  # "HWC", "CHW", "HW"
    #: the output's axis that runs along the image's width (for a flip declaration)
    width_axis: int
    dtype: str
    unit_axes: int


def image_planes(observed: Any) -> list[Plane]:
    """The ways ``observed`` (a PIL image, a tensor, a numeric array) can be read as an image: its colour
    axis first or last, after dropping unit axes; empty when it is none."""
    array, dtype = _as_array(observed)
    if array is None or array.ndim < 2 or array.size == 0:
        return []
    unit = sum(1 for n in array.shape if n == 1)
    squeezed = array.reshape([n for n in array.shape if n != 1]) if unit else array
    out: list[Plane] = []
    if squeezed.ndim == 2:
        # a grey image; its width is the original's last non-unit axis
        width_axis = max(i for i, n in enumerate(array.shape) if n != 1) - array.ndim
        out.append(Plane(squeezed[:, :, None].astype(np.float64), "HW", width_axis, dtype, unit))
    elif squeezed.ndim == 3:
        real = [i for i, n in enumerate(array.shape) if n != 1]
        if squeezed.shape[0] in (3, 4):
            pixels = np.moveaxis(squeezed[:3], 0, -1).astype(np.float64)
            out.append(Plane(pixels, "CHW", real[2] - array.ndim, dtype, unit))
        if squeezed.shape[-1] in (3, 4):
            out.append(Plane(squeezed[..., :3].astype(np.float64), "HWC", real[1] - array.ndim, dtype, unit))
    return out


def _as_array(observed: Any) -> tuple[np.ndarray | None, str]:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is a dependency
        Image = None  # type: ignore[assignment]
    if Image is not None and isinstance(observed, Image.Image):
        image = observed if observed.mode in ("L", "RGB") else observed.convert("RGB")
        return np.asarray(image), "uint8"
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None  # type: ignore[assignment]
    if torch is not None and isinstance(observed, torch.Tensor):
        tensor = observed.detach().cpu()
        if tensor.dtype == torch.bool or tensor.is_complex():
            return None, ""
        dtype = str(tensor.dtype).removeprefix("torch.")
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()
        return tensor.numpy(), dtype
    if isinstance(observed, np.ndarray) and observed.dtype.kind in "uif":
        return observed, str(observed.dtype)
    return None, ""


# -- normalisation ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Normalisation:
    """A per-channel affine map of pixels, as ``(x / 255 - mean) / std``."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def describe(self) -> str:
        return f"mean={_fmt(self.mean)} std={_fmt(self.std)}"

    def declaration(self) -> str:
        return f"normalize {self.describe()}"

    def matches(self, mean: Sequence[float], std: Sequence[float]) -> bool:
        mean, std = _per_channel(mean, len(self.mean)), _per_channel(std, len(self.std))
        return all(abs(m - n) <= 0.01 for m, n in zip(self.mean, mean, strict=True)) and all(
            abs(s / t - 1) <= 0.02 for s, t in zip(self.std, std, strict=True)
        )

    @property
    def raw(self) -> bool:
        """The pixel values as stored (0-255), only perhaps as another dtype."""
        return self.matches((0.0,) * len(self.mean), (1 / 255,) * len(self.std))

    @property
    def unit(self) -> bool:
        """Scaled to [0, 1] (ToTensor)."""
        return self.matches((0.0,) * len(self.mean), (1.0,) * len(self.std))


def _per_channel(values: Sequence[float], n: int) -> tuple[float, ...]:
    values = tuple(float(v) for v in values)
    return values * n if len(values) == 1 else values[:n]


def _fmt(values: Sequence[float]) -> str:
    rounded = [round(v, 4) for v in values]
    if len(set(rounded)) == 1:
        return f"[{rounded[0]:g}]"
    return "[" + ", ".join(f"{v:g}" for v in rounded) + "]"


def fit_normalisation(gains: Sequence[float], offsets: Sequence[float]) -> Normalisation:
    """The normalisation ``y = gain * x + offset`` (x in 0-255) is, as mean and std on [0, 1] pixels."""
    std = tuple(1.0 / (255.0 * g) for g in gains)
    mean = tuple(-o * s for o, s in zip(offsets, std, strict=True))
    return Normalisation(mean, std)


def _judge_normalisation(norm: Normalisation, declared: Normalisation | None) -> tuple[str, str, str]:
    """(verdict, words, cause) for a fitted normalisation."""
    if norm.raw:
        return "kept", "", ""
    if norm.unit:
        return "kept", "scaled to [0, 1]", ""
    if declared is not None and norm.matches(declared.mean, declared.std):
        return "declared", f"normalised as declared ({declared.describe()})", ""
    for name, (mean, std) in KNOWN_NORMALISATIONS.items():
        if norm.matches(mean, std):
            return "kept", f"normalised to {name}" if name.startswith("[") else f"normalised with {name}", ""
    if norm.matches((0.0,), (255.0,)):
        return "corrupted", "divided by 255 twice (values in [0, 0.004])", "scaled twice"
    candidates = dict(KNOWN_NORMALISATIONS)
    if declared is not None:
        candidates["the declared normalisation"] = (declared.mean, declared.std)
    for (first, (m1, s1)), (second, (m2, s2)) in itertools.product(candidates.items(), repeat=2):
        n = len(norm.mean)
        m1, s1, m2, s2 = (_per_channel(v, n) for v in (m1, s1, m2, s2))
        mean = tuple(a + b * c for a, b, c in zip(m1, m2, s1, strict=True))
        std = tuple(a * b for a, b in zip(s1, s2, strict=True))
        if norm.matches(mean, std):
            what = first if first == second else f"{first}, then {second}"
            return (
                "corrupted",
                f"normalised twice ({what} applied to values already normalised: {norm.describe()}, range "
                f"[{_low(norm):.3g}, {_high(norm):.3g}])",
                "normalised twice",
            )
    return "unrecognised", f"normalised with {norm.describe()}", ""


def _low(norm: Normalisation) -> float:
    return min((0 - m) / s for m, s in zip(norm.mean, norm.std, strict=True))


def _high(norm: Normalisation) -> float:
    return max((1 - m) / s for m, s in zip(norm.mean, norm.std, strict=True))


# -- geometry ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """The member's pixels after one candidate geometry, in pixel units."""

    pixels: np.ndarray  # [h, w, 3] float64
    how: str  # "" for none
    kind: str  # "identity", "flip", "transpose", "crop", "resize", "stretch"
    #: exact pixel correspondence (no interpolation): a pointwise value map can be read off
    exact: bool
    #: the axis flipped, for a flip ("h" or "w")
    flipped: str = ""


_PIL_FILTERS = ("bilinear", "bicubic", "lanczos", "box", "hamming", "nearest")
_TORCH_MODES = (
    ("bilinear", True),
    ("bicubic", True),
    ("bilinear", False),
    ("bicubic", False),
    ("area", None),
    ("nearest", None),
    ("nearest-exact", None),
)


def _pil_resize(pixels: np.ndarray, size: tuple[int, int], name: str) -> np.ndarray:
    from PIL import Image

    resample = getattr(Image.Resampling, name.upper())
    image = Image.fromarray(pixels.astype(np.uint8), "RGB")
    return np.asarray(image.resize((size[1], size[0]), resample)).astype(np.float64)


def _torch_resize(pixels: np.ndarray, size: tuple[int, int], mode: str, antialias: bool | None) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    tensor = torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.float32)).permute(2, 0, 1)[None]
    kwargs: dict[str, Any] = {}
    if antialias is not None:
        kwargs = {"align_corners": False, "antialias": antialias}
    out = F.interpolate(tensor, size=size, mode=mode, **kwargs)
    return out[0].permute(1, 2, 0).double().numpy()


#: the interpolations tried first: torchvision's defaults (bilinear, antialiased) and the usual bicubic
_COMMON = ("bilinear, Pillow", "bicubic, Pillow", "bilinear, torch, antialias", "bicubic, torch, antialias")


def _resizes(pixels: np.ndarray, size: tuple[int, int], tier: int) -> Iterator[tuple[str, np.ndarray]]:
    """Resizes of ``pixels`` to ``size``: the common interpolations (tier 0), or all the others (tier 1)."""
    for name in _PIL_FILTERS:
        how = f"{name}, Pillow"
        if (how in _COMMON) == (tier == 0):
            yield how, _pil_resize(pixels, size, name)
    for mode, antialias in _TORCH_MODES:
        aa = "" if antialias is None else (", antialias" if antialias else ", no antialias")
        how = f"{mode}, torch{aa}"
        if (how in _COMMON) == (tier == 0):
            yield how, _torch_resize(pixels, size, mode, antialias)


def _cover_sizes(shape: tuple[int, int], size: tuple[int, int]) -> list[tuple[int, int]]:
    """The sizes a resize that covers ``size`` keeping the aspect may produce (rounded, or truncated as
    torchvision's Resize(int) computes the longer side)."""
    H, W = shape
    h, w = size
    scale = max(h / H, w / W)
    out = {(max(h, round(H * scale)), max(w, round(W * scale)))}
    if H <= W:
        short = h if h / H >= w / W else round(H * scale)
        out.add((short, max(w, int(short * W / H))))
    else:
        short = w if w / W >= h / H else round(W * scale)
        out.add((max(h, int(short * H / W)), short))
    return sorted(s for s in out if s != size and s[0] >= h and s[1] >= w)


def _crops(pixels: np.ndarray, size: tuple[int, int]) -> Iterator[tuple[str, np.ndarray, bool]]:
    """Crops of ``size``: centre crops first (floor and round of the offsets), then every other offset
    (``True`` in the third place: a centre crop)."""
    H, W = pixels.shape[:2]
    h, w = size
    centres = {((H - h) // 2, (W - w) // 2), (int(round((H - h) / 2.0)), int(round((W - w) / 2.0)))}
    for top, left in sorted(centres):
        yield "centre-cropped", pixels[top : top + h, left : left + w], True
    offsets = (H - h + 1) * (W - w + 1)
    if offsets > 4096:
        return
    for top in range(H - h + 1):
        for left in range(W - w + 1):
            if (top, left) not in centres:
                yield f"cropped at ({top}, {left})", pixels[top : top + h, left : left + w], False


def _candidates(member: np.ndarray, size: tuple[int, int], tier: int) -> Iterator[Candidate]:
    """The candidate geometries giving ``size``: tier 0 the exact ones and the common resizes with centre
    crops, tier 1 every other interpolation and crop offset."""
    H, W = member.shape[:2]
    h, w = size
    pixels = member.astype(np.float64)
    if tier == 0:
        if (h, w) == (H, W):
            yield Candidate(pixels, "", "identity", True)
            yield Candidate(pixels[::-1], "flipped vertically", "flip", True, "h")
        if (h, w) == (W, H):
            yield Candidate(pixels.transpose(1, 0, 2), "", "transpose", True)
    if h <= H and w <= W and (h, w) != (H, W):
        for how, crop, centre in _crops(pixels, size):
            if centre == (tier == 0):
                yield Candidate(crop, f"{how} to {h}x{w}", "crop", True)
    if (h, w) == (H, W):
        return
    aspect = abs((w / h) / (W / H) - 1)
    kind = "resize" if aspect <= 0.1 else "stretch"
    for how, resized in _resizes(member, size, tier):
        note = "" if kind == "resize" else f" (aspect ratio {W}:{H} stretched to {w}:{h})"
        yield Candidate(resized, f"resized to {h}x{w} ({how}){note}", kind, how.endswith("Pillow"))
    for cover in _cover_sizes((H, W), size):
        for resize_tier in (0, 1):
            if tier == 0 and resize_tier == 1:
                continue
            for how, resized in _resizes(member, cover, resize_tier):
                for crop_how, crop, centre in _crops(resized, size):
                    if tier == 0 and not centre:
                        continue
                    if tier == 1 and resize_tier == 0 and centre:
                        continue  # tried in tier 0
                    if not centre and (cover[0] - h + 1) * (cover[1] - w + 1) > 64:
                        continue
                    yield Candidate(
                        crop,
                        f"resized to {cover[0]}x{cover[1]} ({how}), {crop_how} to {h}x{w}",
                        "resize",
                        how.endswith("Pillow"),
                    )


# -- fitting -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    candidate: Candidate
    error: float  # mean absolute difference in pixel units
    gains: tuple[float, ...]
    offsets: tuple[float, ...]
    channels: tuple[int, ...]  # the member's channel each output channel follows; (-1,) for luma


def _affine(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float] | None:
    """(gain, offset, mean absolute error in x's units) of the least-squares fit y = gain * x + offset."""
    var = float(x.var())
    if var < 1e-9:
        return None
    gain = float(((x - x.mean()) * (y - y.mean())).mean()) / var
    if abs(gain) < 1e-12:
        return None
    offset = float(y.mean()) - gain * float(x.mean())
    error = float(np.abs((y - offset) / gain - x).mean())
    return gain, offset, error


def _fit(candidate: Candidate, plane: np.ndarray) -> Fit | None:
    """The best per-channel affine fit of ``plane`` ([h, w, c]) on the candidate, over channel orders (and
    luma, for an output whose channels are all grey)."""
    ref = candidate.pixels
    c = plane.shape[2]
    best: Fit | None = None
    orders: list[tuple[int, ...]] = []
    if c == 3:
        orders = [(0, 1, 2), (2, 1, 0)]
        orders += [p for p in itertools.permutations(range(3)) if p not in orders]
    luma = ref @ _LUMA
    for order in [*orders, (-1,) * c]:
        fits = []
        for channel, source in enumerate(order):
            x = luma if source == -1 else ref[:, :, source]
            fitted = _affine(x.reshape(-1), plane[:, :, channel].reshape(-1))
            if fitted is None:
                break
            fits.append(fitted)
        else:
            error = float(np.mean([f[2] for f in fits]))
            if best is None or error < best.error - 1e-9:
                best = Fit(candidate, error, tuple(f[0] for f in fits), tuple(f[1] for f in fits), order)
    return best


def _pointwise(candidate: Candidate, plane: np.ndarray) -> tuple[bool, str] | None:
    """Whether ``plane`` is a pointwise map of the candidate's pixel values (each value always becomes the
    same value), and if so whether that map keeps their order; None where it is no pointwise map."""
    if not candidate.exact or plane.shape[2] != 3:
        return None
    x = np.rint(candidate.pixels).astype(np.int64)
    for channel in range(3):
        keys, y = x[:, :, channel].reshape(-1), plane[:, :, channel].reshape(-1)
        order = np.argsort(keys, kind="stable")
        keys, y = keys[order], y[order]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        means = np.add.reduceat(y, starts) / np.diff(np.r_[starts, len(y)])
        spread = np.abs(y - np.repeat(means, np.diff(np.r_[starts, len(y)]))).max()
        if spread > 1e-3 * max(1.0, float(np.abs(y).max())):
            return None
        falls = np.flatnonzero(np.diff(means) < -1e-6 * max(1.0, float(np.abs(means).max())))
        if len(falls):
            at = int(falls[0])
            low, high = int(keys[starts[at]]), int(keys[starts[at + 1]])
            return False, (
                f"pixel value {low} becomes {means[at]:.4g} but {high} becomes {means[at + 1]:.4g} (channel "
                f"{channel})"
            )
    return True, ""


def _channel_axis_resize(member: np.ndarray, observed: Any) -> str | None:
    """Whether ``observed`` is the member's HWC pixels resized as if they were CHW (``F.interpolate`` on
    an HWC tensor: the height taken for channels, the width and the colours interpolated)."""
    array, _ = _as_array(observed)
    if array is None:
        return None
    squeezed = array.reshape([n for n in array.shape if n != 1]) if 1 in array.shape else array
    H, W, C = member.shape
    if squeezed.ndim != 3 or squeezed.shape[0] != H or squeezed.shape[1:] == (W, C):
        return None
    size = tuple(int(n) for n in squeezed.shape[1:])
    import torch
    import torch.nn.functional as F

    tensor = torch.from_numpy(np.ascontiguousarray(member, dtype=np.float32))[None]  # [1, H, W, C]
    y = squeezed.astype(np.float64).reshape(-1)
    for mode, antialias in _TORCH_MODES:
        kwargs: dict[str, Any] = {} if antialias is None else {"align_corners": False, "antialias": antialias}
        try:
            resized = F.interpolate(tensor, size=size, mode=mode, **kwargs)[0].double().numpy().reshape(-1)
        except (RuntimeError, ValueError):
            continue
        fitted = _affine(resized, y)
        if fitted is not None and fitted[2] <= TOLERANCE:
            return f"{mode}{'' if antialias is None else ', antialias' if antialias else ''}"
    return None


#: a fit this close ends the search (the rounding of a uint8 result is at most 0.5)
GOOD_ENOUGH = 0.6


def _searched(member: np.ndarray, planes: Sequence[Plane], tier: int) -> Iterator[tuple[Plane, Candidate]]:
    """(plane, candidate) pairs to fit: each plane as it is, then mirrored along its width (a horizontal
    flip composes with any geometry: the candidate is then the flipped one)."""
    for plane in planes:
        for candidate in _candidates(member, plane.pixels.shape[:2], tier):
            yield plane, candidate
    for plane in planes:
        mirrored = Plane(plane.pixels[:, ::-1], plane.layout, plane.width_axis, plane.dtype, plane.unit_axes)
        for candidate in _candidates(member, plane.pixels.shape[:2], tier):
            if candidate.kind != "flip":
                flipped = (
                    f"{candidate.how}, flipped horizontally" if candidate.how else "flipped horizontally"
                )
                yield mirrored, Candidate(candidate.pixels, flipped, "flip", candidate.exact, "w")
    # height and width swapped after the geometry (a permute with the wrong axis order): read back transposed
    for plane in planes:
        swapped = Plane(
            plane.pixels.transpose(1, 0, 2), plane.layout, plane.width_axis, plane.dtype, plane.unit_axes
        )
        for candidate in _candidates(member, swapped.pixels.shape[:2], tier):
            if candidate.kind not in ("flip", "transpose"):
                yield swapped, Candidate(candidate.pixels, candidate.how, "transpose", candidate.exact)


# -- the form ----------------------------------------------------------------------------------------------------


def image_form(
    member: np.ndarray,
    observed: Any,
    *,
    declared: Any = None,
) -> Form | None:
    """How ``observed`` holds the image ``member`` (pixels ``[H, W, 3]`` uint8), or None where it cannot be
    read as an image at all (the caller decides: a field that depends on the member but is no image is an
    unrecognised transform). ``declared``: the field's declared transform
    (:class:`~primus_energon.conformance.core.declarations.Transform`), if any."""
    declared_norm = None
    if declared is not None and getattr(declared, "kind", None) == "normalize":
        declared_norm = Normalisation(tuple(declared.mean), tuple(declared.std))
    planes = image_planes(observed)
    if not planes:
        how = _channel_axis_resize(member, observed)
        if how:
            return Form(
                "corrupted",
                f"resized along its colour axis (interpolate on an HWC image as if it were CHW: {how}); "
                "the result mixes colours and columns",
                cause="resized along the colour axis",
            )
        return None
    best: Fit | None = None
    best_plane: Plane | None = None
    pointwise: tuple[Candidate, Plane, str] | None = None
    for tier in (0, 1):
        for plane, candidate in _searched(member, planes, tier):
            fit = _fit(candidate, plane.pixels)
            if fit is not None and (best is None or fit.error < best.error - 1e-9):
                best, best_plane = fit, plane
            if best is not None and best.error <= GOOD_ENOUGH:
                break
            if pointwise is None:
                mapped = _pointwise(candidate, plane.pixels)
                if mapped is not None and not mapped[0]:
                    pointwise = (candidate, plane, mapped[1])
        if best is not None and best.error <= TOLERANCE:
            break
    if best is None or best.error > TOLERANCE:
        if pointwise is not None:
            candidate, plane, where = pointwise
            return Form(
                "corrupted",
                _join(
                    plane.layout if plane.layout != "HWC" else "",
                    candidate.how,
                    f"values wrap around ({where}: uint8 arithmetic overflowing?)",
                ),
                cause="values wrap around",
            )
        how = _channel_axis_resize(member, observed)
        if how:
            return Form(
                "corrupted",
                f"resized along its colour axis (interpolate on an HWC image as if it were CHW: {how})",
                cause="resized along the colour axis",
            )
        near = (
            f" (nearest: {best.candidate.how or 'as it is'}, off by {best.error:.3g} of 255)" if best else ""
        )
        return Form(
            "unrecognised",
            f"an image transformed in a way the suite does not recognise{near}",
            # an image laid out as one, whose content no fixed geometry explains: a random resized crop is
            # the usual deliberate cause
            declaration="crop mode=random" if best is not None and best.error < 40 else None,
        )
    return _describe(best, best_plane, member, declared, declared_norm)


def _describe(
    fit: Fit, plane: Plane, member: np.ndarray, declared: Any, declared_norm: Normalisation | None
) -> Form:
    candidate = fit.candidate
    parts = []
    if plane.layout == "CHW":
        parts.append("CHW")
    if plane.unit_axes:
        parts.append(f"{plane.unit_axes} unit axis" + ("es" if plane.unit_axes > 1 else ""))
    if candidate.how:
        parts.append(candidate.how)
    if fit.channels == (-1,) * len(fit.channels) and _has_colour(member):
        return Form(
            "corrupted",
            _join(*parts, "converted to grey: the colour is lost"),
            cause="colour lost",
        )
    if candidate.kind == "transpose":
        return Form(
            "corrupted",
            _join(*parts, "then height and width swapped (a permute with the wrong axis order?)"),
            cause="transposed",
        )
    norm = fit_normalisation(fit.gains, fit.offsets)
    if any(g < 0 for g in fit.gains):
        return Form("unrecognised", _join(*parts, f"inverted ({norm.describe()})"))
    verdict, words, cause = _judge_normalisation(norm, declared_norm)
    if words:
        parts.append(words)
    if plane.dtype not in ("uint8",) and norm.raw:
        parts.append(f"as {plane.dtype}")
    how = _join(*parts) or "as it is"
    if verdict == "corrupted":
        return Form("corrupted", how, cause=cause)
    if fit.channels[:3] not in ((0, 1, 2), (0,), (0, 1)) and fit.channels[0] != -1:
        return Form("unrecognised", _join(how, f"channels reordered {fit.channels}"))
    if candidate.kind == "flip":
        axis = plane.width_axis if candidate.flipped == "w" else plane.width_axis - 1
        if declared is not None and declared.kind == "flip" and declared.axis == axis:
            return Form("declared", how, cause="flipped")
        return Form("undeclared", how, declaration=f"flip axis={axis} rate=RATE", cause="flipped")
    if verdict == "unrecognised":
        return Form("unrecognised", how, declaration=norm.declaration())
    if candidate.kind == "stretch":
        if declared is not None and declared.kind == "resize" and declared.mode == "stretch":
            return Form("declared", how, cause="resized")
        h, w = candidate.pixels.shape[:2]
        return Form("unrecognised", how, declaration=f"resize height={h} width={w} mode=stretch")
    if verdict == "declared" or (
        declared is not None and declared.kind in ("resize", "crop") and candidate.how
    ):
        return Form("declared", how)
    return Form("kept", how)


def _has_colour(member: np.ndarray) -> bool:
    """Whether the member's channels differ (a grey image stored as RGB loses nothing to a grey output)."""
    return (
        member.ndim == 3
        and member.shape[2] >= 3
        and not (
            np.array_equal(member[:, :, 0], member[:, :, 1])
            and np.array_equal(member[:, :, 1], member[:, :, 2])
        )
    )


def _join(*parts: str) -> str:
    return ", ".join(p for p in parts if p)
