"""``radserve bench --scenario nnunet``: an imported nnU-Net model, radserve vs nnU-Net.

One process, one phantom CT, one nnU-Net 3d_fullres folder made here, imported with
``radserve models import nnunet``. Timed end to end from the CT array to native-grid
labels, after the model is loaded (session / predictor creation excluded), TTA off:

- nnU-Net: ``nnUNetPredictor.predict_single_npy_array`` (its preprocessing, torch
  sliding window, export) on the CPU, torch's default thread count; where radserve serves
  on CUDA and torch sees the GPU, on the GPU as ``nnUNetv2_predict`` runs there
  (everything on the device, its float16 autocast), each contestant run twice and the
  warm second run compared (the first also picks cuDNN's kernels);
- radserve: ``PatchTask`` + the overlapped runner on the bundle's ONNX file through
  the host's chosen ONNX Runtime provider.

Weights: ``trained`` (default since issue 18, session 10) is nnU-Net's random
initialisation trained briefly (:data:`TRAIN_STEPS` Adam steps,
:func:`radserve.bench.nnunet_model.train_briefly`) to the CT's intensity classes, before
timing: logits that decide as a trained model's do (on 8 of the full size's 64 patches
OpenVINO's and torch's labels agree 0.99957). ``fitted`` fits only the segmentation
head to those classes on the random body (:func:`radserve.bench.nnunet_model.fit_head`;
0.9938 on those patches: the random body's features are near-tied where the two
backends' float32 kernels round differently) and ``random`` keeps the head random too.

Memory: the peak resident set above the process's resident set at the start of each
contestant (psutil, sampled every 20 ms), so it includes what each one allocates, not
the shared process. Labels: voxel agreement of radserve's with nnU-Net's, and with
nnU-Net's sliding window re-run on its own recorded patch logits with float32 sums
(:mod:`radserve.bench.nnunet_replay`; untimed, no second network pass).

Sizes: ``full`` is the 512x512x300 benchmark phantom with nnU-Net's default 3d_fullres
architecture (six stages, 32..320 features, 128^3 patch) at a 1.5 mm isotropic target
(coarser than the ~0.8 mm a planner would pick for this CT, so one run fits a two-core
CPU in tens of minutes rather than hours; 64 patches); ``medium`` the same model on
the centre 144x356x356 of that CT (4 patches, a few minutes); ``ci`` a 128x128 phantom
with a four-stage 32x64x64 model.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from radserve.bench.nnunet_model import default_ct_plans, make_results_folder, tiny_plans
from radserve.bench.study import BENCH_SEED, bench_spec
from radserve.domain.volume import Volume

SIZES = ("full", "medium", "ci")
WEIGHTS = ("trained", "fitted", "random")
TRAIN_STEPS = 10  # ``trained``: Adam steps on 64^3 crops (the ci model: its patch)

__all__ = ["run_nnunet_bench"]


class _PeakRss:
    """Peak RSS above the value at entry, sampled on a thread; also the process's CPU
    seconds (all threads) and the 1-minute load average at entry and exit. On a shared
    host the CPU seconds say what each contestant cost where wall seconds say what the
    other work left it (issue 18, session 12: load average 8-12 on 2 cores)."""

    def __init__(self, every_s: float = 0.02) -> None:
        self._proc = psutil.Process()
        self._every = every_s
        self._stop = threading.Event()
        self.peak_mb = 0.0

    def __enter__(self) -> _PeakRss:
        self.load = [os.getloadavg()[0]]
        self._cpu0 = time.process_time()
        self._base = self._proc.memory_info().rss
        self._peak = self._base
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self._every):
            self._peak = max(self._peak, self._proc.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, self._proc.memory_info().rss)
        self.peak_mb = (self._peak - self._base) / 2**20
        self.cpu_s = time.process_time() - self._cpu0
        self.load.append(os.getloadavg()[0])

    def line(self, who: str, seconds: float) -> str:
        """A progress line with this contestant's figures (kept if the run is cut short)."""
        load = " -> ".join(f"{v:.1f}" for v in self.load)
        return (
            f"{who}: {seconds:.1f} s, {self.cpu_s:.1f} CPU-s, peak RSS +{self.peak_mb:.0f} MB, "
            f"load average {load}"
        )


def _plans(size: str) -> dict:
    if size in ("full", "medium"):
        return default_ct_plans((1.5, 1.5, 1.5))
    return tiny_plans(
        patch=(32, 64, 64),
        spacing=(4.0, 3.0, 3.0),
        features=(16, 32, 64, 128),
        kernels=((3, 3, 3),) * 4,
        strides=((1, 1, 1),) + ((2, 2, 2),) * 3,
    )


def _ct(size: str) -> Volume:
    """The benchmark CT for ``size`` (medium: the centre of the full one)."""
    from radserve.phantom import PhantomSpec, generate_phantom
    from radserve.preprocess.crop import crop_volume

    spec = PhantomSpec.random(BENCH_SEED, small=True) if size == "ci" else bench_spec(300)
    ct = generate_phantom(spec).ct
    if size != "medium":
        return ct
    box = (slice(78, 222), slice(78, 434), slice(78, 434))
    return crop_volume(ct, box).with_array(np.ascontiguousarray(ct.array[box]))


