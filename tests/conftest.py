"""Shared, session-scoped datasets written by the synthetic generator into temporary directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_energon.synthetic import generate_dataset
from tests.helpers import SMALL_SHAPES


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One conformance workspace per test process (``workdir=`` of the check functions): the datasets the
    suite generates are named by their contents and made once, whichever test asks first. Each check's own
    files (probe markers, record sinks, child outputs) stay per check, as in a user's run."""
    return tmp_path_factory.mktemp("conformance-workspace")


@pytest.fixture(scope="session")
def preencoded_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 clean preencoded samples in 4 shards of 6, small float32 tensors."""
    out = tmp_path_factory.mktemp("data") / "preencoded"
    generate_dataset(out, encoding="preencoded", num_samples=24, shard_size=6, seed=1, shapes=SMALL_SHAPES)
    return out


@pytest.fixture(scope="session")
def raw_datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One clean raw dataset per image member name: jpg, jpeg, png, webp."""
    root = tmp_path_factory.mktemp("raw")
    out = {}
    for image_format in ("jpg", "jpeg", "png", "webp"):
        out[image_format] = root / image_format
        generate_dataset(
            out[image_format],
            encoding="raw",
            num_samples=8,
            shard_size=4,
            seed=2,
            image_format=image_format,
            image_size=(24, 32),
        )
    return out
