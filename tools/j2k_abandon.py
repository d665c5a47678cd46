"""How soon a streamed JPEG 2000 decode stops once its run is abandoned (cancelled,
failed, server stopping), against a whole streamed decode of the same stack.

The bench CT (512 x 512 x 300, JPEG 2000 lossless, written once into FOLDER) is decoded
by the worker processes as ``radserve run`` streams it: once whole, then abandoned as
soon as its first slices land. Prints, per run, the whole decode's time, how long the
decoder took to stop after the abandon and how many slices it decoded in all.

    .venv/bin/python tools/j2k_abandon.py /tmp/j2k-bench-study
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from radserve.bench.study import bench_spec
from radserve.ingest import IngestPolicy, discover_series
from radserve.ingest.decode import shutdown_decode_workers, start_decode_stack
from radserve.ingest.geometry import plan_stack
from radserve.phantom import generate_phantom, write_dicom_series


def main(folder: Path, runs: int = 2) -> None:
    if not any(folder.glob("*.dcm")):
        folder.mkdir(parents=True, exist_ok=True)
        write_dicom_series(generate_phantom(bench_spec(300)), folder, transfer_syntax="jpeg2000")
    header = discover_series(folder)[0]
    frames = [header.frames[i] for i in plan_stack(header.frames, IngestPolicy()).order]
    print(f"{len(frames)} frames; load average {os.getloadavg()}")
    for run in range(runs):
        t0 = time.perf_counter()
        started = start_decode_stack(frames, air=-1000.0, workers=2)
        if started is None:
            raise SystemExit("this stack is not decoded in processes here (one core?)")
        _, arrival = started
        arrival.wait_all()
        whole = time.perf_counter() - t0
        arrival.wait_stopped(60)
        t0 = time.perf_counter()
        _, arrival = start_decode_stack(frames, air=-1000.0, workers=2)  # type: ignore[misc]
        arrival.wait(range(4))
        abandoned = time.perf_counter()
        arrival.abandon()
        arrival.wait_stopped(120)
        stopped = time.perf_counter() - abandoned
        landed = int(arrival._done.sum())
        print(
            f"run {run}: whole streamed decode {whole:.2f} s; abandoned after "
            f"{abandoned - t0:.2f} s -> decoder stopped {stopped:.3f} s later, "
            f"{landed}/{len(frames)} slices decoded"
        )
    shutdown_decode_workers()
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":  # the decoding processes re-import this file
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/j2k-bench-study"))
