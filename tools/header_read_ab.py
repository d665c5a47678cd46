"""CPU of one DICOM header read, before (``--before``, a git ref) against the working
tree, alternating in one process over the bench study's files.

    PYTHONPATH=src python tools/header_read_ab.py --before main --rounds 7

Two paths are timed: ingest discovery's :func:`~radserve.ingest.headers.read_instance`
(header, validation, attribute extraction into an ``InstanceRecord``) and the C-STORE
SCP's :func:`~radserve.ingest.headers.read_header` of a received file (given the
presentation context's transfer syntax where the version takes it). The ``before``
version is :mod:`radserve.ingest.headers` as committed at ``--before``, loaded beside
the current one; every file's records from both must be equal, or the tool stops.
Printed: the median CPU-ms per file of each over the rounds, with the 1-minute load
average seen after its rounds (CPU time, not wall time, but a loaded machine's caches
still slow it).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import inspect
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from pydicom.uid import ExplicitVRLittleEndian

from radserve.bench.study import ensure_study
from radserve.ingest import headers as after
from radserve.ingest.policy import IngestPolicy
from radserve.ingest.sources import SourceReader, expand_sources


def load_before(ref: str, folder: Path) -> ModuleType:
    """``radserve.ingest.headers`` as committed at ``ref``, as its own module."""
    text = subprocess.run(
        ["git", "show", f"{ref}:src/radserve/ingest/headers.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = folder / "headers_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("headers_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["headers_before"] = module
    spec.loader.exec_module(module)
    return module


def load_1min() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def cpu_ms_per_file(run: Callable[[], int]) -> float:
    start = time.process_time_ns()
    n = run()
    return (time.process_time_ns() - start) / n / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="main", help="git ref of the 'before' version")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--slices", type=int, default=300)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/radserve-bench"))
    args = parser.parse_args()

    study = ensure_study(args.cache, "explicit", args.slices)
    paths = sorted(study.glob("*.dcm"))
    files, _ = expand_sources(paths)
    policy = IngestPolicy()
    with tempfile.TemporaryDirectory() as tmp:
        before = load_before(args.before, Path(tmp))
        versions = {"before": before, "after": after}

        def discovery(module: ModuleType) -> Callable[[], int]:
            # one memo per discovery, as discover_series has, where the version has it
            # (PatientMemo before session 24)
            memo = getattr(module, "DiscoveryMemo", None) or getattr(module, "PatientMemo", None)

            def run() -> int:
                extra = (memo(),) if memo is not None else ()
                with SourceReader() as reader:
                    for src in files:
                        module.read_instance(reader, src, policy, *extra)
                return len(files)

            return run

        def cstore(module: ModuleType) -> Callable[[], int]:
            known = "transfer_syntax" in inspect.signature(module.read_header).parameters
            extra = {"transfer_syntax": ExplicitVRLittleEndian} if known else {}

            def run() -> int:
                for path in paths:
                    module.read_header(path, **extra)
                return len(paths)

            return run

        with SourceReader() as reader:
            for src in files:
                old = before.read_instance(reader, src, policy)
                new = after.read_instance(reader, src, policy)
                if dataclasses.astuple(old) != dataclasses.astuple(new):
                    raise SystemExit(f"records differ for {src}")
        results: dict[str, list[float]] = {}
        loads: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for path_name, make in (("discovery", discovery), ("cstore", cstore)):
                for name, module in versions.items():
                    key = f"{path_name} {name}"
                    results.setdefault(key, []).append(cpu_ms_per_file(make(module)))
                    loads.setdefault(key, []).append(load_1min())
    for key, values in results.items():
        print(
            f"{key:16s} {statistics.median(values):.3f} CPU-ms/file (min {min(values):.3f}, "
            f"{len(values)} rounds), 1-min load {min(loads[key]):.2f}-{max(loads[key]):.2f}"
        )


if __name__ == "__main__":
    main()
