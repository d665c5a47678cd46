"""``tools/eta_decompose.py --parts`` (docs/history/turnaround.md, session 15) on a kept
Zen 4 trace: each part's error (predicted less spent) adds up to the job's ETA error,
and the parts say which one made the ETAs early there."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.factories.eta_traces import TRACES

from radserve.bench.eta_accuracy import read_summary

TOOLS = Path(__file__).resolve().parents[2] / "tools"


@pytest.fixture(scope="module")
def tool() -> Any:
    spec = importlib.util.spec_from_file_location("eta_decompose", TOOLS / "eta_decompose.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["eta_decompose"] = module
    spec.loader.exec_module(module)
    return module


def test_the_parts_add_up_to_each_jobs_error(tool: Any) -> None:
    rows = tool.decompose(read_summary(TRACES / "eta-quiet-zen4-7130cc0-s1.json.gz"))
    assert len(rows) == 15
    for r in rows:  # the rows are rounded to 0.1 s (err to 0.001 of the TAT)
        parts = sum(part(r) for part in tool.PARTS.values())
        assert parts == pytest.approx(r["err"] * r["tat"], abs=0.5 + 0.001 * r["tat"])
    errs = tool.part_errors(rows)
    # the jobs ranked behind that ran beside a deep job, never predicted: early by 12 %
    # of the turnaround summed over the deep jobs; the jobs ahead by 9 %
    assert errs["behind"][0] == pytest.approx(-0.122, abs=0.002)
    assert errs["ahead"][0] == pytest.approx(-0.087, abs=0.002)
    total = sum(r["err"] * r["tat"] for r in rows) / sum(r["tat"] for r in rows)
    assert sum(t for t, _ in errs.values()) == pytest.approx(total, abs=0.01)
