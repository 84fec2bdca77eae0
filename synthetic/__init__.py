"""Deterministic generator of Megatron-Energon-ready CrudeWebdataset shards for diffusion training data.

Example::

    from primus_energon.synthetic import generate_dataset, write_metadataset

    m = generate_dataset("data/pre", num_samples=32, shard_size=8, seed=1,
                         shapes={"latents": (4, 8, 8), "prompt_embeds": (7, 16), "pooled_prompt_embeds": (16,)},
                         faults=["missing-member:2", "malicious-pickle"])
    m.keys()                      # sample keys; m.faults says which were damaged and how
    write_metadataset("data/mix.yaml", [("data/pre", 0.7, {"source": "a"}), ("data/raw", 0.3)])

The same is available on the command line as ``primus-synth`` / ``python -m primus_energon.synthetic``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from primus_energon._lazy import lazy_exports

__all__ = [
    "FAULT_KINDS",
    "BytesSpec",
    "FaultRecord",
    "ImageSpec",
    "JsonSpec",
    "JsonStringSpec",
    "ListSpec",
    "LoopbackObjectStore",
    "Manifest",
    "MemberRecord",
    "NpySpec",
    "ObjectSpec",
    "PickleSpec",
    "SampleRecord",
    "Schema",
    "ShardRecord",
    "SyntheticError",
    "TensorSpec",
    "TextSpec",
    "builtin_schema",
    "derive_dataset",
    "example_schemas",
    "generate_dataset",
    "harmonised",
    "infer_json_spec",
    "load_schema",
    "write_metadataset",
]

#: The public names of each submodule; loaded on first use, so `primus-synth --help` stays fast (generate_dataset
#: pulls in torch and Energon).
_EXPORTS = {
    "schema": (
        "BytesSpec",
        "ImageSpec",
        "JsonSpec",
        "JsonStringSpec",
        "ListSpec",
        "NpySpec",
        "ObjectSpec",
        "PickleSpec",
        "Schema",
        "TensorSpec",
        "TextSpec",
        "builtin_schema",
        "example_schemas",
        "harmonised",
        "infer_json_spec",
        "load_schema",
    ),
    "faults": ("FAULT_KINDS",),
    "manifest": ("FaultRecord", "Manifest", "MemberRecord", "SampleRecord", "ShardRecord"),
    "errors": ("SyntheticError",),
    "generate": ("generate_dataset",),
    "derive": ("derive_dataset",),
    "metadataset": ("write_metadataset",),
    "objectstore": ("LoopbackObjectStore",),
}

if TYPE_CHECKING:
    from .derive import derive_dataset
    from .errors import SyntheticError
    from .faults import FAULT_KINDS
    from .generate import generate_dataset
    from .manifest import FaultRecord, Manifest, MemberRecord, SampleRecord, ShardRecord
    from .metadataset import write_metadataset
    from .objectstore import LoopbackObjectStore
    from .schema import (
        BytesSpec,
        ImageSpec,
        JsonSpec,
        JsonStringSpec,
        ListSpec,
        NpySpec,
        ObjectSpec,
        PickleSpec,
        Schema,
        TensorSpec,
        TextSpec,
        builtin_schema,
        example_schemas,
        harmonised,
        infer_json_spec,
        load_schema,
    )

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
