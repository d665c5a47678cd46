"""Host helpers: lazily backed zero arrays behave like np.zeros."""

from __future__ import annotations

import numpy as np

from radserve.host import lazy_zeros, usable_cores


def test_lazy_zeros_is_a_writable_zero_array() -> None:
    a = lazy_zeros((3, 4, 5), np.uint16)
    assert a.shape == (3, 4, 5) and a.dtype == np.uint16 and a.flags.writeable
    assert not a.any()
    a[1, 2, 3] = 7
    np.testing.assert_array_equal(a.copy(), np.where(np.arange(60).reshape(3, 4, 5) == 33, 7, 0))
    assert lazy_zeros((0, 4, 5), np.uint8).shape == (0, 4, 5)


def test_usable_cores_is_at_least_one() -> None:
    assert usable_cores() >= 1
