"""The compatibility layer's rules, on the installed release (7.4 here; tests/test_energon_releases.py runs the
project on 5.2.0, 6.0.1 and 7.0.0): the dispatch oracle's filters, the stages a TaskEncoder's pipeline runs,
the base fields of a sample, savable-loader settings, and a declared decoder."""

from __future__ import annotations

import types

import pytest
from megatron.energon import DefaultTaskEncoder, Sample, TaskEncoder, stateless

from primus_energon import DiffusionSample, EncodedDiffusionTaskEncoder
from primus_energon.conformance.engine.calls import dataset_sample, matching_cooker
from primus_energon.energon_compat import (
    DECODES_IN_DATASET,
    NO_COOKER_ERRORS,
    SAMPLE_BASE_FIELDS,
    TASK_ENCODER_STAGES,
    cooker_filters,
    declares_decoder,
    is_no_cooker_error,
    missing_decoding_dependency,
    overrides,
    savable_loader,
    training_decoder,
)


def _cooker(has_subflavors=None, is_subflavor=None, condition=None) -> types.SimpleNamespace:
    """A cooker with the filters of Energon 5.x/6.x (``is_subflavor``, ``condition``) beside 7.x's."""
    return types.SimpleNamespace(
        cook=lambda sample: sample,
        has_subflavors=has_subflavors,
        is_subflavor=is_subflavor,
        condition=condition,
    )


def test_the_dispatch_oracle_applies_every_filter_of_the_release() -> None:
    by_subflavor = _cooker(is_subflavor="video")
    by_condition = _cooker(condition=lambda sample: sample["__key__"].endswith("1"))
    by_subflavors = _cooker(has_subflavors={"encoding": "preencoded"})
    cookers = [by_subflavor, by_condition, by_subflavors]
    sample = {"__key__": "s0", "__subflavor__": None, "__subflavors__": {"encoding": "preencoded"}}
    assert matching_cooker(cookers, sample) == 2
    assert matching_cooker(cookers, {**sample, "__key__": "s1"}) == 1
    assert matching_cooker(cookers, {**sample, "__subflavor__": "video"}) == 0
    assert matching_cooker(cookers, {**sample, "__subflavors__": {"encoding": "raw"}}) is None
    # before a sample is read (a dataset's subflavors only), a condition cannot be asked: taken to hold
    assert matching_cooker(cookers, dataset_sample({"encoding": "raw"})) == 1
    assert cooker_filters(by_condition)[2] is by_condition.condition


def test_the_release_no_cooker_wording_is_recognised() -> None:
    assert is_no_cooker_error(ValueError("No cooker found for subflavors: {'encoding': 'x'}"))
    assert not is_no_cooker_error(ValueError("something else"))
    unmatched = NotImplementedError("You are using crude samples but not providing a way to cook them.")
    assert is_no_cooker_error(unmatched) is (NotImplementedError in NO_COOKER_ERRORS)  # 5.x/6.x wording


def test_stages_are_the_ones_the_pipeline_runs() -> None:
    class Encodes(DefaultTaskEncoder):
        @stateless
        def encode_sample(self, sample):
            return sample

    assert overrides(Encodes(), "encode_sample")
    assert not overrides(Encodes(), "encode_batch", bases=(TaskEncoder, DefaultTaskEncoder))

    class Plain(TaskEncoder):
        pass

    assert not overrides(Plain(), "encode_sample") and not overrides(Plain(), "batch")
    assert overrides(EncodedDiffusionTaskEncoder(), "batch")
    assert not overrides(Encodes(), "no_such_stage")
    assert {"cook_crude_sample", "encode_sample", "batch", "encode_batch"} <= set(TASK_ENCODER_STAGES)


def test_diffusion_samples_carry_the_release_base_fields() -> None:
    import dataclasses

    assert SAMPLE_BASE_FIELDS == tuple(field.name for field in dataclasses.fields(Sample))
    names = [field.name for field in dataclasses.fields(DiffusionSample)]
    assert names[: len(SAMPLE_BASE_FIELDS)] == list(SAMPLE_BASE_FIELDS)
    assert names[len(SAMPLE_BASE_FIELDS) :] == ["latents", "prompt_embeds", "pooled_prompt_embeds", "caption"]


def test_a_declared_decoder_is_the_training_decoder() -> None:
    reference = EncodedDiffusionTaskEncoder()
    assert declares_decoder(reference) and training_decoder(reference) is None
    default = DefaultTaskEncoder()
    assert declares_decoder(default) is not DECODES_IN_DATASET
    assert training_decoder(default) is not None  # the release's default decoding, wherever it runs


def test_savable_loader_refuses_a_setting_the_release_cannot_honour() -> None:
    with pytest.raises(TypeError, match="no_such_setting=3: megatron-energon .* has no 'no_such_setting'"):
        savable_loader(object(), no_such_setting=3)


def test_the_release_decoder_missing_its_extra_is_the_environment() -> None:
    error = ImportError(
        "AV decoding is not available. Please install the required dependencies with:\n"
        "pip install megatron-energon[av_decode]\nMissing dependency: No module named 'soundfile'"
    )
    line = missing_decoding_dependency(error)
    assert line is not None and "\n" not in line
    assert "(No module named 'soundfile')" in line and "pip install 'megatron-energon[av-decode]==" in line
    assert missing_decoding_dependency(ImportError("No module named 'mypkg'")) is None
    assert missing_decoding_dependency(ValueError("AV decoding is not available")) is None
