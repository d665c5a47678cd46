"""Why the served MONAI crop case differs from MONAI's run in one voxel: a float32 tie
between two classes, on which MONAI's own label follows torch's thread count.

The e2e crop case (tests/e2e/test_imported_model_serve.py) in process, step by step:
the CT written as DICOM and read back by radserve's ingest against the volume MONAI's
NIfTI is written from (affine and voxels: what the server receives vs what MONAI reads);
radserve's import run on it with ONNX Runtime's CPU and OpenVINO providers; MONAI's
bundle run with torch on its default threads, on one thread, and with radserve's ONNX
session in place of torch's network. For each voxel where any two runs differ: the
class scores ``AsDiscreted(argmax)`` took in each MONAI run (float hex), and how many
voxels are float ties (``float_ties``: the leading two within 1e-6 of the leading one).

Usage: PYTHONPATH=src:. python tools/measure_monai_class_ties.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path


def main() -> None:
    import numpy as np
    import torch
    from tests.factories import monai_bundle as mb
    from tests.factories.dicom_series import make_ct_series

    from radserve.domain.volume import Volume
    from radserve.importers.monai_bundle import import_monai
    from radserve.inference import ModelSession, PatchTask, choose_runtime, run_task
    from radserve.ingest import discover_series, load_series
    from radserve.models.manifest import load_manifest

    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        bundle = mb.write_monai_bundle(t / "bundle", pre=mb.cropped_pre())
        out = import_monai(bundle, t / "models", name="tiny", version="1.0.0")
        spec = load_manifest(out / "model.yaml")
        hu, (n, rows, cols) = mb.served_hu(air=True), mb.SERVED_SHAPE
        spacing, origin = mb.SERVED_SPACING, mb.SERVED_ORIGIN
        make_ct_series(t / "study", n_slices=n, rows=rows, cols=cols, spacing=spacing,
                       origin=origin, hu=hu)  # fmt: skip
        (header,) = discover_series(t / "study")
        received = load_series(header).volume
        written = Volume.from_geometry(hu.astype(np.float32), spacing=spacing, origin=origin)
        same_affine = np.array_equal(received.affine, written.affine)
        same_voxels = np.array_equal(received.array.astype(np.float32), written.array)
        print(f"DICOM as received vs as written: affine equal {same_affine}, voxels {same_voxels}")
        nifti = mb.write_nifti(written, t / "ct.nii.gz")

        labels: dict[str, np.ndarray] = {}
        sessions = {
            provider: ModelSession(
                out / "model.onnx", spec, runtime=choose_runtime(prefer=[provider], threads=1)
            )
            for provider in ("CPUExecutionProvider", "OpenVINOExecutionProvider")
        }
        for provider, session in sessions.items():
            labels[f"radserve {provider}"] = run_task(
                PatchTask(received, spec), session
            ).labels.array

        def onnx_network(x: torch.Tensor) -> torch.Tensor:
            cpu = sessions["CPUExecutionProvider"]
            return torch.from_numpy(cpu.run(x.numpy().astype(np.float32)))

        threads = torch.get_num_threads()
        runs = {f"MONAI torch {threads} threads": mb.run_monai_bundle(bundle, nifti)}
        runs["MONAI with radserve's ONNX session"] = mb.run_monai_bundle(
            bundle, nifti, onnx_network
        )
        torch.set_num_threads(1)
        runs["MONAI torch 1 thread"] = mb.run_monai_bundle(bundle, nifti)
        torch.set_num_threads(threads)
        labels.update({name: run.labels for name, run in runs.items()})

        reference = runs[f"MONAI torch {threads} threads"]
        assert reference.scores is not None
        ties = mb.float_ties(reference.scores)
        print(f"float ties in MONAI's scores: {int(ties.sum())} of {ties.size} voxels")
        names = list(labels)
        for name in names[1:]:
            differ = labels[name] != labels[names[0]]
            print(f"{name} vs {names[0]}: {int(differ.sum())} differ")
        stacked = np.stack([labels[k] for k in names])
        for voxel in np.argwhere((stacked != stacked[0]).any(axis=0)):
            at = tuple(int(v) for v in voxel)
            print(f"voxel (z, y, x) {at}: tie {bool(ties[at])}")
            for name in names:
                run = runs.get(name)
                scores = "" if run is None or run.scores is None else run.scores[(slice(None), *at)]
                text = " ".join(float(s).hex() for s in scores)
                print(f"  {name}: label {int(labels[name][at])} {text}")


if __name__ == "__main__":
    main()
