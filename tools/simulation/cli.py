"""``slts simulate``'s output: the soak's one-line summary, or one seed's program."""

from __future__ import annotations

import argparse
import json
import sys

from .runner import SeedResult, run_seed, shrink, soak

EXIT_OK, EXIT_VIOLATION = 0, 1


def _replay(args: argparse.Namespace) -> int:
    result = run_seed(args.seed, args.ops, ignore=args.ignore)
    shown: SeedResult = result
    if result.violation is not None and not args.no_shrink:
        shown = shrink(args.seed, result, ignore=args.ignore)
    if args.json:
        print(
            json.dumps(
                {
                    "seed": args.seed,
                    "ops": args.ops,
                    "digest": result.digest,
                    "violation": None
                    if result.violation is None
                    else {
                        "kind": result.violation.kind,
                        "detail": result.violation.detail,
                        "step": result.failed_step,
                    },
                    "program": shown.lines,
                    "faults": dict(result.faults),
                    "counters": dict(result.counters),
                    "ignored": dict(result.ignored),
                },
                indent=2,
            )
        )
    else:
        title = "shrunk program" if shown is not result else "program"
        print(f"seed {args.seed}, {result.steps_run} steps, state digest {result.digest[:16]}; {title}:")
        for index, line in enumerate(shown.lines):
            print(f"  {index:4d}  {line}")
        if result.violation is None:
            print(
                f"seed {args.seed}: no violation"
                + (f" (ignored {dict(result.ignored)})" if result.ignored else "")
            )
        else:
            print(
                f"seed {args.seed}: VIOLATION {result.violation.kind} at step {result.failed_step}: "
                f"{result.violation.detail}"
            )
    return EXIT_OK if result.violation is None else EXIT_VIOLATION


def main(args: argparse.Namespace) -> int:
    """Run what ``args`` asks (see ``slts simulate --help``); exit 1 on any violation."""
    if args.seed is not None:
        return _replay(args)
    seeds = range(args.first_seed, args.first_seed + args.seeds)

    def progress(result: SeedResult) -> None:
        if result.violation is not None and not args.json:
            print(
                f"seed {result.seed}: {result.violation.kind} at step {result.failed_step} "
                f"(replay: slts simulate --seed {result.seed} --ops {args.ops})",
                file=sys.stderr,
            )

    summary = soak(seeds, args.ops, ignore=args.ignore, progress=progress, jobs=args.jobs)
    if args.json:
        print(
            json.dumps(
                {
                    "seeds": summary.seeds,
                    "operations": summary.operations,
                    "faults": dict(summary.faults),
                    "counters": dict(summary.counters),
                    "violations": summary.violations,
                    "ignored": summary.ignored,
                }
            )
        )
    else:
        print(summary.line())
        if args.by_kind:
            for kind, found in sorted(summary.violations.items()):
                print(f"  {kind}: seeds {' '.join(map(str, found))}")
            for kind, found in sorted(summary.ignored.items()):
                print(f"  {kind} (ignored): seeds {' '.join(map(str, found))}")
    return EXIT_OK if not summary.violations else EXIT_VIOLATION
