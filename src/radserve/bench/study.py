"""The benchmark's input: one 512x512x300 phantom CT study, written once per syntax."""

from __future__ import annotations

from pathlib import Path

from radserve.bench import PIPELINE
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.pipeline.spec import load_pipeline

BENCH_SEED = 42  # held out from training (training seeds are >= 1000)


def bench_spec(n_slices: int = 300, seed: int = BENCH_SEED) -> PhantomSpec:
    """The seed's patient at 512x512 with exactly ``n_slices`` over the same coverage, or
    over less where that would space them wider than the benchmarked pipeline selects
    (a 60-slice study over 400 mm would have 6.7 mm slices, which it refuses)."""
    spec = PhantomSpec.random(seed)
    coverage = spec.n_slices * spec.slice_spacing_mm
    spacing = coverage / n_slices
    widest = load_pipeline(PIPELINE).series_selection.max_slice_thickness_mm
    if widest is not None:
        spacing = min(spacing, widest)
    return spec.with_slices(n_slices, round(spacing, 3))


def ensure_study(cache_dir: Path, transfer_syntax: str, n_slices: int = 300) -> Path:
    """Write (once) and return the study folder for ``transfer_syntax``."""
    folder = Path(cache_dir) / f"bench-{n_slices}-{transfer_syntax}"
    marker = folder / ".complete"
    if not marker.exists():
        phantom = generate_phantom(bench_spec(n_slices))
        write_dicom_series(phantom, folder, transfer_syntax=transfer_syntax)
        marker.write_text("ok\n")
    return folder
