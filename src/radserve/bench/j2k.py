"""``radserve bench --scenario j2k``: the JPEG 2000 study against its CPU floor (issue 19, goal 2).

In one run, alternating, ``--repeats`` times, each contestant in its own process:

- ``radserve``: the study end to end, the organ model starting on the first slabs while
  the later slices still decode (``run_study(stream_decode=True)``, the default);
- ``radserve-whole``: the same with the stack decoded whole first (``stream_decode=False``);
- ``decode``: the frames alone, by radserve's decoder processes and by GDCM's own
  threaded decode, one file after another (the naive loop's load).

The floor is the CPU work of the study over the cores: ``radserve-whole``'s CPU-seconds
(its own process plus the decoder processes: decode + everything else, with nothing
overlapped to contend) divided by the usable cores. Each wall time is reported as a
ratio to that floor, from the same repeat; medians over the repeats. The labels of
the two radserve contestants are compared voxel for voxel.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from radserve.bench.run import _run_child
from radserve.bench.study import ensure_study
from radserve.host import usable_cores

CONTESTANTS = ("radserve", "radserve-whole", "decode")


def _identical(a: Path, b: Path) -> bool:
    la, lb = np.load(a / "labels.npz"), np.load(b / "labels.npz")
    return la.files == lb.files and all(np.array_equal(la[k], lb[k]) for k in la.files)


def run_j2k(
    *,
    n_slices: int = 300,
    repeats: int = 2,
    precision: str = "fp32",
    cache_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, object]:
    """The summary: per repeat every contestant's wall and CPU seconds, the floor, the
    ratios; medians; the load average before and after."""
    cache_dir = Path(cache_dir or Path(tempfile.gettempdir()) / "radserve-bench")
    log(f"preparing the {n_slices}-slice 512x512 JPEG 2000 phantom study")
    study = ensure_study(cache_dir, "jpeg2000", n_slices)
    cores = usable_cores()
    load_before = os.getloadavg()
    runs: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="radserve-j2k-") as tmp:
        for r in range(repeats):
            results: dict[str, dict[str, object]] = {}
            order = CONTESTANTS if r % 2 == 0 else CONTESTANTS[::-1]
            for mode in order:
                log(f"repeat {r + 1}/{repeats}: {mode}")
                results[mode] = _run_child(mode, study, Path(tmp) / str(r) / mode, precision)
            runs.append(_repeat(results, cores, Path(tmp) / str(r)))
    summary: dict[str, object] = {
        "study": {"shape": [n_slices, 512, 512], "syntax": "JPEG 2000 lossless"},
        "cores": cores,
        "precision": precision,
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
        "repeats": runs,
    }
    keys = [k for k, v in runs[0].items() if isinstance(v, float)]
    summary["median"] = {k: statistics.median(float(run[k]) for run in runs) for k in keys}  # type: ignore[arg-type]
    summary["labels_identical"] = all(bool(run["labels_identical"]) for run in runs)
    return summary


def _repeat(results: dict[str, dict[str, object]], cores: int, folder: Path) -> dict[str, object]:
    streamed, whole, decode = results["radserve"], results["radserve-whole"], results["decode"]

    def cpu(run: dict[str, object]) -> float:
        return float(run["cpu_seconds"]) + float(run.get("workers_cpu_seconds") or 0.0)  # type: ignore[arg-type]

    floor = cpu(whole) / cores
    out: dict[str, object] = {
        "radserve_s": float(streamed["seconds"]),  # type: ignore[arg-type]
        "radserve_whole_s": float(whole["seconds"]),  # type: ignore[arg-type]
        "radserve_cpu_s": cpu(streamed),
        "radserve_whole_cpu_s": cpu(whole),
        "decode_cpu_s_in_whole_run": float(whole.get("workers_cpu_seconds") or 0.0),  # type: ignore[arg-type]
        "floor_s": floor,
        "radserve_over_floor": float(streamed["seconds"]) / floor,  # type: ignore[arg-type]
        "radserve_whole_over_floor": float(whole["seconds"]) / floor,  # type: ignore[arg-type]
        "whole_over_streamed": float(whole["seconds"]) / float(streamed["seconds"]),  # type: ignore[arg-type]
        "decode_radserve_s": float(decode["radserve_s"]),  # type: ignore[arg-type]
        "decode_radserve_cpu_s": float(decode["radserve_cpu_s"]),  # type: ignore[arg-type]
        "decode_gdcm_s": float(decode["gdcm_s"]),  # type: ignore[arg-type]
        "decode_gdcm_cpu_s": float(decode["gdcm_cpu_s"]),  # type: ignore[arg-type]
        "gdcm_decode_over_radserve_decode": float(decode["gdcm_s"])  # type: ignore[arg-type]
        / float(decode["radserve_s"]),  # type: ignore[arg-type]
        "radserve_end_to_end_over_gdcm_decode": float(streamed["seconds"])  # type: ignore[arg-type]
        / float(decode["gdcm_s"]),  # type: ignore[arg-type]
        "labels_identical": _identical(folder / "radserve", folder / "radserve-whole"),
        "stages": {"radserve": streamed["stages"], "radserve-whole": whole["stages"]},
    }
    return out


__all__ = ["run_j2k"]
