"""CPU-seconds (this process and its decoding processes) and wall seconds to decode a
compressed CT stack in the calling process's threads and in the decoding processes,
alternating, so both modes meet the same host load.

    PYTHONPATH=src:. python tools/decode_cost.py [n_slices] [--syntax NAME ...]
        [--phantom] [--repeats N] [--workers N]

``--syntax``: ``jpeg-lossless`` (the default: dcmtk's ``dcmcjpeg``, selection value 1),
``jpeg-baseline`` (8-bit, Pillow, quality 90, as archives send CT), ``jpeg-ls`` and
``jpeg-ls-near`` (pyjpegls, NEAR=2), ``rle``; several are measured in one run. The
stack is the tests' CT series (512 x 512, a ramp that compresses unlike anatomy), or
with ``--phantom`` the anatomy of ``radserve phantom`` (512 x 512, ``n_slices``). Both
modes use the same decoder (pydicom's first plugin that succeeds) and ``--workers``
(default 2). Used for docs/hostile-input.md (which syntaxes are decoded in the
processes); CPU time holds on a loaded host, wall time only in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pydicom
from tests.factories.dicom_series import as_jpeg_baseline, dcmtk_compress, make_ct_series

from radserve.ingest import discover_series
from radserve.ingest.decode import decode_stack, start_decode_workers
from radserve.ingest.sources import SourceReader

SYNTAXES = ("jpeg-lossless", "jpeg-baseline", "jpeg-ls", "jpeg-ls-near", "rle")


def _cpu(me: psutil.Process) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])


def _source(folder: Path, n: int, phantom: bool) -> list[Path]:
    if not phantom:
        return make_ct_series(folder, n_slices=n, rows=512, cols=512)
    subprocess.run(
        ["radserve", "phantom", "--seed", "1", "--out", str(folder), "--slices", str(n)],
        check=True,
        capture_output=True,
    )
    return sorted((folder / "dicom").glob("*.dcm"))


def _encode(paths: list[Path], syntax: str, folder: Path) -> Path:
    """``paths`` encoded in ``syntax`` into ``folder``."""
    folder.mkdir()
    for path in paths:
        dst = folder / path.name
        if syntax == "jpeg-lossless":
            dcmtk_compress(path, dst, "jpeg-lossless-sv1")
            continue
        ds = pydicom.dcmread(path)
        if syntax == "jpeg-ls":
            ds.compress("1.2.840.10008.1.2.4.80")
        elif syntax == "jpeg-ls-near":
            ds.compress("1.2.840.10008.1.2.4.81", jls_error=2)
        elif syntax == "rle":
            ds.compress("1.2.840.10008.1.2.5")
        ds.save_as(dst, enforce_file_format=True)
    if syntax == "jpeg-baseline":
        as_jpeg_baseline(sorted(folder.glob("*.dcm")), quality=90)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n_slices", nargs="?", type=int, default=24)
    parser.add_argument("--syntax", action="append", choices=SYNTAXES)
    parser.add_argument("--phantom", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        paths = _source(Path(work) / "raw", args.n_slices, args.phantom)
        stacks = {s: _encode(paths, s, Path(work) / s) for s in args.syntax or ["jpeg-lossless"]}
        start_decode_workers(args.workers)
        me = psutil.Process()
        for syntax, folder in stacks.items():
            frames = discover_series(folder)[0].frames
            uid = frames[0].pixel.transfer_syntax_uid
            spent: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for processes in (False, True) * args.repeats:
                with SourceReader() as reader:
                    cpu, wall = _cpu(me), time.perf_counter()
                    decode_stack(
                        frames, reader, air=-1024.0, processes=processes, workers=args.workers
                    )
                    spent[processes].append((_cpu(me) - cpu, time.perf_counter() - wall))
                cpu_s, wall_s = spent[processes][-1]
                print(
                    f"{syntax} ({uid}), {len(frames)} frames, processes={processes}: "
                    f"{cpu_s:.3f} CPU-s, {wall_s:.3f} s wall",
                    flush=True,
                )
            threads, procs = (
                [statistics.median(v[i] for v in spent[mode]) for i in (0, 1)]
                for mode in (False, True)
            )
            print(
                f"{syntax} median: threads {threads[0]:.3f} CPU-s {threads[1]:.3f} s wall; "
                f"processes {procs[0]:.3f} CPU-s {procs[1]:.3f} s wall "
                f"({(procs[1] / threads[1] - 1) * 100:+.0f} % wall, "
                f"{(procs[0] / threads[0] - 1) * 100:+.0f} % CPU)",
                flush=True,
            )


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # the usage is the docstring
        sys.exit(__doc__)
    main()
