"""Does a briefly trained network agree between OpenVINO and torch at full size? (issue 18)

The full nnU-Net benchmark's CT and architecture; the model made as ``radserve bench
--scenario nnunet --weights WEIGHTS`` makes it (``trained``: the whole network trained
TRAIN_STEPS Adam steps, ``fitted``: the head only, ``random``), imported with
``radserve models import nnunet``; then 8 patches spread over the 64 of the benchmark's
grid (their air share from 3% to 72%) through the served OpenVINO session and through
torch (nnU-Net's network). Prints per patch and over all 8: argmax agreement, the share
of voxels with a top-2 torch margin below 0.05, and how well the network learned the
intensity classes (torch argmax vs ``hu_band_target``). About 4 minutes on 2 idle
cores for ``trained`` (training 2 of them), 20 under load 10+.

A ``WORK/results`` folder that exists is used as it is (e.g. a copy of a ``radserve bench
--scenario nnunet --size full`` work folder's, the same seeded weights), not rebuilt.
``--bf16`` also runs each patch through OpenVINO at bf16 on CPUs that have it
(``agree_bf16``: does a decisive model keep its labels there? issue 18, session 12).

    PYTHONPATH=src python tools/nnunet_trained_agreement.py WORK [trained|fitted|random] \
        [LR] [STEPS] [--bf16]
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from radserve.bench.nnunet import TRAIN_STEPS, _ct, _plans, _train_on
from radserve.bench.nnunet_model import hu_band_target, make_results_folder
from radserve.importers.nnunet import import_nnunet, load_predictor, read_results_folder
from radserve.inference import ModelSession, make_task
from radserve.models.manifest import load_manifest

args = [a for a in sys.argv if a != "--bf16"]
bf16 = "--bf16" in sys.argv
sys.argv = args
if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
    sys.exit(__doc__)  # the usage; never a WORK folder named "--help"
work = Path(sys.argv[1])
weights = sys.argv[2] if len(sys.argv) > 2 else "trained"
lr = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-3


def log(*a: object) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


ct, plans = _ct("full"), _plans("full")
props = plans["foreground_intensity_properties_per_channel"]["0"]
t0 = time.perf_counter()
steps = (int(sys.argv[4]) if len(sys.argv) > 4 else TRAIN_STEPS) if weights == "trained" else 0
if (work / "results").is_dir():
    folder = next((work / "results").iterdir())
else:
    folder = make_results_folder(
        work / "results", plans=plans, folds=(0,), train_steps=steps, train_lr=lr,
        train_on=None if weights == "random" else _train_on(ct, plans),
    )  # fmt: skip
R: dict = {"weights": weights, "steps": steps, "lr": lr, "build_s": time.perf_counter() - t0}
log(f"model ({weights}) in {R['build_s']:.0f} s")
bundle = work / "models/bench-nnunet/full"
if not bundle.is_dir():
    bundle = import_nnunet(folder, work / "models", name="bench-nnunet", version="full")
model = load_manifest(bundle / "model.yaml")
session = ModelSession(bundle / "model.onnx", model)
session_bf16 = ModelSession(bundle / "model.onnx", model, precision="bf16") if bf16 else None
predictor = load_predictor(read_results_folder(folder))
net = predictor.network
net.load_state_dict(predictor.list_of_parameters[0])
net.eval()
task = make_task(ct, model, max_batch_size=1)
items = task._items
n = len(items)
subset = sorted({(i * (n // 8 + 1)) % n for i in range(8)})
floor = float(task._image.min())
same = same_bf16 = near = learned = total = 0
R["patches"] = {}
for i in subset:
    x = task._inputs((items[i],))
    t = time.perf_counter()
    lo = session.run(x)[0]
    fp32_s = time.perf_counter() - t
    with torch.no_grad():
        lt = net(torch.from_numpy(x))[0].numpy()
    at = lt.argmax(0)
    top2 = np.sort(lt, 0)[-2:]
    row = {
        "start": list(map(int, items[i])),
        "air": float((x == floor).mean()),
        "agree": float((lo.argmax(0) == at).mean()),
        "near_tie_0.05": float(((top2[1] - top2[0]) < 0.05).mean()),
        "learned": float((at == hu_band_target(x[0, 0] * props["std"] + props["mean"])).mean()),
    }
    if session_bf16 is not None:
        t = time.perf_counter()
        lb = session_bf16.run(x)[0]
        row["bf16_s"], row["fp32_s"] = time.perf_counter() - t, fp32_s
        row["agree_bf16"] = float((lb.argmax(0) == at).mean())
        row["meanabs_bf16"] = float(np.abs(lb - lt).mean())
        row["meanabs_fp32"] = float(np.abs(lo - lt).mean())
        same_bf16 += row["agree_bf16"] * at.size
    R["patches"][i] = row
    same += row["agree"] * at.size
    near += row["near_tie_0.05"] * at.size
    learned += row["learned"] * at.size
    total += at.size
    log(
        f"patch {i}",
        json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in row.items()}),
    )
R.update(agree=same / total, near_tie=near / total, learned=learned / total)
if session_bf16 is not None:
    R["agree_bf16"] = same_bf16 / total
    log(f"8 patches at bf16: agreement {R['agree_bf16']:.5f}")
log(f"8 patches: agreement {R['agree']:.5f}, near ties {R['near_tie']:.4f}", R["learned"])
(work / "result.json").write_text(json.dumps(R, indent=1))
