"""One benchmark contestant in its own process, so peak RSS is its own.

``python -m radserve.bench.child MODE STUDY WORKDIR`` warms up the model sessions, runs
the study once, and writes ``result.json`` (stage times, memory) and ``labels.npz``
(organ labels and the binary findings mask) into WORKDIR for the parent to compare.

Memory, all in MiB: ``peak_rss_mb`` is this process's peak resident size (the kernel's
own high-water mark, imports and loaded models included); ``rss_after_warmup_mb`` the
resident size once imports, sessions and one warm-up batch are done, before the study;
``pipeline_rss_mb`` the difference, what the study itself added; all read when the run
returns, before the bench's own label comparison arrays (its full-size boolean findings
mask, 75 MiB on the 300-slice study, could set the peak: 491 against the run's 487 MiB in
one profiled run). Helper processes
(radserve's JPEG 2000 decoders) are not in those figures, so they are reported
beside them: ``workers_peak_rss_mb`` the peak of their summed resident sizes and
``tree_peak_rss_mb`` the peak of this process plus them (shared pages count once per
process, so both are upper bounds), and ``workers_peak_pss_mb`` /
``tree_peak_pss_mb`` the same with the helpers' proportional set sizes (shared pages
split among the processes that map them). Helpers are sampled every 0.1 s.

For a JPEG 2000 study the decoder processes are started during warm-up, as a server
starts them with its model sessions (``radserve.ingest.decode.start_decode_workers``).
Heavy modules are imported inside the functions: decoder processes started by a run
import this module as their ``__main__`` and should not load ONNX Runtime for nothing.
"""

from __future__ import annotations

import json
import resource
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

    from radserve.bench.naive import Runner
    from radserve.models.registry import ModelRegistry
    from radserve.pipeline import SessionPool

from radserve.bench import PIPELINE


def _peak_rss_mb() -> float:
    """This process's resident high-water mark.

    Linux's ``VmHWM`` belongs to the process's own memory map. ``ru_maxrss`` does not
    start afresh at ``exec``: a child started by the bench inherits the bench's own
    resident size at that moment as its floor (measured: a 9 MB child of a 425 MiB
    parent reports 425 MiB), which overstated every contestant started after the bench
    had loaded earlier results.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class TreeMemory:
    """Samples the memory of this process's descendants (decode workers, helpers).

    This process's own peak is the kernel's high-water mark (exact, free). For the
    helpers two sums are kept: resident sizes (an upper bound: pages they share with
    each other and their fork server count once per process) and proportional set
    sizes (each shared page split among the processes mapping it: what the helpers
    really cost; idle, the fork server and two workers hold 167 MiB of RSS but 68 MiB
    of PSS). PSS is read from ``smaps_rollup`` (~0.5 ms a process), so helpers are
    sampled every ``interval_s``; listing them walks every process on the machine, so
    the list is renewed every ``relist_s`` (done at every 20 ms sample, listing alone
    cost the measured run 6 % of its time on the 2-core machine).
    """

    def __init__(self, interval_s: float = 0.1, relist_s: float = 0.5) -> None:
        import psutil

        self._me = psutil.Process()
        self._interval = interval_s
        self._relist = relist_s
        self._children: list[psutil.Process] = []
        self._listed_at = -float("inf")
        self._stop = threading.Event()
        self.workers_peak_mb = 0.0
        self.workers_peak_pss_mb = 0.0
        self.tree_peak_mb = 0.0
        self.tree_peak_pss_mb = 0.0
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)

    def __enter__(self) -> TreeMemory:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(relist=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _sample(self, *, relist: bool = False) -> None:
        import psutil

        now = time.monotonic()
        if relist or now - self._listed_at >= self._relist:
            self._children = self._me.children(recursive=True)
            self._listed_at = now
        rss = pss = 0
        for child in self._children:
            try:
                info = child.memory_full_info()
            except psutil.Error:  # exited since it was listed, or not ours to read
                continue
            rss += info.rss
            pss += getattr(info, "pss", info.rss)  # PSS is Linux-only
        own = self._me.memory_info().rss
        mib = 2**20
        self.workers_peak_mb = max(self.workers_peak_mb, rss / mib)
        self.workers_peak_pss_mb = max(self.workers_peak_pss_mb, pss / mib)
        self.tree_peak_mb = max(self.tree_peak_mb, (own + rss) / mib)
        self.tree_peak_pss_mb = max(self.tree_peak_pss_mb, (own + pss) / mib)

    def report(self, rss_warm_mb: float) -> dict[str, float]:
        peak = _peak_rss_mb()
        return {
            "peak_rss_mb": peak,
            "rss_after_warmup_mb": rss_warm_mb,
            "pipeline_rss_mb": peak - rss_warm_mb,
            "workers_peak_rss_mb": self.workers_peak_mb,
            "workers_peak_pss_mb": self.workers_peak_pss_mb,
            "tree_peak_rss_mb": max(self.tree_peak_mb, peak),
            "tree_peak_pss_mb": max(self.tree_peak_pss_mb, peak),
        }


def _rss_now_mb() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / 2**20


def _warm(pool: SessionPool, registry: ModelRegistry, precision: str) -> dict[str, object]:
    """Create every session and run one batch: servers are warm before studies arrive."""
    from radserve.pipeline.spec import load_pipeline

    sessions = {}
    for step in load_pipeline(PIPELINE).steps:
        bundle = registry.get(step.model, step.version)
        session = pool.get(bundle, precision)
        channels = bundle.spec.input.in_channels
        session.run(np.zeros((1, channels, 256, 256), np.float32))
        session.release_memory()  # as after every task
        sessions[bundle.spec.name] = session
    return sessions


def run_radserve(
    study: Path, workdir: Path, precision: str, *, stream_decode: bool = True
) -> dict[str, object]:
    from radserve.ingest.decode import shutdown_decode_workers, start_decode_workers
    from radserve.models.registry import ModelRegistry
    from radserve.pipeline import SessionPool, release_free_memory
    from radserve.pipeline.spec import load_pipeline
    from radserve.pipeline.study import run_study

    registry, pool = ModelRegistry(), SessionPool()
    _warm(pool, registry, precision)
    if _needs_decode_workers(study):  # started with the server, like its model sessions
        start_decode_workers()
    release_free_memory()
    rss_warm = _rss_now_mb()
    cpu0, workers0 = _cpu_seconds(), _workers_cpu_seconds()
    with TreeMemory() as memory:
        t0 = time.perf_counter()
        result = run_study(
            study,
            pipeline=load_pipeline(PIPELINE),
            out_dir=workdir / "out",
            registry=registry,
            sessions=pool,
            precision=precision,  # type: ignore[arg-type]
            stream_decode=stream_decode,
        )
        elapsed = time.perf_counter() - t0
    cpu = _cpu_seconds() - cpu0
    workers_cpu = _workers_cpu_seconds() - workers0
    used = memory.report(rss_warm)  # before the bench's own comparison arrays below
    vr = result.volume_result
    organs = vr.organ_step.labels.array if vr.organ_step else None
    lesion = vr.lesion_step
    findings = lesion.finding_labels.array > 0 if lesion and lesion.finding_labels else None
    _save(workdir, organs, findings)
    shutdown_decode_workers()
    return {
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "workers_cpu_seconds": workers_cpu,
        "stages": result.report.timings,
        **used,
        "n_findings": len(result.report.findings),
        "models": [f"{m.name} {m.version}" for m in result.report.models],
        "providers": list(pool.runtime.providers),
        "threads": pool.runtime.intra_op_threads,
    }


def _needs_decode_workers(study: Path) -> bool:
    """Whether the study's transfer syntax is decoded in worker processes."""
    import pydicom

    from radserve.ingest.decode import PROCESS_SYNTAXES

    first = next(iter(sorted(study.rglob("*.dcm"))), None)
    if first is None:
        return False
    meta = pydicom.dcmread(first, stop_before_pixels=True)
    return str(meta.file_meta.TransferSyntaxUID) in PROCESS_SYNTAXES


