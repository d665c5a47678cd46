"""The site's ``critical.rules`` are checked against the installed models' finding labels.

A pipeline's or a model's own rule that names a label none of its models produce is
refused where it is declared; the site's rules (radserve.yaml) were not checked at all,
so a label typed wrong there never pushed a critical finding, and nothing said so.
``radserve doctor`` now warns for each such rule (and for rules with no receiver), and
the server logs it at each start. A warning, not a refusal: the model may come later."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tests.factories.service import settings_for

from radserve.lifecycle.doctor import run_doctor

RULES = [
    {"label": "liver_lesion", "min_long_axis_mm": 5},  # the test lesion model's label
    {"label": "liver_lesoin"},  # typed wrong
    {"label": "liver_lesion", "model": "lesions-tset"},  # a model that is not installed
    {"label": "liver", "model": "organs-test"},  # a region label, not a finding label
]


def _checks(tmp_path: Path, **overrides: object) -> dict[str, dict[str, object]]:
    settings = settings_for(tmp_path, critical__rules=RULES, **overrides)
    checks = run_doctor(settings, check_ports=False)
    return {c.name: c.as_json() for c in checks if c.name.startswith("critical")}


def test_doctor_warns_for_each_site_rule_no_installed_model_can_meet(tmp_path: Path) -> None:
    checks = _checks(tmp_path)
    rules = [v for k, v in checks.items() if k.startswith("critical.rules[")]
    assert [r["status"] for r in rules] == ["ok", "warn", "warn", "warn"]
    assert all(r["blocking"] is False for r in rules)
    typo, model, region = (str(r["detail"]) for r in rules[1:])
    assert "names label 'liver_lesoin'" in typo and "'liver_lesion'" in typo  # what exists
    assert "names model 'lesions-tset', which no installed model runs" in model
    assert "names label 'liver'" in region and "produce: none" in region
    assert checks["critical receivers"]["status"] == "warn"  # rules, but nowhere to push
    receiver = [{"name": "pager", "url": "http://127.0.0.1:9/critical"}]
    assert "critical receivers" not in _checks(tmp_path / "b", critical__receivers=receiver)


def test_the_server_logs_them_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from radserve.service import Service

    caplog.set_level(logging.WARNING, logger="radserve.service.service")
    service = Service(settings_for(tmp_path, critical__rules=RULES))
    try:
        logged = [r.getMessage() for r in caplog.records if "can never fire" in r.getMessage()]
    finally:
        service.stop()
    assert [m.split(" can never fire")[0] for m in logged] == [
        "critical.rules[1]",
        "critical.rules[2]",
        "critical.rules[3]",
    ]
    assert any("no critical.receivers: nothing is pushed" in r.getMessage() for r in caplog.records)
