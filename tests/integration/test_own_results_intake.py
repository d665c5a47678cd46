"""radserve's own results (SEG, SR, Secondary Capture key images) sent back to it over
STOW-RS or the REST upload (files or a zip) are acknowledged and never become input: a
study sent again with them is the same study (its result answers), and an upload of
only results is refused with a clear error. Real server (uvicorn on loopback, httpx)."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydicom
import pytest
from tests.factories.dicomweb import REFERENCED, SOP_INSTANCE, dicom_parts, stow
from tests.factories.service import (
    auth,
    live_server,
    make_study,
    settings_for,
    upload,
    wait_job,
)

from radserve.gateway.own_results import own_result_reason

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("own-results")
    with live_server(settings_for(root, results__secondary_capture_key_images=True)) as live:
        yield live


@pytest.fixture(scope="module")
def first_run(server: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A study stored over STOW-RS and its job's DICOM results (SEG, SR, SC)."""
    files = make_study(tmp_path_factory.mktemp("study"))
    response = stow(server, dicom_parts(files))
    assert response.status_code == 200, response.text
    job_id = response.headers["link"].split("/v1/jobs/")[1].split(">")[0]
    job = wait_job(server["client"], job_id, server["read"])
    assert job["state"] == "succeeded", job
    record = server["service"].store.get_job(job_id)
    results = sorted(Path(str(record.result_path)).glob("*.dcm"))
    kinds = {str(pydicom.dcmread(p, stop_before_pixels=True).Modality) for p in results}
    assert {"SEG", "SR"} <= kinds and len(results) >= 4, kinds  # key images too
    return {"files": files, "results": results, "job": job_id}


def _jobs(server: dict[str, Any]) -> int:
    return len(server["service"].store.list_jobs(limit=100).items)


def _indexed(server: dict[str, Any]) -> int:
    with server["service"].store.engine.connect() as connection:
        return int(connection.exec_driver_sql("SELECT count(*) FROM result_instances").scalar())


def test_results_are_recognised_by_header_and_by_the_result_index(
    server: dict[str, Any], first_run: dict[str, Any]
) -> None:
    for path in first_run["results"]:
        header = pydicom.dcmread(path, stop_before_pixels=True)
        assert own_result_reason(header) is not None, path.name  # Manufacturer/equipment
        header.Manufacturer = "OTHER"
        del header.ContributingEquipmentSequence
        assert own_result_reason(header) is None
        known = server["service"].results.contains
        assert own_result_reason(header, known) == "in the result index"
    for path in first_run["files"]:  # source images, made by the phantom writer
        assert own_result_reason(pydicom.dcmread(path, stop_before_pixels=True)) is None


def test_stow_of_study_and_results_is_answered_by_the_first_result(
    server: dict[str, Any], first_run: dict[str, Any]
) -> None:
    jobs, indexed = _jobs(server), _indexed(server)
    everything = [*first_run["files"], *first_run["results"]]
    response = stow(server, dicom_parts(everything))
    assert response.status_code == 200, response.text  # all acknowledged, SEG/SR too
    stored = [i[SOP_INSTANCE]["Value"][0] for i in response.json()[REFERENCED]["Value"]]
    uids = [str(pydicom.dcmread(p, stop_before_pixels=True).SOPInstanceUID) for p in everything]
    assert sorted(stored) == sorted(uids)
    job_id = response.headers["link"].split("/v1/jobs/")[1].split(">")[0]
    job = server["client"].get(f"/v1/jobs/{job_id}", headers=auth(server["read"])).json()
    assert job["cached"] and job["cached_from"] == first_run["job"]  # nothing ran
    assert _jobs(server) == jobs + 1 and _indexed(server) == indexed  # no new results

    only_results = stow(server, dicom_parts(first_run["results"]))
    assert only_results.status_code == 200, only_results.text
    assert "link" not in only_results.headers  # no job at all
    assert _jobs(server) == jobs + 1


def test_upload_with_results_is_the_same_study_and_results_alone_are_refused(
    server: dict[str, Any], first_run: dict[str, Any]
) -> None:
    client, submit = server["client"], auth(server["submit"])
    metric_before = _ignored(server, "upload")
    mixed = client.post(
        "/v1/studies", files=upload([*first_run["files"], *first_run["results"]]), headers=submit
    )
    assert mixed.status_code == 200 and mixed.json()["cached_from"] == first_run["job"]

    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        for n, path in enumerate([*first_run["results"], *first_run["files"]]):
            zf.write(path, f"IM{n:04d}")  # PACS export names: no suffix
    zipped = client.post(
        "/v1/studies",
        files=[("files", ("export.zip", archive.getvalue(), "application/zip"))],
        headers=submit,
    )
    assert zipped.status_code == 200 and zipped.json()["cached_from"] == first_run["job"]

    alone = client.post("/v1/studies", files=upload(first_run["results"]), headers=submit)
    assert alone.status_code == 422
    assert alone.json()["error"]["code"] == "own_results_only"
    assert _ignored(server, "upload") - metric_before == 3 * len(first_run["results"])


def _ignored(server: dict[str, Any], intake: str) -> float:
    value = server["service"].metrics.registry.get_sample_value(
        "radserve_own_results_ignored_total", {"intake": intake}
    )
    return value or 0.0
