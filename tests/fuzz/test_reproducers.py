"""Every input a fuzz target once failed on (tests/data/fuzz/<target>/<name>) now ends in
a declared refusal or is accepted. Runs the target's ``one_input`` directly: no atheris
needed, so these run wherever the test suite does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.targets import TARGETS, entry

DATA = Path(__file__).resolve().parents[1] / "data" / "fuzz"
CASES = sorted(p for target in TARGETS for p in (DATA / target).glob("*") if p.is_file())


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_reproducer_ends_in_a_declared_refusal(path: Path) -> None:
    entry(path.parent.name)(path.read_bytes())
