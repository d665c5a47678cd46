"""Where bf16 loses labels: one 128^3 patch of the medium benchmark's fitted model.

Argmax agreement with torch (float32) of: OpenVINO fp32 and bf16 as served; the bf16
network body with the segmentation head (the last 1x1x1 convolution) applied in float64;
the fp32 body with the head's weights, or its input features, or the final logits
rounded to bfloat16. Also the share of voxels whose torch top-2 logit margin is small.
WORK is a ``radserve bench --scenario nnunet --size medium`` work folder
(``/tmp/radserve-bench-nnunet-*``). About 2 minutes on 2 idle cores (issue 18).

    PYTHONPATH=src python tools/nnunet_bf16_error.py WORK
"""

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import helper

from radserve.bench.nnunet import _ct, _plans, _train_on
from radserve.bench.nnunet_model import _most_mixed_block
from radserve.importers.nnunet import load_predictor, read_results_folder
from radserve.inference.providers import choose_runtime, precision_options

work = Path(sys.argv[1])
bundle = work / "models/bench-nnunet/medium"
plans = _plans("medium")
hu = _most_mixed_block(_train_on(_ct("medium"), plans), [128] * 3)
p = plans["foreground_intensity_properties_per_channel"]["0"]
x = np.clip(hu, p["percentile_00_5"], p["percentile_99_5"])
x = ((x - p["mean"]) / p["std"]).astype(np.float32)[None, None]

model = onnx.load(str(bundle / "model.onnx"))
head = [n for n in model.graph.node if n.op_type == "Conv"][-1]
weights = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
w, b = weights[head.input[1]], weights[head.input[2]]
del model.graph.output[:]  # the same graph, ending at the head's input features
model.graph.output.extend(
    [helper.make_tensor_value_info(head.input[0], onnx.TensorProto.FLOAT, None)]
)
body = work / "body.onnx"
onnx.save(model, str(body))
runtime = choose_runtime()


def run(path: Path, precision: str) -> np.ndarray:
    session = ort.InferenceSession(
        str(path),
        providers=list(runtime.providers),
        provider_options=precision_options(runtime, precision),
    )
    return session.run(None, {"image": x})[0]


def apply_head(features: np.ndarray, weight: np.ndarray = w) -> np.ndarray:
    k = weight.shape[0]
    out = np.einsum("kc,ncdhw->nkdhw", weight.reshape(k, -1).astype(np.float64), features)
    return out + b.reshape(1, -1, 1, 1, 1)


def bf16(a: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(np.array(a, dtype=np.float32))
    return t.to(torch.bfloat16).float().numpy()


predictor = load_predictor(read_results_folder(next((work / "results").iterdir())))
net = predictor.network
net.load_state_dict(predictor.list_of_parameters[0])
net.eval()
with torch.no_grad():
    ref = net(torch.from_numpy(x)).numpy()
fp32, features32 = run(bundle / "model.onnx", "fp32"), run(body, "fp32")
cases = {
    "openvino fp32": fp32,
    "openvino bf16": run(bundle / "model.onnx", "bf16"),
    "bf16 body, float head": apply_head(run(body, "bf16")),
    "fp32, head weights rounded to bf16": apply_head(features32, bf16(w)),
    "fp32, head input rounded to bf16": apply_head(bf16(features32)),
    "fp32, logits rounded to bf16": bf16(fp32),
}
top = np.sort(ref, axis=1)
margin = top[:, -1] - top[:, -2]
result = {
    "top2_margin_below_0.05": float((margin < 0.05).mean()),
    "top2_margin_below_0.2": float((margin < 0.2).mean()),
    "largest_logit": float(np.abs(ref).max()),
}
for name, out in cases.items():
    result[name] = {
        "argmax_vs_torch": float((out.argmax(1) == ref.argmax(1)).mean()),
        "mean_abs_logit_error": float(np.abs(out - ref).mean()),
    }
print(json.dumps(result, indent=1))
