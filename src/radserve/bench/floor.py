"""``radserve bench --scenario floor``: where the memory and the CPU-seconds of one study go.

Measured in resident memory (the kernel's own counters, unaffected by other load) and
CPU-seconds (process CPU time), never wall-clock time. CPU-seconds are not load-free:
shared caches and a busy sibling hyper-thread inflate them (the FP32 study took 18.5
CPU-s at load average 20 against 9.8 idle), so read shares and ratios from them, each
stage beside a floor measured in the same process under the same load.

Memory: what each import and each compiled model costs the warm process (every import
step in a fresh process, its RSS split into anonymous and file-backed pages: shared
libraries are the latter), then the peak of one study by stage (``/proc/self/status``
sampled every few milliseconds, labelled with the stage that was running).

CPU: the study runs stage by stage on one thread (:func:`radserve.inference.run_task`'s
plain loop, not the overlapped runner), so the process's CPU time between two stage
boundaries is that stage's. Beside each stage a lower bound: for inference, the
network alone through the same session on one of the study's own batches, repeated in
isolation, times the number of batches; for the array stages (prepare, merge, ingest,
post-processing), the bytes they must at least read and write over this machine's
measured single-thread copy bandwidth.

``python -m radserve.bench.floor STUDY PRECISION PROVIDER`` is the stage child; the
import steps run in bare ``python -c`` children; :func:`run_floor` starts them all.

The networks replayed (for work on the other stages): ``... PROVIDER --record DIR``
saves every batch's network output and its input's SHA-256 under DIR;
``... PROVIDER --replay DIR``, from any source tree, then runs every stage but with the
saved outputs in place of the networks (``infer`` is then reading them; no network
floors), and stops if a batch's input differs from the recorded one (prepare changed
what the network sees). The networks' ~12 CPU-s are out of the run, so two trees'
replays, alternated, compare the non-network stages under the same load; their label
maps' SHA-256 must match the recording's.
"""

from __future__ import annotations

import functools
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radserve.bench.errors import BenchError

if TYPE_CHECKING:
    import numpy as np

from radserve.bench import PIPELINE

# What the warm serving process imports, in the order its run path needs them; each
# step's cost is measured in a fresh process on top of the steps before it.
IMPORT_STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("python", ()),
    ("numpy", ("numpy",)),
    ("scipy.ndimage", ("scipy.ndimage",)),
    # after radserve, as in a served process: GDCM, requests and tqdm deferred
    # (radserve.pydicom_plugins)
    ("pydicom (+ its decoder plugins)", ("radserve", "pydicom")),
    ("onnxruntime", ("onnxruntime",)),
    ("radserve run path", ("radserve.pipeline.study", "radserve.models.registry")),
    ("report writers (nibabel, PIL)", ("radserve.report.nifti", "radserve.report.keyimages")),
    # `radserve run`: the click group imports the run command alone (radserve.cli)
    ("radserve run command (click, rich)", ("radserve.cli", "radserve.commands.run")),
)


def _status_mib() -> dict[str, float]:
    """VmRSS, RssAnon, RssFile and VmHWM of this process, MiB (Linux)."""
    out: dict[str, float] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024.0
    return out


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- children ---------------------------------------------------------------------------
_IMPORTS_CHILD = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
out = {}
for line in open("/proc/self/status", encoding="ascii"):
    key, _, value = line.partition(":")
    if key in ("VmRSS", "RssAnon", "RssFile"):
        out[key] = int(value.split()[0]) / 1024.0
