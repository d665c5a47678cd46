"""A Series Description never reaches a console session through a refusal reason.

The pipeline rule on the Series Description quoted the refused description in its reason
("series description 'SMITH^JOHN chest' does not match '^AXIAL'"): in the report's
rejected series (the study view's "not analysed" card) and, when every series of the
study was refused, in the failed job's error (the study view, the worklist's rows and
its event stream). A description is free text a technologist types, and names the
patient often enough that the console shows none (docs/console.md); a read session,
outside ``console.phi_roles``, saw this one. Real app over HTTP, real jobs: one with a
second series refused beside the one analysed, one whose only series is refused (sent
over STOW-RS without ``complete=true``, so it becomes a failed job after the quiet time
rather than a refused upload).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pydicom
import pytest
import yaml
from tests.factories.dicom_series import new_uid
from tests.factories.service import auth, live_server, make_study, settings_for, upload, wait_job
from tests.factories.waits import until

from radserve.config import load_settings

pytestmark = pytest.mark.slow

NAME = "SMITH^JOHN"
RULE = "^AXIAL"


def _described(files: list[Path], description: str, **fields: Any) -> list[Path]:
    for path in files:
        ds = pydicom.dcmread(path)
        ds.SeriesDescription = description
        for name, value in fields.items():
            setattr(ds, name, value)
        ds.save_as(path)
    return files


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    base = settings_for(tmp_path)
    pipelines = Path(base.pipelines.dirs[0])
    (pipelines / "described.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "described",
                "version": "1",
                "series_selection": {
                    "modalities": ["CT"],
                    "min_slices": 3,
                    "series_description": RULE,
                },
                "steps": [
                    {"model": "organs-test", "output": "organs"},
                    {"model": "lesions-test", "output": "findings"},
                ],
            }
        )
    )
    settings = load_settings(
        None,
        **{
            "data_dir": str(base.data_dir),
            "models__dirs": [str(d) for d in base.models.dirs],
            "pipelines__dirs": [str(pipelines)],
            "pipelines__default": "described",
            # a STOW-RS study without complete=true becomes a job after this quiet time,
            # which fails (a complete one is refused at once)
            "dicomweb__quiet_s": 1.0,
        },
    )
    with live_server(settings, roles=("submit", "read"), console=True) as srv:
        yield srv


def _stow(c: httpx.Client, files: list[Path], token: str) -> httpx.Response:
    boundary = f"b-{uuid.uuid4().hex}"
    body = b""
    for path in files:
        body += f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode()
        body += path.read_bytes() + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    kind = f'multipart/related; type="application/dicom"; boundary={boundary}'
    headers = {"Content-Type": kind, **auth(token)}
    return c.post("/dicomweb/studies", params={"complete": "false"}, content=body, headers=headers)


def _refused_job(c: httpx.Client, files: list[Path], token: str) -> str:
    before = {j["id"] for j in c.get("/v1/jobs", headers=auth(token)).json()["items"]}
    r = _stow(c, files, token)
    assert r.status_code in (200, 202), r.text
    new: list[str] = []

    def made() -> bool:
        items = c.get("/v1/jobs", headers=auth(token)).json()["items"]
        new[:] = [j["id"] for j in items if j["id"] not in before]
        return bool(new)

    until(made, "the STOW-RS study's job", 60)
    return new[0]


def test_no_refused_series_description_reaches_a_console_session(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, submit = server["client"], server["submit"]
    axial = _described(make_study(tmp_path / "axial"), "AXIAL 1mm")
    study = str(pydicom.dcmread(axial[0]).StudyInstanceUID)
    named = _described(
        make_study(tmp_path / "named"),
        f"{NAME} chest",
        StudyInstanceUID=study,
        SeriesInstanceUID=new_uid(),
        SeriesNumber=7,
    )
    r = c.post("/v1/studies", files=upload([*axial, *named]), headers=auth(submit))
    assert r.status_code == 202, r.text
    analysed = r.json()["id"]
    assert wait_job(c, analysed, submit)["state"] == "succeeded"
    only_named = _described(make_study(tmp_path / "alone"), f"{NAME} abdomen")
    refused = _refused_job(c, only_named, submit)
    failed = wait_job(c, refused, submit)
    assert failed["state"] == "failed", failed
    assert failed["error"]["code"] == "study_invalid", failed

    with httpx.Client(base_url=server["url"], timeout=60) as browser:
        assert browser.post("/console/api/session", json={"key": server["read"]}).status_code == 200
        # the analysed job: the series beside it, refused by the rule, and why
        r = browser.get(f"/console/api/jobs/{analysed}")
        assert r.status_code == 200, r.text
        assert "SMITH" not in r.text
        rejected = r.json()["report"]["series_selection"]["rejected"]
        assert [s["reason"] for s in rejected] == [f"series description does not match {RULE!r}"]
        # the failed job: its error, and the refused-series card read from its study
        r = browser.get(f"/console/api/jobs/{refused}")
        assert r.status_code == 200, r.text
        assert "SMITH" not in r.text
        detail = r.json()
        assert f"series description does not match {RULE!r}" in detail["job"]["error"]["message"]
        assert [s["reason"] for s in detail["refused"]] == [
            f"series description does not match {RULE!r}"
        ]
        # the worklist's rows
        r = browser.get("/console/api/worklist")
        assert r.status_code == 200, r.text
        assert {refused, analysed} <= {row["id"] for row in r.json()["items"]}
        assert "SMITH" not in r.text
