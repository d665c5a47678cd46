"""A CT whose only tissue is thin or flat (a scanner table, a cushion or gel pad on it, a
head holder, phantom rods) is flagged as holding no body, however much of the field that
tissue fills; a real body never is, a phantom lying on its table, a head or a limb in a
small field included.

Probe (2026-12-06): the no-body rule was a share of the voxels above -500 HU (1 %), and
a table alone fills more than that (the phantoms' 450 x 36 mm table: ~1.6 % of a 46 cm
field as a hollow shell, ~8 % solid), so an empty scan with the table in view got a
clean "no findings". The rule (``radserve.pipeline.ct_body``): some axial cross-section
of the tissue, tables left out, must hold a 30 mm disc and not be a slab."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tests.factories.dicom_series import make_ct_series
from tests.factories.results import run_test_pipeline

from radserve.domain import Volume
from radserve.domain.input_domain import OUTSIDE_INPUT_DOMAIN, body_missing
from radserve.phantom import PhantomSpec, generate_phantom
from radserve.pipeline.profile import volume_facts

Plane = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (y, x) mm -> HU


def _table(y: np.ndarray, x: np.ndarray, *, top: float = 120.0, core_hu: float = -650.0):
    """The phantoms' table: a 450 x 36 mm box, a 3 mm shell of 200 HU round a core."""
    hu = np.full(y.shape, -1000.0)
    hu[(y >= top) & (y < top + 36.0) & (np.abs(x) < 225.0)] = 200.0
    hu[(y >= top + 3.0) & (y < top + 33.0) & (np.abs(x) < 222.0)] = core_hu
    return hu


def _table_and(shape: Callable[[np.ndarray, np.ndarray], np.ndarray], hu: float) -> Plane:
    def plane(y: np.ndarray, x: np.ndarray) -> np.ndarray:
        return np.where(shape(y, x), hu, _table(y, x))

    return plane


def _rods(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Nine 28 mm rods (a QA phantom's inserts) in air."""
    rods = np.zeros(y.shape, bool)
    for cy in (-80.0, 0.0, 80.0):
        for cx in (-80.0, 0.0, 80.0):
            rods |= np.hypot(y - cy, x - cx) < 14.0
    return np.where(rods, 100.0, -1000.0)


def _head_holder(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    r = np.hypot(y - 20.0, x)
    return (r > 104.0) & (r < 110.0) & (y > 20.0)


# (plane, field of view mm): no body in view, each over 1 % of the field
EMPTY: dict[str, tuple[Plane, float]] = {
    "table (hollow)": (_table, 460.0),
    "table (solid)": (lambda y, x: _table(y, x, core_hu=0.0), 460.0),
    "table in a 250 mm field": (lambda y, x: _table(y, x, top=60.0, core_hu=0.0), 250.0),
    "table and a gel pad": (
        _table_and(lambda y, x: (np.abs(x) < 100.0) & (y >= 95.0) & (y < 120.0), -50.0),
        460.0,
    ),
    "table and a pad across it": (
        _table_and(lambda y, x: (np.abs(x) < 225.0) & (y >= 70.0) & (y < 120.0), -100.0),
        460.0,
    ),
    "table and a head holder": (_table_and(_head_holder, 100.0), 460.0),
    "phantom rods": (_rods, 330.0),
}

# bodies (not flagged): a limb or a head in a small field, on the table or off it
BODIES: dict[str, tuple[Plane, float]] = {
    "limb on the table": (
        _table_and(lambda y, x: np.hypot(y - 80.0, x) < 40.0, 40.0),
        460.0,
    ),
    "wrist in a small field": (
        lambda y, x: np.where((x / 27.0) ** 2 + (y / 20.0) ** 2 < 1.0, 40.0, -1000.0),
        120.0,
    ),
    "limb filling a small field, table below": (
        lambda y, x: np.where(np.hypot(y + 10.0, x) < 70.0, 40.0, _table(y, x, top=60.0)),
        150.0,
    ),
    "head": (
        lambda y, x: np.where((x / 75.0) ** 2 + (y / 95.0) ** 2 < 1.0, 30.0, -1000.0),
        250.0,
    ),
    "field inside the patient": (lambda y, x: np.full(y.shape, 40.0), 200.0),
}


def _volume(plane: Plane, fov: float, *, columns: int = 256, slices: int = 6) -> Volume:
    spacing = fov / columns
    centre = (columns - 1) / 2.0
    y, x = (np.mgrid[:columns, :columns] - centre) * spacing
    array = np.repeat(plane(y, x)[None].astype(np.int16), slices, axis=0)
    return Volume(array, np.diag([2.5, spacing, spacing, 1.0]))


def _missing(volume: Volume) -> str | None:
    facts = volume_facts(volume, modality="CT", slice_thickness_mm=None, body_part="")
    return body_missing(facts)


@pytest.mark.parametrize("case", sorted(EMPTY))
def test_thin_or_flat_tissue_alone_is_no_body(case: str) -> None:
    plane, fov = EMPTY[case]
    volume = _volume(plane, fov)
    assert np.count_nonzero(volume.array > -500) / volume.array.size > 0.01  # not the share
    missing = _missing(volume)
    assert missing is not None
    assert missing.startswith("no body in view: the tissue above -500 HU is only thin or flat")


@pytest.mark.parametrize("case", sorted(BODIES))
def test_a_body_in_any_field_is_a_body(case: str) -> None:
    plane, fov = BODIES[case]
    assert _missing(_volume(plane, fov)) is None


@pytest.mark.parametrize("small", [False, True])
@pytest.mark.parametrize("scale", [1.0, 0.4])
def test_a_phantom_on_its_table_is_a_body(small: bool, scale: float) -> None:
    spec = dataclasses.replace(PhantomSpec.random(2, small=small), patient_scale=scale)
    n = spec.shape[0]
    phantom = generate_phantom(spec, range(0, n, max(1, n // 6)))
    assert _missing(phantom.ct) is None


def _table_points(points: np.ndarray) -> np.ndarray:
    return _table(points[..., 1], points[..., 0], top=40.0)


def test_a_study_of_the_table_alone_is_flagged_in_its_report(tmp_path: Path) -> None:
    make_ct_series(
        tmp_path / "study", n_slices=8, rows=128, cols=128, spacing=(2.5, 3.6, 3.6),
        origin=(-228.6, -228.6, 0.0), hu=_table_points,
    )  # fmt: skip
    report = run_test_pipeline(tmp_path).report
    assert report.findings == []
    (flag,) = [w for w in report.warnings if w.code == OUTSIDE_INPUT_DOMAIN]
    assert flag.message.startswith("no body in view: the tissue above -500 HU is only thin")
