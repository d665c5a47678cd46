"""`radserve models list` shows each version's output labels (README "Using it": "bundles,
labels, servable precisions"); the session 1-7 rewrite of the listing had dropped them, so
an engineer could not see which label values a model writes without opening its
model.yaml. The bundled models in a fresh data folder."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from radserve.cli import cli


def test_models_list_names_each_versions_labels(tmp_path: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(cli, ["models", "list", "--json", "--data-dir", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    rows = {(r["name"], r["version"]): r for r in json.loads(listed.stdout)}
    organs = rows["organs", "1.0.0"]["labels"]
    assert organs[0] == {"value": 1, "name": "liver"}
    assert len(organs) == 9
    assert rows["lesions", "1.2.0"]["labels"] == [
        {"value": 1, "name": "liver_lesion"},
        {"value": 2, "name": "lung_nodule"},
    ]
    table = runner.invoke(
        cli, ["models", "list", "--data-dir", str(tmp_path)], env={"COLUMNS": "300"}
    )
    assert table.exit_code == 0, table.output
    assert "1 liver_lesion, 2 lung_nodule" in table.stdout
