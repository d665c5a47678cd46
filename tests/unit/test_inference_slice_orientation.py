"""A 2D/2.5D model sees every study the way it was trained, however it was stored.

Before session 36 the network read each slice as stored: a prone study (rows and columns
reversed), a feet-first one (slices the other way), rows and columns swapped or a NIfTI
in RAS reached it turned or mirrored, and a real probe got wrong organ volumes, missed
lesions and left and right swapped, without a warning. The model here is direction
sensitive (gradients along rows, columns and the 2.5D context), so any turn that is not
undone changes its answer."""

from __future__ import annotations

import numpy as np
import pytest
from tests.factories.onnx_models import conv_model, model_spec

from radserve.domain.volume import Volume
from radserve.inference import ModelSession, SliceTask, choose_runtime, run_task
from radserve.preprocess.axes import AxisMap, OrientationError

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)


def _axial() -> Volume:
    """A standard axial stack (slices towards the head, rows towards posterior, columns
    towards the patient's left) holding an off-centre, lopsided blob in a body."""
    z, y, x = np.mgrid[0:7, 0:40, 0:52].astype(np.float32)
    body = ((y - 20) / 17) ** 2 + ((x - 26) / 22) ** 2 <= 1
    blob = 700 * np.exp(-(((y - 14) / 5) ** 2 + ((x - 33) / 8) ** 2 + ((z - 2) / 2) ** 2))
    ramp = 15 * x + 9 * y + 40 * z  # no symmetry left to hide a turn
    hu = np.where(body, 100 + blob + ramp, -1000).astype(np.int16)
    return Volume.from_geometry(hu, spacing=(2.0, 0.7, 0.9), origin=(-30.0, -10.0, 5.0))


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> ModelSession:
    """2.5D: class 1 where the image rises towards the next slice, the next row and the
    next column (a gradient, so every axis's direction matters)."""
    weight = np.zeros((2, 3, 3, 3), np.float32)
    weight[1, 1, 1, 2], weight[1, 1, 1, 0] = 4.0, -4.0  # along the columns
    weight[1, 1, 2, 1], weight[1, 1, 0, 1] = 3.0, -3.0  # along the rows
    weight[1, 2, 1, 1], weight[1, 0, 1, 1] = 2.0, -2.0  # the context: next minus previous
    path = conv_model(tmp_path_factory.mktemp("onnx") / "gradient.onnx", weight, np.zeros(2))
    spec = model_spec(mode="2.5d", context_slices=1, spacing=(None, 1.2, 1.2), kind="lesion")
    return ModelSession(path, spec, runtime=CPU)


STORED = {
    "prone (rows and columns reversed)": AxisMap((0, 1, 2), (False, True, True)),
    "columns mirrored": AxisMap((0, 1, 2), (False, False, True)),
    "feet first (slices reversed)": AxisMap((0, 1, 2), (True, False, False)),
    "rows and columns swapped": AxisMap((0, 2, 1), (False, False, False)),
    "RAS-like (swapped, both reversed, slices reversed)": AxisMap((0, 2, 1), (True, True, True)),
}


@pytest.mark.parametrize("case", sorted(STORED))
def test_a_study_stored_turned_gets_the_labels_of_the_standard_one(
    session: ModelSession, case: str
) -> None:
    axial = _axial()
    expected = run_task(SliceTask(axial, session.spec, crop_to_body=False), session)
    assert 0 < int(expected.labels.array.sum()) < expected.labels.array.size
    turn = STORED[case]
    stored = turn.volume(axial)  # the same patient, voxel for voxel, stored otherwise
    stored = Volume(np.ascontiguousarray(stored.array), stored.affine)
    got = run_task(SliceTask(stored, session.spec, crop_to_body=False), session)
    np.testing.assert_array_equal(got.labels.affine, stored.affine)  # on the stored grid
    # every voxel labelled as the standard study's voxel at the same patient position
    np.testing.assert_array_equal(got.labels.array, turn.view(expected.labels.array))
    np.testing.assert_array_equal(got.confidence.array, turn.view(expected.confidence.array))


def test_slices_in_another_plane_are_refused_unless_the_model_reads_them_as_stored(
    session: ModelSession,
) -> None:
    coronal = AxisMap((1, 0, 2)).volume(_axial())  # the slice axis runs posterior
    coronal = Volume(np.ascontiguousarray(coronal.array), coronal.affine)
    with pytest.raises(OrientationError, match=r"slices are coronal, and model .* reads axial"):
        SliceTask(coronal, session.spec)
    assert OrientationError.code == "orientation_unsupported"
    as_stored = session.spec.model_copy(
        update={"input": session.spec.input.model_copy(update={"axes": ("z", "y", "x")})}
    )
    assert SliceTask(coronal, as_stored).total_batches > 0
