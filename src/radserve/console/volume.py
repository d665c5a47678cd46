"""A job's analysed series (a CT, an MR, a PET) as one NIfTI volume on the grid of its
label maps, for the viewer.

The series the job read (the report's ``series_instance_uid``) is loaded with the same
ingest policy as the job and written with the volume's affine, exactly as the label maps
are (``radserve.report.nifti``), so they overlay voxel for voxel: a CT as int16 HU, any
other series as int16 only where its values are integers int16 holds, else float32 (a
PET in Bq/ml reaches tens of thousands, one in SUV is fractional; int16 clipped the one
and rounded the other to a few grey levels). The
file is kept under ``<data_dir>/console/volumes`` (the study itself is on the same disk)
and made once per job; a NIfTI upload is served as it was stored.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from radserve.ingest import IngestPolicy, discover_series, load_series
from radserve.report.nifti import write_nifti
from radserve.report.schema import Report
from radserve.service.errors import OutputNotFoundError, SourceRemovedError
from radserve.service.sniff import input_kind
from radserve.store import JobRecord

_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


def _lock_for(job_id: str) -> threading.Lock:
    with _guard:
        if len(_locks) > 1000:
            _locks.clear()
        return _locks.setdefault(job_id, threading.Lock())


def viewer_array(array: np.ndarray, modality: str) -> np.ndarray:
    """int16 for a CT (whole HU are all a reader tells apart) and for other values that
    are integers within int16; float32 otherwise, so nothing is clipped or rounded."""
    rounded = np.rint(array)
    if modality.upper() == "CT":
        return np.clip(rounded, -32768, 32767).astype(np.int16)
    fits = rounded.size == 0 or (rounded.min() >= -32768 and rounded.max() <= 32767)
    if fits and np.array_equal(rounded, array):
        return rounded.astype(np.int16)
    return array.astype(np.float32)


def ct_volume(record: JobRecord, report: Report, data_dir: Path, policy: IngestPolicy) -> Path:
    """The NIfTI file of the job's CT (made on first use), read under ``policy`` (the
    server's configured ingest bounds) from discovery to pixels."""
    study = Path(record.study_path)
    if not study.is_dir():
        # removed by the retention sweep (which removes this cached volume with it):
        # before, listing the missing folder was a 500
        raise SourceRemovedError(
            f"job {record.id}: the study's source images are no longer stored "
            "(storage.source_retention_days); the viewer shows them from there"
        )
    if input_kind(study) == "nifti":
        return next(p for p in study.iterdir() if p.is_file())
    folder = Path(data_dir) / "console" / "volumes"
    path = folder / f"{record.id}.nii.gz"
    with _lock_for(record.id):
        if path.is_file():
            return path
        wanted = report.study.series_instance_uid
        found = discover_series(study, policy=policy)
        headers = [h for h in found if h.series_instance_uid == wanted]
        if not headers:
            raise OutputNotFoundError(f"job {record.id}: its series is no longer stored")
        slices = report.geometry.shape[0]
        headers.sort(key=lambda h: len(h.frames) != slices)  # the part the job read first
        loaded = load_series(headers[0], policy)
        volume = loaded.volume
        array = viewer_array(volume.array, loaded.header.modality)
        folder.mkdir(parents=True, exist_ok=True)
        # whole or absent under its name (radserve.durable, inside write_nifti)
        write_nifti(volume.with_array(array), path)
    return path


__all__ = ["ct_volume", "viewer_array"]
