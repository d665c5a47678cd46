"""Where the test suite's time goes, without running it whole: each test file alone
(``pytest --durations=0``, under ``nice``), one after another, and a ranking of files and
of test phases (setup: the fixtures; call: the test) from what they printed.

Each file's output goes to ``OUT/<file>.txt``; ``OUT/summary.tsv`` gets one row per file:
wall seconds, CPU-seconds of pytest and every child it reaped (servers, ``radserve run``,
bench children: the figure a loaded host moves least; not a daemon's unreaped processes:
the PostgreSQL ``pg_ctl`` starts, a local Ray's raylet), the 1-minute load average before
and after, and pytest's last line. On a shared 2-core host the wall seconds are several
times what an idle CI runner takes; compare CPU-seconds, and say what the load was.

    python tools/test_durations.py tests/e2e/test_bench.py tests/e2e/test_doctor.py
    python tools/test_durations.py --rank          # rank what OUT holds so far

``OUT`` is ``/tmp/ci-durations`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

PHASE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")


def run_file(test_file: str, out: Path) -> str:
    """Run ``test_file`` alone; append its row to ``summary.tsv`` and return it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = os.getloadavg()[0]
    start = time.monotonic()
    command = ["nice", "-n", "5", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    with open(out / f"{Path(test_file).stem}.txt", "w") as log:
        subprocess.run([*command, "--durations=0", test_file], stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    last = (out / f"{Path(test_file).stem}.txt").read_text().strip().splitlines()[-1:]
    load1 = os.getloadavg()[0]
    row = f"{test_file}\t{wall:.0f}\t{cpu:.0f}\t{load0:.1f}\t{load1:.1f}\t{''.join(last)}"
    with open(out / "summary.tsv", "a") as summary:
        summary.write(row + "\n")
    return row


def rank(out: Path, top: int = 30) -> None:
    """Print the files by CPU-seconds, then the slowest phases across every file."""
    rows = []
    if (out / "summary.tsv").exists():
        rows = [r.split("\t") for r in (out / "summary.tsv").read_text().splitlines() if r]
    print("wall_s\tcpu_s\tload\tfile")
    for r in sorted(rows, key=lambda r: -float(r[2])):
        print(f"{r[1]}\t{r[2]}\t{r[3]}-{r[4]}\t{r[0]}")
    print(f"total\t{sum(float(r[1]) for r in rows):.0f}\t{sum(float(r[2]) for r in rows):.0f}")
    phases = [
        (float(m[1]), m[2], m[3])
        for txt in out.glob("*.txt")
        for m in (PHASE.match(line) for line in txt.read_text(errors="replace").splitlines())
        if m
    ]
    print("\nslowest phases (wall s; setup = the fixtures the test was first to need)")
    for seconds, phase, test in sorted(phases, reverse=True)[:top]:
        print(f"{seconds:8.1f}  {phase:8}  {test}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="test files, each run alone in turn")
    parser.add_argument("--out", type=Path, default=Path("/tmp/ci-durations"))
    parser.add_argument("--rank", action="store_true", help="rank what --out holds")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for test_file in args.files:
        print(run_file(test_file, args.out), flush=True)
    if args.rank or not args.files:
        rank(args.out)


if __name__ == "__main__":
    main()
