"""A canary is rolled back on its comparisons with the stable version it is judged
against, not with one that served before: a stable version changed while a canary
runs (deploy --role stable keeps the canary) left the canary's record holding
comparisons with the earlier stable, and before 2026-12-07 they counted alike."""

from __future__ import annotations

from radserve.config import GuardrailSettings
from radserve.lifecycle.compare import Comparison, StratumAgreement
from radserve.lifecycle.guardrails import VersionRecord, breach


def _compared(stable: str, agreement: float) -> Comparison:
    both = round(agreement * 10)
    return Comparison(
        job_id="j",
        step="lesions",
        serving_version=stable,  # the stable side, as every comparison is filed now
        candidate_version="1.2",
        candidate_role="canary",
        dice={"liver_lesion": agreement},
        lesions={"<10mm": StratumAgreement(both, 0, 10 - both)},
    )


def test_comparisons_with_an_earlier_stable_do_not_judge_the_canary() -> None:
    limits = GuardrailSettings(min_studies=4, min_comparisons=3)
    canary = VersionRecord("lesions", "1.2")
    for _ in range(3):  # against 1.0, which no longer serves: they disagreed
        canary.comparisons.append(_compared("1.0", 0.5))
    assert "lesion agreement with stable 50% over 3" in (
        breach(canary, VersionRecord("lesions", "1.0"), limits) or ""
    )
    now = VersionRecord("lesions", "1.1")
    assert breach(canary, now, limits) is None  # none yet with 1.1
    for _ in range(3):
        canary.comparisons.append(_compared("1.1", 1.0))
    assert breach(canary, now, limits) is None  # agrees with 1.1
    canary.comparisons.append(_compared("1.1", 0.0))
    canary.comparisons.append(_compared("1.1", 0.0))
    why = breach(canary, now, limits) or ""
    assert "over 5 studies" in why  # the five with 1.1 only, not the eight
    # the record shows them all
    assert canary.summary()["comparisons"] == 8
