"""The rolling z-slab accumulator gives the labels and confidences of one whole-volume
accumulator (the reference, ``_rolling = False``), while holding a window of slices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.factories.onnx_models import conv_model, model_spec

from radserve.domain.volume import Volume
from radserve.inference import ModelSession, PatchTask, choose_runtime, run_task

CPU = choose_runtime(prefer=["CPUExecutionProvider"], threads=1)


class WholeVolume(PatchTask):
    _rolling = False


def _ct(shape: tuple[int, int, int], spacing: tuple[float, float, float]) -> Volume:
    from scipy import ndimage

    field = ndimage.gaussian_filter(np.random.default_rng(1).normal(size=shape), 1.5)
    return Volume.from_geometry((400 * field / field.std()).astype(np.int16), spacing=spacing)


MONAI = {
    "axes": ["R", "A", "S"],
    "overlap": 0.5,
    "crop": "none",
    "resampling": {"grid": "first_voxel", "normalise_first": False},
    "sliding_window": {
        "importance": "monai_gaussian",
        "accumulate": "logits",
        "pad": "centre_zero",
        "placement": "monai",
        "activate_on_model_grid": True,
    },
}
NNUNET = {
    "crop": "none",
    "resampling": {"image_order": 3, "separate_z": "auto"},
    "sliding_window": {
        "importance": "gaussian_filter",
        "accumulate": "logits",
        "pad": "centre_zero",
    },
}
CASES: dict[str, tuple[dict[str, Any], tuple[int, int, int], tuple[float, float, float]]] = {
    "default_resampled": ({"spacing": (1.5, 1.2, 1.2)}, (60, 24, 20), (1.0, 0.9, 0.9)),
    "default_batch_of_8": (
        {"spacing": (1.0, 1.0, 1.0), "batch_size": 8},
        (70, 16, 16),
        (1.0, 1.0, 1.0),
    ),
    "overlap_075": ({"spacing": (1.0, 1.0, 1.0), "overlap": 0.75}, (50, 20, 20), (1.0, 1.0, 1.0)),
    "monai_ras": ({"spacing": (1.2, 1.2, 1.6), **MONAI}, (48, 20, 24), (2.0, 0.9, 1.1)),
    "nnunet_separate_z": ({"spacing": (1.0, 0.8, 0.8), **NNUNET}, (40, 18, 18), (3.5, 0.8, 0.8)),
    "shorter_than_patch": ({"spacing": (1.0, 1.0, 1.0)}, (5, 20, 20), (1.0, 1.0, 1.0)),
}


def _case(tmp_path: Path, case: str, *, seed: int) -> tuple[Any, ModelSession, Volume]:
    """A 3-class 3D conv model (random kernel from ``seed``) with ``case``'s model.yaml
    fields, its CPU session, and ``case``'s CT."""
    fields, shape, spacing = CASES[case]
    kernel = np.random.default_rng(seed).normal(size=(3, 1, 3, 3, 3)).astype(np.float32)
    path = conv_model(tmp_path / "m.onnx", kernel, np.array([0.0, 0.2, -0.1], np.float32))
    spec = model_spec(
        mode="3d",
        labels=2,
        patch_size=(8, 8, 8),
        normalisation={"kind": "ct_window", "center": 0.0, "width": 800.0},
        **fields,
    )
    return spec, ModelSession(path, spec, runtime=CPU), _ct(shape, spacing)


@pytest.mark.parametrize("case", list(CASES))
def test_rolling_window_equals_whole_volume(tmp_path: Path, case: str) -> None:
    spec, session, volume = _case(tmp_path, case, seed=2)
    rolling = PatchTask(volume, spec, crop_to_body=False)
    whole = WholeVolume(volume, spec, crop_to_body=False)
    got, want = run_task(rolling, session), run_task(whole, session)
    assert 0.05 < (want.labels.array > 0).mean() < 0.95
    np.testing.assert_array_equal(got.labels.array, want.labels.array)
    np.testing.assert_array_equal(got.confidence.array, want.confidence.array)
    grid_rows = whole._grid[0]
    if grid_rows > 3 * spec.input.patch_size[0]:  # a long volume: a window, not the grid
        assert rolling._peak_rows < grid_rows / 2, (rolling._peak_rows, grid_rows)


@pytest.mark.parametrize("case", ["default_resampled", "monai_ras", "nnunet_separate_z"])
def test_slabs_mapped_back_on_several_threads_equal_one_thread(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside a GPU the merge is the critical path: its slabs (disjoint native slices,
    read-only final model slices) and each class's sums go to ``merge_threads`` threads,
    with the same result."""
    import radserve.host as host

    pooled: dict[str, list[int]] = {}  # per pool: the items handed to it at once

    class Recording(host.ThreadPoolExecutor):
        def map(self, fn, *iterables, **kwargs):  # type: ignore[no-untyped-def, override]
            items = list(iterables[0])
            pooled.setdefault(self._thread_name_prefix, []).append(len(items))
            return super().map(fn, items, **kwargs)

    monkeypatch.setattr(host, "ThreadPoolExecutor", Recording)
    spec, session, volume = _case(tmp_path, case, seed=3)
    budget = 60_000  # a few native slices a slab: many slabs per drain
    one = PatchTask(volume, spec, crop_to_body=False, memory_budget_bytes=budget)
    three = PatchTask(volume, spec, crop_to_body=False, memory_budget_bytes=budget, merge_threads=3)
    want = run_task(one, session)
    assert pooled == {}  # one thread: no pool
    got = run_task(three, session)
    assert max(pooled["radserve-patch-merge"]) > 1  # slabs mapped back side by side
    assert set(pooled["radserve-patch-sum"]) == {3 + 1}  # each class's sums, the weights'
    assert 0.05 < (want.labels.array > 0).mean() < 0.95
    np.testing.assert_array_equal(got.labels.array, want.labels.array)
    np.testing.assert_array_equal(got.confidence.array, want.confidence.array)
