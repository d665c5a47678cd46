"""A command's table written to a pipe or a file reads as on a wide terminal: rich assumes
80 columns there, and ``radserve models list > models.txt`` cut every cell to a word a
line ("deploy…", a gate reason one word per line). ``COLUMNS`` still decides when set."""

from __future__ import annotations

import os
from pathlib import Path

from tests.factories.server_process import run_radserve


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return {**env, **extra}


def test_models_list_piped_keeps_whole_cells(tmp_path: Path) -> None:
    done = run_radserve("models", "list", "--data-dir", str(tmp_path / "data"), env=_env())
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if "model" in line and "┃" in line)
    assert "deployed" in header and "servable" in header and "…" not in header
    rows = [line for line in done.stdout.splitlines() if line.startswith("│ lesions ")]
    assert rows and all("liver_lesion, 2 lung_nodule" in row for row in rows)


def test_columns_still_decides(tmp_path: Path) -> None:
    done = run_radserve(
        "models", "list", "--data-dir", str(tmp_path / "data"), env=_env(COLUMNS="80")
    )
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
