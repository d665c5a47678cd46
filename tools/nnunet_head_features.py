"""The full nnU-Net benchmark's network body on 8 patches, through torch and OpenVINO
(issue 18, session 10): the features its segmentation head (a 1x1x1 convolution) reads.

The benchmark's models share one random body (nnU-Net's He initialisation, seed 0);
only the head differs (``--weights random`` / ``fitted``). With both backends' head
inputs recorded, any head's logits on either backend are one matrix product, so how a
head's fit decides the OpenVINO-vs-torch agreement is measured without rerunning the
network (``tools/nnunet_head_fit.py`` reads WORK). Also counts the patches whose
network input is bit-identical to another's (what an identical-patch cache would save).

    PYTHONPATH=src python tools/nnunet_head_features.py WORK [full|medium]

Writes WORK/task.json (patches, their air share, duplicates), WORK/ft_<i>.f32 and
WORK/fo_<i>.f32 (32 x 128^3 float32 each, torch / OpenVINO), WORK/in_<i>.f32 (the
patch input); about 4.5 GB at full size, 10 minutes on 2 idle cores.
"""

import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from radserve.bench.nnunet import _ct, _plans
from radserve.bench.nnunet_model import make_results_folder
from radserve.importers.nnunet import import_nnunet, load_predictor, read_results_folder
from radserve.inference import make_task
from radserve.inference.providers import choose_runtime, precision_options
from radserve.models.manifest import load_manifest

work = Path(sys.argv[1])
size = sys.argv[2] if len(sys.argv) > 2 else "full"
work.mkdir(parents=True, exist_ok=True)


def log(*a: object) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


ct = _ct(size)
plans = _plans(size)
if not (work / "models").exists():
    log("random-weight folder + import ...")
    make_results_folder(work / "results", plans=plans, folds=(0,))
    import_nnunet(
        next((work / "results").iterdir()), work / "models", name="bench-nnunet", version=size
    )
folder = next((work / "results").iterdir())
model = load_manifest(work / "models/bench-nnunet" / size / "model.yaml")
task = make_task(ct, model, max_batch_size=1)
items = [tuple(map(int, it)) for it in task._items]
floor = float(task._image.min())
hashes, air = [], []
for it in items:
    x = task._inputs((it,))
    hashes.append(hashlib.blake2b(x.tobytes(), digest_size=16).hexdigest())
    air.append(float((x == floor).mean()))
n = len(items)
subset = sorted({(i * (n // 8 + 1)) % n for i in range(8)})
meta = {
    "items": items,
    "grid": list(task._grid),
    "floor": floor,
    "air": air,
    "distinct_inputs": len(set(hashes)),
    "all_floor": sum(a == 1.0 for a in air),
    "subset": subset,
}
(work / "task.json").write_text(json.dumps(meta))
log(f"{n} patches, {len(set(hashes))} distinct inputs, {meta['all_floor']} all at the floor")
log("air share per patch:", [round(a, 2) for a in air])
for i in subset:
    p = work / f"in_{i}.f32"
    if not p.exists():
        task._inputs((items[i],)).astype(np.float32).tofile(p)
del task

predictor = load_predictor(read_results_folder(folder))
net = predictor.network
net.load_state_dict(predictor.list_of_parameters[0])
net.eval()
head = net.decoder.seg_layers[-1]
torch.save(head.state_dict(), work / "head_random.pt")
net.decoder.seg_layers[-1] = torch.nn.Identity()
body = work / "body.onnx"
if not body.exists():
    with torch.no_grad():
        torch.onnx.export(
            net, (torch.zeros(1, 1, 128, 128, 128),), str(body), dynamo=False,
            opset_version=17, input_names=["image"], output_names=["features"],
            dynamic_axes={"image": {0: "batch"}, "features": {0: "batch"}},
            do_constant_folding=True,
        )  # fmt: skip
runtime = choose_runtime()
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
options.intra_op_num_threads = runtime.intra_op_threads
options.inter_op_num_threads = 1
options.log_severity_level = 3
session = ort.InferenceSession(
    str(body), sess_options=options, providers=list(runtime.providers),
    provider_options=precision_options(runtime, "fp32"),
)  # fmt: skip
full = ort.InferenceSession(
    str(work / "models/bench-nnunet" / size / "model.onnx"), sess_options=options,
    providers=list(runtime.providers), provider_options=precision_options(runtime, "fp32"),
)  # fmt: skip
log("provider", session.get_providers()[0])
for k, i in enumerate(subset):
    x = np.fromfile(work / f"in_{i}.f32", np.float32).reshape(1, 1, 128, 128, 128)
    if not (work / f"fo_{i}.f32").exists():
        t0 = time.perf_counter()
        fo = session.run(None, {"image": x})[0]
        log(f"patch {i}: OpenVINO body {time.perf_counter() - t0:.1f} s")
        if k == 0:  # the head on OpenVINO's body features = OpenVINO's whole network?
            w = head.weight.detach().numpy().reshape(head.weight.shape[0], -1)
            mine = (
                np.einsum("kc,c...->k...", w, fo[0])
                + head.bias.detach().numpy()[:, None, None, None]
            )
            ref = full.run(None, {"image": x})[0][0]
            meta["body_head_vs_full_max_abs"] = float(np.abs(mine - ref).max())
            meta["full_logit_max_abs"] = float(np.abs(ref).max())
            log(
                "head(OV body) vs OV full:",
                meta["body_head_vs_full_max_abs"],
                "of",
                meta["full_logit_max_abs"],
            )
            (work / "task.json").write_text(json.dumps(meta))
        fo[0].tofile(work / f"fo_{i}.f32")
    if not (work / f"ft_{i}.f32").exists():
        t0 = time.perf_counter()
        with torch.no_grad():
            ft = net(torch.from_numpy(x))[0].numpy()
        log(f"patch {i}: torch body {time.perf_counter() - t0:.1f} s")
        ft.tofile(work / f"ft_{i}.f32")
log("done")
