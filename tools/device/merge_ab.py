"""Merge threads on a GPU host: one study, alternating one merge thread and the default.

Usage: PYTHONPATH=src python tools/device/merge_ab.py STUDY_DIR [ROUNDS]
(tools/device/gpu_platform_check.sh runs it on a 300-slice phantom). Models are loaded
and warmed once; each round runs the reference pipeline with ``merge_threads_for``
pinned to 1 (every release before this one), then with the default, and prints wall
seconds, process CPU-seconds and the stage timings, and whether both runs' labels are
identical. On a CPU-only host the default is one thread too, so both modes are the same.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import radserve.inference.runner as runner
from radserve.bench.child import PIPELINE, _warm
from radserve.models.registry import ModelRegistry
from radserve.pipeline import SessionPool
from radserve.pipeline.spec import load_pipeline
from radserve.pipeline.study import run_study

DEFAULT = runner.merge_threads_for


def main(study: Path, rounds: int) -> None:
    registry, pool = ModelRegistry(), SessionPool()
    _warm(pool, registry, "fp32")
    pipeline = load_pipeline(PIPELINE)
    rows: list[dict[str, object]] = []
    labels: dict[str, list[np.ndarray]] = {"one": [], "default": []}
    for r in range(rounds + 1):  # round 0 warms the file cache and the kernels, unreported
        for mode in ("one", "default"):
            runner.merge_threads_for = (lambda _s: 1) if mode == "one" else DEFAULT
            with tempfile.TemporaryDirectory() as out:
                cpu0, t0 = time.process_time(), time.perf_counter()
                result = run_study(
                    study, pipeline=pipeline, out_dir=Path(out), registry=registry, sessions=pool
                )
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            vr = result.volume_result
            maps = [s.labels.array.copy() for s in vr.steps]
            if r == 0:
                continue
            labels[mode].append(np.concatenate([m.ravel() for m in maps]))
            stages = {k: round(v, 3) for k, v in result.report.timings.items()}
            threads = 1 if mode == "one" else DEFAULT(SimpleNamespace(runtime=pool.runtime))
            row = {"round": r, "mode": mode, "merge_threads": threads, "wall_s": round(wall, 3)}
            rows.append({**row, "cpu_s": round(cpu, 2), "stages": stages})
            print(json.dumps(rows[-1]), flush=True)
    same = all(np.array_equal(a, b) for a, b in zip(labels["one"], labels["default"], strict=True))
    for mode in ("one", "default"):
        walls = sorted(float(r["wall_s"]) for r in rows if r["mode"] == mode)  # type: ignore[arg-type]
        print(f"{mode}: median wall {walls[len(walls) // 2]:.2f} s over {len(walls)} runs")
    print(f"labels identical in every round: {same}; runtime {pool.runtime.providers}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3)
