"""MONAI's CropForegroundd against radserve's crops: label agreement with MONAI's own
bundle run, on a tiny bundle with seeded random weights (``none`` and ``nonzero`` are not
MONAI's crop; ``input.crop_foreground``, set by hand, is but for ties: docs/model-ops.md).

The bundle is the test factory's spleen-shaped one with ``CropForegroundd(source_key=image)``
(default ``select_fn`` x > 0, margin 0) after ``ScaleIntensityRanged``; the CT is the
nnU-Net tests' synthetic body (air -1000 HU, soft tissue, a zero-valued frame, which is
above a_min and so foreground for MONAI). radserve runs the same bundle imported without
the crop, with ``input.crop`` set to ``none`` and to ``nonzero`` (nnU-Net's crop); then
again with air in place of the frame; and with ``input.crop_foreground`` set on the
plain import. Why none/nonzero are not MONAI's crop: docs/model-ops.md.

Usage: PYTHONPATH=src:. python tools/measure_monai_crop_foreground.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path


def main(air: bool) -> None:
    from tests.factories import monai_bundle as mb
    from tests.integration.test_nnunet_agreement import synthetic_ct

    from radserve.domain.volume import Volume
    from radserve.importers.monai_bundle import import_monai
    from radserve.inference import ModelSession, PatchTask, choose_runtime, run_task
    from radserve.models.manifest import CropForegroundSpec, load_manifest

    crop = {"_target_": "CropForegroundd", "keys": "image", "source_key": "image"}
    cpu = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        ct = synthetic_ct((40, 64, 72), seed=3)
        if air:
            ct[ct == 0] = -1000.0  # air, not a zero frame, outside the body
        volume = Volume.from_geometry(ct, spacing=(2.5, 0.9, 0.9), origin=(0, 0, 0))
        nifti = mb.write_nifti(volume, t / "ct.nii.gz")
        cropped = mb.write_monai_bundle(t / "cropped", pre=[*mb.PRE[:5], crop, mb.PRE[5]])
        plain = mb.write_monai_bundle(t / "plain")  # same seed: same weights
        want = mb.run_monai_reference(cropped, nifti)
        print(f"{'air' if air else 'zero frame'} outside the body:")
        print(f"MONAI with vs without CropForegroundd: "
              f"{float((want == mb.run_monai_reference(plain, nifti)).mean()):.5f}")  # fmt: skip
        out = import_monai(plain, t / "models", name="tiny")
        for kind in ("none", "nonzero"):
            spec = load_manifest(out / "model.yaml")
            spec = spec.model_copy(update={"input": spec.input.model_copy(update={"crop": kind})})
            got = run_task(
                PatchTask(volume, spec), ModelSession(out / "model.onnx", spec, runtime=cpu)
            )
            print(f"radserve crop {kind!r} vs MONAI with CropForegroundd: "
                  f"{float((got.labels.array == want).mean()):.5f}")  # fmt: skip
        # input.crop_foreground set by hand (the importer refuses the crop: ties)
        spec = load_manifest(out / "model.yaml")
        crop = spec.input.model_copy(update={"crop_foreground": CropForegroundSpec()})
        spec = spec.model_copy(update={"input": crop})
        got = run_task(PatchTask(volume, spec), ModelSession(out / "model.onnx", spec, runtime=cpu))
        print(f"radserve crop_foreground vs MONAI with CropForegroundd: "
              f"{float((got.labels.array == want).mean()):.5f}")  # fmt: skip


if __name__ == "__main__":
    main(air=False)
    main(air=True)
