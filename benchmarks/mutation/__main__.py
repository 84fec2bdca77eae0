"""``python -m benchmarks.mutation``: run the mutants against the conformance suite and write the report.

    python -m benchmarks.mutation                          # every mutant, quick profile -> reports/mutation/
    python -m benchmarks.mutation --operator cast_tensor --mutant cache_by_key
    python -m benchmarks.mutation --out benchmarks/mutation   # the committed report
    python -m benchmarks.mutation --list

Mutants run one at a time (``nice -n 10``), each in a fresh pytest process; results are cached in
``--cache`` (keyed by the mutated source and the profile), so a second run only reruns what changed
(``--fresh`` reruns everything). Exit status 0; 1 with ``--check`` when the goal (95 % failed as meant) is
not met or a mutant could not be run; 2 for a bad argument or a mutant that no longer applies.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..jobs import REPO_ROOT
from .operators import MUTANTS, MutationError, mutated_source, operators, select
from .report import EQUIVALENT_FILE, NOTES_FILE, read_marked, write
from .session import RunResult, judge, run_baseline, run_mutant


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.mutation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--operator", action="append", default=[], help="run the mutants of this operator (repeatable)"
    )
    parser.add_argument("--mutant", action="append", default=[], help="run this mutant (repeatable)")
    parser.add_argument(
        "--profile", default="quick", choices=["quick", "ci", "thorough"], help="conformance profile"
    )
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        help="pass --conformance-property to the suite (a cheaper, partial matrix: for tests)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / "reports" / "mutation",
        help="REPORT.md and mutation.json here",
    )
    parser.add_argument("--cache", type=Path, default=None, help="per-run results (default: OUT/runs)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one pytest run may take")
    parser.add_argument("--fresh", action="store_true", help="ignore cached results")
    parser.add_argument("--check", action="store_true", help="exit 1 unless the goal is met")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: write the report from the cached results (mutants without one are 'not run')",
    )
    parser.add_argument("--list", action="store_true", help="list operators and mutants, then exit")
    return parser


def _not_run(run_id: str, target: str, args: argparse.Namespace) -> RunResult:
    return RunResult(run_id, target, args.profile, "not run", 0.0, None)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list:
        for op in operators():
            print(op)
            for m in MUTANTS:
                if m.operator == op:
                    print(f"    {m.id:34} {m.target:28} meant: {', '.join(m.meant)}")
        print(f"{len(MUTANTS)} mutants, {len(operators())} operators")
        return 0
    try:
        mutants = select(args.operator, args.mutant)
        for m in mutants:
            mutated_source(m)
        known = {m.id for m in MUTANTS}
        equivalent = read_marked(EQUIVALENT_FILE, known)
        notes = read_marked(NOTES_FILE, known)
    except (ValueError, MutationError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from primus_energon.conformance.core.claims import Harm
    from primus_energon.conformance.properties import all_claims

    advice_claims = {c.id for c in all_claims() if c.harm is Harm.ADVICE}
    cache = args.cache or args.out / "runs"
    options = dict(
        profile=args.profile,
        timeout=args.timeout,
        properties=args.property,
        fresh=args.fresh,
        log=print,
        cached_only=args.report_only,
    )
    baselines = {}
    judged = []
    for target in dict.fromkeys(m.target for m in mutants):
        print(f"baseline {target} ...", flush=True)
        baselines[target] = run_baseline(target, cache, **options) or _not_run(
            f"baseline-{target}", target, args
        )
        print(f"baseline {target}: {baselines[target].status} in {baselines[target].seconds} s", flush=True)
    # run in the order asked for (--mutant ...), report in the mutants' order
    asked = {ident: n for n, ident in enumerate(args.mutant)}
    position = {m.id: n for n, m in enumerate(MUTANTS)}
    for index, mutant in enumerate(sorted(mutants, key=lambda m: asked.get(m.id, len(asked))), 1):
        result = run_mutant(mutant, cache, **options) or _not_run(mutant.id, mutant.target, args)
        row = judge(mutant, result, baselines[mutant.target], advice_claims)
        judged.append(row)
        if row["verdict"] == "not run":
            continue
        print(
            f"[{index}/{len(mutants)}] {mutant.id}: {row['verdict']}"
            + (" as meant" if row["as_meant"] else "")
            + f" ({result.seconds} s) by {', '.join(row['detected_by']) or 'nothing'}",
            flush=True,
        )
    judged.sort(key=lambda row: position[row["id"]])
    command = "python -m benchmarks.mutation " + shlex.join(argv if argv is not None else sys.argv[1:])
    document = write(
        args.out,
        judged,
        {t: b.to_dict() for t, b in baselines.items()},
        profile=args.profile,
        equivalent=equivalent,
        notes=notes,
        command=command.strip(),
        subset=len(mutants) < len(MUTANTS) or bool(args.property),
    )
    overall = document["summary"]["overall"]
    print(
        f"failed as meant: {overall['failed_as_meant']}/{overall['scored_defects']} "
        f"({overall['rate_failed_as_meant']}); advice apart: {overall['advised_as_meant']}/"
        f"{overall['scored_advice']} advised as meant; report: {args.out / 'REPORT.md'}"
    )
    if args.check and (
        any(r["verdict"] == "not run" for r in judged)
        or not overall["goal_met"]
        or any(r["verdict"] in ("broken", "unjudged") for r in judged)
    ):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
