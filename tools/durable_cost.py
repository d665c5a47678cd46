"""What a durable write (:mod:`radserve.durable`: temporary, fsync, rename, folder fsync)
costs against the same write unsynced, per file size, on the file system of ``--dir``
(put it on the data folder's). Rounds alternate the two, so load drifts hit both alike.

    PYTHONPATH=src python tools/durable_cost.py --dir /var/lib/radserve/bench --rounds 200

Prints the median and 90th percentile milliseconds per write of each size and mode.
A report is ~10 KB, a critical notice or FHIR Bundle a few KB, a DICOM SEG 0.1-5 MB.

Then a job's DICOM results (two SEGs and an SR, ``JOB_FILES``) into one folder, each
round both ways, alternating: every file fsyncing its folder (before
:func:`radserve.durable.batch`) and one :func:`radserve.durable.batch` (one folder fsync).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path

from radserve import durable

SIZES = (4 << 10, 64 << 10, 1 << 20)
JOB_FILES = {"organs-seg.dcm": 1 << 20, "findings-seg.dcm": 64 << 10, "sr.dcm": 16 << 10}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="a folder to write in")
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        times: dict[tuple[int, bool], list[float]] = {(s, y): [] for s in SIZES for y in (1, 0)}
        for round_ in range(args.rounds):
            for size in SIZES:
                data = os.urandom(size)
                for sync in (True, False) if round_ % 2 else (False, True):
                    path = Path(folder) / f"file-{size}.bin"
                    start = time.perf_counter()
                    durable.write_bytes(path, data, sync=sync)
                    times[(size, sync)].append((time.perf_counter() - start) * 1000)
    print(f"{'size':>8} {'mode':>8} {'median ms':>10} {'p90 ms':>8}")
    for (size, sync), values in times.items():
        p90 = statistics.quantiles(values, n=10)[-1]
        mode = "durable" if sync else "unsynced"
        print(f"{size >> 10:>6}KB {mode:>8} {statistics.median(values):>10.3f} {p90:>8.3f}")
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        jobs = _job_rounds(Path(folder), args.rounds)
    print(f"\n{'one job (3 files)':<24} {'median ms':>10} {'p90 ms':>8}")
    for mode, values in jobs.items():
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"{mode:<24} {statistics.median(values):>10.3f} {p90:>8.3f}")


def _job_rounds(folder: Path, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per job's result files, per file folder fsync against one batch."""
    data = {name: os.urandom(size) for name, size in JOB_FILES.items()}
    times: dict[str, list[float]] = {"folder fsync per file": [], "one batch": []}
    for round_ in range(rounds):
        for batched in (True, False) if round_ % 2 else (False, True):
            job = folder / f"job-{round_}-{int(batched)}"
            job.mkdir()
            start = time.perf_counter()
            with durable.batch() if batched else contextlib.nullcontext():
                for name, payload in data.items():
                    durable.write_bytes(job / name, payload)
            elapsed = (time.perf_counter() - start) * 1000
            times["one batch" if batched else "folder fsync per file"].append(elapsed)
    return times


if __name__ == "__main__":
    main()
