"""CPU-seconds (this process and its decoding processes) to decode a JPEG Lossless CT
stack in the calling process's threads and in the decoding processes, alternating.

    PYTHONPATH=src:. python tools/decode_cost.py [n_slices]

The stack is the tests' CT series (512 x 512) encoded by dcmtk's ``dcmcjpeg`` (JPEG
Lossless, selection value 1). Used for docs/hostile-input.md (why JPEG Lossless is
decoded in the processes): CPU time, not wall time, so it holds on a loaded host.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
from tests.factories.dicom_series import make_ct_series

from radserve.ingest import discover_series
from radserve.ingest.decode import decode_stack, start_decode_workers
from radserve.ingest.sources import SourceReader


def _cpu(me: psutil.Process) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])


def main() -> None:
    if {"-h", "--help"} & set(sys.argv[1:]):  # the usage is the docstring
        sys.exit(__doc__)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    with tempfile.TemporaryDirectory() as work:
        raw, jpeg = Path(work) / "raw", Path(work) / "jpeg"
        jpeg.mkdir()
        for path in make_ct_series(raw, n_slices=n, rows=512, cols=512):
            subprocess.run(["dcmcjpeg", str(path), str(jpeg / path.name)], check=True)
        frames = discover_series(jpeg)[0].frames
        start_decode_workers(2)
        me = psutil.Process()
        for processes in (False, True) * 3:
            with SourceReader() as reader:
                before = _cpu(me)
                decode_stack(frames, reader, air=-1024.0, processes=processes, workers=2)
                spent = _cpu(me) - before
            print(f"{len(frames)} frames, processes={processes}: {spent:.3f} CPU-s", flush=True)


if __name__ == "__main__":
    main()
