"""``tools/drift_false_alarms.py``'s judging (the figures in docs/models.md): a stable
population counts no alarm; a shifted output feature is counted as an output-feature
alarm, by name."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

TOOL = Path(__file__).resolve().parents[2] / "tools" / "drift_false_alarms.py"


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("drift_false_alarms", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _features(rng: np.random.Generator, lesion_shift: float = 0.0) -> dict[str, Any]:
    count = float(rng.poisson(2.0 + lesion_shift))
    return {
        "hist": {"hu_body": list(rng.dirichlet(np.full(10, 50.0)))},
        "num": {"noise_hu": float(rng.normal(15.0, 2.0)), "slices": float(rng.integers(250, 350))},
        "cat": {"manufacturer": "phantom"},
        "models": {
            "lesions": {
                "num": {
                    "finding_count": count,
                    "finding_size_mm": [float(v) for v in rng.gamma(4.0, 4.0, int(count))],
                },
                "cat": {"positive": "yes" if count else "no"},
            }
        },
    }


def test_a_stable_population_counts_no_alarm_and_a_shifted_output_is_named() -> None:
    tool = _tool()
    rng = np.random.default_rng(0)
    reference = [_features(rng) for _ in range(20)]
    stable = tool.judge(reference, [_features(rng) for _ in range(40)], "lesions")
    assert stable["judged_windows"] == 21  # 40 studies, judged once the window (20) is full
    assert stable["overall"] == {"warn": 0, "alert": 0}
    assert stable["output_features"] == ["finding_count", "finding_size_mm", "positive"]

    shifted = tool.judge(reference, [_features(rng, 6.0) for _ in range(40)], "lesions")
    assert shifted["overall"]["alert"] > 0
    assert "finding_count" in shifted["output_feature_alarms"]
    assert "noise_hu" not in shifted["non_ok_by_feature"]  # the inputs did not move
