"""MONAI's CropForegroundd imported by radserve: label agreement with MONAI's own bundle
run, and what the crop costs, on a tiny bundle with seeded random weights.

The bundle is the test factory's spleen-shaped one with ``CropForegroundd(source_key=image)``
(default ``select_fn`` x > 0, margin 0) after ``ScaleIntensityRanged``; the CT is the
nnU-Net tests' synthetic body. Three volumes: ``zero frame`` (a 0 HU frame round the
body: above a_min, so MONAI's box is the whole image), ``air`` (-1000 HU round the body)
and ``ties`` (24x64x64 at 2.5x1.2x1.2 mm, air beside the body and in the first slices:
every 5th row and 4th slice lands exactly on a model voxel, some beside the box). For
each: MONAI's cropped bundle vs MONAI without the crop; radserve's import of the plain
bundle with ``crop: none`` / ``nonzero`` (not MONAI's crop); radserve's import of the
cropped bundle (``input.crop_foreground``); the same with the way back at ``i * s / t``
instead of MONAI's own coordinates (session 9's arithmetic, as a control); seconds per
run (radserve's ``run_task``, MONAI's preprocessing + inferer + postprocessing), one
thread each, to compare within one run only.

``--cost``: what the crop costs radserve at a larger size: the bundle imported without
and with ``CropForegroundd`` on a 120x320x320 CT at 2.5x0.8x0.8 mm (air on two sides),
each in a fresh process (one thread): seconds per stage and peak RSS. The crop keeps one
accumulator for the whole model grid and maps back in float64.

Usage: PYTHONPATH=src:. python tools/measure_monai_crop_foreground.py [--cost]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any


def _timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(kind: str) -> None:
    import numpy as np
    import torch
    from tests.factories import monai_bundle as mb
    from tests.factories.agreement import synthetic_ct

    from radserve.domain.volume import Volume
    from radserve.importers.monai_bundle import import_monai
    from radserve.inference import ModelSession, PatchTask, choose_runtime, run_task
    from radserve.inference.patches import PatchTask as Task
    from radserve.models.manifest import load_manifest

    torch.set_num_threads(1)
    cpu = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        shape, spacing = (40, 64, 72), (2.5, 0.9, 0.9)
        if kind == "ties":
            shape, spacing = (24, 64, 64), (2.5, 1.2, 1.2)
        ct = synthetic_ct(shape, seed=3)
        if kind == "air":
            ct[ct == 0] = -1000.0  # air, not a zero frame, outside the body
        if kind == "ties":
            ct[:, :, :3] = -1000.0
            ct[:2] = -1000.0
        volume = Volume.from_geometry(ct, spacing=spacing, origin=(0, 0, 0))
        nifti = mb.write_nifti(volume, t / "ct.nii.gz")
        cropped = mb.write_monai_bundle(t / "cropped", pre=mb.cropped_pre())
        plain = mb.write_monai_bundle(t / "plain")  # same seed: same weights
        want, monai_s = _timed(lambda: mb.run_monai_reference(cropped, nifti))
        print(f"{kind} ({shape[0]}x{shape[1]}x{shape[2]} at {spacing} mm):")
        print(f"  MONAI with vs without CropForegroundd: "
              f"{float((want == mb.run_monai_reference(plain, nifti)).mean()):.5f}")  # fmt: skip

        def agree(out: Path, update: dict[str, Any] | None = None) -> tuple[str, float]:
            spec = load_manifest(out / "model.yaml")
            if update:
                spec = spec.model_copy(update={"input": spec.input.model_copy(update=update)})
            session = ModelSession(out / "model.onnx", spec, runtime=cpu)
            got, secs = _timed(lambda: run_task(PatchTask(volume, spec), session))
            differ = int((got.labels.array != want).sum())
            return f"{1 - differ / want.size:.5f} ({differ} voxels differ)", secs

        plain_out = import_monai(plain, t / "models", name="plain")
        for crop_kind in ("none", "nonzero"):
            text, secs = agree(plain_out, {"crop": crop_kind})
            print(f"  radserve plain import, crop {crop_kind!r}: {text}, {secs:.2f} s")
        out = import_monai(cropped, t / "models", name="cropped")
        text, secs = agree(out)
        print(f"  radserve imported CropForegroundd: {text}, {secs:.2f} s; MONAI {monai_s:.2f} s")
        keep = Task._monai_back_coordinates
        Task._monai_back_coordinates = lambda self, volume, box: None  # type: ignore[method-assign]
        try:
            text, _ = agree(out)
        finally:
            Task._monai_back_coordinates = keep  # type: ignore[method-assign]
        print(f"  control, way back at i * s / t (session 9): {text}")
        assert np.asarray(want).size == volume.array.size


def cost(kind: str) -> None:
    """One run of the ``kind`` ('plain' or 'crop') import on the larger CT."""
    import resource

    from tests.factories import monai_bundle as mb
    from tests.factories.agreement import synthetic_ct

    from radserve.domain.volume import Volume
    from radserve.importers.monai_bundle import import_monai
    from radserve.inference import ModelSession, PatchTask, choose_runtime, run_task
    from radserve.models.manifest import load_manifest

    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        pre = mb.cropped_pre() if kind == "crop" else None
        out = import_monai(mb.write_monai_bundle(t / "b", pre=pre), t / "m", name=kind)
        spec = load_manifest(out / "model.yaml")
        ct = synthetic_ct((120, 320, 320), seed=3)
        ct[:, :, :20] = -1000.0
        ct[:, :20] = -1000.0
        volume = Volume.from_geometry(ct, spacing=(2.5, 0.8, 0.8), origin=(0, 0, 0))
        cpu = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)
        session = ModelSession(out / "model.onnx", spec, runtime=cpu)
        task = PatchTask(volume, spec)
        _, wall = _timed(lambda: run_task(task, session))
        stages = ", ".join(f"{k} {v:.2f} s" for k, v in task._state.timings.items())
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{kind}: {wall:.2f} s ({stages}), peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    import subprocess
    import sys

    if {"-h", "--help"} & set(sys.argv[1:]):  # the usage is the docstring
        sys.exit(__doc__)
    if sys.argv[1:2] == ["--cost"]:
        for kind in ("plain", "crop"):
            subprocess.run([sys.executable, __file__, "--cost-one", kind], check=True)
    elif sys.argv[1:2] == ["--cost-one"]:
        cost(sys.argv[2])
    else:
        for kind in ("zero frame", "air", "ties"):
            main(kind)
