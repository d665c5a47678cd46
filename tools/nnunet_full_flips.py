"""Where radserve's labels differ from nnUNetPredictor's at full size (issue 18, item 3).

The full benchmark (300x512x512 CT, default 3d_fullres net, fitted head, 64 patches)
agreed 0.99341 where the medium one agreed 0.99876. This records, once, radserve's patch
inputs and OpenVINO logits (labels ``ov``: the benchmark's radserve) and replays those
logits through nnU-Net's own sliding window and export with its float16 sums
(``nn16_ov``) and float32 sums (``nn32_ov``): radserve vs ``nn32_ov`` is radserve's
pipeline alone at this size. torch runs on 8 patches spread over the grid (``sub``, the
default) or on all (``all``: then also ``rs_torch``, radserve replaying torch's logits,
and ``nn16`` / ``nn32``, nnU-Net replaying them, which split the benchmark's figure into
pipeline, float16 sums and network kernels). It says where the disagreements are: on
class boundaries, at the body's edge, outside the body, where the model-grid logits are
near a tie (OpenVINO's top-2 margin below 0.025, the largest OpenVINO-vs-torch logit
difference on a patch), where the summed Gaussian weight is low, near patch faces; and
per torch patch, how OpenVINO and torch differ there. Writes WORK/result.json.

Phases are cached in WORK (3 GB at full size), so the analysis reruns in minutes. The
first run is a full-size OpenVINO pass (64 patches: 3 minutes on 2 idle cores, 35 under
load 12) and torch on 8 patches (about 1 minute idle); ``medium all`` is the 4-patch
medium benchmark with every split (about 3 minutes idle).

    PYTHONPATH=src python tools/nnunet_full_flips.py WORK [full|medium] [sub|all]
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy import ndimage

from radserve.bench.nnunet import _ct, _plans, _train_on
from radserve.bench.nnunet_model import make_results_folder
from radserve.bench.nnunet_replay import float32_accumulation
from radserve.importers.nnunet import import_nnunet, load_predictor, read_results_folder
from radserve.inference import ModelSession, make_task, run_task
from radserve.models.manifest import load_manifest
from radserve.preprocess.resample import grid_coordinates

work = Path(sys.argv[1])
size = sys.argv[2] if len(sys.argv) > 2 else "full"
mode = sys.argv[3] if len(sys.argv) > 3 else "sub"  # torch on all patches, or on 8
work.mkdir(parents=True, exist_ok=True)
P = 128
R: dict = {"size": size}


def log(*a: object) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


ct = _ct(size)
plans = _plans(size)
if not (work / "models").exists():
    make_results_folder(work / "results", plans=plans, folds=(0,), train_on=_train_on(ct, plans))
    import_nnunet(
        next((work / "results").iterdir()), work / "models", name="bench-nnunet", version=size
    )
folder = next((work / "results").iterdir())
bundle = work / "models/bench-nnunet" / size
model = load_manifest(bundle / "model.yaml")


class Replay:
    """A session double returning recorded logits in order (and checking the inputs)."""

    precision = "fp32"

    def __init__(self, inputs: np.ndarray, logits: np.ndarray) -> None:
        self.inputs, self.logits, self.i = inputs, logits, 0

    def run(self, x: np.ndarray) -> np.ndarray:
        n = len(x)
        assert np.array_equal(x, self.inputs[self.i : self.i + n]), "patch order differs"
        out = np.array(self.logits[self.i : self.i + n])
        self.i += n
        return out


class Record:
    def __init__(self, session: ModelSession) -> None:
        self.session, self.precision = session, session.precision
        self.inputs: list[np.ndarray] = []
        self.outputs: list[np.ndarray] = []

    def run(self, x: np.ndarray) -> np.ndarray:
        out = self.session.run(x)
        self.inputs.append(np.array(x))
        self.outputs.append(out)
        return out


def memmap(name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    path = work / name
    if shape is None:
        meta = json.loads((work / f"{name}.json").read_text())
        return np.memmap(path, np.float32, "r", shape=tuple(meta))
    (work / f"{name}.json").write_text(json.dumps(list(shape)))
    return np.memmap(path, np.float32, "w+", shape=shape)


# --- 1: radserve with OpenVINO, recording patch inputs and logits ----------------------
if not (work / "labels_ov.npy").exists():
    log("radserve (OpenVINO) ...")
    session = ModelSession(bundle / "model.onnx", model)
    rec = Record(session)
    task = make_task(ct, model, max_batch_size=1)
    t0 = time.perf_counter()
    labels = run_task(task, rec).labels.array
    R["radserve_ov_s"] = time.perf_counter() - t0
    np.save(work / "labels_ov.npy", labels)
    n = len(rec.inputs)
    xin = memmap("in.f32", (n, *rec.inputs[0].shape[1:]))
    xov = memmap("ov.f32", (n, *rec.outputs[0].shape[1:]))
    for i, (a, b) in enumerate(zip(rec.inputs, rec.outputs, strict=True)):
        xin[i], xov[i] = a[0], b[0]
    xin.flush(), xov.flush()
    meta = {
        "items": [list(map(int, it)) for it in task._items],
        "grid": list(task._grid),
        "resampled": list(task._resampled),
        "pad_before": list(task._pad_before),
        "native_crop": list(task._native_crop),
        "box": [[s.start, s.stop] for s in task.box],
    }
    (work / "task.json").write_text(json.dumps(meta))
    del rec, task, session, xin, xov
xin, xov = memmap("in.f32"), memmap("ov.f32")
meta = json.loads((work / "task.json").read_text())
n = len(xin)

# --- 2: torch on the same patch inputs (all, or a spread subset: ``sub``) -------------
predictor = load_predictor(read_results_folder(folder))
net = predictor.network
net.load_state_dict(predictor.list_of_parameters[0])
net.eval()
subset = list(range(n)) if mode == "all" else sorted({(i * (n // 8 + 1)) % n for i in range(8)})
tname = "torch.f32" if mode == "all" else "torch_sub.f32"
if not (work / f"{tname}.json").exists():
    log(f"torch on {len(subset)} patches ...")
    xt = np.memmap(work / f"{tname}.part", np.float32, "w+", shape=(len(subset), *xov.shape[1:]))
    t0 = time.perf_counter()
    with torch.no_grad():
        for j, i in enumerate(subset):
            xt[j] = net(torch.from_numpy(np.array(xin[i : i + 1])))[0].numpy()
    xt.flush()
    del xt
    R["torch_s_per_patch"] = (time.perf_counter() - t0) / len(subset)
    (work / f"{tname}.part").rename(work / tname)
    (work / f"{tname}.json").write_text(json.dumps([len(subset), *xov.shape[1:]]))
xto = memmap(tname)
full_torch = mode == "all"

# --- 3: radserve's pipeline replaying torch's logits -----------------------------------
if full_torch and not (work / "labels_rs_torch.npy").exists():
    log("radserve replaying torch logits ...")
    task = make_task(ct, model, max_batch_size=1)
    np.save(work / "labels_rs_torch.npy", run_task(task, Replay(xin, xto)).labels.array)
    del task

# --- 4: nnU-Net's sliding window + export replaying recorded logits --------------------
replays = [("nn16_ov", xov, False), ("nn32_ov", xov, True)]
if full_torch:
    replays += [("nn16", xto, False), ("nn32", xto, True)]
replays = [r for r in replays if not (work / f"labels_{r[0]}.npy").exists()]
if replays:
    from nnunetv2.inference.data_iterators import PreprocessAdapterFromNpy
    from nnunetv2.inference.export_prediction import (
        convert_predicted_logits_to_segmentation_with_correct_shape as export,
    )

    log("nnU-Net preprocessing ...")
    dct = next(
        PreprocessAdapterFromNpy(
            [ct.array[None].astype(np.float32)], [None], [{"spacing": list(ct.spacing)}],
            [None], predictor.plans_manager, predictor.dataset_json,
            predictor.configuration_manager, num_threads_in_multithreaded=1,
        )
    )  # fmt: skip
    data, props = dct["data"], dct["data_properties"]

    class NetReplay(torch.nn.Module):
        def __init__(self, logits: np.ndarray) -> None:
            super().__init__()
            self.logits, self.i, self.worst, self.order_differs = logits, 0, 0.0, False

        def load_state_dict(self, *a: object, **k: object) -> None:
            return None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            """The recorded logits of radserve's patch equal to ``x``: the next one in
            order, else (air patches look alike in part) the closest of all."""
            a = x.numpy()[0]
            i = self.i
            if i >= n or float(np.abs(a - xin[i]).max()) > 1e-3:
                i = int(np.argmin([float(np.abs(a - xin[j]).max()) for j in range(n)]))
            self.worst = max(self.worst, float(np.abs(a - xin[i]).max()))
            self.order_differs |= i != self.i
            self.i += 1
            return torch.from_numpy(np.array(self.logits[i : i + 1]))

    for name, logits, fp32 in replays:
        log(f"nnU-Net {name} ...")
        predictor.network = NetReplay(logits)
        if fp32:
            float32_accumulation(predictor)
        else:
            predictor.__dict__.pop("_internal_predict_sliding_window_return_logits", None)
        lg = predictor.predict_logits_from_preprocessed_data(data).cpu()
        R[f"{name}_patch_input_maxabs_vs_radserve"] = predictor.network.worst
        R[f"{name}_patch_order_differs"] = predictor.network.order_differs
        lab = export(
            lg, predictor.plans_manager, predictor.configuration_manager,
            predictor.label_manager, props,
        )  # fmt: skip
        np.save(work / f"labels_{name}.npy", np.asarray(lab))
        del lg, lab
    del data

# --- 5: analysis -----------------------------------------------------------------------
log("analysis ...")
names = ["ov", "nn16_ov", "nn32_ov"] + (["rs_torch", "nn16", "nn32"] if full_torch else [])
L = {k: np.load(work / f"labels_{k}.npy") for k in names}


def ag(a: str, b: str) -> float:
    return float((L[a] == L[b]).mean())


R["agreement"] = {
    "pipeline: radserve vs nnunet, both OpenVINO logits, fp32 sums": ag("ov", "nn32_ov"),
    "radserve vs nnunet fp16 sums, both OpenVINO logits": ag("ov", "nn16_ov"),
    "nnunet fp16 vs fp32 sums (OpenVINO logits)": ag("nn16_ov", "nn32_ov"),
}
if full_torch:
    R["agreement"].update(
        {
            "radserve_ov vs nnunet_default (the benchmark's figure)": ag("ov", "nn16"),
            "radserve_ov vs nnunet_fp32_sums": ag("ov", "nn32"),
            "pipeline: radserve vs nnunet, both torch logits, fp32 sums": ag("rs_torch", "nn32"),
            "nnunet fp16 vs fp32 sums (torch logits)": ag("nn16", "nn32"),
            "kernels: radserve OpenVINO vs radserve torch logits": ag("ov", "rs_torch"),
        }
    )

from radserve.inference.patches import filtered_gaussian  # noqa: E402

grid = tuple(meta["grid"])
items = meta["items"]
ramp = np.minimum(np.arange(P), np.arange(P)[::-1]).astype(np.int16)
pface = np.minimum(np.minimum(ramp[:, None, None], ramp[None, :, None]), ramp[None, None, :])
TIE = 0.025  # OpenVINO vs torch logits, largest difference on a patch (tools/nnunet_ov_configs.py)

# per patch (raw network outputs): OpenVINO vs torch, by where the patch sits
floor = float(min(xin[i].min() for i in subset))
rows = []
for j, i in enumerate(subset):
    a, b = xov[i], xto[j]
    flip = a.argmax(0) != b.argmax(0)
    air = xin[i][0] <= floor + 1e-6
    at_edge = sum(s == 0 or s + P == g for s, g in zip(items[i], grid, strict=True))
    srt = np.sort(b, axis=0)
    rows.append(
        {
            "start": items[i],
            "grid_faces_touched": int(at_edge),
            "argmax_agree": float(1 - flip.mean()),
            "air_share (input at its floor)": float(air.mean()),
            "flip_rate_in_air_vs_elsewhere": [float(flip[air].mean()), float(flip[~air].mean())],
            "logits_maxabs": float(np.abs(a - b).max()),
            "logits_meanabs": float(np.abs(a - b).mean()),
            "torch_margin_below_tie": float(((srt[-1] - srt[-2]) < TIE).mean()),
            "flip_rate_within_8_of_patch_face_vs_beyond": [
                float(flip[pface < 8].mean()),
                float(flip[pface >= 8].mean()),
            ],
        }
    )
R["per_patch_ov_vs_torch"] = rows

# model grid: Gaussian-weighted averages, weight sum, patches covering, face distance
g = filtered_gaussian((P, P, P))
k = xov.shape[1]
acc_ov = np.zeros((k, *grid), np.float32)
acc_t = np.zeros((k, *grid), np.float32) if full_torch else None
wsum = np.zeros(grid, np.float32)
cover = np.zeros(grid, np.uint8)
face = np.full(grid, P, np.int16)  # distance to the nearest face of a covering patch
for i, (z, y, x) in enumerate(items):
    sl = (slice(z, z + P), slice(y, y + P), slice(x, x + P))
    acc_ov[(slice(None), *sl)] += xov[i] * g
    if acc_t is not None:
        acc_t[(slice(None), *sl)] += xto[i] * g
    wsum[sl] += g
    cover[sl] += 1
    face[sl] = np.minimum(face[sl], pface)
acc_ov /= wsum
srt = np.sort(acc_ov, axis=0)
margin = srt[-1] - srt[-2]
am_ov = acc_ov.argmax(0)
del srt, acc_ov
tie = margin < TIE


def by(mask: np.ndarray, where: np.ndarray) -> dict[str, float]:
    """rate of ``mask`` where ``where`` holds and elsewhere, and the share it covers"""
    return {
        "rate_in": float(mask[where].mean()) if where.any() else float("nan"),
        "rate_out": float(mask[~where].mean()) if (~where).any() else float("nan"),
        "share_of_voxels": float(where.mean()),
    }


mg: dict = {
    "shape": list(grid),
    "near_tie_frac (OpenVINO margin < 0.025)": float(tie.mean()),
    "near_tie by patches covering": {
        int(c): [float(tie[cover == c].mean()), float((cover == c).mean())]
        for c in np.unique(cover)
    },
    "near_tie where weight sum < 0.1": by(tie, wsum < 0.1),
    "near_tie within 8 of a patch face": by(tie, face < 8),
}
if acc_t is not None:
    acc_t /= wsum
    model_flip = am_ov != acc_t.argmax(0)
    del acc_t
    mg["argmax_agreement_ov_vs_torch"] = float(1 - model_flip.mean())
    mg["flips by patches covering"] = {
        int(c): [float(model_flip[cover == c].mean()), float((cover == c).mean())]
        for c in np.unique(cover)
    }
    mg["flips where weight sum < 0.1"] = by(model_flip, wsum < 0.1)
    mg["flips within 8 of a patch face"] = by(model_flip, face < 8)
    mg["flips among near ties (margin < 0.025)"] = by(model_flip, tie)
R["model_grid"] = mg

# native grid, by category: class boundaries, body edge, outside the body, weight, faces
box = tuple(slice(a, b) for a, b in meta["box"])
ref = L["nn32_ov"]
edge = np.zeros(ref.shape, bool)
for ax in range(3):  # a voxel whose 6-neighbourhood holds another label
    a = np.diff(ref, axis=ax) != 0
    lo = [slice(None)] * 3
    hi = [slice(None)] * 3
    lo[ax], hi[ax] = slice(0, -1), slice(1, None)
    edge[tuple(lo)] |= a
    edge[tuple(hi)] |= a
del a
body = ct.array > -500
body_edge = ndimage.binary_dilation(body, iterations=2)
body_edge &= ~ndimage.binary_erosion(body, iterations=2)
rd, rh, rw = meta["resampled"]
oz, oy, ox = meta["pad_before"]
nc = meta["native_crop"]
near = [  # the model-grid voxel nearest each native voxel of the crop
    np.clip(np.rint(grid_coordinates(r, m)), 0, r - 1).astype(np.intp) + o
    for r, m, o in zip((rd, rh, rw), nc, (oz, oy, ox), strict=True)
]
ix = np.ix_(*near)


def native(model_array: np.ndarray, fill: object) -> np.ndarray:
    out = np.full(ref.shape, fill, model_array.dtype)
    out[box] = model_array[ix]
    return out


tie_n = native(ndimage.binary_dilation(tie), False)  # a near tie at or beside
low_n = native(wsum < 0.1, False)
face_n = native(face < 8, False)
cats = {
    "on a class boundary (6-neighbour)": edge,
    "within 2 voxels of the body edge (HU -500)": body_edge,
    "outside the body": ~body,
    "model-grid near tie at or beside": tie_n,
    "summed Gaussian weight < 0.1": low_n,
    "within 8 model voxels of a patch face": face_n,
}
R["native_voxel_shares"] = {c: float(m.mean()) for c, m in cats.items()}
R["labels_nn32_ov_fracs"] = {int(v): float((ref == v).mean()) for v in np.unique(ref)}


def split(flip: np.ndarray) -> dict:
    """[share of the flips in category, flip rate in category, flip rate outside]"""
    return {
        "count": int(flip.sum()),
        "frac": float(flip.mean()),
        "[share of flips, rate in, rate out]": {
            c: [float(m[flip].mean()), float(flip[m].mean()), float(flip[~m].mean())]
            for c, m in cats.items()
        },
    }


R["native_flips nnunet fp16 vs fp32 sums (OpenVINO logits)"] = split(L["nn16_ov"] != L["nn32_ov"])
R["native_flips radserve vs nnunet fp32 sums (OpenVINO logits)"] = split(L["ov"] != L["nn32_ov"])
if full_torch:
    R["native_flips kernels (radserve OpenVINO vs torch logits)"] = split(L["ov"] != L["rs_torch"])
    R["native_flips the benchmark's (radserve vs nnunet default)"] = split(L["ov"] != L["nn16"])
print(json.dumps(R, indent=1))
(work / "result.json").write_text(json.dumps(R, indent=1))