def _train_on(ct: Volume, plans: dict) -> np.ndarray:
    """The CT in HU strided to about the model's spacing, at least a patch in size."""
    config = plans["configurations"]["3d_fullres"]
    steps = [
        max(1, min(round(t / s), n // p))
        for t, s, n, p in zip(
            config["spacing"], ct.spacing, ct.shape, config["patch_size"], strict=True
        )
    ]
    return ct.array[:: steps[0], :: steps[1], :: steps[2]]


def run_nnunet_bench(
    *,
    size: str = "full",
    weights: str = "trained",
    precision: str = "fp32",
    work_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Time both predictors once on the same CT and weights; return the summary."""
    import torch

    from radserve.bench.child import baseline_device
    from radserve.bench.nnunet_replay import PatchLogits, float32_accumulation
    from radserve.importers.nnunet import import_nnunet, load_predictor, read_results_folder
    from radserve.inference import ModelSession, make_task, run_task_overlapped
    from radserve.models.manifest import load_manifest

    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    work = Path(work_dir or tempfile.mkdtemp(prefix="radserve-bench-nnunet-"))
    log(f"phantom ({size}) ...")
    ct = _ct(size)
    plans = _plans(size)
    log(f"nnU-Net folder ({weights} weights) + import ...")
    train_on = _train_on(ct, plans) if weights != "random" else None
    steps = TRAIN_STEPS if weights == "trained" else 0
    t0 = time.perf_counter()
    folder = make_results_folder(
        work / "results", plans=plans, folds=(0,), train_on=train_on, train_steps=steps
    )
    build_s = time.perf_counter() - t0
    bundle = import_nnunet(folder, work / "models", name="bench-nnunet", version=size)
    model = load_manifest(bundle / "model.yaml")
    session = ModelSession(bundle / "model.onnx", model, precision=precision)
    device = baseline_device()
    predictor = load_predictor(read_results_folder(folder), device=device)
    # on a GPU the first run of each also picks its convolution kernels (cuDNN's search):
    # both run twice there and the second, warm run is the one compared
    runs = 1 if device == "cpu" else 2

    log("radserve ...")
    ours_cold_s = None
    for run in range(runs):
        with _PeakRss() as ours_mem:
            t0 = time.perf_counter()
            cap = session.runtime.batch_cap(model.input.mode)
            task = make_task(
                ct,
                model,
                max_batch_size=cap,
                precision=precision,
                merge_threads=session.runtime.merge_threads,
            )
            prediction = run_task_overlapped(task, session)
            ours = prediction.labels.array
            ours_s = time.perf_counter() - t0
        n_patches = len(task._items)
        del task
        if run < runs - 1:
            ours_cold_s = ours_s
            log(f"radserve, first run (cold): {ours_s:.1f} s")
    stages = {k: round(v, 2) for k, v in prediction.timings.items()}
    log(f"{ours_mem.line('radserve', ours_s)}; {n_patches} patches, stages {stages}")
    log(f"nnU-Net on {device} ...")
    recorder = PatchLogits(predictor.network, work / "patch-logits.f32")
    image, props = ct.array[None].astype(np.float32), {"spacing": list(ct.spacing)}
    theirs_cold_s = None
    if device == "cpu":  # record in the timed run: beside a CPU's network time the copy is small
        predictor.network = recorder
    for run in range(runs):
        with _PeakRss() as theirs_mem:
            t0 = time.perf_counter()
            theirs = np.asarray(predictor.predict_single_npy_array(image, props))
            theirs_s = time.perf_counter() - t0
        if run < runs - 1:
            theirs_cold_s = theirs_s
            log(f"nnUNetPredictor, first run (cold): {theirs_s:.1f} s")
    if device != "cpu":  # recorded in a run of its own, untimed
        predictor.network = recorder
        predictor.predict_single_npy_array(image, props)
    log(f"{theirs_mem.line('nnUNetPredictor', theirs_s)}; network {recorder.network_s:.1f} s")
    log("nnU-Net again from its recorded patch logits, float32 sums (untimed) ...")
    recorder.replay()
    predictor.device, predictor.perform_everything_on_device = torch.device("cpu"), False
    float32_accumulation(predictor)
    theirs32 = np.asarray(predictor.predict_single_npy_array(image, props))
    (work / "patch-logits.f32").unlink()

    return {
        "size": size,
        "device": device,
        "weights": weights,
        "volume": list(ct.shape),
        "spacing_mm": [round(s, 3) for s in ct.spacing],
        "model_spacing_mm": list(model.input.spacing),
        "patch": list(model.input.patch_size or ()),
        "patches": n_patches,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "provider": session.providers_in_use[0],
        "precision": precision,
        "train_steps": steps,
        "model_build_s": build_s,  # making the weights (training), untimed
        "radserve_s": ours_s,
        "nnunet_s": theirs_s,
        # on a GPU: each one's first run, which also picks its kernels (None on a CPU)
        "radserve_cold_s": ours_cold_s,
        "nnunet_cold_s": theirs_cold_s,
        "speedup": theirs_s / ours_s,
        # where the time goes: network (infer, on the calling thread), preparing patches
        # (incl. resampling the crop, in make_task) and merging (accumulate, map back)
        "radserve_stages_s": stages,
        "nnunet_network_s": recorder.network_s,
        "radserve_peak_rss_mb": ours_mem.peak_mb,
        "nnunet_peak_rss_mb": theirs_mem.peak_mb,
        # CPU seconds of the process while each ran (every thread): the cost on a busy
        # host, where the wall seconds depend on the other work
        "radserve_cpu_s": ours_mem.cpu_s,
        "nnunet_cpu_s": theirs_mem.cpu_s,
        "cpu_speedup": theirs_mem.cpu_s / ours_mem.cpu_s,
        "load_average_1min": {"radserve": ours_mem.load, "nnunet": theirs_mem.load},
        "label_agreement": float((ours == theirs).mean()),
        "label_agreement_nnunet_fp32_sums": float((ours == theirs32).mean()),
        "nnunet_fp16_vs_fp32_sums": float((theirs == theirs32).mean()),
        "labels_present": sorted(int(v) for v in np.unique(theirs)),
    }
