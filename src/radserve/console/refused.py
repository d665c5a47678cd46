"""The series of a failed job's study that its pipeline refused, for the job page.

A job fails (``study_invalid``, ``unsupported_modality``) when no series of its study
meets the pipeline's selection rules: it has no report, so no ``series_selection``, and
its error names the series in one line of text. The page lists them as it lists a
succeeded job's refused series: the stored study's headers are read again (no pixel
data, under the server's ingest bounds) and judged by the same rules
(:func:`radserve.pipeline.selection.refusals`, the series' plane included), as long as
the pipeline is still the version the job ran (else nothing is listed: today's rules
need not be the job's).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from radserve.errors import RadserveError, StudyError, UnsupportedModalityError
from radserve.ingest import IngestPolicy, discover_series
from radserve.pipeline.selection import SlicePlanes, refusals
from radserve.preprocess.axes import OrientationError
from radserve.report.schema import SeriesRef
from radserve.service.catalog import Catalog
from radserve.store import JobRecord, JobState

logger = logging.getLogger(__name__)

# the codes select_series fails with, and the code of a study whose every series lies
# in another plane than a slice model reads (refused before any series is loaded)
SELECTION_CODES = frozenset({StudyError.code, UnsupportedModalityError.code, OrientationError.code})

# The selection rule on the Series Description quotes the description it refused
# (radserve.pipeline.selection.rejection_reason: "series description 'SMITH^JOHN chest'
# does not match '^AXIAL'"), in the report's rejected series and in a failed job's error:
# free text a technologist typed, which may name the patient, shown to every console
# role. The quoted description (Python's repr: '...' or "...", escapes inside) is left out.
_DESCRIPTION = re.compile(
    r"""series description (?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*") does not"""
)
_WITHOUT = "series description does not"


def without_descriptions(text: str) -> str:
    """``text`` (a refusal reason, a job's error message) with every quoted Series
    Description left out."""
    return _DESCRIPTION.sub(_WITHOUT, text)


def report_without_descriptions(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` (parsed JSON) with the rejected series' reasons as
    :func:`without_descriptions` gives them."""
    selection = report.get("series_selection")
    if not isinstance(selection, dict):
        return report
    refs = [selection.get("selected"), *(selection.get("rejected") or [])]
    for ref in refs:
        if isinstance(ref, dict) and isinstance(ref.get("reason"), str):
            ref["reason"] = without_descriptions(ref["reason"])
    return report


def refused_series(record: JobRecord, catalog: Catalog, policy: IngestPolicy) -> list[SeriesRef]:
    """Every series of ``record``'s study with the rule it broke, when the job failed
    because its pipeline refused them all; else none."""
    if record.state is not JobState.FAILED or record.error_code not in SELECTION_CODES:
        return []
    try:
        spec = catalog.resolve(record.pipeline_name).spec
        if spec.version != record.pipeline_version:
            return []
        headers = discover_series(Path(record.study_path), policy=policy)
        planes = SlicePlanes.of_pipeline(spec, catalog.registry)
    except RadserveError as exc:  # the pipeline or the study is gone, or not DICOM
        logger.info("job %s: its refused series cannot be listed (%s)", record.id, exc.code)
        return []
    except OSError as exc:
        logger.info("job %s: its study cannot be read (%s)", record.id, exc.strerror)
        return []
    found = refusals(headers, spec.series_selection, planes, policy)
    return [
        s.model_copy(update={"reason": without_descriptions(s.reason)}) if s.reason else s
        for s in found
    ]