print(json.dumps(out))
"""


class _Sampler:
    """Resident memory every ``interval_s``, attributed to the stage named in ``stage``."""

    def __init__(self, interval_s: float = 0.004) -> None:
        self.stage = "warm"
        self.peaks: dict[str, dict[str, float]] = {}
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="floor-memory", daemon=True)

    def _sample(self) -> None:
        now = _status_mib()
        best = self.peaks.get(self.stage)
        if best is None or now["VmRSS"] > best["VmRSS"]:
            self.peaks[self.stage] = now

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class _Stages:
    """CPU-seconds and wall seconds per stage name (stages run one at a time)."""

    def __init__(self, sampler: _Sampler) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self._sampler = sampler

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        self._sampler.stage = name
        c0, t0 = _cpu(), time.perf_counter()
        try:
            return fn()
        finally:
            self.cpu[name] = self.cpu.get(name, 0.0) + _cpu() - c0
            self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - t0


class _Replay:
    """The networks' outputs saved (``record``) or read back in their place (``replay``)."""

    def __init__(self, mode: str, folder: Path) -> None:
        self.mode, self.folder = mode, folder
        folder.mkdir(parents=True, exist_ok=True)
        index = folder / "inputs.json"
        self.inputs: dict[str, list[str]] = (
            json.loads(index.read_text()) if mode == "replay" else {}
        )

    def run(self, name: str, i: int, session: Any, inputs: np.ndarray) -> np.ndarray:
        import hashlib

        import numpy as np

        digest = hashlib.sha256(np.ascontiguousarray(inputs)).hexdigest()
        path = self.folder / f"{name}-{i:04d}.npy"
        if self.mode == "record":
            self.inputs.setdefault(name, []).append(digest)
            output = session.run(inputs)
            np.save(path, output)
            return output
        if digest != self.inputs[name][i]:
            raise SystemExit(f"{name}, batch {i}: the network input differs from the recording")
        return np.load(path)

    def close(self) -> None:
        if self.mode == "record":
            (self.folder / "inputs.json").write_text(json.dumps(self.inputs))


