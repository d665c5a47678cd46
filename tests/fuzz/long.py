"""The long mode (``make fuzz``): every target (or those named) in turn for
``--minutes`` each, corpus and reproducers kept under ``--out/<target>/`` so a later run
goes on from where this one stopped. Prints executions, coverage and findings per target;
exits 1 when any target found something.

    python -m tests.fuzz.long --minutes 10 --out out/fuzz [TARGET ...]
"""

from __future__ import annotations

import argparse
import os
import time
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
        executions, coverage, found = 0, 0, set[Path]()
        earlier = set((work / "artifacts").glob("*"))  # an earlier run's, reported then
        deadline = time.monotonic() + args.minutes * 60
        # libFuzzer stops at its first finding: go on from the grown corpus until the
        # target's time is up (each finding stays in artifacts/)
        while (left := round(deadline - time.monotonic())) >= 10:
            seed = args.seed + executions
            log = work / f"log-{seed}.txt"
            outcome = fuzz(target, work, seconds=left, seed=seed, log_file=log)
            executions += outcome.executions
            coverage = max(coverage, outcome.coverage)
            found.update(set(outcome.artifacts) - earlier)
            if outcome.returncode != 0 and not outcome.artifacts:
                found.add(log)  # killed without a reproducer: see its log
                break
        print(
            f"{target}: {executions} executions, cov {coverage}, {len(found)} finding(s) "
            f"(logs: {work}/log-*.txt)",
            flush=True,
        )
        for path in sorted(found):
            print(f"  reproduce: python -m tests.fuzz.run {target} {path}", flush=True)
        failed += bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
