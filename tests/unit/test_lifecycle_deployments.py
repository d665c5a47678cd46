"""Deployments: deterministic canary routing by Study Instance UID (URGENT excluded
unless asked), shadow sampling, the append-only table with one audit record a change,
shadow comparison figures and the guardrail rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radserve.config import GuardrailSettings
from radserve.domain.deployment import (
    DeploymentAction,
    Role,
    StepDeployment,
    route,
    shadow_for,
)
from radserve.domain.priority import PriorityClass
from radserve.lifecycle.compare import (
    Comparison,
    StratumAgreement,
    compare_results,
    lesion_agreement,
)
from radserve.lifecycle.guardrails import MIN_SLOW_JOBS, VersionRecord, breach, own_seconds
from radserve.store import init_store
from radserve.store.deployments import DeploymentStore


def test_canary_share_is_deterministic_and_close_to_the_percentage() -> None:
    d = StepDeployment(step="lesions", stable="1.0", canary="1.1", canary_percent=20)
    uids = [f"1.2.826.0.1.{i}" for i in range(2000)]
    first = [route(d, uid, PriorityClass.OUTPATIENT) for uid in uids]
    assert first == [route(d, uid, PriorityClass.OUTPATIENT) for uid in uids]
    share = sum(role is Role.CANARY for _, role in first) / len(uids)
    assert 0.17 < share < 0.23
    canary_uids = [u for u, (_, r) in zip(uids, first, strict=True) if r is Role.CANARY]
    assert all(route(d, u, PriorityClass.URGENT) == ("1.0", Role.STABLE) for u in canary_uids)
    urgent_too = StepDeployment(
        step="lesions", stable="1.0", canary="1.1", canary_percent=20, canary_urgent=True
    )
    assert route(urgent_too, canary_uids[0], PriorityClass.URGENT) == ("1.1", Role.CANARY)
    shadow = StepDeployment(step="lesions", stable="1.0", shadow="2.0", shadow_percent=50)
    sampled = [shadow_for(shadow, uid) for uid in uids]
    assert set(sampled) == {"2.0", None}
    assert 0.45 < sampled.count("2.0") / len(uids) < 0.55


def test_each_change_is_a_row_and_an_audit_record(tmp_path: Path) -> None:
    store = init_store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    deployments = DeploymentStore(store.engine)
    try:
        deployments.record(StepDeployment(step="lesions", stable="1.0", actor="k1", reason="a"))
        deployments.record(
            StepDeployment(
                step="lesions",
                stable="1.0",
                canary="1.1",
                canary_percent=20,
                actor="k1",
                reason="try 1.1",
            )
        )
        deployments.record(
            StepDeployment(step="organs", stable="2.0", action=DeploymentAction.PROMOTE, reason="b")
        )
        current = deployments.current()
        assert current["lesions"].canary == "1.1" and current["organs"].stable == "2.0"
        assert [d.reason for d in deployments.history("lesions")] == ["try 1.1", "a"]
        records = [r for r in store.iter_audit() if r.action == "model.changed"]
        assert [r.payload["event"] for r in records] == [
            "deployment.deploy",
            "deployment.deploy",
            "deployment.promote",
        ]
        assert records[1].actor_key_id == "k1" and records[1].payload["reason"] == "try 1.1"
        assert store.verify_audit().ok
    finally:
        store.close()


def _finding(label: str, at: tuple[float, float, float], diameter: float) -> dict[str, object]:
    return {"label": label, "centroid_mm": at, "longest_diameter_mm": diameter}


def test_lesion_agreement_by_size_stratum() -> None:
    serving = [
        _finding("liver_lesion", (0, 0, 0), 6),
        _finding("liver_lesion", (30, 0, 0), 15),
        _finding("liver_lesion", (60, 0, 0), 25),
    ]
    candidate = [_finding("liver_lesion", (1, 1, 0), 7), _finding("liver_lesion", (60, 3, 0), 24)]
    strata = lesion_agreement(serving, candidate)
    assert strata["<10mm"] == StratumAgreement(1, 0, 0)
    assert strata["10-20mm"] == StratumAgreement(0, 1, 0)
    assert strata[">=20mm"] == StratumAgreement(1, 0, 0)
    extra = lesion_agreement([], [_finding("lung_nodule", (0, 0, 0), 4)])
    assert extra["<10mm"] == StratumAgreement(0, 0, 1) and extra["<10mm"].agreement == 0.0


def _comparison(agreement: float) -> Comparison:
    both = round(agreement * 10)
    return Comparison(
        job_id="j",
        step="lesions",
        serving_version="1.1",
        candidate_version="1.0",
        candidate_role="stable",
        dice={"liver_lesion": agreement},
        lesions={"<10mm": StratumAgreement(both, 10 - both, 0)},
    )


def test_guardrails() -> None:
    limits = GuardrailSettings(min_studies=4, min_comparisons=3)
    canary, stable = VersionRecord("lesions", "1.1"), VersionRecord("lesions", "1.0")
    for ok in (True, True, True):
        canary.add_job(ok, 1.0)
        stable.add_job(ok, 1.0)
    assert breach(canary, stable, limits) is None
    canary.add_job(False, None)
    canary.add_job(False, None)
    assert "failure rate 40%" in (breach(canary, stable, limits) or "")
    slow = VersionRecord("lesions", "1.2")
    for _ in range(5):
        slow.add_job(True, 10.0, own=10.0)
        stable.add_job(True, 1.0, own=1.0)
    assert "p95 of its own step 10.00 s" in (breach(slow, stable, limits) or "")
    damaged = VersionRecord("lesions", "1.3")
    for _ in range(3):
        damaged.comparisons.append(_comparison(0.5))
    assert "lesion agreement with stable 50%" in (breach(damaged, stable, limits) or "")
    good = VersionRecord("lesions", "1.4")
    for _ in range(3):
        good.comparisons.append(_comparison(1.0))
    assert breach(good, stable, limits) is None


def test_a_canary_is_judged_on_its_own_step_and_the_load_it_shared_with_stable() -> None:
    """A canary's turnaround holds its wait in the queue: deployed into a burst, a good
    version looked many times slower than stable's quiet record and was rolled back."""
    limits = GuardrailSettings(min_studies=5, max_p95_ratio=3.0)
    timings = {"queue": 40.0, "ingest": 1.0, "lesions: infer": 2.0, "lesions: merge": 0.5}
    assert own_seconds(timings, "lesions") == 2.5
    assert own_seconds({"organs: infer": 1.0, "total": 3.0}, "lesions") is None
    stable, canary = VersionRecord("lesions", "1.0"), VersionRecord("lesions", "1.1")
    for i in range(20):  # quiet: stable alone, 3 s from arrival to finish
        stable.add_job(True, 3.0, own=2.5, at=float(i))
    for i in range(10):  # a burst: each canary job waits for the ones before it
        canary.add_job(True, 3.0 + 10.0 * i, own=2.5, at=100.0 + i)
    assert canary.p95() and stable.p95() and canary.p95() > 3 * stable.p95()
    assert breach(canary, stable, limits) is None
    # a version 4x slower at its own step is rolled back, against stable's latest jobs...
    slow = VersionRecord("lesions", "1.2")
    for i in range(5):
        slow.add_job(True, 12.0, own=10.0, at=200.0 + i)
    assert "stable's 2.50 s (its latest 5 jobs)" in (breach(slow, stable, limits) or "")
    # ...and against the jobs stable ran beside it when it ran enough of them: here on a
    # loaded host, where stable was as slow, the same canary is not
    for i in range(5):
        stable.add_job(True, 12.0, own=9.0, at=200.5 + i)
    assert breach(slow, stable, limits) is None
    for i in range(5):
        slow.add_job(True, 40.0, own=40.0, at=206.0 + i)
    assert "stable's 9.00 s (the same span)" in (breach(slow, stable, limits) or "")
    # the versions' records show both figures
    summary = canary.summary()
    assert summary["p95_step_seconds"] == 2.5 and summary["p95_seconds"] > 80