def _workers_cpu_seconds() -> float:
    """CPU time of this process's live descendants (the decoder processes, which live
    as long as the pool and are never reaped, so ``RUSAGE_CHILDREN`` misses them)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _cpu_seconds() -> float:
    """CPU time of this process (all threads), for how busy the cores were."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def baseline_device() -> str:
    """Where the baselines run: on radserve's own GPU when it serves on one and torch sees
    it (a GPU site's naive loop runs on its GPU), else on the CPU."""
    from radserve.bench.torch_weights import torch_available
    from radserve.inference import choose_runtime

    if not choose_runtime().device.startswith("cuda"):
        return "cpu"
    if not torch_available():
        return "cuda"  # the ONNX Runtime baseline's device; torch does not run
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_runners(registry: ModelRegistry, threads: int, device: str) -> dict[str, Runner]:
    """PyTorch eager modules with the bundles' weights (radserve.bench.torch_weights),
    warmed like the rest, on ``device``."""
    import torch

    from radserve.bench.torch_weights import torch_model
    from radserve.pipeline.spec import load_pipeline

    torch.set_num_threads(threads)
    runners: dict[str, Runner] = {}
    for step in load_pipeline(PIPELINE).steps:
        bundle = registry.get(step.model, step.version)
        module = torch_model(bundle).to(device)

        def run(x: np.ndarray, module: torch.nn.Module = module) -> np.ndarray:
            with torch.no_grad():
                return module(torch.from_numpy(x).to(device)).cpu().numpy()

        run(np.zeros((1, bundle.spec.input.in_channels, 256, 256), np.float32))
        runners[bundle.spec.name] = run
    return runners


