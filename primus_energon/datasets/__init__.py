"""Dataset tooling: finalize, validate, info and preview for Energon CrudeWebdatasets (and metadatasets).

Working replacements for ``energon info``/``preview``/``lint``, which fail on a CrudeWebdataset in 7.4.1::

    from primus_energon.datasets import finalize_dataset, validate_path

    finalize_dataset("/data/pre", "preencoded", split="0.9,0.05,0.05")   # prepare + dataset.yaml
    report = validate_path("/data/pre", workers=8)                        # or a metadataset .yaml
    report.ok, report.problems[0].code, report.to_json()

Command line: ``primus-energon finalize|validate|info|preview`` (`primus_energon.datasets.commands`, a module
per command). Modules: `validate` (orchestration), `scan` (one shard), `tarscan` (strict tar reader), `checks`
(one member), `analysis` (whole-dataset rules), `metadata` (.nv-meta), `metadataset` (blends), `finalize`,
`preparation` (Energon's prepare_dataset and dataset.yaml), `info`, `preview`, `report` (JSON and summary),
`problems` (codes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

__all__ = [
    "CODES",
    "DatasetInfo",
    "DatasetReport",
    "FinalizeError",
    "LeafReport",
    "MetadatasetReport",
    "Problem",
    "REPORT_VERSION",
    "ValidationError",
    "dataset_info",
    "finalize_dataset",
    "parse_split",
    "preview_dataset",
    "render_summary",
    "resolve_metadataset",
    "validate_dataset",
    "validate_metadataset",
    "validate_path",
]

#: The public names of each submodule; a name loads its module on first use.
_EXPORTS = {
    "problems": ("CODES", "Problem"),
    "report": ("DatasetReport", "LeafReport", "MetadatasetReport", "REPORT_VERSION", "render_summary"),
    "validate": ("ValidationError", "validate_dataset", "validate_path"),
    "metadataset": ("validate_metadataset", "resolve_metadataset"),
    "finalize": ("FinalizeError", "finalize_dataset", "parse_split"),
    "info": ("DatasetInfo", "dataset_info"),
    "preview": ("preview_dataset",),
}

if TYPE_CHECKING:
    from .finalize import FinalizeError, finalize_dataset, parse_split
    from .info import DatasetInfo, dataset_info
    from .metadataset import resolve_metadataset, validate_metadataset
    from .preview import preview_dataset
    from .problems import CODES, Problem
    from .report import REPORT_VERSION, DatasetReport, LeafReport, MetadatasetReport, render_summary
    from .validate import ValidationError, validate_dataset, validate_path


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