def test_one_slow_job_among_a_few_does_not_roll_a_canary_back() -> None:
    """Over five jobs a p95 is almost the slowest one: a single pause (a garbage
    collection, a neighbour's burst) rolled a good version back."""
    limits = GuardrailSettings(min_studies=5, max_p95_ratio=3.0)
    stable, canary = VersionRecord("lesions", "1.0"), VersionRecord("lesions", "1.1")
    for i in range(5):
        stable.add_job(True, 3.0, own=2.0, at=float(i))
    for i, own in enumerate([2.0, 2.1, 1.9, 2.0, 30.0]):
        canary.add_job(True, own + 1.0, own=own, at=10.0 + i)
    assert canary.own_p95() and canary.own_p95() > 3 * 2.0
    assert breach(canary, stable, limits) is None
    canary.add_job(True, 26.0, own=25.0, at=20.0)  # a second one: slow, not a pause
    assert "(2 of them slower) is over 3x stable's 2.00 s" in (breach(canary, stable, limits) or "")
    assert MIN_SLOW_JOBS == 2


def _classified(folder: Path, label: str, positive: bool) -> Path:
    """A result folder whose report holds one classification by the step ``bleed``."""
    folder.mkdir(parents=True)
    report = {
        "classifications": [{"model": "bleed", "label": label, "positive": positive}],
        "timings": {"total": 1.0},
    }
    (folder / "report.json").write_text(json.dumps(report))
    return folder


