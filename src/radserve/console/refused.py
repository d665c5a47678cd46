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
from pathlib import Path

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
    return refusals(headers, spec.series_selection, planes, policy)
