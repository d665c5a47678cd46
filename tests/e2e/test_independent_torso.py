"""Issue 18's second example: a simple torso drawn by an independent generator
(tests/factories/torso.py: numpy ellipses, not radserve.phantom), in a geometry inside
the shipped models' declaration, comes out of the organs model with a token liver and
heart. The report flags it (``outside_input_domain`` from the declared structure
volumes); nothing about its geometry is outside."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.factories.torso import simple_torso, write_torso_nifti

from radserve.domain.input_domain import OUTSIDE_INPUT_DOMAIN
from radserve.pipeline import load_pipeline
from radserve.pipeline.inputs import NiftiInput
from radserve.pipeline.study import run_study

pytestmark = pytest.mark.slow


def test_an_independent_torso_inside_the_geometry_is_flagged_by_its_organ_volumes(
    tmp_path: Path,
) -> None:
    torso = write_torso_nifti(tmp_path / "torso.nii.gz", simple_torso())
    result = run_study(
        NiftiInput(torso), pipeline=load_pipeline("ct-chest-abdomen"), out_dir=tmp_path / "out",
        key_images=False,
    )  # fmt: skip
    flags = [w.message for w in result.report.warnings if w.code == OUTSIDE_INPUT_DOMAIN]
    organs = [m for m in flags if m.startswith("outside the input domain of organs/1.0.0:")]
    assert len(organs) == 1, flags
    # its geometry (512x512, 0.78 mm, 5 mm x 70 = 350 mm) is inside every declared range
    for geometric in ("pixel spacing", "slice thickness", "field of view", "coverage", "rows"):
        assert geometric not in organs[0]
    assert "liver" in organs[0] and "(complete) outside the expected [400, 4000] ml" in organs[0]
    liver = next(m for m in result.report.organ_measurements if m.label == "liver")
    assert liver.volume_ml is not None and liver.volume_ml < 400  # the drawn liver is ~2 l