def run_baseline(
    study: Path, workdir: Path, precision: str, runtime: str = "auto"
) -> dict[str, object]:
    """The naive baseline: PyTorch eager when torch is installed, else ONNX Runtime batch 1;
    float32 whatever radserve is asked to run."""
    from radserve.bench.naive import run_naive
    from radserve.bench.torch_weights import torch_available
    from radserve.inference import choose_runtime
    from radserve.models.registry import ModelRegistry
    from radserve.pipeline import SessionPool
    from radserve.pipeline.spec import load_pipeline

    # What a plain `pip install onnxruntime` runs: the CPU provider, at fp32; on a GPU
    # host, onnxruntime-gpu's CUDA provider (batch 1 all the same).
    registry = ModelRegistry()
    device = baseline_device()
    provider = "CUDAExecutionProvider" if device == "cuda" else "CPUExecutionProvider"
    pool = SessionPool(choose_runtime(prefer=[provider]))
    precision = "fp32"
    use_torch = runtime == "torch" or (runtime == "auto" and torch_available())
    if use_torch:
        runners = _torch_runners(registry, pool.runtime.intra_op_threads, device)
        engine = f"pytorch-eager-{device}"
    else:
        sessions = _warm(pool, registry, precision)
        runners = {name: session.run for name, session in sessions.items()}
        engine = f"onnxruntime-{device}-batch1"
    rss_warm = _rss_now_mb()
    with TreeMemory() as memory:
        t0 = time.perf_counter()
        result = run_naive(study, load_pipeline(PIPELINE), registry, runners, precision)
        elapsed = time.perf_counter() - t0
    used = memory.report(rss_warm)
    _save(workdir, result.organs, result.findings > 0)
    return {
        "seconds": elapsed,
        "stages": result.stages,
        **used,
        "engine": engine,
    }


def run_baseline_ort(study: Path, workdir: Path, precision: str) -> dict[str, object]:
    return run_baseline(study, workdir, precision, runtime="onnxruntime")


def _save(workdir: Path, organs: np.ndarray | None, findings: np.ndarray | None) -> None:
    arrays = {}
    if organs is not None:
        arrays["organs"] = organs
    if findings is not None:
        arrays["findings"] = np.asarray(findings, np.uint8)
    np.savez(workdir / "labels.npz", **arrays)


def run_radserve_whole(study: Path, workdir: Path, precision: str) -> dict[str, object]:
    """radserve decoding a JPEG 2000 stack whole before the first model (as before the
    streamed decode; what the server's scheduler still does)."""
    return run_radserve(study, workdir, precision, stream_decode=False)


def run_decode(study: Path, workdir: Path, precision: str) -> dict[str, object]:
    """Decode only, the study's frames two ways: radserve's (warm pylibjpeg processes,
    as in a run) and GDCM's own threaded decode one file after another (the naive
    loop's load, through pydicom's gdcm plugin); wall and CPU seconds of each."""
    from pydicom.pixels import pixel_array

    from radserve.ingest import IngestPolicy, discover_series
    from radserve.ingest.decode import (
        decode_stack,
        shutdown_decode_workers,
        start_decode_workers,
    )
    from radserve.ingest.geometry import plan_stack
    from radserve.ingest.sources import SourceReader

    header = discover_series(study)[0]
    frames = [header.frames[i] for i in plan_stack(header.frames, IngestPolicy()).order]
    start_decode_workers()
    out: dict[str, object] = {"frames": len(frames)}
    cpu0, workers0, t0 = _cpu_seconds(), _workers_cpu_seconds(), time.perf_counter()
    with SourceReader() as reader:
        decode_stack(frames, reader, air=-1000.0)
    out["radserve_s"] = time.perf_counter() - t0
    out["radserve_cpu_s"] = _cpu_seconds() - cpu0 + _workers_cpu_seconds() - workers0
    shutdown_decode_workers()
    paths = sorted(study.rglob("*.dcm"))
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    for path in paths:
        pixel_array(path, decoding_plugin="gdcm")
    out["gdcm_s"] = time.perf_counter() - t0
    out["gdcm_cpu_s"] = _cpu_seconds() - cpu0
    out["seconds"] = out["radserve_s"]
    out["stages"] = {}
    out["peak_rss_mb"] = _peak_rss_mb()
    np.savez(workdir / "labels.npz")
    return out


MODES = {
    "radserve": run_radserve,
    "radserve-whole": run_radserve_whole,
    "decode": run_decode,
    "naive": run_baseline,
    "naive-ort": run_baseline_ort,
}


def main(argv: list[str]) -> None:
    mode, study, workdir = argv[0], Path(argv[1]), Path(argv[2])
    precision = argv[3] if len(argv) > 3 else "fp32"
    if not mode.startswith("radserve"):
        from radserve.pydicom_plugins import load_gdcm

        load_gdcm()  # the baselines decode with pydicom as installed, GDCM loaded
    if mode == "monai":
        from radserve.bench.monai_baseline import run_monai

        runner = run_monai
    else:
        runner = MODES[mode]
    workdir.mkdir(parents=True, exist_ok=True)
    out = runner(study, workdir, precision)
    (workdir / "result.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # the usage is the docstring
        sys.exit(__doc__)
    main(sys.argv[1:])
