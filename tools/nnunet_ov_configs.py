"""OpenVINO float32 configurations for one 128^3 nnU-Net patch on this CPU (issue 18, item 1).

Compares, through ONNX Runtime's OpenVINO provider as radserve uses it, the served
configuration (one request at a time, the ONNX graph's dynamic batch, all cores) with:
two requests in flight (two threads calling ``run`` on one session: the provider keeps
``num_of_threads`` infer requests) at NUM_STREAMS 2 with one thread each, a static
1 x C x 128^3 input shape (``reshape_input``), single CPU-plugin properties, and, for
comparison, ONNX Runtime's own CPU provider (not
tried: SCHEDULING_CORE_TYPE, this CPU has one core type; dynamic quantization, which
OpenVINO's CPU plugin applies to fully connected layers, and this network has none). Each
round builds every configuration afresh, in turn (A/B alternated, ``ROUNDS`` rounds), runs
one warm-up pass and then two patches of the benchmark CT (see WORK); prints one
JSON line per configuration and round with seconds per patch, the load average, and the
logits against torch's on the same patches (argmax agreement, max / mean abs diff).

WORK is a ``tools/nnunet_full_flips.py`` work folder (its bundle; the patches are the
block of the benchmark CT its head was fitted on and the centre block, normalised as
nnU-Net does; torch's logits of the two are computed once and cached).
About 4 minutes per round on 2 idle cores.

    PYTHONPATH=src python tools/nnunet_ov_configs.py WORK [ROUNDS] [CONFIG ...]

``iN`` for ROUNDS keeps one session per one-request configuration and runs N passes,
each configuration in turn on the same patch, then prints the paired ratios (the fairer
comparison on a loaded machine). CONFIG: substrings of configuration names.
"""

import functools
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from radserve.bench.nnunet import _ct, _plans, _train_on
from radserve.bench.nnunet_model import _most_mixed_block
from radserve.importers.nnunet import load_predictor, read_results_folder
from radserve.inference.providers import choose_runtime, precision_options

work = Path(sys.argv[1])
arg = sys.argv[2] if len(sys.argv) > 2 else "2"
interleave = arg.startswith("i")  # "i5": sessions kept, 5 passes each, in turn
rounds = int(arg.lstrip("i"))
only = sys.argv[3:]
P = 128
size = next((work / "models/bench-nnunet").iterdir())
model = size / "model.onnx"
plans = _plans(size.name)
hu = _train_on(_ct(size.name), plans)
p = plans["foreground_intensity_properties_per_channel"]["0"]
c = [(n - P) // 2 for n in hu.shape]
blocks = [  # the block the head was fitted on (most mixed) and the centre block
    _most_mixed_block(hu, [P] * 3),
    hu[c[0] : c[0] + P, c[1] : c[1] + P, c[2] : c[2] + P],
]
patches = [
    ((np.clip(b, p["percentile_00_5"], p["percentile_99_5"]) - p["mean"]) / p["std"]).astype(
        np.float32
    )[None, None]
    for b in blocks
]
del hu
shape = patches[0].shape
ref_file = work / "ov_configs_torch.npy"
if not ref_file.exists():
    pr = load_predictor(read_results_folder(next((work / "results").iterdir())))
    net = pr.network
    net.load_state_dict(pr.list_of_parameters[0])
    net.eval()
    with torch.no_grad():
        np.save(ref_file, np.concatenate([net(torch.from_numpy(p)).numpy() for p in patches]))
    del pr, net
ref = np.load(ref_file)

runtime = choose_runtime()
threads = runtime.intra_op_threads
base = precision_options(runtime, "fp32")  # what radserve serves: its OpenVINO options


def cpu(**props: str) -> dict[str, str]:
    """Provider options: radserve's, with CPU-plugin properties added to load_config."""
    opts = dict(base[0])
    cfg = json.loads(opts["load_config"])
    cfg["CPU"].update(props)
    opts["load_config"] = json.dumps(cfg)
    return opts


name_in = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).get_inputs()[0]
static = f"{name_in.name}[1,{shape[1]},{shape[2]},{shape[3]},{shape[4]}]"
one_thread_each = {"NUM_STREAMS": "2", "INFERENCE_NUM_THREADS": str(threads)}
CONFIGS: dict[str, tuple[dict[str, str], int]] = {  # options, requests in flight
    "served": (cpu(), 1),
    "2 in flight, NUM_STREAMS 2, THROUGHPUT": (
        cpu(PERFORMANCE_HINT="THROUGHPUT", **one_thread_each),
        2,
    ),
    "static 1x1x128^3": ({**cpu(), "reshape_input": static}, 1),
    "static, 2 in flight, NUM_STREAMS 2": ({**cpu(**one_thread_each), "reshape_input": static}, 2),
    "CPU_DENORMALS_OPTIMIZATION YES": (cpu(CPU_DENORMALS_OPTIMIZATION="YES"), 1),
    "ENABLE_CPU_PINNING YES": (cpu(ENABLE_CPU_PINNING="YES"), 1),
    "ONNX Runtime CPU provider (not OpenVINO)": ({}, 1),
    "CPU_RUNTIME_CACHE_CAPACITY default": (
        {**base[0], "load_config": json.dumps({"CPU": {}})},
        1,
    ),
}
if only:
    CONFIGS = {k: v for k, v in CONFIGS.items() if any(o in k for o in only)}


