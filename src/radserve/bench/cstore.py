"""``radserve bench --scenario cstore``: C-STORE ingest rate, per durability mode.

The bench's 512x512 phantom study (explicit VR little endian, ~512 KB an instance) is
sent by dcmtk's ``storescu`` to a :class:`~radserve.gateway.GatewaySCP` in this process,
from 1 and from ``associations`` concurrent associations (the files split between
them), for each ``gateway.durability`` mode in turn, ``repeats`` times alternating the
modes, each run into a fresh data folder on the file system of ``work_dir``. A run's
rate is instances / wall time from the first storescu start to the last one's exit
(association set-up included); every instance must have been answered with success and
be on disk. Medians per (mode, associations), and each mode's ratio to ``per_instance``
(the old path) at the same concurrency.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radserve.bench.study import ensure_study
from radserve.gateway import GatewaySCP, ScpConfig
from radserve.gateway.storage import study_instances

# (label, gateway.durability, gateway.group_sync)
MODES: tuple[tuple[str, str, str], ...] = (
    ("per_instance", "per_instance", "fsync"),
    ("group (fsync)", "group", "fsync"),
    ("group (syncfs)", "group", "syncfs"),
)
GOAL_RATE = 300.0


def dcmtk_storescu() -> str | None:
    """dcmtk's storescu binary (pynetdicom installs a Python script of that name)."""
    for folder in os.get_exec_path():
        candidate = Path(folder) / "storescu"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            with open(candidate, "rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    return str(candidate)
    return None


def _one_run(
    tool: str, files: list[Path], data_dir: Path, durability: str, group_sync: str, n_assoc: int
) -> dict[str, Any]:
    config = ScpConfig(
        data_dir=data_dir, port=0, quiet_s=3600, durability=durability, group_sync=group_sync
    )
    with GatewaySCP(config, lambda study: None, run_monitor=False) as scp:
        host, port = scp.address
        chunks = [files[k::n_assoc] for k in range(n_assoc)]
        start = time.perf_counter()
        senders = [
            subprocess.Popen(
                [tool, "-aet", "BENCH", "-aec", "RADSERVE", host, str(port), *map(str, chunk)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for chunk in chunks
        ]
        errors = [p.communicate(timeout=600)[1] for p in senders]
        seconds = time.perf_counter() - start
        committer = scp.instances.committer
        batches = committer.batches if committer is not None else None
    failed = [
        e.decode(errors="replace")[-300:]
        for p, e in zip(senders, errors, strict=True)
        if p.returncode
    ]
    stored = sum(len(study_instances(d)) for d in (data_dir / "incoming").iterdir())
    if failed or stored != len(files):
        raise RuntimeError(f"{durability}: {stored}/{len(files)} stored; storescu: {failed}")
    return {
        "seconds": seconds,
        "rate": len(files) / seconds,
        "mean_batch": len(files) / batches if batches else None,
    }


def run_cstore_bench(
    *,
    n_instances: int = 300,
    associations: tuple[int, ...] = (1, 4),
    repeats: int = 3,
    cache_dir: Path | None = None,
    work_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    tool = dcmtk_storescu()
    if tool is None:
        raise RuntimeError("dcmtk's storescu is not installed (apt-get install dcmtk)")
    cache = Path(cache_dir or Path(tempfile.gettempdir()) / "radserve-bench")
    study = ensure_study(cache, "explicit", n_instances)
    files = sorted(study.glob("*.dcm"))
    size = statistics.fmean(p.stat().st_size for p in files)
    log(f"{len(files)} instances of {size / 1024:.0f} KiB from {study}")
    root = Path(tempfile.mkdtemp(prefix="radserve-cstore-", dir=work_dir))
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {
        m[0]: {n: [] for n in associations} for m in MODES
    }
    try:
        for repeat in range(repeats):
            for n_assoc in associations:
                for label, durability, group_sync in MODES:
                    data_dir = root / f"{repeat}-{n_assoc}-{durability}-{group_sync}"
                    result = _one_run(tool, files, data_dir, durability, group_sync, n_assoc)
                    runs[label][n_assoc].append(result)
                    shutil.rmtree(data_dir, ignore_errors=True)
                    rate = result["rate"]
                    log(f"repeat {repeat + 1}: {label}, {n_assoc} association(s): {rate:.0f}/s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for label, _durability, _sync in MODES:
        for n_assoc in associations:
            rates = [r["rate"] for r in runs[label][n_assoc]]
            base = statistics.median(r["rate"] for r in runs["per_instance"][n_assoc])
            batches = [r["mean_batch"] for r in runs[label][n_assoc] if r["mean_batch"]]
            rows.append(
                {
                    "mode": label,
                    "associations": n_assoc,
                    "instances_per_s": statistics.median(rates),
                    "runs": [round(r, 1) for r in rates],
                    "ratio_vs_per_instance": statistics.median(rates) / base,
                    "mean_batch": statistics.median(batches) if batches else None,
                }
            )
    return {
        "instances": len(files),
        "instance_kib": size / 1024,
        "repeats": repeats,
        "file_system_of": str(root.parent),
        "goal_instances_per_s": GOAL_RATE,
        "rows": rows,
    }
