"""What an API reader process leaves unimported (issue 19, goal 4): each reader is a
spawned interpreter that answers two reads (job status, report JSON), and every module it
loads stays resident in every reader. It used to import the app factory (every router)
and, through the job reads, the report writers, the ingest code and the inference
runtime: ~115 MiB of its ~188 MiB it never ran (docs/scaling.md). Checked in fresh
interpreters, with the snapshot a reader unpickles and what ``serve_reader`` imports."""

from __future__ import annotations

import datetime as dt
import pickle

from tests.factories.imports import loaded_after

from radserve.domain.jobs import JobState
from radserve.domain.priority import PriorityClass
from radserve.service.job_view import JobEta, JobView
from radserve.store import JobRecord

T0 = dt.datetime(2026, 12, 3, 3, 0, tzinfo=dt.UTC)

# what only the serving process runs: inference, DICOM/NIfTI reading and writing, FHIR,
# the scheduler's and the service's own modules, every other router
NOT_IN_A_READER = (
    "onnxruntime",
    "highdicom",
    "scipy",
    "nibabel",
    "radserve.inference",
    "radserve.ingest",
    "radserve.report",
    "radserve.pipeline",
    "radserve.service.service",
    "radserve.service.turnaround",
    "radserve.api.app",
    "radserve.api.routes.studies",
)

# the reader module and what serve_reader imports when the process starts
READER_MODULES = (
    "radserve.api.reader",
    "radserve.api.audit_writer",
    "radserve.api.http_limits",
    "radserve.api.proxy",
    "radserve.service.logs",
    "radserve.store.audited",
    "radserve.tls",
)


def _loaded(*modules: str) -> list[str]:
    record = JobRecord(
        "job-1", JobState.RUNNING, PriorityClass.URGENT, T0, T0, "ct", "1", "fp32", "f", "/nowhere"
    )
    view = JobView(record, None, JobEta(T0, T0, T0, 3, False, T0, "prior"))
    # then the reader unpickles a published snapshot entry, as it does for every read
    then = (
        "import pickle\n"
        f"view = pickle.loads({pickle.dumps(view)!r})\n"
        "assert view.eta.order_position == 3, view\n"
    )
    return loaded_after(NOT_IN_A_READER, modules, then)


def test_a_reader_process_loads_no_inference_report_or_ingest_code() -> None:
    assert _loaded(*READER_MODULES) == []


def test_the_probe_sees_what_the_serving_process_loads() -> None:
    """The check above can fail: the serving process's app does load them."""
    loaded = _loaded("radserve.api.app")
    assert {"onnxruntime", "highdicom", "radserve.service.service"} <= set(loaded)
