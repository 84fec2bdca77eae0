"""The throughput plot: samples/s against ``num_workers``, one line per pipeline, one panel per payload size.

    python -m benchmarks.plot results.json [out.png]

The ceilings (raw sequential read, memcpy), one to two orders of magnitude above the pipelines, are
written in each panel rather than drawn. Diagnostic pipelines are dotted. Needs matplotlib (the
``bench`` extra).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["plot_results"]

_STYLE = {
    "reference": {"color": "tab:red", "marker": "o", "linewidth": 2.5},
    "floor": {"color": "black", "marker": "s"},
    "reference_copying": {"color": "tab:pink", "marker": "o", "linestyle": ":"},
    "reference_uncached": {"color": "tab:orange", "marker": "o", "linestyle": ":"},
    "guide": {"color": "tab:blue", "marker": "^"},
    "webdataset": {"color": "tab:green", "marker": "v"},
    "tarfile": {"color": "tab:purple", "marker": "D"},
}


def plot_results(report: Mapping[str, Any], out: Path) -> Path:
    """Draw ``report`` (the JSON of ``benchmarks.throughput`` or its dict) into the PNG ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"]]
    sizes = [s for s in report["payloads"] if any(r["size"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 4.8), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        sized = [r for r in rows if r["size"] == size]
        for name in dict.fromkeys(r["pipeline"] for r in sized if r["kind"] == "pipeline"):
            points = sorted(
                (r["num_workers"], r["samples_per_s"], r["min_samples_per_s"], r["max_samples_per_s"])
                for r in sized
                if r["pipeline"] == name and r["label"] == "default"
            )
            if not points:
                continue
            x, y, lo, hi = zip(*points, strict=True)
            errors = [
                [a - b for a, b in zip(y, lo, strict=True)],
                [b - a for a, b in zip(y, hi, strict=True)],
            ]
            ax.errorbar(x, y, yerr=errors, label=name, capsize=3, **_STYLE.get(name, {}))
        ceilings = [
            f"{name.replace('_', ' ')} {row['samples_per_s']:,.0f}/s ({row['gb_per_s']:.1f} GB/s)"
            for name in ("raw_read", "memcpy")
            for row in sized
            if row["pipeline"] == name
        ]
        if ceilings:
            ax.text(
                0.98, 0.98, "ceilings (off scale):\n" + "\n".join(ceilings), transform=ax.transAxes,
                ha="right", va="top", fontsize=8, color="dimgrey",
            )  # fmt: skip
        ax.set_ylim(bottom=0)
        ax.set_xlabel("num_workers")
        ax.set_ylabel("samples/s (median of passes; bars: min-max)")
        ax.set_xticks(sorted({r["num_workers"] for r in sized if r["kind"] == "pipeline"}))
        label = report["payloads"][size].get("label", size)
        ax.set_title(label.replace(": ", ":\n", 1), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=9)
    machine = report.get("machine", {})
    fig.suptitle(
        f"primus-energon throughput, batch {report.get('batch_size', 4)}: {machine.get('cpu', '?')}, "
        f"{machine.get('cpus_usable', '?')} CPUs, torch {machine.get('torch', '?')}, "
        f"energon {machine.get('megatron_energon', '?')}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    source = Path(argv[0])
    out = Path(argv[1]) if len(argv) > 1 else source.with_suffix(".png")
    print(plot_results(json.loads(source.read_text()), out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