def test_a_classification_steps_answers_are_compared(tmp_path: Path) -> None:
    """A classification step writes no label map and no finding: before, its comparison
    held no Dice and no lesion agreement, so a candidate answering otherwise on every
    study passed every guardrail."""

    def compared(tmp: Path, serving: tuple[str, bool], candidate: tuple[str, bool]) -> bool | None:
        return compare_results(
            _classified(tmp / "serving", *serving),
            _classified(tmp / "candidate", *candidate),
            job_id="j",
            step="bleed",
            serving_version="1.0",
            candidate_version="1.1",
            candidate_role="shadow",
        ).answer_agrees

    assert compared(tmp_path / "a", ("bleed", True), ("bleed", True)) is True
    assert compared(tmp_path / "b", ("bleed", True), ("bleed", False)) is False
    comparison = compare_results(
        _classified(tmp_path / "c" / "serving", "bleed", True),
        _classified(tmp_path / "c" / "candidate", "bleed", True),
        job_id="j",
        step="lesions",  # another step: none of its answers in either report
        serving_version="1.0",
        candidate_version="1.1",
        candidate_role="shadow",
    )
    assert comparison.answer_agrees is None and comparison.mean_dice is None


def test_guardrails_roll_back_a_classifier_that_answers_otherwise() -> None:
    limits = GuardrailSettings(min_studies=4, min_comparisons=3)
    stable = VersionRecord("bleed", "1.0")

    def record(answers: list[bool]) -> VersionRecord:
        canary = VersionRecord("bleed", "1.1")
        for alike in answers:
            canary.comparisons.append(
                Comparison("j", "bleed", "1.1", "1.0", "stable", answer_agrees=alike)
            )
        return canary

    flipped = record([True, False, False])
    assert flipped.summary()["answer_agreement"] == pytest.approx(1 / 3)
    assert breach(flipped, stable, limits) == (
        "classification answers alike with stable on 33% of 3 studies, below 80%"
    )
    assert breach(record([True, True, True, True, False]), stable, limits) is None  # 80 %
    assert breach(record([False, False]), stable, limits) is None  # under min_comparisons
