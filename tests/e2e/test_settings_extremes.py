"""``tools/settings_extremes.py --ci --beyond``: the settings whose extremes broke a real
``radserve serve`` before session 32 (a traceback at start, a background thread killed,
every model's warm-up failed, memory exhausted in the ETA walk, associations aborted),
each at the largest value the settings take and ten times past it. The largest must
serve (health, C-ECHO, C-STORE, a clean stop, no error line in the log); past it must
be refused at load, naming the setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.factories.dicom_net import dcmtk_tool
from tests.factories.tools import load_tool

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
