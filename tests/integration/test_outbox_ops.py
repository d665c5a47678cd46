"""The outbox for operators (issue 11, item 8): a FHIR server that is down, then
answers 422, then 200 — seen through ``GET /v1/ops/outbox``, ``/readyz``, ``/metrics``,
re-armed with ``POST /v1/ops/outbox/{id}/retry`` (audited) and ``radserve outbox``."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import httpx
from click.testing import CliRunner
from tests.factories.fhir_server import Answer, FhirServer
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE, until

from radserve.api import create_app
from radserve.cli import cli
from radserve.service import Service
from radserve.store.outbox import NewDelivery, OutboxKind, OutboxState, OutboxStore, Settlement


def test_unreachable_fhir_server_is_reported_and_a_failed_bundle_is_re_armed(
    tmp_path: Path,
) -> None:
    fhir = FhirServer()  # not up yet: connections are refused
    settings = settings_for(
        tmp_path,
        fhir__url=fhir.url,
        fhir__retry_first_s=0.1,
        fhir__retry_max_s=0.2,
        outbox__unreachable_after_s=0.5,
    )
    service = Service(settings)
    admin, read = create_key(service.store, "admin"), create_key(service.store, "read")
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        assert service.wait_warm(60 * WAIT_SCALE)
        r = c.post("/v1/studies", files=upload(make_study(tmp_path / "s")), headers=auth(admin))
        assert wait_job(c, r.json()["id"], admin)["state"] == "succeeded"

        def outbox() -> dict[str, Any]:
            answer = c.get("/v1/ops/outbox", params={"kind": "fhir"}, headers=auth(admin))
            assert answer.status_code == 200, answer.text
            return answer.json()

        until(lambda: outbox()["items"][0]["attempts"] >= 2, "failed attempts")
        [item] = outbox()["items"]
        job_url = f"/v1/jobs/{r.json()['id']}/deliveries"
        mine = c.get(job_url, headers=auth(read))  # a reader sees the job's deliveries
        assert mine.status_code == 200, mine.text
        [delivery] = mine.json()["deliveries"]
        assert (delivery["id"], delivery["kind"], delivery["destination"]) == (
            item["id"], "fhir", "fhir",
        )  # fmt: skip
        assert delivery["attempts"] >= 2
        assert "cannot reach the FHIR server" in str(delivery["last_error"])
        assert c.get("/v1/jobs/nope/deliveries", headers=auth(read)).status_code == 404
        assert item["state"] in ("pending", "sending") and item["kind"] == "fhir"
        assert "cannot reach the FHIR server" in str(outbox()["destinations"][0]["last_error"])

        def degraded() -> dict[str, Any] | None:
            answer = c.get("/readyz", headers=auth(read))
            return answer.json() if answer.json()["degraded"] else None

        ready = until(degraded, "/readyz to report the FHIR server")
        assert ready["ready"] is True  # degraded by default: still serving (200)
        assert list(ready["unreachable_peers"]) == ["fhir"]
        assert any("fhir destination fhir unreachable" in why for why in ready["reasons"])
        metrics = c.get("/metrics").text
        assert 'radserve_outbox_pending{destination="fhir",kind="fhir"} 1.0' in metrics
        # retried every 0.1-0.2 s, the row is 'sending' at some scrapes: wait for a scrape
        # that sees it between attempts
        retrying = 'radserve_outbox_failing{destination="fhir",kind="fhir",state="retrying"} 1.0'
        until(lambda: retrying in c.get("/metrics").text, "the retrying gauge")
        assert "radserve_outbox_oldest_pending_age_seconds{" in metrics
        assert c.get("/v1/ops/outbox", headers=auth(read)).status_code == 403
        bad = c.get("/v1/ops/outbox", params={"state": "lost"}, headers=auth(admin))
        assert bad.status_code == 400

        fhir.script(Answer(422))  # now up, and refusing the Bundle: a permanent failure
        fhir.up()
        try:
            until(lambda: outbox()["items"][0]["state"] == "failed_permanent", "the 422")
            until(lambda: not c.get("/readyz", headers=auth(read)).json()["degraded"], "ok")
            failing = 'radserve_outbox_failing{destination="fhir",kind="fhir",state="failed_'
            assert failing + 'permanent"} 1.0' in c.get("/metrics").text

            url = f"/v1/ops/outbox/{item['id']}/retry"
            assert c.post(url, headers=auth(read)).status_code == 403
            retried = c.post(url, headers=auth(admin))
            assert retried.status_code == 200, retried.text
            assert retried.json()["attempts"] == 0
            until(lambda: outbox()["items"][0]["state"] == "sent", "the re-armed Bundle")
            [sent] = c.get(job_url, headers=auth(read)).json()["deliveries"]
            assert sent["state"] == "sent" and sent["sent_at"] is not None
            assert len(fhir.received) == until(lambda: len(fhir.received), "posts")
            again = c.post(url, headers=auth(admin))
            assert again.status_code == 409
            assert again.json()["error"]["code"] == "outbox_not_retryable"
            missing = c.post("/v1/ops/outbox/987654/retry", headers=auth(admin))
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "outbox_item_not_found"
            # past a 64-bit row id: refused as a bad request (was a 500 from the database)
            huge = c.post(f"/v1/ops/outbox/{2**64}/retry", headers=auth(admin))
            assert huge.status_code == 400
        finally:
            fhir.down()
    audit = [r for r in service.store.iter_audit() if r.action == "outbox.retried"]
    assert len(audit) == 1 and audit[0].subject == str(item["id"])
    assert audit[0].payload["previous_state"] == "failed_permanent"
    assert audit[0].actor_key_id is not None and audit[0].actor_key_id in admin


def test_not_ready_mode_and_the_cli(tmp_path: Path) -> None:
    settings = settings_for(
        tmp_path, outbox__unreachable_after_s=60, outbox__unreachable_is_not_ready=True
    )
    service = Service(settings)
    rows = OutboxStore(service.store.engine)
    old = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    [item] = rows.add(
        [
            NewDelivery(
                destination="PACS",
                path=str(tmp_path / "gone.dcm"),
                sop_class_uid="1.2.840.10008.5.1.4.1.1.66.4",
                sop_instance_uid="1.2.3.4",
                study_instance_uid="1.2.3",
                transfer_syntax_uid="1.2.840.10008.1.2.1",
            )
        ],
        now=old,
    )
    [claimed] = rows.claim_due(old)
    rows.settle_all([Settlement.retry(claimed.id, now=old, due=old, error="association rejected")])
    service.start()
    try:
        assert service.wait_warm(60 * WAIT_SCALE)
        state = service.readiness()
        assert not state.ready and state.degraded
        assert "association rejected" in state.unreachable_peers["PACS"]
    finally:
        service.stop()

    runner = CliRunner()
    base = ["--data-dir", str(settings.data_dir)]
    listed = runner.invoke(cli, ["outbox", "list", *base])
    assert listed.exit_code == 0, listed.output
    assert "dicom PACS: 1 pending (1 retrying)" in listed.output
    assert "association rejected" in listed.output
    as_json = runner.invoke(cli, ["outbox", "list", "--json", "--state", "pending", *base])
    [row] = [json.loads(line) for line in as_json.output.splitlines()]
    assert row["id"] == item.id and row["attempts"] == 1
    usage = runner.invoke(cli, ["outbox", "retry", *base])
    assert usage.exit_code == 2 and "--all-failed" in usage.output
    done = runner.invoke(cli, ["outbox", "retry", str(item.id), *base])
    assert done.exit_code == 0, done.output
    assert f"row {item.id} (dicom to PACS): pending, due now" in done.output
    store = OutboxStore(service.store.engine)  # the engine reopens on demand
    assert store.get(item.id).state is OutboxState.PENDING
    assert store.get(item.id).kind is OutboxKind.DICOM
    none = runner.invoke(cli, ["outbox", "retry", "--all-failed", *base])
    assert none.exit_code == 0 and "no failed row to retry" in none.output
