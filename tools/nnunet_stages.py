"""Stage by stage, radserve vs nnUNetPredictor on one CT and one set of weights.

The README's issue 18 section ("Why the agreement was low") comes from this script:
nnU-Net's default 3d_fullres architecture on the centre NZ x 356 x 356 of the benchmark
CT (NZ=144: 4 patches), random weights (or ``fit``: the benchmark's fitted head).
It records both sides' patch inputs and logits, compares the preprocessed input, the
patch inputs, one patch's logits from torch / OpenVINO / ONNX Runtime's CPU provider,
and replays the recorded logits through nnU-Net's own sliding window with float16
(its default) and float32 sums. Writes WORKDIR/result.json. Minutes on 2 idle cores
(torch runs the network 4 times, OpenVINO 4 times, ONNX Runtime's CPU provider once).

    PYTHONPATH=src python tools/nnunet_stages.py /tmp/nnunet-stages [NZ] [fit]
"""

import json
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch
from nnunetv2.inference.data_iterators import PreprocessAdapterFromNpy
from nnunetv2.inference.export_prediction import (
    convert_predicted_logits_to_segmentation_with_correct_shape,
)
from nnunetv2.inference.sliding_window_prediction import (
    compute_gaussian,
    compute_steps_for_sliding_window,
)

from radserve.bench.nnunet import _plans
from radserve.bench.nnunet_model import make_results_folder
from radserve.bench.study import bench_spec
from radserve.importers.nnunet import import_nnunet, load_predictor, read_results_folder
from radserve.inference import ModelSession, make_task, run_task_overlapped
from radserve.inference.providers import choose_runtime
from radserve.models.manifest import load_manifest
from radserve.phantom import generate_phantom
from radserve.preprocess.crop import crop_volume

work = Path(sys.argv[1])
work.mkdir(parents=True, exist_ok=True)
NZ = int(sys.argv[2]) if len(sys.argv) > 2 else 144
R = {}
ct_full = generate_phantom(bench_spec(300)).ct
z0 = (300 - NZ) // 2
box = (slice(z0, z0 + NZ), slice(78, 434), slice(78, 434))
ct = crop_volume(ct_full, box)
ct = ct.with_array(np.ascontiguousarray(ct.array))
print("crop", ct.shape, ct.spacing, flush=True)
folder = work / "results"
FIT = len(sys.argv) > 3 and sys.argv[3] == "fit"
if not folder.exists():
    t = time.perf_counter()
    train = ct_full.array[:, ::2, ::2] if FIT else None  # ~1.3 x 1.6 mm, HU
    make_results_folder(folder, plans=_plans("full"), folds=(0,), train_on=train)
    R["make_folder_s"] = time.perf_counter() - t
folder = folder / next(p.name for p in folder.iterdir())
bundle = work / "models/bench-nnunet/full"
if not bundle.exists():
    bundle = import_nnunet(folder, work / "models", name="bench-nnunet", version="full")
model = load_manifest(bundle / "model.yaml")
session = ModelSession(bundle / "model.onnx", model)
predictor = load_predictor(read_results_folder(folder))
R["provider"] = session.providers_in_use[0]

# --- radserve, recording the patch inputs/outputs
rec_in, rec_out, ov_t = [], [], []


class Rec:
    def __init__(s, inner):
        s.inner = inner

    def __getattr__(s, k):
        return getattr(s.inner, k)

    def run(s, x):
        t = time.perf_counter()
        o = s.inner.run(x)
        ov_t.append((len(x), time.perf_counter() - t))
        rec_in.append(np.array(x))
        rec_out.append(np.array(o))
        return o


t0 = time.perf_counter()
task = make_task(ct, model, max_batch_size=session.runtime.max_batch_size)
rs_image = np.array(task._image)
items = list(task._items)
L_rs = run_task_overlapped(task, Rec(session)).labels.array.copy()
R["radserve_s"] = time.perf_counter() - t0
ov_in = np.concatenate(rec_in)
ov_out = np.concatenate(rec_out)
R["ov_patch_s"] = [t / n for n, t in ov_t]
print("radserve done", R["radserve_s"], items, flush=True)

# --- nnU-Net preprocessing once
ppa = PreprocessAdapterFromNpy(
    [ct.array[None].astype(np.float32)],
    [None],
    [{"spacing": list(ct.spacing)}],
    [None],
    predictor.plans_manager,
    predictor.dataset_json,
    predictor.configuration_manager,
    num_threads_in_multithreaded=1,
)
dct = next(ppa)
nn_data = dct["data"]
props = dct["data_properties"]
nd = nn_data.numpy()
R["pre_shape_nn"], R["pre_shape_rs"] = list(nd.shape), list(rs_image.shape)
if nd.shape == rs_image.shape:
    R["pre_maxabs"] = float(np.abs(nd - rs_image).max())
    R["pre_meanabs"] = float(np.abs(nd - rs_image).mean())
