"""GPU session: the reference loader feeding a GPU step of fixed cost, against the pinned-copy ceiling.

    python -m benchmarks.gpu --json gpu.json            # about 2-3 minutes on one H200
    python -m benchmarks.gpu --json gpu.json --quick    # FLUX-sized only, nw=2, under a minute

Where ``torch.cuda.is_available()`` is False it prints why, writes ``{"skipped": true, "reason": ...}``
and exits 0.

Each payload size and ``num_workers`` is one configuration, measured in a fresh process by
:func:`benchmarks.gpu_feed.run_config` (its docstring says how): both pinning modes (``loader``, ``ring``),
the loader's time per batch ``t_load``, and the fed loop with a GPU step of 0, 1.2 and 2 x ``t_load``.
The session stops starting configurations after ``--budget-s``.

The project's targets for the GPU feed: host-to-device GB/s >= 80% of the pinned-copy ceiling in every
configuration; stall < 2% whenever the step takes >= 1.2 x ``t_load``.

Writes the JSON (``--json``) and a markdown table beside it (``.md``); prints the table and every missed
target. Exit status 1 if a configuration failed, and, with ``--check-targets``, if a target is missed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from . import cli
from .gpu_feed import BATCH_SIZE, device_description, run_config, skip_reason
from .guard import Guard, run_guarded
from .jobs import spawn_job
from .report import machine_description, missed_targets, write_json, write_report
from .tables import gpu_markdown

__all__ = ["main", "skip_reason", "run_config", "verdicts"]

FACTORS = (0.0, 1.2, 2.0)
H2D_TARGET = 0.8
STALL_TARGET_PCT = 2.0
#: Step costs (x t_load) from which the stall target applies.
STALL_FROM_FACTOR = 1.2


def verdicts(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One verdict (``target``, ``value``, ``met``) per fed loop on H2D against the ceiling, and one on stall
    % for each loop whose step is at least :data:`STALL_FROM_FACTOR` x ``t_load``."""
    found = []
    for config in configs:
        for mode, measured in config.get("result", {}).get("modes", {}).items():
            for run in measured["runs"]:
                where = f"{config['size']} nw={config['num_workers']} {mode} step={run['factor']:g}x t_load"
                found.append(
                    {
                        "target": f"H2D >= {H2D_TARGET:.0%} of pinned ceiling: {where}",
                        "value": run["h2d_fraction_of_ceiling"],
                        "met": run["h2d_fraction_of_ceiling"] >= H2D_TARGET,
                    }
                )
                if run["factor"] >= STALL_FROM_FACTOR:
                    found.append(
                        {
                            "target": f"stall < {STALL_TARGET_PCT:g}%: {where} (measured {run['step_over_load']:.2f}x)",
                            "value": run["stall_pct"],
                            "met": run["stall_pct"] < STALL_TARGET_PCT,
                        }
                    )
    return found


def _run_configs(
    args: argparse.Namespace, specs: Mapping[str, Any], workers: list[int], guard: Guard | None
) -> list[dict[str, Any]]:
    """Every configuration in a fresh process, until ``--budget-s`` has passed (the rest: an error each)."""
    from .pipelines import make_dataset

    started = time.time()
    configs: list[dict[str, Any]] = []
    with cli.scratch_dir(args.data_dir, "bench-gpu-") as data_dir:
        for size, spec in specs.items():
            path = make_dataset(data_dir, spec, workers=min(8, os.cpu_count() or 1))
            for nw in workers:
                config: dict[str, Any] = {"size": size, "num_workers": nw}
                configs.append(config)
                if time.time() - started > args.budget_s:
                    config["result"] = {
                        "error": f"not run: the session passed --budget-s {args.budget_s:.0f}"
                    }
                    continue
                job = {
                    "path": str(path),
                    "num_samples": spec.num_samples,
                    "num_workers": nw,
                    "modes": args.modes.split(","),
                    "factors": list(FACTORS),
                    "min_batches": 40 if args.quick else 60,
                }
                timeout = max(60.0, args.budget_s - (time.time() - started) + 60.0)
                config["result"] = run_guarded(
                    lambda j=job, t=timeout: spawn_job("benchmarks.gpu", j, t), guard
                )
                print(
                    f"{size} nw={nw}: {'error' if 'error' in config['result'] else 'done'}", file=sys.stderr
                )
    return configs


def main(argv: list[str] | None = None) -> int:
    parser = cli.session_parser(
        "python -m benchmarks.gpu", __doc__, output_help="write the results here (and a .md table beside it)"
    )
    cli.add_fresh_process_options(parser, quick_help="FLUX-sized only, nw=2, one factor set")
    parser.add_argument("--sizes", default=None, help="payload sizes (default small,flux)")
    parser.add_argument("--workers", default=None, help="num_workers values (default 0,2,4)")
    parser.add_argument("--modes", default="loader,ring", help="pinning modes (default loader,ring)")
    parser.add_argument("--budget-s", type=float, default=270.0, help="stop starting configs after this")
    cli.add_guard_options(parser, default_note="default: off")
    args = parser.parse_args(argv)

    if cli.run_job_mode(args, run_config):
        return 0
    out = cli.require_output(parser, args)
    reason = skip_reason()
    if reason is not None:
        print(f"SKIPPED: {reason}")
        write_json(out, {"benchmark": "primus-energon GPU feed", "skipped": True, "reason": reason})
        return 0

    from .pipelines import PAYLOADS, QUICK_PAYLOADS, PayloadSpec

    sizes = (args.sizes or ("flux" if args.quick else "small,flux")).split(",")
    workers = [int(w) for w in (args.workers or ("2" if args.quick else "0,2,4")).split(",")]
    base = QUICK_PAYLOADS if args.quick else PAYLOADS
    # more samples than the CPU run (and >= 4 shards per worker): the GPU host has the cores for it
    specs = {
        s: PayloadSpec(**{**asdict(base[s]), "num_samples": base[s].num_samples * (1 if args.quick else 2)})
        for s in sizes
    }
    guard = cli.guard_from_args(args, default_max_foreign=None)
    started = time.time()
    configs = _run_configs(args, specs, workers, guard)
    report = {
        "benchmark": "primus-energon GPU feed",
        "skipped": False,
        "device": device_description(),
        "machine": machine_description(),
        "wall_s": time.time() - started,
        "load_avg": os.getloadavg(),
        "payloads": {s: asdict(specs[s]) for s in sizes},
        "batch_size": BATCH_SIZE,
        "max_foreign_cores": args.max_foreign,
        "configs": configs,
    }
    report["targets"] = verdicts(configs)
    write_report(out, report, gpu_markdown(report))
    missed = missed_targets(report["targets"])
    for t in missed:
        print(f"target missed: {t['target']} ({t['value']:.3f})")
    failed = any("error" in c.get("result", {}) for c in configs)
    return cli.exit_status(failed=failed, missed=bool(missed), check_targets=args.check_targets)


if __name__ == "__main__":
    sys.exit(main())