def child_stages(
    study: Path, precision: str, provider: str, replay: _Replay | None = None
) -> dict[str, Any]:
    """One study, stage by stage on this thread: CPU-seconds, peak memory and bounds.

    ``replay``: the networks' outputs recorded, or replayed in their place."""
    import numpy as np

    from radserve.bench.child import _warm
    from radserve.inference import choose_runtime
    from radserve.inference.runner import release_arena
    from radserve.models.registry import ModelRegistry
    from radserve.pipeline import SessionPool, release_free_memory
    from radserve.pipeline.inputs import as_input
    from radserve.pipeline.spec import load_pipeline
    from radserve.pipeline.study import finish_study
    from radserve.pipeline.volume import VolumeRun
    from radserve.progress import StageTimer

    memory: list[dict[str, Any]] = [{"step": "imports", **_status_mib()}]
    registry = ModelRegistry()
    pool = SessionPool(choose_runtime(prefer=[provider]) if provider != "auto" else None)
    pipeline = load_pipeline(PIPELINE)
    for step in pipeline.steps:
        bundle = registry.get(step.model, step.version)
        session = pool.get(bundle, precision)
        memory.append({"step": f"{bundle.spec.name}: compiled", **_status_mib()})
        session.run(np.zeros((1, bundle.spec.input.in_channels, 256, 256), np.float32))
        session.release_memory()
        memory.append({"step": f"{bundle.spec.name}: one batch run", **_status_mib()})
    _warm(pool, registry, precision)  # the same warm-up as the pipeline scenario's
    release_free_memory()
    warm = _status_mib()
    bytes_moved: dict[str, float] = {}
    networks: dict[str, dict[str, Any]] = {}
    with _Sampler() as sampler:
        stages = _Stages(sampler)
        cpu0, t0 = _cpu(), time.perf_counter()
        timer = StageTimer()
        ingested = stages.run(
            "ingest", lambda: as_input(study).ingest(pipeline, policy=None, timer=timer)
        )
        volume = ingested.loaded.volume
        bytes_moved["ingest"] = sum(p.stat().st_size for p in study.rglob("*.dcm")) + (
            volume.array.nbytes
        )
        run = VolumeRun(volume, pipeline, registry=registry, sessions=pool, precision=precision)
        while True:
            pending = stages.run("make task", run.next_step)
            if pending is None:
                break
            name, task, session = pending.bundle.spec.name, pending.task, pending.session
            moved = {"prepare": 0.0, "merge": 0.0}
            sample: np.ndarray | None = None
            n_batches = 0
            while (batch := stages.run(f"{name}: prepare", task.next_batch)) is not None:
                infer = (
                    functools.partial(session.run, batch.inputs)
                    if replay is None
                    else functools.partial(replay.run, name, n_batches, session, batch.inputs)
                )
                out = stages.run(f"{name}: infer", infer)
                stages.run(f"{name}: merge", lambda b=batch, o=out, t=task: t.accept(b, o))
                n_batches += 1
                crop_px = len(batch.items) * _crop_px(task)
                moved["prepare"] += crop_px * volume.array.itemsize + batch.inputs.nbytes
                written = 1 + (task.confidence is not None)  # uint8 labels (+ confidence)
                moved["merge"] += out.nbytes + crop_px * written
                if n_batches == task.total_batches // 2 or sample is None:
                    sample = batch.inputs
            prediction = stages.run(
                f"{name}: merge",
                lambda t=task, s=session: (release_arena(s), t.finish(precision=s.precision))[1],
            )
            bytes_moved[f"{name}: prepare"] = moved["prepare"]
            bytes_moved[f"{name}: merge"] = moved["merge"]
            labels = prediction.labels.array
            bytes_moved[f"{name}: postprocess"] = labels.nbytes
            stages.run(f"{name}: postprocess", lambda p=prediction: run.complete_step(p))
            del prediction, pending, task
            release_free_memory()
            if sample is not None and replay is None:
                networks[name] = _network_alone(session, sample, n_batches)
        stages.run(
            "report",
            lambda: finish_study(
                ingested,
                run.result(),
                pipeline=pipeline,
                sessions=pool,
                out_dir=Path(tempfile.mkdtemp(prefix="radserve-floor-")),
                timer=timer,
            ),
        )
        total_cpu, total_wall = _cpu() - cpu0, time.perf_counter() - t0
    peak = _status_mib()["VmHWM"]  # before anything below allocates
    return {
        "precision": precision,
        "providers": list(pool.runtime.providers),
        "memory_warm": [*memory, {"step": "warm (as the pipeline scenario)", **warm}],
        "stage_cpu_s": stages.cpu,
        "stage_wall_s": stages.wall,
        "stage_peak": sampler.peaks,
        "peak_rss_mb": peak,
        "total_cpu_s": total_cpu,
        "total_wall_s": total_wall,
        "bytes_moved": bytes_moved,
        "networks": networks,
        "labels_sha256": labels_digest(run.result()),
        "volume_int16_mb": volume.array.size * 2 / 2**20,
    }


def labels_digest(result: Any) -> dict[str, str]:
    """SHA-256 of every step's label map (and findings map): the stage-by-stage run must
    give the served pipeline's answer for its figures to mean anything."""
    import hashlib

    import numpy as np

    out = {}
    for step in result.steps:
        out[step.name] = hashlib.sha256(np.ascontiguousarray(step.labels.array)).hexdigest()
        if step.finding_labels is not None:
            found = np.ascontiguousarray(step.finding_labels.array)
            out[f"{step.name}: findings"] = hashlib.sha256(found).hexdigest()
    return out


def _crop_px(task: Any) -> int:
    """Native pixels of one work item (a slice of the crop, or a patch task's crop)."""
    box = task.box
    h, w = (s.stop - s.start for s in box[1:])
    return int(h * w)


