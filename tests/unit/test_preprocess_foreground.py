"""radserve's CropForeground box (input.crop_foreground) is MONAI's, option for option."""

from __future__ import annotations

import numpy as np
import pytest

from radserve.errors import ModelError
from radserve.models.manifest import CropForegroundSpec
from radserve.preprocess.foreground import foreground_box, foreground_window

OPTIONS = [
    {},
    {"margin": (2, 0, 7)},
    {"margin": (9, 9, 9)},
    {"margin": (9, 9, 9), "allow_smaller": True},
    {"k_divisible": (16, 5, 8)},
    {"margin": (1, 3, 0), "k_divisible": (32, 32, 32), "allow_smaller": True},
]


@pytest.mark.parametrize("options", OPTIONS)
def test_box_is_monais(options: dict) -> None:
    monai = pytest.importorskip("monai.transforms")
    rng = np.random.default_rng(len(str(options)))
    spec = CropForegroundSpec(**options)
    for _ in range(5):
        image = np.full((1, 17, 23, 29), -0.5, np.float32)
        lo = rng.integers(0, (10, 15, 20))
        hi = lo + rng.integers(1, 8, 3)
        image[0, lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]] = rng.uniform(-1, 1, hi - lo)
        image[0, lo[0], lo[1], lo[2]] = 0.5  # at least one voxel above 0
        cropper = monai.CropForeground(
            margin=list(spec.margin),
            k_divisible=list(spec.k_divisible),
            allow_smaller=spec.allow_smaller,
        )
        want = cropper.compute_bounding_box(image)
        got = foreground_box(image, spec)
        assert [list(w) for w in want] == [list(g) for g in got]
        window = foreground_window(image, spec, (8, 8, 8))
        (s, e), (o, size) = window.box, window.windows
        cropped = window.image[0, s[0] : e[0], s[1] : e[1], s[2] : e[2]]
        assert np.array_equal(cropped, np.asarray(cropper(image))[0])
        assert all(n >= 8 for n in size) and all(a <= b for a, b in zip(o, s, strict=True))


def test_no_foreground_is_a_clear_error() -> None:
    with pytest.raises(ModelError, match=r"no voxel of the normalised image is above 0\.0"):
        foreground_box(np.zeros((1, 4, 4, 4), np.float32), CropForegroundSpec())
