"""Deterministic captions that look like real ones: varied length, non-ASCII words, occasional very long text."""

from __future__ import annotations

import numpy as np

from .schema import TextSpec

__all__ = ["NON_ASCII_PHRASES", "make_caption"]

_SUBJECTS = (
    "a red fox",
    "an old lighthouse",
    "a bowl of ramen",
    "two cyclists",
    "a glass teapot",
    "a sleeping cat",
    "a wooden sailboat",
    "a crowded street market",
    "a snow-covered cabin",
    "an astronaut",
    "a vintage typewriter",
    "a field of sunflowers",
    "a golden retriever",
    "a steam locomotive",
    "a bonsai tree",
    "a city skyline",
    "a plate of dumplings",
    "a portrait of an elderly woman",
    "a mountain lake",
    "a neon-lit alley",
)
_ADJECTIVES = (
    "misty",
    "vibrant",
    "quiet",
    "weathered",
    "minimalist",
    "ornate",
    "sunlit",
    "rain-soaked",
    "cozy",
    "surreal",
    "colorful",
    "moody",
    "tiny",
    "enormous",
    "ancient",
    "futuristic",
)
_PLACES = (
    "at dusk",
    "in the rain",
    "on a sunny beach",
    "in a forest clearing",
    "under the northern lights",
    "on a busy sidewalk",
    "in a sunlit kitchen",
    "at the edge of a cliff",
    "inside a greenhouse",
    "at midnight",
)
_STYLES = (
    "35mm photo",
    "watercolor",
    "oil painting",
    "studio lighting",
    "shallow depth of field",
    "highly detailed",
    "bokeh",
    "isometric illustration",
    "film grain",
    "golden hour",
    "8k",
    "soft pastel colors",
    "wide angle",
)
#: phrases in several scripts; odd-indexed samples get at least one of them
NON_ASCII_PHRASES = (
    "café",
    "crème brûlée",
    "Zürich",
    "São Paulo",
    "Kraków",
    "smørrebrød",
    "piñata",
    "naïve",
    "façade",
    "jalapeño",
    "Ærøskøbing",
    "東京の夜景",
    "富士山",
    "こんにちは",
    "서울의 거리",
    "Москва зимой",
    "Ελληνικό νησί",
    "مرحبا بالعالم",
    "שלום",
    "हिन्दी पाठ",
    "🌸",
    "🚲 ride",
    "Ω-shaped",
    "naïveté",
    "Ünïcödé",
)


def _pick(rng: np.random.Generator, items: tuple[str, ...]) -> str:
    return items[int(rng.integers(len(items)))]


def _phrase(rng: np.random.Generator) -> str:
    return f"{_pick(rng, _ADJECTIVES)} {_pick(rng, _SUBJECTS)} {_pick(rng, _PLACES)}, {_pick(rng, _STYLES)}"


def make_caption(spec: TextSpec, index: int, rng: np.random.Generator) -> str:
    """The caption of sample `index`: ASCII for even indices unless `rng` adds non-ASCII words, at least one
    non-ASCII phrase for odd indices (when `spec.non_ascii`), and at least `spec.long_words` words when
    ``index % spec.long_every == 1 % spec.long_every`` (when `spec.long_every` > 0)."""
    long = spec.long_every > 0 and index % spec.long_every == 1 % spec.long_every
    target = spec.long_words if long else int(rng.integers(spec.min_words, spec.max_words + 1))
    words: list[str] = []
    while len(words) < target:
        words.extend(_phrase(rng).split())
        if long:
            words[-1] += "."
    words = words[: max(target, spec.min_words)]
    if spec.non_ascii and (index % 2 == 1 or rng.random() < 0.25):
        for _ in range(int(rng.integers(1, 4))):
            words.insert(int(rng.integers(len(words) + 1)), _pick(rng, NON_ASCII_PHRASES))
    text = " ".join(words)
    return text[0].upper() + text[1:]
