"""A study run through the test pipeline (tiny threshold bundles, :mod:`.bundles`), so
the report, label maps and source files the result writers read are the real thing.

:func:`lesion_study` is a small CT series with a 'liver' block and two 'lesions' at known
places (:func:`enhanced_lesion_study`: the same as one Enhanced CT instance);
:func:`run_test_pipeline` runs whatever study lies in ``root/study``;
:func:`relabel` copies source files under another patient name or character set.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pydicom
from pydicom.uid import generate_uid

from radserve.domain import Volume
from radserve.models.registry import ModelRegistry
from radserve.pipeline.spec import load_pipeline
from radserve.pipeline.study import StudyResult, run_study
from radserve.report.nifti import read_nifti
from radserve.report.schema import LabelMapOutput, Report
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_series import make_ct_series, make_enhanced_series

LESIONS = (((6.0, -4.0, 21.0), 6.0), ((-12.0, 10.0, 10.0), 4.0))  # LPS centre, radius mm


def lesions_hu(points: np.ndarray) -> np.ndarray:
    """A 100 HU block (50 x 50 x 80 mm around (0, 0, 21)) in air, :data:`LESIONS` at 700 HU."""
    block = (np.abs(points - np.array([0.0, 0.0, 21.0])) < np.array([25.0, 25.0, 40.0])).all(-1)
    hu = np.where(block, 100.0, -1000.0)
    for centre, radius in LESIONS:
        hu = np.where(np.linalg.norm(points - np.array(centre), axis=-1) <= radius, 700.0, hu)
    return hu


def run_test_pipeline(
    root: Path, *, key_images: bool = False, **bundle_options: float
) -> StudyResult:
    """Run ``root/study`` through the test pipeline and bundles (written under ``root``,
    ``bundle_options`` as for :func:`write_test_bundles`); results in ``root/out``."""
    return run_study(
        root / "study",
        pipeline=load_pipeline(write_test_pipeline(root)),
        out_dir=root / "out",
        registry=ModelRegistry(write_test_bundles(root / "models", **bundle_options)),
        key_images=key_images,
    )


@dataclass(frozen=True)
class LesionStudy:
    """What :func:`lesion_study` made: the report, its output folder and the source files."""

    report: Report
    out: Path
    files: list[Path]

    def label_map(self, kind: str) -> tuple[LabelMapOutput, Volume]:
        """The report's label map of ``kind`` ("organs", "findings") and its volume."""
        output = next(m for m in self.report.outputs.label_maps if m.kind == kind)
        return output, read_nifti(self.out / output.path)


LESION_GRID = {"rows": 64, "cols": 64, "spacing": (1.5, 1.0, 1.0), "origin": (-31.5, -31.5, -0.75)}
LESION_SLICES = 30


def lesion_study(root: Path) -> LesionStudy:
    """30 slices of 64 x 64 (1.5 x 1 x 1 mm) with :func:`lesions_hu` in ``root/study``, run
    through the test pipeline; the threshold models find the two lesions.

    Built once per test session and copied into ``root`` (``study/``, ``out/`` and the
    report): each caller has folders of its own to write its results into, with the same
    voxels as every other caller's (twelve callers each ran the pipeline before) and
    Study, Series, Frame of Reference and SOP Instance UIDs of its own, in the files and
    the report alike: two calls are two studies, as a reader of a test expects (before
    session 19 every copy had the cache's UIDs; no caller relied on that)."""
    built = _LESION_STUDY.get("built")
    if built is None:
        cache = Path(tempfile.mkdtemp(prefix="radserve-lesion-study-"))
        atexit.register(shutil.rmtree, cache, ignore_errors=True)
        files = make_ct_series(
            cache / "study", n_slices=LESION_SLICES, hu=lesions_hu, **LESION_GRID
        )
        built = _LESION_STUDY["built"] = LesionStudy(
            run_test_pipeline(cache).report, cache / "out", files
        )
    cache = built.out.parent
    for folder in ("study", "out"):
        shutil.copytree(cache / folder, root / folder)
    files = [root / "study" / f.relative_to(cache / "study") for f in built.files]
    renamed = _fresh_uids(files)
    report_json = root / "out" / "report.json"
    report_json.write_text(_renamed_json(report_json.read_text(), renamed))
    report = Report.model_validate_json(_renamed_json(built.report.model_dump_json(), renamed))
    return LesionStudy(report, root / "out", files)


_RENAMED_UIDS = ("StudyInstanceUID", "SeriesInstanceUID", "FrameOfReferenceUID", "SOPInstanceUID")


def _fresh_uids(files: list[Path]) -> dict[str, str]:
    """Give ``files`` new UIDs (one per old UID, so the series stays one series); old -> new."""
    renamed: dict[str, str] = {}
    for path in files:
        ds = pydicom.dcmread(path)
        for keyword in _RENAMED_UIDS:
            if keyword in ds:
                old = str(ds.data_element(keyword).value)
                setattr(ds, keyword, renamed.setdefault(old, generate_uid()))
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        ds.save_as(path)
    return renamed


def _renamed_json(text: str, renamed: dict[str, str]) -> str:
    """``text`` (JSON) with each whole string value that is an old UID replaced."""
    for old, new in renamed.items():
        text = text.replace(f'"{old}"', f'"{new}"')
    return text


_LESION_STUDY: dict[str, LesionStudy] = {}  # "built": the one lesion_study of this session


def enhanced_lesion_study(root: Path, *, key_images: bool = False) -> LesionStudy:
    """:func:`lesion_study`'s series as one Enhanced CT instance whose frames are stored
    shuffled (frame number != slice + 1), run through the test pipeline."""
    path = make_enhanced_series(
        root / "study", n_frames=LESION_SLICES, hu=lesions_hu, frame_order="shuffled", seed=5,
        **LESION_GRID,
    )  # fmt: skip
    result = run_test_pipeline(root, key_images=key_images)
    return LesionStudy(result.report, root / "out", [path])


def relabel(
    files: list[Path],
    folder: Path,
    name: str | bytes,
    *,
    charset: str | list[str] | None = None,
    **extra: object,
) -> list[Path]:
    """Copies of ``files`` in ``folder`` with patient name ``name`` (and, when given,
    Specific Character Set ``charset``, ``""`` to remove it, and other attributes
    ``extra``). A ``bytes`` name is written as these bytes (ISO 2022 escape sequences
    exactly as given; undeclared when ``charset`` is ``""``)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for path in files:
        ds = pydicom.dcmread(path)
        if charset == "":
            del ds.SpecificCharacterSet
        elif charset is not None:
            ds.SpecificCharacterSet = charset
        if isinstance(name, bytes):
            ds.add_new(0x00100010, "PN", name)
        else:
            ds.PatientName = name
        for keyword, value in extra.items():
            setattr(ds, keyword, value)
        ds.save_as(folder / path.name)
        out.append(folder / path.name)
    return out
