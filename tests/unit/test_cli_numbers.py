"""A number no command can use is a usage error naming its option, before any work:
NaN passes click's range checks (it fails every comparison), so ``plan --hours nan``
simulated forever and ``bench --load nan`` ran a whole benchmark; a negative seed
reached numpy and ended in a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from radserve.cli import cli

CASES = [
    (["plan", "--rate", "urgent=2/h", "--hours", "nan"], "--hours"),
    (["plan", "--rate", "urgent=2/h", "--hours", "inf"], "--hours"),
    (["plan", "--rate", "urgent=2/h", "--seed", "-1"], "--seed"),
    (["bench", "--scenario", "eta", "--load", "nan"], "--load"),
    (["bench", "--scenario", "eta", "--seed", "-1"], "--seed"),
    (["bench", "--scenario", "eta", "--studies", "1"], "--studies"),
    (["bench", "--scenario", "scale", "--studies", "0"], "--studies"),
    (["bench", "--scenario", "swap", "--interval", "inf"], "--interval"),
    (["bench", "--scenario", "swap", "--interval", "0"], "--interval"),
    (["bench", "--scenario", "priority", "--routine", "-1"], "--routine"),
    (["bench", "--scenario", "cstore", "--repeats", "0"], "--repeats"),
    (["bench", "--slices", "0"], "--slices"),
    (["phantom", "--seed", "1", "--slice-spacing", "nan", "--out", "x"], "--slice-spacing"),
    (["phantom", "--seed", "-3", "--out", "x"], "--seed"),
    (["demo", "--seed", "-1"], "--seed"),
    (
        [
            "gateway",
            "echo",
            "--host",
            "127.0.0.1",
            "--port",
            "104",
            "--ae",
            "X",
            "--timeout",
            "nan",
        ],
        "--timeout",
    ),
    (
        ["gateway", "echo", "--host", "127.0.0.1", "--port", "104", "--ae", "X", "--timeout", "-1"],
        "--timeout",
    ),
    (["models", "deploy", "m", "1.0", "--percent", "nan", "--reason", "r"], "--percent"),
    # too large to be a study radserve ingests: a MemoryError traceback before
    (["bench", "--slices", "100000000"], "--slices"),
    (["phantom", "--seed", "1", "--slices", "100000000", "--out", "x"], "--slices"),
    (["phantom", "--seed", "1", "--small", "--slices", "70000", "--out", "x"], "--slices"),
    (["models", "build-variants", "--threads", "0"], "--threads"),
    # over a year, as every duration setting (socket timeouts overflowed: a traceback)
    (
        ["gateway", "echo", "--host", "127.0.0.1", "--port", "1", "--ae", "X", "--timeout", "1e9"],
        "--timeout",
    ),
]


@pytest.mark.parametrize(
    ("args", "option"), CASES, ids=lambda a: " ".join(a) if isinstance(a, list) else a
)
def test_a_number_the_command_cannot_use_is_refused_naming_its_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], option: str
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output
    assert list(tmp_path.iterdir()) == []  # refused before anything was written