def session(options: dict[str, str]) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    if not options:  # the comparison: ONNX Runtime's own CPU kernels
        return ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    return ort.InferenceSession(
        str(model), so, providers=["OpenVINOExecutionProvider"], provider_options=[options]
    )


def one(s: ort.InferenceSession, x: np.ndarray) -> np.ndarray:
    return s.run(None, {name_in.name: x})[0]


print(json.dumps({"model": str(size), "threads": threads}), flush=True)
if interleave:  # one-request configurations only: the same patch through each in turn
    sessions = {k: session(o) for k, (o, n) in CONFIGS.items() if n == 1}
    for s in sessions.values():
        one(s, patches[0])
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for r in range(rounds):
        for k, s in sessions.items():
            t = time.perf_counter()
            one(s, patches[r % 2])
            times[k].append(time.perf_counter() - t)
        print(json.dumps({"pass": r, "s": {k: round(v[-1], 2) for k, v in times.items()},
                          "load": os.getloadavg()[0]}), flush=True)  # fmt: skip
    first = next(iter(times))
    print(json.dumps({
        "median_s": {k: round(float(np.median(v)), 2) for k, v in times.items()},
        f"paired ratio to {first!r} (median, min, max)": {
            k: [round(float(f(np.array(v) / np.array(times[first]))), 3)
                for f in (np.median, np.min, np.max)]
            for k, v in times.items()
        },
    }), flush=True)  # fmt: skip
    sys.exit(0)
for r in range(rounds):
    for label, (options, in_flight) in CONFIGS.items():
        t = time.perf_counter()
        try:
            sess = session(options)
        except Exception as exc:  # a property this plugin refuses: say so, go on
            print(json.dumps({"config": label, "error": str(exc)[:300]}), flush=True)
            continue
        compile_s = time.perf_counter() - t
        one(sess, patches[0])  # warm
        load0 = os.getloadavg()[0]
        t = time.perf_counter()
        if in_flight == 1:
            outs = [one(sess, x) for x in patches]
        else:
            with ThreadPoolExecutor(in_flight) as pool:
                outs = list(pool.map(functools.partial(one, sess), patches))
        seconds = time.perf_counter() - t
        out = np.concatenate(outs)
        d = np.abs(out - ref)
        line = {
            "round": r,
            "config": label,
            "s_per_patch": round(seconds / len(patches), 3),
            "compile_s": round(compile_s, 2),
            "argmax_vs_torch": float((out.argmax(1) == ref.argmax(1)).mean()),
            "logits_maxabs": float(d.max()),
            "logits_meanabs": float(d.mean()),
            "load": [load0, os.getloadavg()[0]],
        }
        print(json.dumps(line), flush=True)
        del sess, outs, out, d