print("pre", R, flush=True)

# --- nnU-Net network, recording
net = predictor.network
tin, tout, tt = [], [], []


class NetRec(torch.nn.Module):
    def __init__(s, net, replay=None):
        super().__init__()
        s.net = net
        s.replay = replay
        s.i = 0

    def load_state_dict(s, *a, **k):
        return s.net.load_state_dict(*a, **k)

    def forward(s, x):
        if s.replay is not None:
            o = torch.from_numpy(s.replay[s.i : s.i + len(x)].copy())
            s.i += len(x)
            return o
        t = time.perf_counter()
        o = s.net(x)
        tt.append(time.perf_counter() - t)
        tin.append(x.numpy().copy())
        tout.append(o.numpy().copy())
        return o


def labels_with(netmod, acc32=False):
    predictor.network = netmod
    if acc32:
        predictor._internal_predict_sliding_window_return_logits = types.MethodType(
            _acc32, predictor
        )
    else:
        predictor.__dict__.pop("_internal_predict_sliding_window_return_logits", None)
    logits = predictor.predict_logits_from_preprocessed_data(nn_data).cpu()
    lab = convert_predicted_logits_to_segmentation_with_correct_shape(
        logits,
        predictor.plans_manager,
        predictor.configuration_manager,
        predictor.label_manager,
        props,
    )
    return np.asarray(lab), logits.float().numpy()


