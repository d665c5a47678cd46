"""One benchmark contestant in its own process, so peak RSS is its own.

``python -m radserve.bench.child MODE STUDY WORKDIR`` warms up the model sessions, runs
the study once, and writes ``result.json`` (stage times, peak RSS) and ``labels.npz``
(organ labels and the binary findings mask) into WORKDIR for the parent to compare.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

from radserve.models.registry import ModelRegistry
from radserve.pipeline import SessionPool
from radserve.pipelines.spec import load_pipeline

PIPELINE = "ct-chest-abdomen"


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _warm(pool: SessionPool, registry: ModelRegistry, precision: str) -> dict[str, object]:
    """Create every session and run one batch: servers are warm before studies arrive."""
    sessions = {}
    for step in load_pipeline(PIPELINE).steps:
        bundle = registry.get(step.model, step.version)
        session = pool.get(bundle, precision)
        channels = bundle.spec.input.in_channels
        session.run(np.zeros((1, channels, 256, 256), np.float32))
        sessions[bundle.spec.name] = session
    return sessions


def run_radserve(study: Path, workdir: Path, precision: str) -> dict[str, object]:
    from radserve.study import run_study

    registry, pool = ModelRegistry(), SessionPool()
    _warm(pool, registry, precision)
    rss_warm = _peak_rss_mb()
    t0 = time.perf_counter()
    result = run_study(
        study,
        pipeline=load_pipeline(PIPELINE),
        out_dir=workdir / "out",
        registry=registry,
        sessions=pool,
        precision=precision,  # type: ignore[arg-type]
    )
    elapsed = time.perf_counter() - t0
    vr = result.volume_result
    organs = vr.organ_step.labels.array if vr.organ_step else None
    lesion = vr.lesion_step
    findings = lesion.finding_labels.array > 0 if lesion and lesion.finding_labels else None
    _save(workdir, organs, findings)
    return {
        "seconds": elapsed,
        "stages": result.report.timings,
        "peak_rss_mb": _peak_rss_mb(),
        "rss_after_warmup_mb": rss_warm,
        "n_findings": len(result.report.findings),
        "providers": list(pool.runtime.providers),
        "threads": pool.runtime.intra_op_threads,
    }


def run_baseline(study: Path, workdir: Path, precision: str) -> dict[str, object]:
    from radserve.bench.naive import run_naive

    registry, pool = ModelRegistry(), SessionPool()
    sessions = _warm(pool, registry, precision)
    rss_warm = _peak_rss_mb()
    t0 = time.perf_counter()
    result = run_naive(study, load_pipeline(PIPELINE), registry, sessions)  # type: ignore[arg-type]
    elapsed = time.perf_counter() - t0
    _save(workdir, result.organs, result.findings > 0)
    return {
        "seconds": elapsed,
        "stages": result.stages,
        "peak_rss_mb": _peak_rss_mb(),
        "rss_after_warmup_mb": rss_warm,
    }


def _save(workdir: Path, organs: np.ndarray | None, findings: np.ndarray | None) -> None:
    arrays = {}
    if organs is not None:
        arrays["organs"] = organs
    if findings is not None:
        arrays["findings"] = np.asarray(findings, np.uint8)
    np.savez(workdir / "labels.npz", **arrays)


MODES = {"radserve": run_radserve, "naive": run_baseline}


def main(argv: list[str]) -> None:
    mode, study, workdir = argv[0], Path(argv[1]), Path(argv[2])
    precision = argv[3] if len(argv) > 3 else "fp32"
    if mode == "monai":
        from radserve.bench.monai_baseline import run_monai

        runner = run_monai
    else:
        runner = MODES[mode]
    workdir.mkdir(parents=True, exist_ok=True)
    out = runner(study, workdir, precision)
    (workdir / "result.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
