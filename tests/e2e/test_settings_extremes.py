"""``tools/settings_extremes.py --ci --beyond``: the settings whose extremes broke a real
``radserve serve`` before session 32 (a traceback at start, a background thread killed,
every model's warm-up failed, memory exhausted in the ETA walk, associations aborted),
each at the largest value the settings take and ten times past it. The largest must
serve (health, C-ECHO, C-STORE, a clean stop, no error line in the log); past it must
be refused at load, naming the setting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tests.factories.dicom_net import dcmtk_tool, free_port
from tests.factories.fhir_server import FhirServer
from tests.factories.server_process import create_key_cli, start_server, stop_servers
from tests.factories.service import auth, config_file, make_study, upload, wait_job
from tests.factories.syslog import Collector
from tests.factories.tools import load_tool
from tests.factories.waits import until

from radserve.config import MAX_DURATION_S as YEAR
from radserve.config import PEER_TIMEOUT, RETRY_INTERVAL

pytestmark = [pytest.mark.slow, pytest.mark.tools]


@pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk's storescu is not installed")
def test_each_setting_at_its_extreme_serves_and_past_it_is_refused(tmp_path: Path) -> None:
    tool = load_tool("settings_extremes")
    out = tmp_path / "results.json"
    rc = tool.main(["--ci", "--beyond", "--json", str(out)])
    results = json.loads(out.read_text())
    assert len(results) == 2 * len(tool.CI_FIELDS)
    findings = {case: r for case, r in results.items() if not r["fine"]}
    assert rc == 0 and not findings, findings
    extremes = dict(tool.extremes())
    for path in tool.CI_FIELDS:
        at = results[f"{path}={extremes[path]}"]
        past = results[f"{path}={extremes[path] * 10}"]
        assert at["up"] and at["store"] == 0 and not at["refused"], (path, at)
        assert past["refused"] and not past["up"], (path, past)


# --- critical-finding receivers and deadline-risk alert receivers at their extremes -------

# the least and the most a receiver's timeout takes (5e-324 s and a year until session 38,
# when waits on a peer got both ends bounded: radserve.config.PEER_TIMEOUT)
LEAST, MOST = PEER_TIMEOUT.low_s, PEER_TIMEOUT.high_s
WEBHOOKS, SYSLOGS, FHIRS = 12, 8, 4


def _receivers(hooks: list[FhirServer], logs: list[Collector], ehr: FhirServer) -> list[dict]:
    """Many receivers of each kind, every other one at the least timeout, the rest at
    the most (a year); each webhook and FHIR receiver at a path of its own."""
    out: list[dict[str, Any]] = []
    for i in range(WEBHOOKS):
        url = f"{hooks[i % len(hooks)].url}/hook{i}"
        out.append({"name": f"hook{i}", "url": url, "timeout_s": LEAST if i % 2 else MOST})
    for i, log in enumerate(logs):
        out.append({
            "name": f"log{i}", "kind": "syslog", "host": "127.0.0.1", "port": log.port,
            "transport": "tcp", "timeout_s": LEAST if i % 2 else MOST,
        })  # fmt: skip
    for i in range(FHIRS):
        out.append({
            "name": f"ehr{i}", "kind": "fhir", "url": f"{ehr.url}/ehr{i}", "flag": i % 2 == 0,
            "timeout_s": LEAST if i % 2 else MOST,
        })  # fmt: skip
    return out


def _declare_critical(root: Path) -> None:
    """The test lesion model declares any liver lesion critical (its model.yaml)."""
    path = root / "assets" / "models" / "lesions-test" / "1.0.0" / "model.yaml"
    manifest = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**manifest, "critical": [{"label": "liver_lesion"}]}))


def _sent(metrics: str) -> dict[str, float]:
    """radserve_critical_pushes_total{outcome="sent"} per receiver."""
    return {
        s.labels["receiver"]: s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
        if s.name == "radserve_critical_pushes_total" and s.labels["outcome"] == "sent"
    }


def test_critical_and_risk_alert_receivers_at_extreme_settings_serve_and_deliver(
    tmp_path: Path,
) -> None:
    """24 critical receivers (12 webhooks, 8 syslog collectors, 4 FHIR servers), each at
    the least (0.1 s) or the most (300 s) timeout the settings take; the back-off from
    the least first wait to the most cap (0.1 s, a day); the risk webhook and a risk
    syslog collector at the least timeout, every job at risk (the margin and clearing band a
    year), the stop's grace its most (60 s). A real ``radserve serve``: it answers and
    is ready, not degraded; each receiver acknowledges its notice once, the alert
    receivers get the risk; it stops cleanly with no error line in its log."""
    hooks = [FhirServer() for _ in range(3)]
    ehr, risk_hook = FhirServer(), FhirServer()
    logs = [Collector() for _ in range(SYSLOGS)]
    risk_log = Collector()
    for server in (*hooks, ehr, risk_hook):
        server.up()
    config = config_file(
        tmp_path,
        critical={
            "receivers": _receivers(hooks, logs, ehr),
            "retry_first_s": RETRY_INTERVAL.low_s,
            "retry_max_s": RETRY_INTERVAL.high_s,
        },
        turnaround={
            "risk_margin_s": YEAR,
            "risk_clear_s": YEAR,
            "risk_alert_grace_s": 60.0,
            "risk_webhook_url": risk_hook.url,
            "risk_syslog": {
                "host": "127.0.0.1",
                "port": risk_log.port,
                "transport": "tcp",
                "timeout_s": LEAST,
            },
        },
    )
    _declare_critical(tmp_path)
    data, port = tmp_path / "data", free_port()
    keys = {role: create_key_cli(config, data, role) for role in ("submit", "admin")}
    log = tmp_path / "server.log"
    process = start_server(config, data, port, log)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            files = make_study(tmp_path / "study")
            job = c.post("/v1/studies", files=upload(files), headers=auth(keys["submit"]))
            assert job.status_code == 202, job.text
            done = wait_job(c, job.json()["id"], keys["submit"])
            assert done["state"] == "succeeded", done
            names = [r["name"] for r in _receivers(hooks, logs, ehr)]

            def all_sent() -> dict[str, float] | None:
                sent = _sent(c.get("/metrics", headers=auth(keys["admin"])).text)
                return sent if set(sent) == set(names) else None

            sent = until(all_sent, "every receiver's acknowledgement", 120)
            assert sent == dict.fromkeys(names, 1.0)  # once each, a row is sent once

            # ready once its warm-up ends, which on a busy host may be after the job (a
            # study runs before warm-up finishes; CI at load ~35 saw warmed_up: false)
            def ready() -> dict[str, object] | None:
                answer = c.get("/readyz", headers=auth(keys["admin"]))
                return answer.json() if answer.status_code == 200 else None

            body = until(ready, "the server ready (warmed up)", 120)
            assert body["ready"], body
            assert not body["degraded"] and body["unreachable_peers"] == {}, body
            assert c.get("/healthz").status_code == 200
            until(lambda: risk_hook.received, "the risk webhook's alert", 60)
            until(lambda: risk_log.messages, "the risk collector's alert", 60)
    finally:
        stop_servers([process])
        for server in (*hooks, ehr, risk_hook):
            server.down()
    hooked = {r.path.rsplit("/", 1)[-1] for h in hooks for r in h.received}
    assert hooked == {f"hook{i}" for i in range(WEBHOOKS)}
    assert all(any(m["msgid"] == "RADSERVE-CRITICAL" for m in log_.parsed()) for log_ in logs)
    fhir = {r.path.rsplit("/", 1)[-1] for r in ehr.received}
    assert fhir == {f"ehr{i}" for i in range(FHIRS)}
    alert = risk_hook.received[0].json()
    assert (alert["event"], alert["job_id"]) == ("job.deadline_risk", done["id"])
    assert [m["msgid"] for m in risk_log.parsed()][:1] == ["RADSERVE-RISK"]
    for collector in (*logs, risk_log):
        collector.close()
    assert process.returncode == 0, log.read_text()[-3000:]
    bad = load_tool("settings_extremes")._bad_lines(log.read_text(errors="replace"))
    assert bad == [], bad