def _network_alone(session: Any, batch: np.ndarray, n_batches: int, repeats: int = 10) -> dict:
    """The network's own CPU-seconds per batch through the same session, in isolation.

    The least of ``repeats`` runs: other load only ever adds CPU time (shared caches,
    a busy sibling hyper-thread), so the minimum is the estimate of the floor.
    """
    session.run(batch)
    per = []
    for _ in range(repeats):
        c0 = _cpu()
        session.run(batch)
        per.append(_cpu() - c0)
    session.release_memory()
    return {
        "batch_shape": list(batch.shape),
        "cpu_s_per_batch": min(per),
        "cpu_s_per_batch_median": statistics.median(per),
        "batches": n_batches,
        "floor_cpu_s": min(per) * n_batches,
    }


def copy_bandwidth_gib_per_cpu_s(mib: int = 256, repeats: int = 5) -> float:
    """Bytes read plus written per CPU-second by one thread copying a large array."""
    import numpy as np

    src = np.ones(mib * 2**20, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = math.inf
    for _ in range(repeats):
        c0 = _cpu()
        np.copyto(dst, src)
        best = min(best, max(_cpu() - c0, 1e-6))
    return 2 * mib / 1024 / best


def reduced_decode_costs(study: Path, levels: tuple[int, ...] = (1, 2, 3)) -> dict[str, Any]:
    """CPU-ms per frame of a JPEG 2000 study decoded whole (pylibjpeg-openjpeg, what
    radserve's decoder processes run) and at reduced resolution levels (Pillow's
    ``reduce``, the same OpenJPEG library: pylibjpeg-openjpeg's API has no such
    option), and the body box (rows above -500 HU) each level finds, in native pixels.

    The question it answers (issue 19 goal 2): can the body box be found before the
    full decode, for a fraction of its cost.
    """
    import io

    import numpy as np
    import pydicom
    from openjpeg import decode
    from PIL import Image
    from pydicom.encaps import generate_frames

    files = sorted(study.rglob("*.dcm"))
    frames, meta = [], None
    for path in files:
        meta = pydicom.dcmread(path)
        frames.append(next(generate_frames(meta.PixelData, number_of_frames=1)))
    assert meta is not None
    slope = float(getattr(meta, "RescaleSlope", 1.0))
    intercept = float(getattr(meta, "RescaleIntercept", 0.0))
    widen = 16 - int(meta.BitsStored)  # Pillow widens the samples to 16 bits

    def pillow(frame: bytes, level: int) -> np.ndarray:
        image = Image.open(io.BytesIO(frame))
        image.reduce = level
        image.load()
        return np.asarray(image).astype(np.int32) >> widen

    def measure(fn: Callable[[bytes], np.ndarray]) -> tuple[float, list[int]]:
        best, out = math.inf, []
        for _ in range(3):
            c0 = _cpu()
            out = [fn(f) for f in frames]
            best = min(best, _cpu() - c0)
        stack = np.stack(out).astype(np.float32) * slope + intercept
        scale = 512 // stack.shape[1]
        body = stack > -500.0
        rows = np.flatnonzero(body.any(axis=(0, 2)))
        cols = np.flatnonzero(body.any(axis=(0, 1)))
        box = [int(rows[0]) * scale, (int(rows[-1]) + 1) * scale]
        box += [int(cols[0]) * scale, (int(cols[-1]) + 1) * scale]
        return 1000.0 * best / len(frames), box

    full_ms, full_box = measure(lambda f: np.asarray(decode(f)))
    rows = [{"level": 0, "decoder": "pylibjpeg-openjpeg", "cpu_ms": full_ms, "box": full_box}]
    for level in levels:
        ms, box = measure(lambda f, lv=level: pillow(f, lv))
        rows.append({"level": level, "decoder": "Pillow reduce", "cpu_ms": ms, "box": box})
    return {"frames": len(frames), "rows": rows}


# --- parent -----------------------------------------------------------------------------
def _child(*args: str, script: str | None = None) -> dict[str, Any]:
    head = ["-c", script] if script else ["-m", "radserve.bench.floor"]
    cmd = [sys.executable, *head, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BenchError(f"floor child {args[0]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def import_costs() -> list[dict[str, Any]]:
    """RSS after each import step, each in a fresh process, and the step's delta."""
    rows, previous = [], None
    for i, (label, _) in enumerate(IMPORT_STEPS, start=1):
        modules = [m for _, step in IMPORT_STEPS[:i] for m in step]
        now = _child(*modules, script=_IMPORTS_CHILD)
        delta = None if previous is None else now["VmRSS"] - previous["VmRSS"]
        rows.append({"step": label, **now, "delta_mb": delta})
        previous = now
    return rows


_ARRAY_STAGES = ("ingest", "prepare", "merge", "postprocess")


def floor_table(stages: dict[str, Any], gib_per_cpu_s: float) -> list[dict[str, Any]]:
    """Per stage: CPU-seconds now, a lower bound and its kind, the gap."""
    rows = []
    networks = stages["networks"]
    for name, cpu in stages["stage_cpu_s"].items():
        model, _, kind = name.rpartition(": ")
        bound, basis = None, "none defended"
        if kind == "infer" and model in networks:
            bound, basis = networks[model]["floor_cpu_s"], "network alone, same batches"
        elif kind in _ARRAY_STAGES and name in stages["bytes_moved"]:
            moved = stages["bytes_moved"][name]
            bound = moved / 2**30 / gib_per_cpu_s
            basis = f"{moved / 2**20:.0f} MiB read+written at copy bandwidth"
        rows.append(
            {
                "stage": name,
                "cpu_s": cpu,
                "floor_cpu_s": bound,
                "basis": basis,
                "gap_cpu_s": None if bound is None else cpu - bound,
            }
        )
    return rows


def run_floor(
    *,
    n_slices: int = 300,
    precisions: tuple[str, ...] = ("fp32", "int8"),
    provider: str = "auto",
    cache_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Import costs, then each precision's stage table (each in a fresh child)."""
    cache_dir = Path(cache_dir or Path(tempfile.gettempdir()) / "radserve-bench")
    from radserve.bench.study import ensure_study

    log(f"preparing the {n_slices}-slice explicit study")
    study = ensure_study(cache_dir, "explicit", n_slices)
    log("import costs, one fresh process per step")
    imports = import_costs()
    gib = copy_bandwidth_gib_per_cpu_s()
    runs = {}
    for precision in precisions:
        log(f"stages at {precision} ({provider})")
        result = _child(str(study), precision, provider)
        result["floor"] = floor_table(result, gib)
        runs[precision] = result
    log("JPEG 2000 decode at reduced resolution (20 frames of the same patient)")
    j2k = reduced_decode_costs(ensure_study(cache_dir, "jpeg2000", 20))
    int16_mb = 512 * 512 * n_slices * 2 / 2**20
    return {
        "jpeg2000_reduced_decode": j2k,
        "scenario": "floor",
        "study": {"shape": [n_slices, 512, 512], "int16_volume_mb": int16_mb},
        "copy_gib_per_cpu_s": gib,
        "imports": imports,
        "runs": runs,
        "peak_rss_over_int16_volume": {p: r["peak_rss_mb"] / int16_mb for p, r in runs.items()},
        "note": "resident memory does not depend on other load; CPU-seconds do (shared "
        "caches, busy sibling hyper-threads): compare stages and floors of one run, not "
        "absolute CPU-seconds across runs; stage_wall_s is noise on a shared machine",
    }


def main(argv: list[str]) -> None:
    replay = None
    if len(argv) == 5 and argv[3] in ("--record", "--replay"):
        replay = _Replay(argv[3][2:], Path(argv[4]))
    elif len(argv) != 3:
        raise SystemExit(
            "usage: python -m radserve.bench.floor STUDY PRECISION PROVIDER "
            "[--record DIR | --replay DIR]"
        )
    result = child_stages(Path(argv[0]), argv[1], argv[2], replay)
    if replay is not None:
        replay.close()
        result["replayed"] = replay.mode
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
