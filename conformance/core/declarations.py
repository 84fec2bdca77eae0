"""Declared transforms: deliberate changes of one field that the suite checks instead of calling them loss.

A target may change a field on purpose: classifier-free-guidance caption dropout (the caption replaced by
``""`` for 10 % of the samples), a seeded horizontal flip, T5 embeddings truncated to a configured length, a
cast to bfloat16. Undeclared, each of these is data that differs from the member it came from, and the data
claims fail it (their message names the declaration that would express the change). Declared, the value in
that field must be the member's value or its declared transform, and the ``transforms`` property checks the
declaration itself: the rate, the same draw for the same sample and seed, a new draw for a new per-sample
seed, and no other field changed with it.

One declaration is one line, ``FIELD: KIND [NAME=VALUE ...]`` (values are Python literals, or a bare word)::

    caption: dropout rate=0.1 to=""          # CFG: the caption replaced by "" for 10 % of the samples
    prompt_embeds: dropout rate=0.1 to=zeros # ... the embeddings by zeros of the same shape
    prompt_embeds: dropout rate=0.1 to=constant  # ... by one fixed tensor (an empty prompt's embedding)
    latents: flip axis=-1 rate=0.5           # a seeded horizontal flip
    prompt_embeds: truncate axis=0 length=77 # only the first 77 rows, when there are more
    latents: cast dtype=bfloat16             # every value cast
    pixel_values: normalize mean=[0.5] std=[0.5]  # (x / 255 - mean) / std, per channel
    pixel_values: resize mode=stretch        # resized to the field's size, the aspect ratio not kept
    pixel_values: crop mode=random           # a crop whose box is drawn from Energon's per-sample seed
    input_ids: tokenize max_length=77        # the caption tokenised, cut to 77 ids

given on the command line (``--conformance-transform LINE``, repeatable), in ``pyproject.toml``
(``conformance_transforms`` under ``[tool.pytest.ini_options]``, one line each) or to the Python API
(``check_task_encoder(..., transforms=[LINE, ...])``). ``FIELD`` is the output field (a dotted path for a
nested one: ``metadata.caption``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Transform",
    "KINDS",
    "parse_transform",
    "parse_transforms",
    "declaration_hint",
    "what_changed",
    "field_transform",
    "DROPOUT_WORDS",
    "FLOAT_DTYPES",
    "FORM_KINDS",
]

#: what each kind of transform takes: (required parameters, {optional parameter: default})
KINDS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "dropout": (("rate", "to"), {}),
    "flip": ((), {"axis": -1, "rate": 0.5}),
    "truncate": (("length",), {"axis": 0}),
    "cast": (("dtype",), {}),
    "normalize": (("mean", "std"), {}),
    "resize": ((), {"mode": "keep"}),
    "crop": ((), {"mode": "center"}),
    "tokenize": ((), {"max_length": None}),
}

#: kinds whose result the suite cannot compute from the clean value alone: the data judge recognises them
#: (a normalisation, a resize, a crop, token ids) and checks what a declaration adds
FORM_KINDS = ("normalize", "resize", "crop", "tokenize")
#: the modes ``resize`` and ``crop`` take
RESIZE_MODES = ("keep", "stretch")
CROP_MODES = ("center", "random")

#: the values ``dropout to=`` names with a word (any other value is a Python literal: "", 0, None, -1.0)
DROPOUT_WORDS = ("zeros", "constant")

#: the dtypes ``cast dtype=`` names (torch's own names)
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_LINE = re.compile(r"^\s*(?P<field>[A-Za-z_][\w.\[\]]*)\s*:\s*(?P<kind>\w+)(?P<rest>.*)$")


@dataclass(frozen=True)
class Transform:
    """One declared transform of one field. ``rate``: the share of samples it applies to (dropout, flip;
    None: every sample it can apply to, for truncate and cast)."""

    field: str
    kind: str
    rate: float | None = None
    to: Any = None
    axis: int = 0
    length: int | None = None
    dtype: str | None = None
    #: normalize: per-channel mean and std on [0, 1] pixels (one value for every channel)
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    #: resize: "keep" (the aspect ratio) or "stretch"; crop: "center" or "random"
    mode: str = ""
    max_length: int | None = None
    text: str = ""

    def __str__(self) -> str:
        """The declaration as one line (parsed back by :func:`parse_transform` to an equal Transform)."""
        if self.text:
            return self.text
        params = {
            "dropout": {"rate": self.rate, "to": self.to},
            "flip": {"axis": self.axis, "rate": self.rate},
            "truncate": {"axis": self.axis, "length": self.length},
            "cast": {"dtype": self.dtype},
            "normalize": {"mean": list(self.mean), "std": list(self.std)},
            "resize": {"mode": self.mode},
            "crop": {"mode": self.mode},
            "tokenize": {"max_length": self.max_length},
        }[self.kind]
        words = []
        for name, value in params.items():
            bare = name in ("dtype", "mode") or (name == "to" and value in DROPOUT_WORDS)
            words.append(f"{name}={value if bare else repr(value)}")
        return f"{self.field}: {self.kind} {' '.join(words)}"

    def covers(self, path: str) -> bool:
        """Whether a payload at ``path`` (``caption``, ``metadata.caption``, ``latents[0]``) is this field's."""
        path = path or ""
        return path == self.field or path.startswith((f"{self.field}.", f"{self.field}["))

    @property
    def traceable(self) -> bool:
        """Whether the transformed value can be computed from the clean one (and so found by value); a
        dropout to None or to an unknown constant cannot (the transforms property judges it)."""
        return self.kind not in FORM_KINDS and not (
            self.kind == "dropout" and (self.to is None or self.to == "constant")
        )


