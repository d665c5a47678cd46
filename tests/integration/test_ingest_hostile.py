"""The hostile-input suite (issue 12, "Kept fixed"): seeded mutants of a small CT series
(header values across VRs, geometry and pixel attributes, truncations) and bombs (frame
counts, a zip and a deflate bomb with a 256 MB private element, a 2 GB length claim) go
through ingest in a child process, as ``radserve run`` reads a study.

Each case must end in success or one clear RadserveError (one line), with no traceback
in the log, no hang, and the child's peak RSS within the bound of its class over a
warmed-up baseline. ``RADSERVE_TEST_FUZZ_CASES`` sets the number of cases (default 100,
a couple of minutes on two cores; the nightly run uses 5000); ``RADSERVE_TEST_FUZZ_SEED``
the seed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.factories.hostile import base_series, cases

CASES = int(os.environ.get("RADSERVE_TEST_FUZZ_CASES", "100"))
SEED = int(os.environ.get("RADSERVE_TEST_FUZZ_SEED", "12"))
# Peak RSS over the warmed-up baseline (MB) each class is held to.
BOUND_MB = {"bomb": 128, "mutation": 96}
CHILD_TIMEOUT_S = 600  # a hang detector for the whole child, not a performance bound


def _run_child(folders: list[Path]) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    run = subprocess.run(
        [sys.executable, "-m", "tests.factories.hostile_child", *map(str, folders)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Traceback" not in run.stderr, run.stderr[-4000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return lines[1:]  # the first line is the import-time baseline


def _check(outcome: dict[str, Any], name: str, baseline: float, bound: float) -> float:
    assert outcome["result"] in ("ok", "error"), (name, outcome.get("traceback", outcome))
    assert not outcome["traceback_logged"], name
    for code, message in outcome["errors"]:
        assert code and message and "\n" not in message, (name, code, message)
    grown = outcome["peak_mb"] - baseline
    assert grown <= bound, f"{name}: peak RSS grew {grown:.0f} MB, bound {bound} MB"
    return grown


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str, Path]]:
    root = tmp_path_factory.mktemp("hostile")
    made = []
    for case in cases(CASES, SEED):
        folder = root / f"case{case.number:05d}"
        folder.mkdir()
        case.write(folder)
        made.append((case.kind, f"#{case.number} {case.kind}: {case.name}", folder))
    return made


def test_bombs_are_refused_within_bounded_memory(
    generated: list[tuple[str, str, Path]], tmp_path: Path
) -> None:
    warm = tmp_path / "warm"
    base_series(warm, 0)
    bombs = [(name, folder) for kind, name, folder in generated if kind == "bomb"]
    # One child for all bombs: its peak RSS is a high-water mark, so each case's line
    # shows whether that case (or one before it) passed the bound.
    warmup, *outcomes = _run_child([warm, *(folder for _, folder in bombs)])
    assert warmup["result"] == "ok", warmup
    grown = 0.0
    for (name, _), outcome in zip(bombs, outcomes, strict=True):
        grown = _check(outcome, name, warmup["peak_mb"], BOUND_MB["bomb"])
        if "NumberOfFrames" in name:
            assert outcome["result"] == "error", (name, outcome)
    print(f"{len(bombs)} bombs: peak RSS +{grown:.0f} MB over {warmup['peak_mb']:.0f} MB")


def test_mutants_end_in_success_or_one_clear_error(
    generated: list[tuple[str, str, Path]], tmp_path: Path
) -> None:
    warm = tmp_path / "warm"
    base_series(warm, 0)
    mutants = [(name, folder) for kind, name, folder in generated if kind != "bomb"]
    warmup, *outcomes = _run_child([warm, *(folder for _, folder in mutants)])
    assert warmup["result"] == "ok", warmup
    assert len(outcomes) == len(mutants)
    grown = 0.0
    for (name, _), outcome in zip(mutants, outcomes, strict=True):
        grown = _check(outcome, name, warmup["peak_mb"], BOUND_MB["mutation"])
    refused = sum(o["result"] == "error" for o in outcomes)
    print(f"{len(mutants)} mutants, {refused} refused: peak RSS {grown:.0f} MB over baseline")
    assert refused  # the generator does produce inputs ingest must refuse
