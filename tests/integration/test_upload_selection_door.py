"""A REST upload none of whose series the pipeline can use is refused, 422, before a job
exists, naming each series and why in the words its job would have used; the doors
that acknowledge first (C-STORE) keep the job that fails early, in the same words.

Probe (2026-12-07, session notes): a study of only coronal and sagittal series for the
axial test models was answered 202, stored, given a job row and a queue place, and the
job then failed ``orientation_unsupported``; an MR study for a CT pipeline likewise
(``unsupported_modality``). The server held every file before it answered.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydicom
import pytest
from tests.factories.dicom_net import dcmtk_tool, small_study, storescu
from tests.factories.dicom_series import (
    AXIAL,
    CORONAL,
    SAGITTAL,
    make_ct_series,
    new_uid,
    oblique_orientation,
)
from tests.factories.dicomweb import dicom_parts, failures, stow
from tests.factories.service import (
    auth,
    lesion_hu,
    live_server,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE, until

from radserve.errors import StudyError
from radserve.pipeline.inputs import ingest_study
from radserve.pipeline.selection import SlicePlanes
from radserve.service import selection_door
from radserve.service.unclaimed import UNCLAIMED_DIR
from radserve.store.files import STAGING_DIR, STUDIES_DIR

REASON_CODE, REASON_TEXT = "00091001", "00091002"  # radserve's reason in a STOW failed item


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("door")
    settings = settings_for(
        root,
        gateway__enabled=True,
        gateway__port=0,
        gateway__quiet_s=0.5,
        gateway__allowed_peers=[{"ae_title": "STORESCU", "host": "127.0.0.1"}],
    )
    with live_server(settings, roles=("submit", "admin"), console=True) as live:
        yield live


def _series(folder: Path, orientation: tuple[float, ...], number: int, study: str) -> list[Path]:
    return make_ct_series(
        folder, n_slices=12, rows=40, cols=40, spacing=(2.0, 1.0, 1.0),
        origin=(-19.5, -19.5, 0.0), orientation=orientation, hu=lesion_hu(), study_uid=study,
        series_number=number,
    )  # fmt: skip


def _wrong_plane(folder: Path) -> list[Path]:
    study = new_uid()
    return [
        *_series(folder / "coronal", CORONAL, 1, study),
        *_series(folder / "sagittal", SAGITTAL, 2, study),
    ]


def _left(data_dir: Path) -> set[Path]:
    """What a submission may leave in the data folder: study folders, staging folders,
    set-aside markers."""
    return {
        *(data_dir / STUDIES_DIR).glob("*/*"),
        *(data_dir / STAGING_DIR).glob("*"),
        *(data_dir / UNCLAIMED_DIR).glob("*"),
    }


def _jobs(server: dict[str, Any]) -> int:
    return len(server["service"].store.list_jobs(limit=1000).items)


def _job_error(server: dict[str, Any], folder: Path) -> StudyError:
    """What a job of the server's pipeline fails with on the study at ``folder``, as the
    job runs ingest (the server's pipeline, models and ingest policy)."""
    service = server["service"]
    spec = service.catalog.resolve(None).spec
    planes = SlicePlanes.of_pipeline(spec, service.catalog.registry)
    with pytest.raises(StudyError) as failed:
        ingest_study(folder, pipeline=spec, policy=service.intake.policy, planes=planes)
    return failed.value


def test_an_upload_of_only_wrong_plane_series_is_refused_naming_each_and_leaves_nothing(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, key = server["client"], server["submit"]
    files = _wrong_plane(tmp_path / "study")
    data_dir = server["service"].settings.data_dir
    left, jobs = _left(data_dir), _jobs(server)
    r = c.post("/v1/studies", files=upload(files), headers=auth(key))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "orientation_unsupported"
    for number, plane in ((1, "coronal"), (2, "sagittal")):
        expected = f"series {number}: its slices are {plane}, and model organs-test/1.0.0 reads"
        assert expected in error["message"]
    job = _job_error(server, tmp_path / "study")  # the words the job would have used
    assert (error["code"], error["message"]) == (job.code, job.message)
    assert _jobs(server) == jobs  # no job row
    assert _left(data_dir) == left  # no study folder, staging folder or marker


def test_an_upload_no_series_of_which_meets_the_rules_is_refused_with_each_reason(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, key = server["client"], server["submit"]
    study = new_uid()
    short = make_ct_series(tmp_path / "s" / "short", n_slices=2, series_number=2, study_uid=study)
    mr = make_ct_series(
        tmp_path / "s" / "mr", n_slices=6, series_number=3, study_uid=study, modality="MR",
        sop_class_uid=pydicom.uid.MRImageStorage,
    )  # fmt: skip
    jobs = _jobs(server)
    r = c.post("/v1/studies", files=upload([*short, *mr]), headers=auth(key))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "study_invalid"
    assert "series 2: 2 images, fewer than the 3 required" in error["message"]
    assert "series 3: modality MR is not one of ['CT']" in error["message"]
    job = _job_error(server, tmp_path / "s")
    assert (error["code"], error["message"]) == (job.code, job.message)
    # only the MR: unsupported_modality, as the job said it
    r = c.post("/v1/studies", files=upload(mr), headers=auth(key))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "unsupported_modality"
    assert _jobs(server) == jobs


def test_a_study_with_one_series_the_models_read_is_accepted_and_runs(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, key = server["client"], server["submit"]
    study = new_uid()
    coronal = _series(tmp_path / "coronal", CORONAL, 1, study)
    axial = _series(tmp_path / "axial", AXIAL, 2, study)
    r = c.post("/v1/studies", files=upload([*coronal, *axial]), headers=auth(key))
    assert r.status_code == 202, r.text
    job = wait_job(c, r.json()["id"], key)
    assert job["state"] == "succeeded", job
    report = c.get(f"/v1/jobs/{job['id']}/report", headers=auth(key)).json()
    assert report["series_selection"]["selected"]["series_number"] == 2


def _zipped(files: list[Path], path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for f in files:
            archive.write(f, f.name)
    return path


def test_the_test_studies_and_a_phantom_are_accepted_without_a_second_header_read(
    server: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The headers the upload's own-results check read let them through: the door's
    discovery (1.5 ms a file) is not run for them."""
    discovered: list[Path] = []
    real = selection_door.discover_series

    def discover(folder: Path, **options: Any) -> Any:
        discovered.append(folder)
        return real(folder, **options)

    monkeypatch.setattr(selection_door, "discover_series", discover)
    c, key = server["client"], server["submit"]
    studies = {
        "make_study": make_study(tmp_path / "a"),
        "zip": [_zipped(make_study(tmp_path / "z"), tmp_path / "study.zip")],
        "phantom": small_study(tmp_path / "phantom", seed=4),
        "oblique": make_ct_series(
            tmp_path / "oblique",
            n_slices=8,
            rows=24,
            cols=24,
            study_uid=new_uid(),
            orientation=oblique_orientation(20.0),
        ),
    }
    for name, files in studies.items():
        r = c.post("/v1/studies", files=upload(files), headers=auth(key))
        assert r.status_code in (200, 202), (name, r.text)
        job = wait_job(c, r.json()["id"], key, timeout=120)
        assert job["state"] == "succeeded", (name, job)
    assert discovered == []
    # a wrong-plane study is read again, by the exact check, and refused
    r = c.post("/v1/studies", files=upload(_wrong_plane(tmp_path / "bad")), headers=auth(key))
    assert r.status_code == 422 and len(discovered) == 1, r.text


def test_one_wrong_plane_study_in_a_batch_refuses_only_itself(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, key = server["client"], server["submit"]
    good = make_study(tmp_path / "good")
    bad = _wrong_plane(tmp_path / "bad")
    jobs = _jobs(server)
    body = [*upload(good, field="good"), *upload(bad, field="bad")]
    r = c.post("/v1/studies/batch", files=body, headers=auth(key))
    assert r.status_code == 207, r.text
    answer = r.json()
    assert (answer["accepted"], answer["refused"]) == (1, 1)
    items = {item["study"]: item for item in answer["items"]}
    assert items["good"]["status"] == 202 and items["good"]["job"] is not None
    assert items["bad"]["status"] == 422 and items["bad"]["job"] is None
    assert items["bad"]["error"]["code"] == "orientation_unsupported"
    assert items["bad"]["error"]["message"] == _job_error(server, tmp_path / "bad").message
    assert _jobs(server) == jobs + 1
    assert wait_job(c, items["good"]["job"]["id"], key)["state"] == "succeeded"


def test_a_stow_request_of_only_wrong_plane_series_fails_each_instance_with_the_reason(
    server: dict[str, Any], tmp_path: Path
) -> None:
    """STOW-RS (not quiet) stores a complete study through the same intake before it
    answers: each instance fails 0xC000 with the code and reason the form gives."""
    files = _wrong_plane(tmp_path / "study")
    jobs = _jobs(server)
    r = stow(server, dicom_parts(files))
    assert r.status_code == 409, r.text
    assert {reason for _, reason in failures(r)} == {0xC000}
    message = _job_error(server, tmp_path / "study").message
    for item in r.json()["00081198"]["Value"]:
        assert item[REASON_CODE]["Value"] == ["orientation_unsupported"]
        assert item[REASON_TEXT]["Value"] == [message]
    assert _jobs(server) == jobs


def test_a_wrong_plane_study_sent_by_c_store_fails_its_job_in_the_same_words(
    server: dict[str, Any], tmp_path: Path
) -> None:
    """Its instances were acknowledged as they came: its job fails before any series is
    loaded, with the error the form answers, and the console lists each series with the
    reason the error gives it."""
    if dcmtk_tool("storescu") is None:
        pytest.skip("dcmtk's storescu is not installed")
    service, admin = server["service"], server["admin"]
    c = server["client"]
    files = _wrong_plane(tmp_path / "study")
    before = {job.id for job in service.store.list_jobs(limit=1000).items}
    assert service.gateway_address is not None
    sent = storescu(*service.gateway_address, files)
    assert sent.returncode == 0, sent.stderr

    def new_jobs() -> list[str]:
        return [j.id for j in service.store.list_jobs(limit=1000).items if j.id not in before]

    until(lambda: new_jobs() != [], "the C-STORE study's job", 60 * WAIT_SCALE)
    [job_id] = new_jobs()
    job = wait_job(c, job_id, admin)
    assert (job["state"], job["error"]["code"]) == ("failed", "orientation_unsupported")
    r = c.post("/v1/studies", files=upload(files), headers=auth(server["submit"]))
    assert r.status_code == 422, r.text
    assert job["error"]["message"] == r.json()["error"]["message"]
    assert c.post("/console/api/session", json={"key": admin}).status_code == 200
    refused = c.get(f"/console/api/jobs/{job_id}").json()["refused"]
    assert sorted(s["series_number"] for s in refused) == [1, 2]
    for series in refused:
        assert f"series {series['series_number']}: {series['reason']}" in job["error"]["message"]
