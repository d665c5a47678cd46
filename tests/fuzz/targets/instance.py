"""Target (a): one DICOM instance's bytes through what each door does per instance.

- STOW-RS: :func:`~radserve.gateway.dicomweb.stow.check_part` (bounded header read, the
  UID rules of :mod:`radserve.ingest.rules`, SOP class, transfer syntax, completeness),
  which must answer every part with an outcome and never raise;
- C-STORE: the SCP's header read of the spooled file, its UID checks and the own-result
  check (:meth:`GatewaySCP._store` before the instance is filed) and the failure SR a
  job of that instance would send (:func:`build_failure_sr`: an SR or ``ReportError``);
- the upload form: the sniffer, the own-result filter of the upload, then ingest's
  per-file read (:func:`~radserve.ingest.headers.read_stream`) that the job's discovery
  makes of every stored file (a file it cannot use is skipped with a reason)."""

from __future__ import annotations

import datetime
import io
import tempfile
from pathlib import Path

from radserve.errors import ReportError
from radserve.gateway.dicomweb.stow import DICOM_MEDIA, StowPart, check_part
from radserve.gateway.own_results import OwnResults
from radserve.gateway.scp import instance_uids
from radserve.ingest.headers import SkipFile, read_header, read_stream
from radserve.ingest.policy import IngestPolicy
from radserve.ingest.sources import SourceFile
from radserve.report.dicom.failure import build_failure_sr
from radserve.service.own_uploads import without_own_results
from radserve.service.sniff import sniff
from tests.fuzz.invariant import refusals_only
from tests.fuzz.targets import _phantom

COVERED = (
    "radserve.ingest",
    "radserve.gateway",
    "radserve.service.own_uploads",
    "radserve.service.sniff",
    "radserve.report.dicom.failure",
    *_phantom.PARSER,
)
# the server's defaults, but a small file and header bound: a fuzzed length field then
# meets the limit in microseconds instead of reading megabytes
POLICY = IngestPolicy(max_file_bytes=8 << 20, max_header_bytes=1 << 20)
_WHEN = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
_SPOOL = Path(tempfile.mkdtemp(prefix="radserve-fuzz-")) / "received.dcm"


def seeds() -> list[bytes]:
    return list(_phantom.instances())


def one_input(data: bytes) -> None:
    stream = io.BytesIO(data)
    outcome = check_part(1, StowPart(DICOM_MEDIA, stream), None, policy=POLICY)
    if not outcome.stored and not outcome.reason:
        raise AssertionError(f"STOW part refused ({outcome.failure}) without a reason")
    _cstore(data)
    with refusals_only():
        kind = sniff(stream, 1, 1)
        with without_own_results([stream], [kind], OwnResults()):
            pass
    with refusals_only(SkipFile):
        record = read_stream(stream, len(data), SourceFile(Path("fuzz.dcm")), POLICY)
        for frame in record.frames:
            if frame.problem is not None and not frame.problem.text:
                raise AssertionError(f"problem {frame.problem.code} without a text")


def _cstore(data: bytes) -> None:
    """What :meth:`GatewaySCP._store` does with the file pynetdicom spooled."""
    _SPOOL.write_bytes(data)
    dataset = None
    with refusals_only():
        dataset = read_header(_SPOOL, max_header_bytes=POLICY.max_header_bytes)
        OwnResults(known=lambda uid: False).check(dataset, "C-STORE")
        instance_uids(dataset, "1.2.3", image=True)
    if dataset is None:  # the header read refused the file
        return
    with refusals_only(ReportError):
        build_failure_sr([dataset], job_id="fuzz", error_code="E", reason="r", when=_WHEN)
