"""A deadline-risk webhook that refuses its alerts shows in ``/readyz`` (degraded, its
reason) and in the metrics, as a critical receiver's failed notices do. Before session
37 the alert was retried for 36 s, counted, and health said nothing. A real server; the
receiver a real loopback HTTP server answering every POST with a redirect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from tests.factories.fhir_server import Answer, FhirServer
from tests.factories.service import auth, live_server, make_study, settings_for, upload, wait_job
from tests.factories.waits import until


def test_a_refusing_risk_webhook_degrades_readyz(tmp_path: Path) -> None:
    with FhirServer() as hook:
        for _ in range(10):
            hook.script(Answer(302))
        settings = settings_for(
            tmp_path,
            turnaround__prior_per_slice_s=5.0,  # the first job is at risk at submission
            turnaround__risk_margin_s=0.1,
            turnaround__risk_webhook_url=hook.url,
            scheduler__tat_s__outpatient=30.0,
        )
        with live_server(settings, roles=("submit", "read", "admin")) as live:
            c, key, admin = live["client"], live["submit"], live["admin"]
            files = make_study(tmp_path / "study")
            job = c.post("/v1/studies", files=upload(files), headers=auth(key)).json()
            assert wait_job(c, job["id"], key)["state"] == "succeeded"

            def degraded() -> dict[str, Any] | None:
                body = c.get("/readyz", headers=auth(admin)).json()
                return body if "risk:webhook" in body["unreachable_peers"] else None

            ready = until(degraded, "the risk webhook in /readyz", 30)
            assert ready["degraded"] and ready["ready"]  # unreachable_is_not_ready: off
            reason = ready["unreachable_peers"]["risk:webhook"]
            assert "HTTP 302" in reason and hook.url not in reason
            assert reason in ready["reasons"]
            metrics = c.get("/metrics", headers=auth(admin)).text
            failed = [
                s.value
                for family in text_string_to_metric_families(metrics)
                for s in family.samples
                if s.name == "radserve_deadline_risk_alerts_dropped_total"
                and s.labels == {"receiver": "webhook", "reason": "failed"}
            ]
            assert failed == [1.0]
        assert len(hook.received) == 1  # refused at once: not retried past the redirect
