"""Execution providers and precisions side by side, per model, on the pipeline's own
input batches: ONNX Runtime's CPU provider (what plain ``pip install onnxruntime``
runs) against each other provider and precision this host serves.

Every row runs the same batch through a :class:`~radserve.inference.ModelSession`
configured as serving configures it; the ratio is the CPU provider's time over the
row's, and the label agreement is the share of voxels whose arg-max matches the CPU
provider's at FP32 (the same answer, faster).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from radserve.bench import PIPELINE
from radserve.bench.study import bench_spec
from radserve.evaluation.pipeline_runs import record_model_inputs
from radserve.inference import ModelSession, RuntimeChoice, choose_runtime
from radserve.models.registry import ModelBundle, ModelRegistry
from radserve.phantom import generate_phantom
from radserve.pipeline.spec import load_pipeline


def _time(session: ModelSession, batch: np.ndarray, repeats: int) -> tuple[float, np.ndarray]:
    out = session.run(batch)  # first run: compilation, arena growth
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = session.run(batch)
        times.append(time.perf_counter() - start)
    return 1000.0 * statistics.median(times), out


def candidates(bundle: ModelBundle) -> list[tuple[str, RuntimeChoice, str]]:
    """(label, runtime, precision): the CPU provider at FP32 first, then every other
    available provider at every precision its model bundle may serve there."""
    cpu = choose_runtime(prefer=["CPUExecutionProvider"])
    rows = [("CPUExecutionProvider fp32", cpu, "fp32")]
    best = choose_runtime()
    for precision in bundle.available_precisions():
        for runtime in {cpu.primary: cpu, best.primary: best}.values():
            if runtime is cpu and precision == "fp32":
                continue
            if precision == "bf16" and not runtime.runs_bf16:
                continue
            rows.append((f"{runtime.primary} {precision}", runtime, precision))
    return rows


def run_providers_bench(
    *, n_slices: int = 120, repeats: int = 10, log: Callable[[str], None] = print
) -> dict[str, object]:
    registry = ModelRegistry()
    pipeline = load_pipeline(PIPELINE)
    log(f"recording the pipeline's input batches on a {n_slices}-slice phantom")
    ct = generate_phantom(bench_spec(n_slices)).ct
    models: dict[str, object] = {}
    for step in pipeline.steps:
        bundle = registry.get(step.model, step.version)
        batches = record_model_inputs(registry, pipeline, step.model, [ct], batches_per_study=8)
        batch = max(batches, key=len)
        rows = []
        reference_ms, reference = 0.0, None
        for label, runtime, precision in candidates(bundle):
            log(f"{bundle.key}: {label}")
            path = bundle.onnx_path(precision)
            session = ModelSession(path, bundle.spec, runtime=runtime, precision=precision)
            ms, out = _time(session, batch, repeats)
            if reference is None:
                reference_ms, reference = ms, out.argmax(1)
            rows.append(
                {
                    "provider": session.providers_in_use[0],
                    "precision": precision,
                    "ms_per_batch": ms,
                    "ms_per_slice": ms / len(batch),
                    "speedup_vs_cpu_fp32": reference_ms / ms,
                    "label_agreement": float(np.mean(out.argmax(1) == reference)),
                    "threads": runtime.intra_op_threads,
                }
            )
        models[bundle.key] = {"batch_shape": list(batch.shape), "rows": rows}
    return {"study_slices": n_slices, "repeats": repeats, "models": models}
