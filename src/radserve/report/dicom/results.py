"""All DICOM results of one report folder: a SEG per label map, then the SR.

Two SEGs rather than one: the organ and findings label maps come from different models
and overlap (lesions lie in organs), so each map stays one non-overlapping BINARY SEG
with one model in its Contributing Equipment, built from a label array without a
per-segment stack in memory. Both SEGs share one new series (instances 1 and 2); the SR
is in a second new series (a series holds one modality) and references both.

The files are written in one :func:`radserve.durable.batch`: each is fsynced and renamed
on its own, the folder once at the end (one folder fsync a job instead of one a file).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset
from pydicom.tag import Tag

from radserve import durable
from radserve.checkpoints import checkpoint
from radserve.errors import ReportError
from radserve.heap import release_free_memory
from radserve.ingest.policy import IngestPolicy
from radserve.report.dicom import common
from radserve.report.dicom.frames import SliceSources
from radserve.report.dicom.sc import write_key_image_scs
from radserve.report.dicom.seg import build_seg
from radserve.report.dicom.sr import build_sr
from radserve.report.nifti import read_nifti
from radserve.report.schema import Report

logger = logging.getLogger(__name__)

SEG_FILE = "{name}-seg.dcm"  # name: the label map's file stem (organs, findings, ...)
SR_FILE = "measurements-sr.dcm"
PIXEL_DATA = Tag("PixelData")


def write_dicom_results(
    report: Report,
    result_dir: Path,
    source_files: Sequence[Path],
    *,
    key_images: bool = False,
    policy: IngestPolicy | None = None,
) -> list[Path]:
    """Write one ``<label map>-seg.dcm`` per label map (``organs-seg.dcm``,
    ``findings-seg.dcm`` for the reference pipeline) and ``measurements-sr.dcm``, and
    with ``key_images`` one ``keyimage-NN-sc.dcm`` Secondary Capture per key image.

    The files go next to ``report.json`` in ``result_dir``; label maps are read from the
    paths the report names. A label map with no voxel of a described segment (no
    findings) gets no SEG. Returns the written paths, SEGs first.
    """
    result_dir = Path(result_dir)
    sources = common.slice_sources(report, common.read_headers(source_files, policy))
    with durable.batch():  # the folder fsynced once, before this returns
        return _write_all(report, result_dir, sources, key_images=key_images)


def _write_all(
    report: Report, result_dir: Path, sources: SliceSources, *, key_images: bool
) -> list[Path]:
    series_uid = common.report_uid(report, "seg-series")
    written: list[Path] = []
    segs: list[Dataset] = []
    for label_map in report.outputs.label_maps:
        checkpoint()  # a routine study's DICOM results let URGENT work pass, object by object
        path = result_dir / label_map.path
        if not path.is_file():
            raise ReportError(f"label map {label_map.path} named by the report is missing")
        name = Path(label_map.path).name.removesuffix(".gz").removesuffix(".nii")
        described = [s.value for s in label_map.segments]
        # Read only a map with described segments, checked slice by slice: a
        # full-volume temporary here set radserve run's peak (issue 19, goal 4).
        labels = read_nifti(path) if described else None
        if labels is None or not any(np.isin(plane, described).any() for plane in labels.array):
            logger.info("no SEG for the %s label map: no segment has voxels", label_map.kind)
            continue
        seg = build_seg(
            report,
            labels,
            label_map.segments,
            sources,
            series_instance_uid=series_uid,
            instance_number=len(segs) + 1,
            name=name,
            renumber_in_place=True,  # read for this SEG alone
        )
        del labels  # not held while the next map is read
        written.append(common.save_atomic(seg, result_dir / SEG_FILE.format(name=name)))
        segs.append(sr_reference(seg))
        del seg  # written: its frames and highdicom's tables not held while the next is built
        release_free_memory()  # else the next map is read on top of this build's freed heap
    checkpoint()
    sr = build_sr(report, segs, sources)
    written.append(common.save_atomic(sr, result_dir / SR_FILE))
    logger.info("DICOM results written: %d SEG, 1 SR", len(segs))
    if key_images:
        written += write_key_image_scs(report, result_dir, sources)
    return written


def sr_reference(seg: Dataset) -> Dataset:
    """What the SR needs of a written SEG (its UIDs, segments and per-frame source
    references): every attribute but the Pixel Data, in a plain :class:`Dataset`. The
    highdicom ``Segmentation`` itself also holds its frames and frame look-up tables,
    which kept each SEG's memory until the SR was built."""
    header = Dataset()
    for element in seg:
        if element.tag != PIXEL_DATA:
            header.add(element)
    return header
