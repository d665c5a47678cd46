"""Peak memory of the 3D sliding window: rolling z-slab accumulator vs one whole-volume
accumulator (issue 18), each in a fresh process, with identical labels checked.

A 1 -> K-class 3x3x3 convolution (cheap: the accumulator, not the network, dominates)
runs on a long synthetic CT through ``PatchTask`` at 1.5 mm with 64^3 patches, overlap
0.5. Peak RSS is the child's ``ru_maxrss``; the accumulator's own bytes are printed
beside it.

Usage: PYTHONPATH=src python tools/measure_patch_memory.py [--classes 32] [--slices 400]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path


def _model(path: Path, classes: int) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).normal(size=(classes, 1, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["logits"], kernel_shape=[3, 3, 3], pads=[1] * 6)],
        "measure",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "a", "b", "c"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes, "a", "b", "c"])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def _child(args: argparse.Namespace) -> None:
    import numpy as np

    from radserve.domain.volume import Volume
    from radserve.inference import ModelSession, PatchTask, choose_runtime, run_task
    from radserve.models.manifest import ModelSpec

    concept = {"value": "1", "scheme": "99RADSRV", "meaning": "x"}
    spec = ModelSpec.model_validate(
        {
            "name": "measure",
            "version": "1.0.0",
            "task": "segmentation",
            "modality": "CT",
            "labels": [
                {"value": v, "name": f"l{v}", "concept": concept, "category": concept}
                for v in range(1, args.classes)
            ],
            "input": {
                "mode": "3d",
                "spacing": [1.5, 1.5, 1.5],
                "patch_size": [64, 64, 64],
                "normalisation": {"kind": "ct_window", "center": 0, "width": 800},
                "crop": "none",
            },
        }
    )
    rng = np.random.default_rng(1)
    hu = rng.normal(0, 300, size=(args.slices, args.rows, args.rows)).astype(np.int16)
    volume = Volume.from_geometry(hu, spacing=(1.0, 0.8, 0.8))
    cls = PatchTask if args.mode == "rolling" else type("Whole", (PatchTask,), {"_rolling": False})
    runtime = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)
    session = ModelSession(Path(args.model), spec, runtime=runtime)
    task = cls(volume, spec, crop_to_body=False)
    grid, rows = task._grid, task._acc.shape[1]
    labels = run_task(task, session).labels.array
    print(
        json.dumps(
            {
                "mode": args.mode,
                "model_grid": list(grid),
                "accumulator_rows": int(getattr(task, "_peak_rows", rows)),
                # K class rows + the weight sum, float32
                "accumulator_mb": round(
                    4 * (spec.num_classes + 1) * task._peak_rows * grid[1] * grid[2] / 2**20, 1
                ),
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                "labels_sha256": hashlib.sha256(labels.tobytes()).hexdigest()[:16],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=32)
    parser.add_argument("--slices", type=int, default=400)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--mode", choices=["rolling", "whole"])
    parser.add_argument("--model")
    args = parser.parse_args()
    if args.mode:
        _child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "m.onnx"
        _model(model, args.classes)
        results = []
        for mode in ("whole", "rolling"):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--mode",
                    mode,
                    "--model",
                    str(model),
                    "--classes",
                    str(args.classes),
                    "--slices",
                    str(args.slices),
                    "--rows",
                    str(args.rows),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]))
        same = results[0]["labels_sha256"] == results[1]["labels_sha256"]
        print(f"identical labels: {same}")


if __name__ == "__main__":
    main()
