"""From the CPU run's raw results to its figures: medians per (payload size, pipeline, num_workers,
settings), the named ratios, and the verdicts on :data:`TARGETS`.

A figure is the median over all the passes of a group; a ratio is a ratio of those medians, reported with
the median of the per-repetition ratios beside it. Measurements the load guard marked ``contaminated``
are kept apart and used only for a group that has no undisturbed one (then flagged ``disturbed_only``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .plan import settings_label

__all__ = ["RATIO_PAIRS", "TARGETS", "summarize"]

GB = 1e9

#: The throughput targets: (name, payload size, numerator, denominator, minimum ratio). Measured at nw=0.
TARGETS: tuple[tuple[str, str, str, str, float], ...] = (
    ("reference >= 0.85 x floor (small)", "small", "reference", "floor", 0.85),
    ("reference >= 0.85 x floor (FLUX)", "flux", "reference", "floor", 0.85),
    ("reference >= 1.2 x guide (small)", "small", "reference", "guide", 1.2),
    ("reference >= 1.3 x guide (FLUX)", "flux", "reference", "guide", 1.3),
    ("reference > webdataset (FLUX)", "flux", "reference", "webdataset", 1.0),
)

#: The ratios reported for every (payload size, num_workers) measured: (numerator, denominator).
RATIO_PAIRS: tuple[tuple[str, str], ...] = (
    ("reference", "raw_read"),
    ("reference", "memcpy"),
    ("reference", "floor"),
    ("reference", "guide"),
    ("reference", "webdataset"),
    ("reference", "tarfile"),
    ("floor", "raw_read"),
    ("reference_copying", "floor"),
    ("reference_uncached", "floor"),
    ("reference", "reference_copying"),
    ("reference", "reference_uncached"),
)


def _median(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def _add(
    groups: dict[tuple[str, str, int, str], dict[str, Any]],
    job: Mapping[str, Any],
    name: str,
    result: Mapping[str, Any],
    load: float,
) -> None:
    """Add one process's passes of ``name`` to its group (size, name, workers, settings)."""
    kind = "pipeline" if job["kind"] == "pipeline" else "ceiling"
    key = (job["size"], name, job.get("num_workers", 0), settings_label(job.get("settings", {})))
    group = groups.setdefault(
        key,
        {
            "size": key[0],
            "pipeline": name,
            "kind": kind,
            "num_workers": key[2],
            "settings": job.get("settings", {}),
            "label": key[3],
            "passes": [],
            "rep_medians": {},
            "first_batch_s": [],
            "build_s": [],
            "batch_ms": [],
            "load_avg_1min": [],
        },
    )
    if result.get("contaminated"):  # kept apart: used only if the group has no undisturbed measurement
        group.setdefault("disturbed_passes", []).extend(result["rates"])
        group.setdefault("disturbed_rep_medians", {})[job["rep"]] = statistics.median(result["rates"])
    else:
        group["passes"] += result["rates"]
        group["rep_medians"][job["rep"]] = statistics.median(result["rates"])
    group["load_avg_1min"].append(load)
    group.setdefault("foreign_cores", []).append(result.get("foreign_cores"))
    group.setdefault("attempts", []).append(result.get("attempts", 1))
    if "gb_per_s" in result:
        group.setdefault("measured_gb_per_s", []).extend(result["gb_per_s"])
    for k in ("first_batch_s", "build_s", "batch_ms"):
        if k in result:
            group[k].append(result[k])
    if "batch" in result:
        group["batch"] = result["batch"]


def summarize(
    jobs: Sequence[Mapping[str, Any]],
    results: Sequence[Mapping[str, Any]],
    bytes_per_sample: Mapping[str, float],
) -> dict[str, Any]:
    """Medians per (size, pipeline, workers, settings), ceilings, named ratios and target verdicts."""
    groups: dict[tuple[str, str, int, str], dict[str, Any]] = {}
    decode: dict[str, Any] = {}
    errors: list[dict[str, Any]] = []
    for job, result in zip(jobs, results, strict=True):
        if "error" in result:
            errors.append({"job": job, "error": result["error"]})
            continue
        if job["kind"] == "ceilings":
            if "decode_us" in result:
                decode[job["size"]] = result["decode_us"]
            for kind in ("raw_read", "memcpy"):
                extra = {k: result[k] for k in ("foreign_cores", "attempts", "contaminated") if k in result}
                _add(groups, job, kind, {**result[kind], **extra}, result["load_avg_1min"])
            continue
        _add(groups, job, job["pipeline"], result, result["load_avg_1min"])
    rows = []
    for group in groups.values():
        if not group["passes"]:  # every measurement of it was disturbed: report them, flagged
            group["passes"], group["rep_medians"] = group["disturbed_passes"], group["disturbed_rep_medians"]
            group["disturbed_only"] = True
        rate = statistics.median(group["passes"])
        row = {
            **group,
            "samples_per_s": rate,
            "gb_per_s": rate * bytes_per_sample[group["size"]] / GB,
            "min_samples_per_s": min(group["passes"]),
            "max_samples_per_s": max(group["passes"]),
            "first_batch_s": _median(group["first_batch_s"]),
            "build_s": _median(group["build_s"]),
            "batch_ms": {k: _median(b[k] for b in group["batch_ms"]) for k in ("p50", "p90", "p99", "max")}
            if group["batch_ms"]
            else None,
        }
        rows.append(row)
    index = {(r["size"], r["pipeline"], r["num_workers"], r["label"]): r for r in rows}

    def ratio(size: str, a: str, b: str, nw: int, label_a: str = "default") -> dict[str, Any] | None:
        ra = index.get((size, a, nw if a not in ("raw_read", "memcpy") else 0, label_a))
        rb = index.get((size, b, nw if b not in ("raw_read", "memcpy") else 0, "default"))
        if ra is None or rb is None:
            return None
        paired = [
            ra["rep_medians"][rep] / rb["rep_medians"][rep]
            for rep in ra["rep_medians"]
            if rep in rb["rep_medians"]
        ]
        return {
            "ratio": ra["samples_per_s"] / rb["samples_per_s"],
            "paired_median": statistics.median(paired) if paired else None,
            "numerator_samples_per_s": ra["samples_per_s"],
            "denominator_samples_per_s": rb["samples_per_s"],
        }

    ratios: dict[str, dict[str, dict[str, Any]]] = {}
    for size, nw in sorted({(r["size"], r["num_workers"]) for r in rows if r["kind"] == "pipeline"}):
        for a, b in RATIO_PAIRS:
            found = ratio(size, a, b, nw)
            if found is not None:
                ratios.setdefault(size, {})[f"nw={nw}: {a}/{b}"] = found
        for r in rows:  # settings sweeps: against the same pipeline with default settings
            if r["size"] == size and r["num_workers"] == nw and r["label"] != "default":
                found = ratio(size, r["pipeline"], r["pipeline"], nw, label_a=r["label"])
                if found is not None:
                    ratios[size][f"nw={nw}: {r['pipeline']}[{r['label']}]/{r['pipeline']}[default]"] = found
    targets = []
    for name, size, a, b, minimum in TARGETS:
        found = ratios.get(size, {}).get(f"nw=0: {a}/{b}")
        value = None if found is None else found["ratio"]
        targets.append(
            {
                "target": name,
                "size": size,
                "ratio": value,
                "paired_median": None if found is None else found["paired_median"],
                "minimum": minimum,
                "met": None if value is None else (value > minimum if minimum == 1.0 else value >= minimum),
            }
        )
    return {"rows": rows, "ratios": ratios, "targets": targets, "decode_us": decode, "errors": errors}
