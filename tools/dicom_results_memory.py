"""Memory of a job's DICOM results (:func:`radserve.report.dicom.write_dicom_results`)
alone, on a finished ``radserve run`` folder: what sets ``radserve run``'s peak (the
pipeline's own peak is lower: docs/benchmarking.md).

    radserve phantom --seed 7 --slices 300 --out /tmp/ph300
    radserve run /tmp/ph300/dicom --out /tmp/run300
    PYTHONPATH=src python tools/dicom_results_memory.py /tmp/run300 /tmp/ph300/dicom

The same series as one Enhanced (Legacy Converted) CT instance, for the multi-frame path:

    PYTHONPATH=src:. python -c "import sys, pathlib; from tests.factories.dicom_series \
    import make_legacy_enhanced as m; m(sorted(pathlib.Path(sys.argv[1]).iterdir()), \
    pathlib.Path(sys.argv[2]))" /tmp/ph300/dicom /tmp/enh300/enhanced.dcm
    radserve run /tmp/enh300 --out /tmp/run300e
    PYTHONPATH=src python tools/dicom_results_memory.py /tmp/run300e /tmp/enh300

Prints, for the whole call, its wall time and the process's peak resident size above
its resident size at the call (``VmHWM`` reset through ``/proc/self/clear_refs``), and
for each SEG (not with ``--call-only``), the memory (tracemalloc) its build peaked at
and what the built ``Segmentation`` holds against the header the SR is given (what a
job keeps until the SR is built). The results are written to a scratch copy of the run
folder, never over the run's own. Before/after a change, alternating, one process at a time:

    git archive main src | tar -x -C /tmp/before
    for i in 1 2 3; do for s in /tmp/before/src src; do PYTHONPATH=$s python \
      tools/dicom_results_memory.py --call-only /tmp/run300 /tmp/ph300/dicom; done; done
"""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

from radserve.report.dicom import common
from radserve.report.dicom.results import sr_reference, write_dicom_results
from radserve.report.dicom.seg import build_seg
from radserve.report.json_report import read_report
from radserve.report.nifti import read_nifti

MIB = 1 << 20


def status_mib(key: str) -> float:
    """A ``/proc/self/status`` size (``VmRSS``, ``VmHWM``) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def whole_call(run: Path, sources: list[Path], scratch: Path) -> None:
    out = scratch / "whole"
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("*.dcm"))
    report = read_report(out / "report.json")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    start = status_mib("VmRSS")
    began = time.perf_counter()
    write_dicom_results(report, out, sources)
    seconds = time.perf_counter() - began
    peak = status_mib("VmHWM")
    rise = peak - start
    print(
        f"write_dicom_results: RSS {start:.1f} MiB at the call, peak {peak:.1f} (+{rise:.1f}), "
        f"{seconds:.2f} s"
    )


def per_seg(run: Path, sources: list[Path]) -> None:
    report = read_report(run / "report.json")
    headers = common.slice_sources(report, common.read_headers(sources))
    for label_map in report.outputs.label_maps:
        labels = read_nifti(run / label_map.path)
        gc.collect()
        tracemalloc.start()
        seg = build_seg(
            report, labels, label_map.segments, headers, name=label_map.kind, renumber_in_place=True
        )
        _, peak = tracemalloc.get_traced_memory()
        del labels
        gc.collect()
        with_seg = tracemalloc.get_traced_memory()[0]
        reference = sr_reference(seg)
        del seg
        gc.collect()
        held = (with_seg - tracemalloc.get_traced_memory()[0]) / MIB
        tracemalloc.stop()
        del reference
        print(
            f"{label_map.kind} SEG: its build allocated {peak / MIB:.1f} MiB at most (besides "
            "the label map); "
            f"the Segmentation holds {held:.1f} MiB more than the SR's header"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished radserve run --out folder")
    parser.add_argument("study", type=Path, help="the run's source DICOM folder")
    parser.add_argument(
        "--call-only",
        action="store_true",
        help="the whole call's figures alone (also with an older radserve on PYTHONPATH)",
    )
    args = parser.parse_args()
    sources = sorted(args.study.glob("*.dcm"))
    with tempfile.TemporaryDirectory() as scratch:
        whole_call(args.run, sources, Path(scratch))
    if not args.call_only:
        per_seg(args.run, sources)


if __name__ == "__main__":
    main()