def parse_transform(line: str) -> Transform:
    """One declaration line; ``ValueError`` saying what is wrong and what a declaration looks like."""
    match = _LINE.match(line or "")
    example = "for example 'caption: dropout rate=0.1 to=\"\"' or 'latents: flip axis=-1 rate=0.5'"
    if not match:
        raise ValueError(f"transform {line!r}: write FIELD: KIND [NAME=VALUE ...], {example}")
    field_name, kind, rest = match["field"], match["kind"], match["rest"].strip()
    if kind not in KINDS:
        raise ValueError(f"transform {line!r}: unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    required, defaults = KINDS[kind]
    params: dict[str, Any] = dict(defaults)
    for name, value in _pairs(line, rest):
        if name not in required and name not in defaults:
            known = ", ".join((*required, *defaults)) or "none"
            raise ValueError(f"transform {line!r}: {kind} takes no {name!r} (it takes {known})")
        params[name] = value
    missing = [name for name in required if name not in params]
    if missing:
        raise ValueError(f"transform {line!r}: {kind} needs {', '.join(n + '=' for n in missing)}; {example}")
    return _checked(line, field_name, kind, params)


def _pairs(line: str, rest: str) -> Iterable[tuple[str, Any]]:
    # shlex-like split that keeps quoted literals whole: to="" and to='a b'
    for match in re.finditer(r"(\w+)\s*=\s*(\"[^\"]*\"|'[^']*'|\[[^\]]*\]|\([^)]*\)|[^\s]+)|(\S+)", rest):
        if match[3] is not None:
            raise ValueError(f"transform {line!r}: {match[3]!r} is not NAME=VALUE")
        name, raw = match[1], match[2]
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw  # a bare word: zeros, constant, bfloat16
        yield name, value


def _checked(line: str, field_name: str, kind: str, params: dict[str, Any]) -> Transform:
    def bad(why: str) -> ValueError:
        return ValueError(f"transform {line!r}: {why}")

    rate = params.get("rate")
    if rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise bad(f"rate must be a number in (0, 1], not {rate!r}")
        rate = float(rate)
    axis = params.get("axis", 0)
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise bad(f"axis must be an integer, not {axis!r}")
    length = params.get("length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 0):
        raise bad(f"length must be a non-negative integer, not {length!r}")
    dtype = params.get("dtype")
    if kind == "cast" and dtype not in FLOAT_DTYPES:
        raise bad(f"dtype must be one of {', '.join(FLOAT_DTYPES)}, not {dtype!r}")
    mean, std = params.get("mean"), params.get("std")
    if kind == "normalize":
        mean, std = _channels(line, "mean", mean), _channels(line, "std", std)
        if any(v <= 0 for v in std):
            raise bad(f"std must be positive, not {list(std)}")
    mode = params.get("mode") or ""
    if kind == "resize" and mode not in RESIZE_MODES:
        raise bad(f"mode must be one of {', '.join(RESIZE_MODES)}, not {mode!r}")
    if kind == "crop" and mode not in CROP_MODES:
        raise bad(f"mode must be one of {', '.join(CROP_MODES)}, not {mode!r}")
    max_length = params.get("max_length")
    if max_length is not None and (
        isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1
    ):
        raise bad(f"max_length must be a positive integer, not {max_length!r}")
    to = params.get("to")
    if kind == "dropout" and not (
        to is None or isinstance(to, (str, int, float)) and not isinstance(to, bool)
    ):
        raise bad(f'to must be a text (""), a number, None, zeros or constant, not {to!r}')
    if kind == "dropout" and isinstance(to, str) and to not in DROPOUT_WORDS and not _quoted(line, to):
        raise bad(f'to={to} is neither a quoted text (to="{to}") nor one of {", ".join(DROPOUT_WORDS)}')
    return Transform(
        field=field_name,
        kind=kind,
        rate=rate if kind in ("dropout", "flip") else None,
        to=to,
        axis=axis,
        length=length,
        dtype=dtype,
        mean=tuple(mean) if kind == "normalize" else (),
        std=tuple(std) if kind == "normalize" else (),
        mode=mode if kind in ("resize", "crop") else "",
        max_length=max_length if kind == "tokenize" else None,
        text=" ".join(line.split()),
    )


def _channels(line: str, name: str, value: Any) -> tuple[float, ...]:
    """A per-channel list of numbers (one number, or a list of 1, 3 or 4)."""
    values = [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if (
        not isinstance(values, (list, tuple))
        or len(values) not in (1, 3, 4)
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    ):
        raise ValueError(
            f"transform {line!r}: {name} must be a number or a list of 1, 3 or 4 numbers, as torchvision's "
            f"Normalize takes them (e.g. {name}=[0.5] or {name}=[0.485, 0.456, 0.406]), not {value!r}"
        )
    return tuple(float(v) for v in values)


def _quoted(line: str, text: str) -> bool:
    return f'"{text}"' in line or f"'{text}'" in line


def parse_transforms(lines: Iterable[str | Transform] | str | None) -> tuple[Transform, ...]:
    """Every declaration (lines, Transform objects, or one text of lines; blank lines and ``#`` comments
    skipped); ``ValueError`` for the first bad one. Two declarations of one field are refused: their order
    would be a guess."""
    if lines is None:
        return ()
    if isinstance(lines, str):
        lines = lines.splitlines()
    out: list[Transform] = []
    for item in lines:
        if isinstance(item, Transform):
            out.append(item)
            continue
        text = item.split("#", 1)[0].strip() if "#" in item and not _in_quotes(item) else item.strip()
        if text:
            out.append(parse_transform(text))
    fields = [t.field for t in out]
    twice = sorted({f for f in fields if fields.count(f) > 1})
    if twice:
        raise ValueError(
            f"transforms: field(s) {twice} declared more than once; declare one transform per field"
        )
    return tuple(out)


def _in_quotes(line: str) -> bool:
    head = line.split("#", 1)[0]
    return head.count('"') % 2 == 1 or head.count("'") % 2 == 1


def what_changed(recognised: str) -> str:
    """What a recognised change (see :func:`recognise`) did, in words: "it flipped along axis -1"."""
    kind, _, rest = recognised.partition(" ")
    params = dict(re.findall(r"(\w+)=(\S+)", rest))
    if kind == "dropout":
        return f"{params.get('to', '?')} (a dropout)"
    if kind == "flip":
        return f"it flipped along axis {params.get('axis')}"
    if kind == "truncate":
        along = f" along axis {params['axis']}" if "axis" in params else ""
        return f"it truncated to {params.get('length')}{along}"
    if kind == "cast":
        return f"it cast to {params.get('dtype')}"
    return recognised


def declaration_hint(field_name: str, recognised: str, rate: float | None = None) -> str:
    """The sentence a message ends with when a change looks deliberate: the declaration that expresses it."""
    tail = recognised if rate is None else recognised.replace("RATE", f"{rate:.3g}")
    line = f"{field_name}: {tail}"
    rate_note = " with RATE the share of samples it applies to" if "RATE" in line else ""
    return (
        f"if this is deliberate, declare it: --conformance-transform '{line}'{rate_note} (or that line under "
        "conformance_transforms in [tool.pytest.ini_options]); undeclared, it is data the model never sees"
    )


def field_transform(transforms: Sequence[Transform], path: str) -> Transform | None:
    """The declaration that covers a payload at ``path``, if any."""
    for transform in transforms:
        if transform.covers(path):
            return transform
    return None
