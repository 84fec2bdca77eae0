"""A shard is untrusted input: no path through the reference code may unpickle a payload's objects.

Each test uses a real shard whose ``latents.pth`` would create a marker file if it were unpickled
with ``weights_only=False``. ``test_payload_is_live`` proves the payload really runs through
Energon's default decoder, so the other tests' "marker never appears" can fail.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from megatron.energon import SampleDecoder

from primus_energon import (
    EncodedDiffusionTaskEncoder,
    MultiFormatTaskEncoder,
    PayloadDecodeError,
    RawDiffusionTaskEncoder,
    SafeDecodingTaskEncoder,
    cook_preencoded_diffusion,
    cook_preencoded_diffusion_zero_copy,
    get_loader,
)
from primus_energon.energon_compat import key_in_shard
from primus_energon.synthetic import generate_dataset, write_metadataset
from tests.helpers import SMALL_SHAPES, crude_samples

# Every switch that could turn unsafe unpickling back on; the tests run with all of them set.
UNSAFE_ENV = {"WDS_PYTORCH_WEIGHTS_ONLY": "0", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}


def _malicious(root: Path) -> tuple[Path, Path, str, str]:
    """A preencoded dataset whose one malicious member would create ``marker``: (dataset, marker, key, member)."""
    marker = root / "MARKER_payload_ran"
    dataset = root / "malicious"
    manifest = generate_dataset(
        dataset,
        encoding="preencoded",
        num_samples=8,
        shard_size=4,
        seed=5,
        shapes=SMALL_SHAPES,
        faults={"malicious-pickle": 1},
        marker_path=marker,
    )
    (fault,) = [f for f in manifest.faults if f.kind == "malicious-pickle"]
    return dataset, marker, fault.key, fault.member


@pytest.fixture
def unsafe_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in UNSAFE_ENV.items():
        monkeypatch.setenv(name, value)


def test_payload_is_live_through_energons_default_decoder(tmp_path: Path) -> None:
    """The deliberately unsafe path (Energon's default SampleDecoder) runs the payload: the threat is real."""
    dataset, marker, _, _ = _malicious(tmp_path)
    script = textwrap.dedent(
        f"""
        from tests.helpers import crude_samples
        crude_samples({str(dataset)!r}, decoded=True)
        """
    )
    subprocess.run(
        [sys.executable, "-c", script], cwd=Path(__file__).parents[1], check=False, capture_output=True
    )
    assert marker.exists(), (
        "the malicious payload did not run through the default decoder; the safety tests prove nothing"
    )


@pytest.mark.parametrize("cook", [cook_preencoded_diffusion, cook_preencoded_diffusion_zero_copy])
def test_bare_cooker_refuses_payload(tmp_path: Path, unsafe_env: None, cook: Callable[[dict], Any]) -> None:
    dataset, marker, key, member = _malicious(tmp_path)
    (sample,) = [s for s in crude_samples(dataset) if key_in_shard(s["__key__"]) == key]
    key = sample["__key__"]  # as Energon names it (on 7.0-7.2 with its shard in front)
    with pytest.raises(PayloadDecodeError) as caught:
        cook(sample)
    assert (caught.value.key, caught.value.member) == (key, member)
    assert (
        repr(key) in str(caught.value)
        and repr(member) in str(caught.value)
        and "run code" in str(caught.value)
    )
    assert "weights_only=False" not in str(caught.value), "the error must not advise unsafe loading"
    assert not marker.exists()


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("task_encoder", [EncodedDiffusionTaskEncoder, MultiFormatTaskEncoder])
def test_full_loading_path_refuses_payload(
    tmp_path: Path, unsafe_env: None, task_encoder: type, num_workers: int
) -> None:
    dataset, marker, key, member = _malicious(tmp_path)
    (key,) = [s["__key__"] for s in crude_samples(dataset) if key_in_shard(s["__key__"]) == key]
    loader = get_loader(
        dataset, task_encoder, batch_size=2, num_workers=num_workers, mode="val", split_part="train"
    )
    with loader, pytest.raises(PayloadDecodeError) as caught:
        for _ in range(8):
            next(loader)
    # From a worker process torch re-creates the error from its message, so check the message.
    assert repr(key) in str(caught.value) and repr(member) in str(caught.value)
    assert not marker.exists()


def test_skip_mode_skips_only_the_malicious_sample(tmp_path: Path, unsafe_env: None) -> None:
    dataset, marker, key, member = _malicious(tmp_path)
    (key,) = [s["__key__"] for s in crude_samples(dataset) if key_in_shard(s["__key__"]) == key]
    loader = get_loader(
        dataset,
        EncodedDiffusionTaskEncoder,
        batch_size=1,
        num_workers=0,
        mode="val",
        split_part="train",
        on_error="skip",
    )
    keys = [batch["__key__"][0] for batch in loader.dataloader]
    assert len(keys) == 7 and key not in keys
    assert not marker.exists()


def test_raw_task_encoder_never_decodes_tensor_members(tmp_path: Path, unsafe_env: None) -> None:
    """Route the malicious preencoded dataset to the raw cooker: its .pth members must stay bytes."""
    dataset, marker, _, _ = _malicious(tmp_path)
    blend = write_metadataset(tmp_path / "as_raw.yaml", [(dataset, 1.0, {"encoding": "raw"})])
    loader = get_loader(
        blend,
        RawDiffusionTaskEncoder,
        batch_size=1,
        num_workers=0,
        mode="val",
        split_part="train",
        on_error="skip",
    )
    # Every sample reaches the raw cooker (and fails there: no image), the malicious one included.
    assert list(loader.dataloader) == []
    assert not marker.exists()


def test_decoder_cannot_be_switched_on() -> None:
    with pytest.raises(TypeError, match="must not set a decoder"):

        class Unsafe(EncodedDiffusionTaskEncoder):
            decoder = SampleDecoder()

    encoder = EncodedDiffusionTaskEncoder()
    with pytest.raises(TypeError, match="must not set a decoder"):
        encoder.decoder = SampleDecoder(image_decode="pil")
    assert encoder.decoder is None
    assert issubclass(MultiFormatTaskEncoder, SafeDecodingTaskEncoder)


def test_energons_deprecated_decoder_kwargs_cannot_switch_it_on(preencoded_dataset: Path) -> None:
    from megatron.energon import WorkerConfig, get_train_dataset

    encoder = EncodedDiffusionTaskEncoder()
    # Energon asserts (its decoder is not the default one) before it would call the setter that raises.
    with pytest.raises((TypeError, AssertionError), match="decoder"):
        get_train_dataset(
            preencoded_dataset,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
            batch_size=1,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            task_encoder=encoder,
            image_decode="pil",
        )
    assert encoder.decoder is None
