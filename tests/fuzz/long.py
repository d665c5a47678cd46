"""The long mode (``make fuzz``): every target (or those named) in turn for
``--minutes`` each, corpus and reproducers kept under ``--out/<target>/`` so a later run
goes on from where this one stopped. Prints executions, coverage and findings per target;
exits 1 when any target found something.

    python -m tests.fuzz.long --minutes 10 --out out/fuzz [TARGET ...]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tests.fuzz.session import fuzz
from tests.fuzz.targets import TARGETS

MINUTES_ENV = "RADSERVE_TEST_FUZZ_MINUTES"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help=f"default: all ({', '.join(TARGETS)})")
    parser.add_argument("--minutes", type=float, default=float(os.environ.get(MINUTES_ENV) or 10))
    parser.add_argument("--out", type=Path, default=Path("out/fuzz"))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    unknown = sorted(set(args.targets) - set(TARGETS))
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; one of {', '.join(TARGETS)}")
    failed = 0
    for target in args.targets or TARGETS:
        work = (args.out / target).resolve()
        work.mkdir(parents=True, exist_ok=True)
        seconds = max(1, round(args.minutes * 60))
        outcome = fuzz(target, work, seconds=seconds, seed=args.seed, log_file=work / "log.txt")
        print(
            f"{target}: {outcome.executions} executions, cov {outcome.coverage}, "
            f"ft {outcome.features}, {len(outcome.artifacts)} finding(s), rc "
            f"{outcome.returncode} (log: {work / 'log.txt'})",
            flush=True,
        )
        for path in outcome.artifacts:
            print(f"  reproduce: python -m tests.fuzz.run {target} {path}", flush=True)
        failed += outcome.found
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
