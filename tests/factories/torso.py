"""A simple torso drawn independently of radserve.phantom: numpy ellipses, textbook HU,
Gaussian noise. It stands for a new user's own test data (issue 18): its geometry lies
inside the shipped models' declared input domain, but it does not look like the phantoms
they were trained on."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np

from radserve.domain.volume import Volume


def _ellipse(x: np.ndarray, y: np.ndarray, cx: float, cy: float, a: float, b: float):
    return ((x - cx) / a) ** 2 + ((y - cy) / b) ** 2 <= 1


def simple_torso(
    *, matrix: int = 512, pixel_mm: float = 0.78, slice_mm: float = 5.0, slices: int = 70
) -> Volume:
    """Body, fat, lungs (chest half), heart, liver and spleen (upper abdomen), kidneys,
    aorta and a vertebra; z runs from the pelvis end (first slice) towards the head."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:matrix, 0:matrix].astype(np.float32)
    x = (x - matrix / 2) * pixel_mm  # towards patient left
    y = (y - matrix / 2) * pixel_mm  # towards posterior
    hu = np.full((slices, matrix, matrix), -1000.0, np.float32)
    for k in range(slices):
        z = (k - slices / 2) * slice_mm
        s = hu[k]
        s[_ellipse(x, y, 0, 0, 170, 120)] = -90  # subcutaneous fat
        s[_ellipse(x, y, 0, 0, 160, 110)] = 40  # muscle and soft tissue
        if z > -20:
            for cx in (-70, 70):
                s[_ellipse(x, y, cx, 5, 60, 80)] = -850  # lungs
            if z < 90:
                s[_ellipse(x, y, 15, -20, 45, 40)] = 45  # heart
        elif z > -150:
            s[_ellipse(x, y, -60, -10, 80, 65)] = 60  # liver (patient right)
            s[_ellipse(x, y, 80, 20, 35, 50)] = 50  # spleen
        if -150 < z < -60:
            for cx in (-60, 60):
                s[_ellipse(x, y, cx, 50, 28, 45)] = 35  # kidneys
        s[_ellipse(x, y, 20, 40, 12, 12)] = 180  # aorta
        s[_ellipse(x, y, 0, 70, 18, 18)] = 600  # vertebral body
    hu += rng.normal(0.0, 15.0, hu.shape).astype(np.float32)
    array = np.clip(np.round(hu), -1024, 3071).astype(np.int16)
    origin = (-matrix / 2 * pixel_mm, -matrix / 2 * pixel_mm, -slices / 2 * slice_mm)
    return Volume.from_geometry(array, spacing=(slice_mm, pixel_mm, pixel_mm), origin=origin)


def write_torso_nifti(path: Path, volume: Volume) -> Path:
    """The torso as a NIfTI file (RAS affine), as a user's own tool would write it."""
    data = np.ascontiguousarray(np.transpose(volume.array, (2, 1, 0)))
    nib.save(nib.Nifti1Image(data, volume.nifti_affine()), str(path))
    return path
