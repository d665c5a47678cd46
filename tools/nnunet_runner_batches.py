"""radserve alone on the medium nnU-Net benchmark CT: one patch per batch or two, with
the overlapped runner or the plain loop (issue 18; the README's nnU-Net section).

Each configuration runs the whole study once (make_task included) on a session that
ran one patch first; prints one JSON line per configuration with its seconds, stage
timings, the load average and its voxel agreement with the first configuration's
labels. WORK is a ``radserve bench --scenario nnunet --size medium`` work folder
(``/tmp/radserve-bench-nnunet-*``, kept after the run). About 3 minutes on 2 idle cores.

    PYTHONPATH=src python tools/nnunet_runner_batches.py WORK [fp32|bf16]
"""

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from radserve.bench.nnunet import _ct
from radserve.inference import ModelSession, make_task, run_task, run_task_overlapped
from radserve.models.manifest import load_manifest

work = Path(sys.argv[1])
precision = sys.argv[2] if len(sys.argv) > 2 else "fp32"
bundle = work / "models/bench-nnunet/medium"
spec = load_manifest(bundle / "model.yaml")
ct = _ct("medium")
session = ModelSession(bundle / "model.onnx", spec, precision=precision)
session.run(np.zeros((1, 1, *spec.input.patch_size), np.float32))  # compiled and warm
first = None
for batch, runner in ((1, run_task_overlapped), (2, run_task_overlapped), (1, run_task)):
    t0 = time.perf_counter()
    task = make_task(ct, spec, max_batch_size=batch, precision=precision)
    prediction = runner(task, session)
    seconds = time.perf_counter() - t0
    labels = prediction.labels.array
    first = labels if first is None else first
    print(
        json.dumps(
            {
                "batch": batch,
                "runner": runner.__name__,
                "s": round(seconds, 2),
                "stages": {k: round(v, 2) for k, v in prediction.timings.items()},
                "same_labels_as_first": float((labels == first).mean()),
                "load": os.getloadavg()[0],
            }
        ),
        flush=True,
    )
