"""The code-execution probe: its payloads run (only a marker file) when unpickled and are refused by safe
readers; the verdict names the member, the sample, what ran it and in which environment."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from megatron.energon import Cooker, DefaultTaskEncoder, SampleDecoder

from primus_energon import read_tensor
from primus_energon.conformance import check_cooker, check_task_encoder
from primus_energon.conformance.properties._probe import (
    PROBE_DIR_VARIABLE,
    _ran_by,
    environment,
    hostile_bytes,
    read_findings,
)
from tests.conformance_zoo.broken import cook_accepts_decoded


@pytest.mark.parametrize(
    "member", ["latents.pth", "payload.pickle", "payload.pyd", "payload.npy", "caption.txt"]
)
def test_hostile_bytes_run_only_when_unpickled(member: str, tmp_path: Path) -> None:
    data = hostile_bytes(member, f"k--{member}", str(tmp_path / "fallback"))
    markers = tmp_path / "markers"
    with environment({PROBE_DIR_VARIABLE: str(markers)}):
        if member.endswith(".pth"):
            with pytest.raises(pickle.UnpicklingError):
                torch.load(io.BytesIO(data), weights_only=True)
            with pytest.raises(ValueError):
                read_tensor(data)
            assert not markers.exists()
            torch.load(io.BytesIO(data), weights_only=False)  # noqa: S614 (the test's own benign payload)
        elif member.endswith(".npy"):
            with pytest.raises(ValueError):
                np.load(io.BytesIO(data), allow_pickle=False)
            assert not markers.exists()
            np.load(io.BytesIO(data), allow_pickle=True)  # noqa: S301
        else:
            pickle.loads(data)  # noqa: S301 (the test's own benign payload)
    (finding,) = read_findings(markers, "default")
    assert (finding.key, finding.member) == ("k", member)
    assert "test_conformance_probe.py" in finding.stack


def test_the_stack_tells_a_decoder_from_the_targets_own_load() -> None:
    decoder_stack = (
        '  File "/x/site-packages/megatron/energon/flavors/webdataset/sample_decoder.py", line 140, in __call__\n'
        '  File "/x/site-packages/webdataset/autodecode.py", line 120, in torch_loads\n'
        '  File "/x/site-packages/torch/serialization.py", line 1500, in load\n'
    )
    assert _ran_by(decoder_stack)[0] == "decoder"
    own_stack = (
        '  File "/x/site-packages/megatron/energon/task_encoder/base.py", line 420, in cook_crude_sample\n'
        '  File "/home/u/mypkg/cookers.py", line 12, in cook\n'
        '  File "/x/site-packages/torch/serialization.py", line 1500, in load\n'
    )
    assert _ran_by(own_stack) == ("target", "the target's own code at /home/u/mypkg/cookers.py:12 (in cook)")


def test_torch_load_without_weights_only_is_caught_only_under_the_override(tmp_path: Path) -> None:
    (result,) = check_cooker(
        "tests.conformance_zoo.broken:cook_default_torch_load",
        properties=["bad_input"],
        profile="quick",
        workdir=tmp_path,
        encoding="preencoded",
    )
    claim = result.claim("bad_input/code_execution")
    assert claim.verdict == "fail", claim.message
    assert "only with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1" in claim.message
    assert (
        "tests/conformance_zoo/broken.py:" in claim.message
        and "pass weights_only=True explicitly" in claim.message
    )
    assert "'latents.pth'" in claim.message and "payload" not in claim.message


def test_energons_default_decoder_is_named_with_every_member_it_ran(tmp_path: Path) -> None:
    (result,) = check_task_encoder(
        "tests.conformance_zoo.broken:DefaultDecoderTaskEncoder",
        properties=["bad_input"],
        profile="quick",
        workdir=tmp_path,
    )
    claim = result.claim("bad_input/code_execution")
    assert claim.verdict == "fail" and "the TaskEncoder's decoder" in claim.message
    for member in ("latents.pth", "payload.pth", "payload.pickle", "payload.pyd"):
        assert f"'{member}'" in claim.message, claim.message
    assert "payload.npy" not in claim.message  # webdataset's .npy handler does not unpickle
    assert "in the default environment and with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1" in claim.message
    assert claim.examined == 16


def test_a_target_no_fresh_process_can_rebuild_is_probed_in_process(tmp_path: Path) -> None:
    """The probe is never skipped: an object defined here cannot be imported by a child, so it runs here."""

    class LocalDefaultDecoder(DefaultTaskEncoder):
        decoder = SampleDecoder(image_decode="pil")
        cookers = [Cooker(cook_accepts_decoded, has_subflavors={"encoding": "preencoded"})]

    (result,) = check_task_encoder(
        LocalDefaultDecoder(), properties=["bad_input"], profile="quick", workdir=tmp_path
    )
    claim = result.claim("bad_input/code_execution")
    assert claim.verdict == "fail" and "the TaskEncoder's decoder" in claim.message, claim.message
    assert result.details["probe"]["process"].startswith("in-process")
