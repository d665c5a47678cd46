"""What one 128^3 patch of nnU-Net's default network costs, torch vs OpenVINO (issue 18).

The full benchmark's network (``radserve bench --scenario nnunet --size full``: nnU-Net's
default 3d_fullres plans at 1.5 mm, six stages, 32..320 features) with random weights
(a network's cost does not depend on them), built and imported into WORK once. Prints
its multiply-accumulates per patch (forward hooks on nnU-Net's own network: every
Conv3d and ConvTranspose3d), then, alternated in one process for ROUNDS rounds on the
same two patches: torch (the network nnUNetPredictor runs, its default thread count),
OpenVINO as radserve serves it (one request, all cores) and OpenVINO with two requests
in flight on two one-thread streams. Each line: wall and process CPU seconds per patch
(CPU seconds are what a shared host moves least), GFLOP per CPU second, argmax
agreement with torch, the load average. About 2 minutes a round on 2 idle cores.

    PYTHONPATH=src python tools/nnunet_network_cost.py WORK [ROUNDS]
"""

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from radserve.bench.nnunet import _plans
from radserve.bench.nnunet_model import make_results_folder
from radserve.importers.nnunet import import_nnunet, load_predictor, read_results_folder
from radserve.inference.providers import choose_runtime, precision_options

if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    sys.exit(__doc__)  # the usage; never a WORK folder named "--help"
work = Path(sys.argv[1])
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
if not (work / "models").is_dir():
    made = make_results_folder(work / "results", plans=_plans("full"), folds=(0,))
    import_nnunet(made, work / "models", name="bench-nnunet", version="full")
predictor = load_predictor(read_results_folder(next((work / "results").iterdir())))
net = predictor.network
net.load_state_dict(predictor.list_of_parameters[0])
net.eval()

macs = [0]


def count(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
    k = int(np.prod(getattr(module, "kernel_size", (1,))))
    if isinstance(module, torch.nn.Conv3d):
        macs[0] += output.numel() * module.in_channels // module.groups * k
    elif isinstance(module, torch.nn.ConvTranspose3d):
        macs[0] += inputs[0].numel() * module.out_channels * k


hooks = [m.register_forward_hook(count) for m in net.modules()]
with torch.no_grad():
    net(torch.zeros(1, 1, 64, 64, 64))  # 1/8 of a patch's voxels: the smallest that runs
for h in hooks:
    h.remove()
gflop = 2 * macs[0] * 8 / 1e9
print(json.dumps({"GMAC_per_patch": gflop / 2, "torch_threads": torch.get_num_threads()}))

runtime = choose_runtime()
threads = runtime.intra_op_threads
served = precision_options(runtime, "fp32")[0]
config = json.loads(served["load_config"])
config["CPU"].update(NUM_STREAMS="2", INFERENCE_NUM_THREADS=str(threads))
options = {"served": served, "2 streams": {**served, "load_config": json.dumps(config)}}
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.log_severity_level = 3
model = str(work / "models/bench-nnunet/full/model.onnx")
sessions = {
    k: ort.InferenceSession(model, so, providers=[runtime.primary], provider_options=[o])
    for k, o in options.items()
}
name = sessions["served"].get_inputs()[0].name
x = (np.random.default_rng(0).standard_normal((2, 1, 128, 128, 128)) * 0.5).astype(np.float32)


def run(config: str) -> np.ndarray:
    if config == "torch":
        with torch.no_grad():
            return np.concatenate([net(torch.from_numpy(x[i : i + 1])).numpy() for i in (0, 1)])
    session = sessions[config]
    one = lambda i: session.run(None, {name: x[i : i + 1]})[0]  # noqa: E731
    if config == "served":
        return np.concatenate([one(0), one(1)])
    with ThreadPoolExecutor(2) as pool:  # two requests in flight
        return np.concatenate(list(pool.map(one, (0, 1))))


for config in sessions:
    run(config)  # compiled and warm
for r in range(rounds):
    reference = None
    for config in ("torch", *sessions):
        load, cpu, t = os.getloadavg()[0], time.process_time(), time.perf_counter()
        out = run(config)
        wall, cpu = (time.perf_counter() - t) / 2, (time.process_time() - cpu) / 2
        reference = out if reference is None else reference
        line = {
            "round": r,
            "config": config,
            "s_per_patch": round(wall, 2),
            "cpu_s_per_patch": round(cpu, 2),
            "gflop_per_cpu_s": round(gflop / cpu, 1),
            "argmax_vs_torch": float((out.argmax(1) == reference.argmax(1)).mean()),
            "load": [round(load, 1), round(os.getloadavg()[0], 1)],
        }
        print(json.dumps(line), flush=True)
