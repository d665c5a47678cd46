"""A PET/CT study uploaded to the server runs the two-channel model (both series used)."""

from __future__ import annotations

import httpx
from tests.factories.petct import write_petct_bundle, write_petct_pipeline
from tests.factories.service import ServerThread, auth, create_key, settings_for, upload, wait_job
from tests.factories.waits import WAIT_SCALE

from radserve.api import create_app
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.phantom.pet import generate_pet, write_pet_series
from radserve.service import Service


def test_server_runs_a_two_channel_model_on_an_uploaded_pet_ct_study(tmp_path):
    phantom = generate_phantom(PhantomSpec.random(0, small=True))
    files = write_dicom_series(phantom, tmp_path / "study")
    files += write_pet_series(generate_pet(phantom), tmp_path / "study")
    models = write_petct_bundle(tmp_path / "models")
    write_petct_pipeline(tmp_path / "pipelines")
    settings = settings_for(
        tmp_path,
        models__dirs=[str(models)],
        pipelines__dirs=[str(tmp_path / "pipelines")],
        pipelines__default="petct-pipeline",
    )
    service = Service(settings)
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert service.wait_warm(60 * WAIT_SCALE)
        key = create_key(service.store, "submit")
        r = c.post("/v1/studies", files=upload(files), headers=auth(key))
        assert r.status_code == 202, r.text
        job = wait_job(c, r.json()["id"], key, timeout=120)
        assert job["state"] == "succeeded", job
        report = c.get(f"/v1/jobs/{job['id']}/report", headers=auth(key)).json()
        assert report["findings"], "the hot lesions are findings"
        assert report["series_selection"]["selected"]["modality"] == "CT"
        assert report["series_selection"]["rejected"] == []