@torch.inference_mode()
def _acc32(self, data, slicers, do_on_device=True):
    pl = torch.zeros(
        (self.label_manager.num_segmentation_heads, *data.shape[1:]), dtype=torch.float32
    )
    n = torch.zeros(data.shape[1:], dtype=torch.float32)
    g = compute_gaussian(
        tuple(self.configuration_manager.patch_size),
        sigma_scale=1.0 / 8,
        value_scaling_factor=10,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    for sl in slicers:
        p = self._internal_maybe_mirror_and_predict(data[sl][None])[0].float()
        pl[sl] += p * g
        n[sl[1:]] += g
    return pl / n


t0 = time.perf_counter()
L_nn16, lg16 = labels_with(NetRec(net))
R["nnunet_s_excl_pre"] = time.perf_counter() - t0
R["torch_patch_s"] = tt
t_in = np.concatenate(tin)
t_out = np.concatenate(tout)
print("nnunet done", R["nnunet_s_excl_pre"], flush=True)
R["patch_inputs_maxabs"] = (
    float(np.abs(t_in - ov_in).max())
    if t_in.shape == ov_in.shape
    else str((t_in.shape, ov_in.shape))
)
d = np.abs(t_out - ov_out)
R["logits_torch_vs_ov_maxabs"] = float(d.max())
R["logits_torch_vs_ov_meanabs"] = float(d.mean())
R["logit_scale_std"] = float(t_out.std())
R["patch_argmax_agree_torch_vs_ov"] = float((t_out.argmax(1) == ov_out.argmax(1)).mean())
s = np.sort(t_out, axis=1)
margin = s[:, -1] - s[:, -2]
R["patch_margin_quantiles"] = [float(np.quantile(margin, q)) for q in (0.001, 0.01, 0.05, 0.5)]
R["frac_margin_below_maxabs_ov"] = float((margin < d.max()).mean())

# ORT CPU on patch 0
cpu = ModelSession(
    bundle / "model.onnx", model, runtime=choose_runtime(prefer=["CPUExecutionProvider"])
)
t = time.perf_counter()
o_cpu = cpu.run(ov_in[:1])
R["ort_cpu_patch_s"] = time.perf_counter() - t
R["logits_torch_vs_ortcpu_maxabs_p0"] = float(np.abs(t_out[:1] - o_cpu).max())
R["logits_ov_vs_ortcpu_maxabs_p0"] = float(np.abs(ov_out[:1] - o_cpu).max())
R["argmax_torch_vs_ortcpu_p0"] = float((t_out[:1].argmax(1) == o_cpu.argmax(1)).mean())

# OpenVINO with INFERENCE_PRECISION_HINT f32 set explicitly, on patch 0: is radserve's
# session float32 (not the AMX bf16 OpenVINO defaults to on such CPUs)?
import onnxruntime as ort  # noqa: E402

from radserve.inference.providers import openvino_cpu_config  # noqa: E402

rt = session.runtime
cfg = openvino_cpu_config()
cfg["CPU"]["INFERENCE_PRECISION_HINT"] = "f32"
opts = [dict(o) for o in rt.provider_options]
opts[0]["load_config"] = json.dumps(cfg)
so = ort.SessionOptions()
so.intra_op_num_threads = rt.intra_op_threads
f32 = ort.InferenceSession(
    str(bundle / "model.onnx"), so, providers=list(rt.providers), provider_options=opts
)
o_f32 = f32.run(None, {f32.get_inputs()[0].name: ov_in[:1]})[0]
R["ov_vs_ov_f32hint_maxabs_p0"] = float(np.abs(ov_out[:1] - o_f32).max())

if FIT:
    bf = ModelSession(bundle / "model.onnx", model, precision="bf16")
    bf.run(ov_in[:1])
    t = time.perf_counter()
    o_bf = bf.run(ov_in[:1])
    R["ov_bf16_patch_s"] = time.perf_counter() - t
    t = time.perf_counter()
    session.run(ov_in[:1])
    R["ov_fp32_patch_s_again"] = time.perf_counter() - t
    R["argmax_torch_vs_ovbf16_p0"] = float((t_out[:1].argmax(1) == o_bf.argmax(1)).mean())
    R["argmax_torch_vs_ovfp32_p0"] = float((t_out[:1].argmax(1) == ov_out[:1].argmax(1)).mean())
L_nn32, lg32 = labels_with(NetRec(net, replay=t_out), acc32=True)
L_nn16_ov, _ = labels_with(NetRec(net, replay=ov_out))
L_nn32_ov, lg32ov = labels_with(NetRec(net, replay=ov_out), acc32=True)


def ag(a, b):
    return float((a == b).mean())


R["agree"] = {
    "radserve_vs_nnunet_default(fp16 acc, torch)": ag(L_rs, L_nn16),
    "radserve_vs_nnunet_fp32acc_torch": ag(L_rs, L_nn32),
    "radserve_vs_nnunet_fp32acc_ovlogits": ag(L_rs, L_nn32_ov),
    "radserve_vs_nnunet_fp16acc_ovlogits": ag(L_rs, L_nn16_ov),
    "nnunet_fp16_vs_fp32_torch": ag(L_nn16, L_nn32),
    "nnunet_fp32_torch_vs_fp32_ov": ag(L_nn32, L_nn32_ov),
    "model_grid_argmax_fp16_vs_fp32": ag(lg16.argmax(0), lg32.argmax(0)),
}
# where fp16/fp32 disagree on model grid: weight sum there
g = compute_gaussian((128,) * 3, 1 / 8, 10, dtype=torch.float32, device=torch.device("cpu")).numpy()
nsum = np.zeros(nd.shape[1:], np.float32)
for sx in compute_steps_for_sliding_window(nd.shape[1:], (128,) * 3, 0.5)[0]:
    for sy in compute_steps_for_sliding_window(nd.shape[1:], (128,) * 3, 0.5)[1]:
        for sz in compute_steps_for_sliding_window(nd.shape[1:], (128,) * 3, 0.5)[2]:
            nsum[sx : sx + 128, sy : sy + 128, sz : sz + 128] += g
dis = lg16.argmax(0) != lg32.argmax(0)
R["weightsum_quantiles_all"] = [float(np.quantile(nsum, q)) for q in (0.01, 0.1, 0.5)]
R["weightsum_at_fp16_disagreements_quantiles"] = (
    [float(np.quantile(nsum[dis], q)) for q in (0.1, 0.5, 0.9)] if dis.any() else None
)
R["frac_voxels_weightsum_below_1e-2"] = float((nsum < 1e-2).mean())
R["fp16_disagree_frac_where_weightsum_below_1e-2"] = (
    float(dis[nsum < 1e-2].mean()) if (nsum < 1e-2).any() else None
)
R["fp16_disagree_frac_where_weightsum_above_1e-2"] = float(dis[nsum >= 1e-2].mean())
sg = np.sort(lg32, axis=0)
mg = sg[-1] - sg[-2]
R["acc_logit_margin_quantiles_fp32"] = [float(np.quantile(mg, q)) for q in (0.001, 0.01, 0.05, 0.5)]
R["labels_present"] = sorted(int(v) for v in np.unique(L_nn16))
R["label_fracs_nn16"] = {int(v): float((L_nn16 == v).mean()) for v in np.unique(L_nn16)}
np.savez_compressed(work / "cache.npz", t_out=t_out, ov_out=ov_out)
print(json.dumps(R, indent=1))
(work / "result.json").write_text(json.dumps(R, indent=1))
