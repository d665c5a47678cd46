"""``tools/settings_extremes.py`` runs dcmtk's echoscu and storescu, not pynetdicom's
Python scripts of the same names.

Found on 2026-12-06: the tool called them by bare name, so with a virtual
environment's ``bin`` first on PATH (where pynetdicom installs its console scripts) the
scripts ran instead, with options they do not take, and every setting was reported a
finding. A PATH with such scripts first, and the tool's commands checked by what they
run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from tests.factories.dicom_net import dcmtk_tool
from tests.factories.tools import load_tool

pytestmark = pytest.mark.skipif(
    dcmtk_tool("storescu") is None or dcmtk_tool("echoscu") is None,
    reason="dcmtk is not installed",
)


def test_the_probe_runs_dcmtks_binaries_with_python_scripts_of_their_names_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shadow = tmp_path / "venv-bin"
    shadow.mkdir()
    for name in ("echoscu", "storescu"):  # as pynetdicom's console scripts shadow them
        script = shadow / name
        script.write_text("#!/bin/sh\necho pynetdicom\nexit 2\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shadow}:{os.environ['PATH']}")
    tool = load_tool("settings_extremes")
    echo, store = tool.dcmtk_commands(11112, tmp_path / "study")
    for command, name in ((echo, "echoscu"), (store, "storescu")):
        assert not command[0].startswith(str(shadow)), command
        version = subprocess.run(
            [command[0], "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        assert version.stdout.startswith(f"$dcmtk: {name} v"), version.stdout
    assert store[-3:] == ["127.0.0.1", "11112", str(tmp_path / "study")]
