"""The drift features of a CT volume: the memory-lean extractor gives exactly what the
straightforward one (two float32 copies of the strided volume) gave; the noise is the
input-domain check's own measurement (radserve.pipeline.ct_noise), not a second one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import ndimage

from radserve.domain.input_domain import AcquisitionFacts
from radserve.phantom import PhantomSpec, generate_phantom
from radserve.pipeline import profile
from radserve.pipeline.ct_noise import noise_hu
from radserve.pipeline.profile import (
    _BODY_HU,
    HU_EDGES,
    _hu_counts,
    _strided,
    volume_features,
)

SCANNER = {"manufacturer": "radserve phantom", "kernel": "STANDARD", "kvp": "120"}


def _reference(array: np.ndarray) -> tuple[list[float], float]:
    """Histogram and mean as computed before the memory rework."""
    array = _strided(array)
    mask = array > _BODY_HU
    labels, n = ndimage.label(mask)
    if n > 1:
        sizes = np.bincount(labels.ravel())
        sizes[0] = 0
        mask = labels == int(np.argmax(sizes))
    body = array[mask].astype(np.float32)
    counts, _ = np.histogram(np.clip(body, HU_EDGES[0], HU_EDGES[-1] - 1e-3), bins=HU_EDGES)
    return (counts / counts.sum()).tolist(), float(body.mean())


def test_volume_features_match_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profile, "_CHUNK", 4099)  # many chunks, a ragged last one
    spec = PhantomSpec.random(3, small=True)
    ct = generate_phantom(spec, range(0, spec.n_slices, 2)).ct
    array = ct.array.copy()
    array[:3, :4, :4] = 40  # a second component above -500 HU, apart from the body
    ct = ct.with_array(array)
    facts = AcquisitionFacts(
        modality="CT",
        pixel_spacing_mm=spec.pixel_spacing_mm,
        slice_thickness_mm=spec.slice_thickness_mm,
        rows=spec.rows,
        columns=spec.columns,
        slices=spec.n_slices,
        body_part="CHEST",
    )
    got = volume_features(ct, facts, SCANNER)
    hist, mean = _reference(ct.array)
    assert got["hist"]["hu_body"] == hist
    assert got["num"]["hu_body_mean"] == mean
    # facts without a noise: measured as the check measures it; with one: that one
    assert got["num"]["noise_hu"] == noise_hu(ct) and noise_hu(ct) > 0.0
    measured = dataclasses.replace(facts, noise_hu=12.5)
    assert volume_features(ct, measured, SCANNER)["num"]["noise_hu"] == 12.5
    assert ndimage.label(_strided(array) > _BODY_HU)[1] > 1  # the largest-component path


def test_whole_hu_are_binned_as_numpys_histogram_of_the_edges() -> None:
    """The integer volumes' counting (bin by integer division) gives np.histogram's
    counts, edges, the ends and values beyond them included."""
    rng = np.random.default_rng(0)
    hu = rng.integers(-1100, 1600, 500_000).astype(np.float32)
    hu[:200] = HU_EDGES[rng.integers(0, len(HU_EDGES), 200)]  # exactly on an edge
    clipped = np.clip(hu, HU_EDGES[0], HU_EDGES[-1] - 1e-3)
    want = np.histogram(clipped, bins=HU_EDGES)[0]
    np.testing.assert_array_equal(_hu_counts(hu, integral=True), want)
    np.testing.assert_array_equal(_hu_counts(hu, integral=False), want)
