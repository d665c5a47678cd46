"""``tools/edge_probe.py --ci`` against a real ``radserve serve``: a few of its hostile DICOM
variants (those that found defects, and one per kind of door) each through one door, and
``AGREEMENT_VARIANTS`` through every door, which must answer them alike
(C-STORE from dcmtk's storescu, STOW-RS, the upload form, ``radserve run``), with a good
study beside it. Every case must pass the probe's checks (docs/hostile-input.md, "Probed
at every door"): a specific error or a success with the good study's findings, the good
study beside it unharmed, the server alive, no traceback, no patient name in the log,
peak RSS and open files bounded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.factories.dicom_net import dcmtk_tool
from tests.factories.edge_probe_tool import edge_probe

pytestmark = [pytest.mark.slow, pytest.mark.tools]


@pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk's storescu is not installed")
def test_edge_probe_ci_mode_passes_at_every_door(tmp_path: Path) -> None:
    probe = edge_probe()
    out = tmp_path / "cases.json"
    rc = probe.main(["--ci", "--json", str(out)])
    cases = json.loads(out.read_text())
    failed = [(c["variant"], c["door"], c["problems"]) for c in cases if c["problems"]]
    assert rc == 0 and not failed, failed
    assert {c["door"] for c in cases} == set(probe.DOORS)
    assert {c["variant"] for c in cases} == set(probe.CI_VARIANTS)
    # the character-set variant's DICOM results are read by dciodvfy (STOW-RS's only)
    assert [c["door"] for c in cases if c["variant"] == "charset_utf8_undeclared"] == ["stow"]
    # one rule per door: these went through every door, and the doors agreed (a
    # disagreement is a problem of each of its cases, so the assertion above holds it)
    for name in probe.AGREEMENT_VARIANTS:
        assert {c["door"] for c in cases if c["variant"] == name} == set(probe.DOORS)
        codes = {c["door"]: c["code"] for c in cases if c["variant"] == name}
        assert codes["form"] == codes["stow"] == codes["run"] == "instance_invalid", codes
    # the probe did make the server refuse something, with a specific reason
    assert any("job failed [" in c["outcome"] or "exit 2" in c["outcome"] for c in cases)
