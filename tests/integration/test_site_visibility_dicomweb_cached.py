"""Under ``security.visibility: site`` a study site B stored over STOW-RS that site A's job
had analysed was answered from A's cached result (until session 37; since, it runs again),
and its SEG/SR made for B's route (:mod:`radserve.service.cached`) -- but indexed under
A's job, the one that made them. WADO-RS and QIDO-RS checked the visibility of that job
alone, so B's own DICOMweb client got 404 for its own study's results and an empty
search. B now reads them through its own job (and the read is audited against it); a
site that has no job answered from that result still sees nothing."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pydicom
import pytest
from tests.factories.service import ServerThread, auth, make_study, settings_for, wait_job
from tests.factories.waits import WAIT_SCALE

from radserve.api import create_app
from radserve.gateway.dicomweb.stow import StowPart
from radserve.service import Origin, Service
from radserve.service.intake import DICOMWEB_SOURCE

pytestmark = pytest.mark.slow

SEG = "1.2.840.10008.5.1.4.1.1.66.4"
DICOM_JSON = {"Accept": "application/dicom+json"}


def _stow(client: httpx.Client, files: list[Path], token: str) -> httpx.Response:
    boundary = f"b-{uuid.uuid4().hex}"
    body = b""
    for path in files:
        body += f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode()
        body += path.read_bytes() + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    media = f'multipart/related; type="application/dicom"; boundary={boundary}'
    return client.post(
        "/dicomweb/studies", content=body, headers={"Content-Type": media, **auth(token)}
    )


def _job_of(response: httpx.Response) -> str:
    link = response.headers["link"]
    return link[len("</v1/jobs/") : -len('>; rel="related"')]


def _stored_before_session_37(service: Service, key_id: str, files: list[Path]) -> str:
    """A STOW-RS of ``files`` by ``key_id`` as it was answered before session 37: from
    whatever result the cache holds (``Origin.sees`` unset)."""
    streams = [path.open("rb") for path in files]
    try:
        stored = service.stow.store(
            [StowPart("application/dicom", stream) for stream in streams],
            target_study=None,
            resolved=service.intake.precheck(None, None),
            priority=None,
            origin=Origin(key_id, "127.0.0.1", source=DICOMWEB_SOURCE),
        )
    finally:
        for stream in streams:
            stream.close()
    (submission,) = stored.jobs
    assert submission.cached
    return submission.job.id


def test_a_site_reads_the_dicom_results_of_its_cached_study_through_its_own_job(
    tmp_path: Path,
) -> None:
    service = Service(settings_for(tmp_path, security__visibility="site"))

    def key(role: str, site: str) -> str:
        return service.store.create_api_key(name=f"{role} {site}", role=role, site=site)[1]

    submit_a, submit_b, read_b, read_c = (
        key("submit", "A"),
        key("submit", "B"),
        key("read", "B"),
        key("read", "C"),
    )
    b_key_id = submit_b.split("_")[1]
    files = make_study(tmp_path / "study")
    study = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert service.wait_warm(60 * WAIT_SCALE)
        first = _stow(c, files, submit_a)
        assert first.status_code == 200, first.text
        a1 = _job_of(first)
        assert wait_job(c, a1, submit_a)["state"] == "succeeded"
        # since session 37 B's STOW of A's study runs again, not from A's result
        run = _stow(c, files, submit_b)
        assert run.status_code == 200, run.text
        ran = wait_job(c, _job_of(run), submit_b)
        assert ran["state"] == "succeeded" and ran["cached"] is False

        # B's job as a STOW was answered before session 37: from A's cached result
        b1 = _stored_before_session_37(service, b_key_id, files)
        job = wait_job(c, b1, submit_b)
        assert job["state"] == "succeeded" and job["cached"] is True

        since = service.store.audit_head()[0]
        metadata = c.get(
            f"/dicomweb/studies/{study}/metadata", headers={**auth(read_b), **DICOM_JSON}
        )
        assert metadata.status_code == 200, metadata.text
        classes = {str(pydicom.Dataset.from_json(d).SOPClassUID) for d in metadata.json()}
        assert SEG in classes
        retrieved = c.get(f"/dicomweb/studies/{study}", headers=auth(read_b))
        assert retrieved.status_code == 200
        found = c.get("/dicomweb/studies", headers={**auth(read_b), **DICOM_JSON})
        assert [s["0020000D"]["Value"][0] for s in found.json()] == [study]
        reads = [r for r in service.store.iter_audit(after=since) if r.action == "phi.read"]
        # each read audited against B's own jobs (the kept one and the one that ran since),
        # never A's (B may not see it)
        assert reads and {r.subject for r in reads} == {b1, ran["id"]}
        assert a1 not in metadata.text + found.text

        # a site with no job answered from that result sees nothing of it
        metadata_c = c.get(
            f"/dicomweb/studies/{study}/metadata", headers={**auth(read_c), **DICOM_JSON}
        )
        assert metadata_c.status_code == 404
        assert c.get(f"/dicomweb/studies/{study}", headers=auth(read_c)).status_code == 404
        nothing = c.get("/dicomweb/studies", headers={**auth(read_c), **DICOM_JSON})
        assert nothing.status_code == 200 and nothing.json() == []


def test_a_second_sites_results_in_a_study_leave_the_first_sites_retrieve_its_own(
    tmp_path: Path,
) -> None:
    """A user trial (session 42): once site B had sent the same study (its own job, its
    own results), a study-level WADO-RS retrieve or metadata request by site A's reader
    answered 404 (one job behind the study's results it could not see failed the whole
    request), while QIDO-RS still listed the study: a denial of A's retrieve by any other
    sender, and an oracle for "another site has results for this study". Each reader now
    gets its own site's instances, never the other's."""
    service = Service(settings_for(tmp_path, security__visibility="site"))

    def key(role: str, site: str) -> str:
        return service.store.create_api_key(name=f"{role} {site}", role=role, site=site)[1]

    submit_a, submit_b, read_a, read_b = (
        key("submit", "A"),
        key("submit", "B"),
        key("read", "A"),
        key("read", "B"),
    )
    files = make_study(tmp_path / "study")
    study = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert service.wait_warm(60 * WAIT_SCALE)
        jobs = {}
        for site, token in (("A", submit_a), ("B", submit_b)):
            stored = _stow(c, files, token)
            assert stored.status_code == 200, stored.text
            jobs[site] = _job_of(stored)
            assert wait_job(c, jobs[site], token)["state"] == "succeeded"
        for site, reader in (("A", read_a), ("B", read_b)):
            own = {
                r.sop_instance_uid for r in service.results.find(study) if r.job_id == jobs[site]
            }
            assert own, site
            metadata = c.get(
                f"/dicomweb/studies/{study}/metadata", headers={**auth(reader), **DICOM_JSON}
            )
            assert metadata.status_code == 200, (site, metadata.text)
            shown = {str(pydicom.Dataset.from_json(d).SOPInstanceUID) for d in metadata.json()}
            assert shown == own, site
            retrieved = c.get(f"/dicomweb/studies/{study}", headers=auth(reader))
            assert retrieved.status_code == 200, site
            parts = retrieved.content.count(b"Content-Type: application/dicom")
            assert parts == len(own), site  # one part per instance of its own
