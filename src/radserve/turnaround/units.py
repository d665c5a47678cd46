"""A job's work in the server's own units, for the simulation (:mod:`.simulate`).

The server does not run a study as one CPU stage, its device batches and one more CPU
stage: per model it prepares each batch (CPU), runs it (device), merges its output
(CPU), then post-processes (CPU), and ends with the report. Preparing and merging are
*feed* work, handed out before any stage of the same class, so the best-ranked job's
batches keep the device busy while other jobs' long stages (ingest, reports) wait for a
thread (``Scheduler.next_cpu_dispatch``). :func:`fine_service` builds that sequence from
the steps' seconds the service-time model or a job's end record holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from radserve.turnaround.service_time import NOT_WORK
from radserve.turnaround.simulate import JobService, ModelWork

INGEST = "ingest"


def fine_service(
    steps: Mapping[str, float], slices: int, batch_slices: int, scale: float = 1.0
) -> JobService:
    """The job whose steps took ``steps`` seconds (``ingest``, ``<model>: prepare`` /
    ``infer`` / ``merge`` / ``postprocess``, then the report's), each times ``scale``:
    its models in the order the steps name them, each model's prepare, infer and merge
    seconds spread evenly over its ``ceil(slices / batch_slices)`` batches (the server's
    split); a model's other steps are its post-processing stage; steps of no model
    (report, result lineage) the last stage."""
    n = max(1, math.ceil(slices / max(1, batch_slices)))
    models: dict[str, dict[str, float]] = {}
    last = 0.0
    for name, seconds in steps.items():
        if name in NOT_WORK or name == INGEST:
            continue
        model, sep, kind = name.partition(": ")
        if not sep:
            last += seconds
            continue
        parts = models.setdefault(model, {})
        key = kind if kind in ("prepare", "infer", "merge") else "post"
        parts[key] = parts.get(key, 0.0) + seconds

    def spread(seconds: float) -> tuple[float, ...]:
        return (seconds * scale / n,) * n if seconds > 0 else ()

    work = []
    for parts in models.values():
        batches = spread(parts.get("infer", 0.0))
        if not batches:  # no device work: all of it one stage
            work.append(ModelWork((), post_s=sum(parts.values()) * scale))
            continue
        prepare = spread(parts.get("prepare", 0.0)) or (0.0,) * n
        merge = spread(parts.get("merge", 0.0)) or (0.0,) * n
        work.append(ModelWork(batches, prepare, merge, parts.get("post", 0.0) * scale))
    return JobService(
        steps.get(INGEST, 0.0) * scale,
        tuple(b for m in work for b in m.batches_s),
        max(0.0, last) * scale,
        tuple(work),
    )


__all__ = ["fine_service"]
