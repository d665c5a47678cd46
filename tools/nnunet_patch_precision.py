"""One 128^3 patch of the medium benchmark's fitted model: OpenVINO fp32 and bf16 vs torch.

Times one run each (after a warm-up for OpenVINO) and gives each one's argmax agreement
with torch on that patch. WORK is a ``radserve bench --scenario nnunet --size medium``
work folder (``/tmp/radserve-bench-nnunet-*``, kept after the run). About a minute.

    PYTHONPATH=src python tools/nnunet_patch_precision.py WORK
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from radserve.bench.nnunet import _ct, _plans, _train_on
from radserve.bench.nnunet_model import _most_mixed_block
from radserve.importers.nnunet import load_predictor, read_results_folder
from radserve.inference import ModelSession
from radserve.models.manifest import load_manifest

w = Path(sys.argv[1])
b = w / "models/bench-nnunet/medium"
spec = load_manifest(b / "model.yaml")
plans = _plans("medium")
hu = _most_mixed_block(_train_on(_ct("medium"), plans), [128] * 3)
p = plans["foreground_intensity_properties_per_channel"]["0"]
x = ((np.clip(hu, p["percentile_00_5"], p["percentile_99_5"]) - p["mean"]) / p["std"]).astype(
    np.float32
)[None, None]
R = {}
for prec in ("fp32", "bf16"):
    s = ModelSession(b / "model.onnx", spec, precision=prec)
    s.run(x)
    t = time.perf_counter()
    R[prec] = s.run(x)
    R[prec + "_s"] = time.perf_counter() - t
pr = load_predictor(read_results_folder(next((w / "results").iterdir())))
net = pr.network
net.load_state_dict(pr.list_of_parameters[0])
net.eval()
with torch.no_grad():
    t = time.perf_counter()
    ref = net(torch.from_numpy(x)).numpy()
    R["torch_s"] = time.perf_counter() - t
out = {k: v for k, v in R.items() if k.endswith("_s")}
for prec in ("fp32", "bf16"):
    out[prec + "_argmax_vs_torch"] = float((R[prec].argmax(1) == ref.argmax(1)).mean())
print(json.dumps(out))
