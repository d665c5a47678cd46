"""The viewer's volume keeps a series' values as a reader needs them: a CT as whole HU in
int16, any other modality as int16 only when that loses nothing (an MR's integer values),
else float32 (a PET in Bq/ml or SUV)."""

from __future__ import annotations

import numpy as np

from radserve.console.volume import viewer_array


def test_a_ct_is_whole_hu_in_int16_clipped_to_its_range() -> None:
    hu = np.array([[-1024.4, 40.6], [3071.0, 40000.0]], np.float32)
    out = viewer_array(hu, "CT")
    assert out.dtype == np.int16
    assert out.tolist() == [[-1024, 41], [3071, 32767]]


def test_an_mr_of_integers_stays_int16() -> None:
    mr = np.array([[0.0, 812.0], [1533.0, 4095.0]], np.float32)
    out = viewer_array(mr, "MR")
    assert out.dtype == np.int16 and np.array_equal(out, mr)


def test_a_pet_keeps_its_fractions_and_its_highest_values() -> None:
    bq_ml = np.array([[0.0, 4712.37], [98510.5, 3.25]], np.float32)
    out = viewer_array(bq_ml, "PT")
    assert out.dtype == np.float32 and np.array_equal(out, bq_ml)
    suv = np.array([[0.0, 1.5], [11.75, 0.25]], np.float32)
    assert np.array_equal(viewer_array(suv, "PT"), suv)
    big = np.array([[0.0, 40000.0]], np.float32)  # integers, but past int16
    assert viewer_array(big, "PT").dtype == np.float32
