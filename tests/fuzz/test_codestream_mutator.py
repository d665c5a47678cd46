"""The structure-aware mutator (tests/fuzz/codestream.py) sees what it is for: a child
that dies by a signal is a finding, one that raises is a refusal, and the header
segments it mutates are found in every seed."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.codestream import mutate, refused, run_child, seeds, segments

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="forks a child per input")


def test_a_child_that_aborts_is_a_finding_and_one_that_raises_is_not() -> None:
    assert run_child(os.abort) == "signal 6"

    def refuse() -> None:
        raise RuntimeError("a decoder's refusal")

    assert run_child(refuse) == ""
    assert run_child(lambda: None) == ""


def test_every_seed_has_its_header_segments_found_and_passes_the_header_check() -> None:
    found = {}
    for seed in seeds():
        spans = segments(seed.syntax, seed.frame)
        markers = [seed.frame[start + 1] for start, _ in spans]
        found[seed.syntax] = markers
        assert refused(seed, seed.frame) == "", seed.syntax
        mutants = [mutate(seed.syntax, seed.frame, random.Random(k)) for k in range(20)]
        assert sum(m != seed.frame for m in mutants) >= 15, seed.syntax
    assert found["1.2.840.10008.1.2.4.80"] == [0xF7, 0xDA]  # SOF55, SOS
    assert found["1.2.840.10008.1.2.4.50"][-1] == 0xDA
    assert found["1.2.840.10008.1.2.4.90"][:2] == [0x51, 0x52]  # SIZ, COD
    assert found["1.2.840.10008.1.2.5"] == [0x00]  # the RLE header's first byte (64)


def test_help_prints_the_usage_and_runs_nothing() -> None:
    """``python -m tests.fuzz.codestream --help`` read ``--help`` as the seconds per pair
    and ended in a traceback; it prints its usage line now."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.codestream", "--help"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("``python -m tests.fuzz.codestream [--unrefused]")
    assert "Traceback" not in done.stderr
