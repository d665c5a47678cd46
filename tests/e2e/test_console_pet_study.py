"""The console's study view of a study analysed on a PET (a PET-only model): the image is
windowed by its own range, not by CT windows in HU. Before, the soft-tissue window
(-160 to 240) put a PET in Bq/ml (thousands) at white wherever it had activity. Debian's
chromium against a real ``radserve serve`` whose default pipeline reads the PT series."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import nibabel as nib
import numpy as np
import pydicom
import pytest
from PIL import Image
from tests.factories.console import Page, browser, ms, need_browser
from tests.factories.dicom_net import free_port
from tests.factories.petct import write_pet_only_bundle, write_pet_only_pipeline
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import auth, config_file, upload, wait_job

from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.phantom.pet import generate_pet, write_pet_series

pytestmark = pytest.mark.slow


def test_a_pet_study_is_windowed_by_its_own_range(tmp_path: Path) -> None:
    need_browser()
    phantom = generate_phantom(PhantomSpec.random(0, small=True))
    study = tmp_path / "study"
    write_dicom_series(phantom, study)
    write_pet_series(generate_pet(phantom), study)
    models = write_pet_only_bundle(tmp_path / "pet-models")
    write_pet_only_pipeline(tmp_path / "pet-pipelines")
    config = config_file(
        tmp_path,
        models={"dirs": [str(models)]},
        pipelines={"dirs": [str(tmp_path / "pet-pipelines")], "default": "pet-only-pipeline"},
    )
    data, port = tmp_path / "data", free_port()
    admin = create_key_cli(config, data, "admin")
    process = start_server(config, data, port, tmp_path / "server.log")
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=60) as c:
            files = upload(sorted(study.glob("*.dcm")))
            r = c.post("/v1/studies", files=files, headers=auth(admin))
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            assert wait_job(c, job_id, admin)["state"] == "succeeded"
            report = c.get(f"/v1/jobs/{job_id}/report", headers=auth(admin)).json()
            assert report["series_selection"]["selected"]["modality"] == "PT"
            # the viewer's volume holds the PET's values whole: before, int16 clipped
            # them at 32767 Bq/ml and rounded them
            served = c.get(f"/v1/jobs/{job_id}/volume", headers=auth(admin))
            assert served.status_code == 200
            (tmp_path / "pet.nii.gz").write_bytes(served.content)
            image = nib.load(tmp_path / "pet.nii.gz")
            values = np.asarray(image.dataobj)
            assert values.dtype == np.float32
            bq_ml = [
                ds.pixel_array * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
                for ds in map(pydicom.dcmread, sorted(study.glob("PT*.dcm")))
            ]
            # fractions kept (int16 rounded them; a hot lesion of SUV 20 after a typical
            # dose reads ~100,000 Bq/ml, which it clipped; this phantom's reach ~24,000)
            assert np.any(values != np.rint(values))
            top = max(float(a.max()) for a in bq_ml)
            assert float(values.max()) == pytest.approx(top, rel=1e-6)
            assert float(values.sum()) == pytest.approx(
                sum(float(a.sum()) for a in bq_ml), rel=1e-5
            )
        with browser() as b:
            p = Page(b, base, tmp_path / "shots")
            p.sign_in(admin)
            p.page.wait_for_selector(f"#worklist tr[data-id='{job_id}']")
            p.page.click(f"#worklist tr[data-id='{job_id}']")
            p.page.wait_for_selector("#viewer[data-slice]", timeout=ms(60))
            viewer = p.page.locator("#viewer")
            assert viewer.get_attribute("data-modality") == "PT"
            assert viewer.get_attribute("data-window") == "auto"
            buttons = p.page.locator("button[data-window]")
            assert [buttons.nth(i).inner_text() for i in range(buttons.count())] == ["auto"]
            low, high, top = p.page.evaluate(
                "(() => { const v = window.__radserveViewer.nv.volumes[0]"
                "; return [v.cal_min, v.cal_max, v.global_max] })()"
            )
            # the image's own range, in its units (Bq/ml: thousands), not a CT window
            assert 240 < high <= top and low < high, (low, high, top)
            p.page.uncheck("[data-overlay=findings]")
            p.page.wait_for_timeout(300)  # one frame; nothing to wait on in WebGL
            shown = np.asarray(Image.open(io.BytesIO(viewer.screenshot())).convert("L"))
            h, w = shown.shape
            body = shown[int(0.3 * h) : int(0.7 * h), int(0.3 * w) : int(0.7 * w)]
            # grey levels across the body, not one saturated white
            assert (body >= 250).mean() < 0.5, (body >= 250).mean()
            assert len(np.unique(body // 16)) >= 4
            links = p.page.locator("#downloads a")
            names = [links.nth(i).inner_text() for i in range(links.count())]
            assert "PT volume (NIfTI)" in names and "CT volume (NIfTI)" not in names, names
            p.shot("study-pet")
            assert p.errors == []
            p.close()
    finally:
        process.terminate()
        process.wait(60)
