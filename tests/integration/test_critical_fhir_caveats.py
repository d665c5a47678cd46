"""A FHIR receiver is told a critical finding's caveats, as the webhook is.

Probe of session 37: the webhook's and syslog's notices carried the report's caveats
(``outside_input_domain``, ``input_domain_unchecked``, ``lossy_input``; session 36), the
FHIR receiver's Communication and Flag none: a FHIR receiver paged a finding of a study
outside the models' input domain with nothing to say so. Through a real server: the
lesion model declares its critical finding and an input domain the test study is
outside of (its 40 x 40 matrix under the declared 256); a real loopback webhook and FHIR
endpoint take the notices; the Bundle is validated with fhir.resources (R4B, and R4
4.0.1 where ``RADSERVE_TEST_FHIR_R4_PYTHON``/``.venv-fhir-r4`` exists)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml
from tests.factories.fhir_server import FhirServer
from tests.factories.service import auth, live_server, make_study, settings_for, upload, wait_job
from tests.factories.waits import until

REPO = Path(__file__).resolve().parents[2]
R4_PYTHON = Path(
    os.environ.get("RADSERVE_TEST_FHIR_R4_PYTHON", REPO / ".venv-fhir-r4" / "bin" / "python")
)


def _declare(root: Path) -> None:
    """The lesion model: any liver lesion is critical; trained on 256+ matrices only."""
    path = root / "assets" / "models" / "lesions-test" / "1.0.0" / "model.yaml"
    manifest = yaml.safe_load(path.read_text())
    manifest["critical"] = [{"label": "liver_lesion"}]
    manifest["input_domain"] = {"matrix": {"min": 256}}
    path.write_text(yaml.safe_dump(manifest))


def _resources(bundle: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] == kind]


def test_a_fhir_receiver_gets_the_caveats_the_webhook_gets(tmp_path: Path) -> None:
    from fhir.resources.R4B.bundle import Bundle

    with FhirServer() as hook, FhirServer() as ehr:
        settings = settings_for(
            tmp_path,
            critical__receivers=[
                {"name": "ward", "url": hook.url},
                {"name": "ehr", "kind": "fhir", "url": ehr.url, "flag": True},
            ],
        )
        _declare(tmp_path)
        with live_server(settings) as live:
            c, key = live["client"], live["submit"]
            files = make_study(tmp_path / "study", extra={"PatientName": "Doe^Caveat"})
            submitted = c.post("/v1/studies", files=upload(files), headers=auth(key)).json()
            job = wait_job(c, submitted["id"], key)
            assert job["state"] == "succeeded", job
            report = c.get(f"/v1/jobs/{job['id']}/report", headers=auth(key)).json()
            codes = [w["code"] for w in report["warnings"]]
            assert "outside_input_domain" in codes, report["warnings"]
            until(lambda: hook.received and ehr.received, "the webhook's and FHIR's notices")
    (notice,) = [r.json() for r in hook.received]
    caveats = notice["caveats"]
    assert "outside_input_domain" in [c["code"] for c in caveats], caveats
    (posted,) = ehr.received
    bundle = posted.json()
    Bundle.model_validate(bundle)  # valid R4B with the caveats in it
    (communication,) = _resources(bundle, "Communication")
    (flag,) = _resources(bundle, "Flag")
    texts = [p["contentString"] for p in communication["payload"]]
    # the finding's own text first, then one entry per caveat, in the notice's order
    assert texts[0].startswith("Critical finding:")
    assert texts[1:] == [f"Caveat ({c['code']}): {c['message']}" for c in caveats]
    for caveat in caveats:  # also where a receiver shows only the reason or the Flag
        assert caveat["message"] in communication["reasonCode"][0]["text"]
        assert caveat["message"] in flag["code"]["text"]
    if R4_PYTHON.is_file():  # and valid R4 4.0.1, where the side venv exists
        path = tmp_path / "critical-bundle.json"
        path.write_text(json.dumps(bundle))
        checked = subprocess.run(
            [str(R4_PYTHON), str(REPO / "tools" / "fhir_r4_validate.py"), str(path)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert checked.returncode == 0, checked.stdout + checked.stderr
