"""``radserve phantom --mr-grids`` (or ``--mr-second-frame``) without ``--mr`` is a usage
error before anything is written: it was checked after the CT and its ground truth, so the
command exited 2 and left a whole study in ``--out`` (a 500-slice one at full size)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from radserve.cli import cli


@pytest.mark.parametrize("flag", [["--mr-grids"], ["--mr-second-frame", "T2"]])
def test_mr_options_without_mr_write_nothing(tmp_path: Path, flag: list[str]) -> None:
    out = tmp_path / "phantom"
    args = ["phantom", "--seed", "3", "--small", *flag, "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "need --mr" in result.output
    assert not out.exists()
