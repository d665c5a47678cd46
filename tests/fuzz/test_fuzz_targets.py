"""The CI short mode: each fuzz target runs a fixed number of inputs, seeded
deterministically, from its seed corpus; a finding fails the test with the reproducer.
``RADSERVE_TEST_FUZZ_MINUTES`` runs each that many minutes instead (the long mode's
length, here under pytest)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fuzz.long import MINUTES_ENV
from tests.fuzz.session import fuzz
from tests.fuzz.targets import TARGETS, skip_without_needs

pytest.importorskip("atheris")

# inputs per target, for ~50 CPU-s for all six, startup included (the importers target
# loads MONAI first): 300/100/600/400/100/3000 took 66 CPU-s on 2 cores at load 6-8
# (2026-12-03), instance and importers the most; at these counts, with the instance target
# also building the failure SR, 74.1 user + 6.8 sys = 80.9 CPU-s at load 3.4-3.7 (a7b14de+)
RUNS = {
    "instance": 150,
    "series": 80,
    "multipart": 400,
    "settings": 400,
    "importers": 60,
    "qido": 3000,
    "nifti": 2000,
}


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_finds_nothing(target: str, tmp_path: Path) -> None:
    skip_without_needs(target)
    minutes = float(os.environ.get(MINUTES_ENV) or 0)
    if minutes:
        outcome = fuzz(target, tmp_path, seconds=round(minutes * 60))
    else:
        outcome = fuzz(target, tmp_path, runs=RUNS[target])
    assert not outcome.found, outcome.report()
    assert outcome.executions > 0, outcome.report()
