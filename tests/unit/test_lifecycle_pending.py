"""Comparison runs waiting for an idle server: bounded per version, served in turn, so a
canary compared on every study cannot starve a shadow deployed beside it (CI, session
13: the shadow's comparisons never came when eight canary re-runs were already waiting)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

from tests.factories.records import job_record
from tests.factories.service import config_file

from radserve.config import load_settings
from radserve.domain.deployment import StepDeployment
from radserve.domain.priority import PriorityClass
from radserve.lifecycle.pending import FairPending
from radserve.service import Service
from radserve.service.intake import deployment_meta
from radserve.store import JobRecord


def test_each_key_is_bounded_and_the_keys_take_turns() -> None:
    pending: FairPending[str, str] = FairPending(per_key=2)
    assert [pending.put("canary", f"c{i}") for i in range(4)] == [True, True, False, False]
    assert pending.put("shadow", "s0") and pending.put("shadow", "s1")
    assert not pending.put("shadow", "s2")
    assert pending.waiting() == {"canary": 2, "shadow": 2}
    assert [pending.get(0) for _ in range(4)] == ["c0", "s0", "c1", "s1"]
    assert pending.get(0) is None  # nothing waiting, no wait
    assert pending.waiting() == {}


def test_a_key_that_comes_back_joins_the_end_of_the_line() -> None:
    pending: FairPending[str, int] = FairPending(per_key=8)
    for i in range(3):
        pending.put("a", i)
    pending.put("b", 10)
    assert pending.get(0) == 0  # a served, goes last
    pending.put("c", 20)
    assert [pending.get(0) for _ in range(4)] == [10, 1, 20, 2]


def test_close_wakes_a_waiting_consumer_and_refuses_more() -> None:
    pending: FairPending[str, int] = FairPending(per_key=1)
    got: list[int | None] = []
    consumer = threading.Thread(target=lambda: got.append(pending.get()))
    consumer.start()
    time.sleep(0.05)  # let it block
    pending.close()
    consumer.join(5)
    assert not consumer.is_alive() and got == [None]
    assert pending.put("a", 1) is False


def _finished(job_id: str, role: str, version: str, shadow: str, tmp: Path) -> JobRecord:
    return job_record(
        id=job_id,
        study_path=str(tmp / job_id / "study"),
        result_path=str(tmp / job_id / "result"),
        model_versions={"lesions-test": version},
        stage_timings={"total": 1.0},
        queue_meta={"deployment": {"lesions-test": role}, "shadows": {"lesions-test": shadow}},
    )


def test_a_busy_canary_does_not_crowd_out_the_shadows_comparisons(tmp_path: Path) -> None:
    settings = load_settings(
        config_file(tmp_path, lifecycle={"max_pending_comparisons": 3}),
        data_dir=tmp_path / "data",
    )
    lifecycle = Service(settings).lifecycle  # not started: the runs stay waiting
    for i in range(6):  # each canary study queues a stable re-run for the canary's record
        lifecycle.on_finished(_finished(f"c{i}", "canary", "1.1.0", "1.0.0", tmp_path))
    lifecycle.on_finished(_finished("h0", "stable", "1.0.0", "1.3.0", tmp_path))
    assert lifecycle._tasks.waiting() == {
        ("lesions-test", "1.1.0"): 3,
        ("lesions-test", "1.3.0"): 1,
    }
    assert lifecycle.skipped() == {("lesions-test", "1.1.0"): 3}
    first = [lifecycle._tasks.get(0) for _ in range(2)]
    assert [(t.job.id, t.candidate_version, t.candidate_role) for t in first if t] == [
        ("c0", "1.0.0", "stable"),
        ("h0", "1.3.0", "shadow"),
    ]


def test_a_canary_study_sampled_for_the_shadow_feeds_both_records(tmp_path: Path) -> None:
    """Canary 100 % and shadow 100 %: each study runs the canary, is compared with the
    stable for the canary's record and with the shadow for the shadow's. Before, the
    shadow took the stable's place: its comparison was filed in the canary's record as
    one against the stable (the canary judged on the shadow's differences), and the
    shadow's record never got it (CI: the shadow's comparisons never came, ~1 run in 20,
    when both shadow studies of tests/e2e/test_model_lifecycle.py fell in the canary)."""
    settings = load_settings(config_file(tmp_path), data_dir=tmp_path / "data")
    lifecycle = Service(settings).lifecycle  # not started: the runs stay waiting
    step = "lesions-test"
    both = StepDeployment(
        step, "1.0.0", canary="1.1.0", canary_percent=100, shadow="1.3.0", shadow_percent=100
    )
    with lifecycle._lock:
        lifecycle._active = {step: both}
    resolved = lifecycle.route(lifecycle.catalog.resolve(), "1.2.3.4", PriorityClass.OUTPATIENT)
    assert resolved.model_versions[step] == "1.1.0" and resolved.roles[step] == "canary"
    meta = deployment_meta(resolved)
    assert meta["shadows"] == {step: "1.3.0"} and meta["canary_checks"] == {step: "1.0.0"}
    job = replace(_finished("j0", "canary", "1.1.0", "unused", tmp_path), queue_meta=meta)
    lifecycle.on_finished(job)
    assert lifecycle._tasks.waiting() == {(step, "1.1.0"): 1, (step, "1.3.0"): 1}
    tasks = sorted(
        (t.record_for, t.candidate_version, t.candidate_role)
        for t in (lifecycle._tasks.get(0), lifecycle._tasks.get(0))
        if t is not None
    )
    assert tasks == [("1.1.0", "1.0.0", "stable"), ("1.3.0", "1.3.0", "shadow")]

    # a stable study sampled for the shadow: one comparison, the shadow's; an empty
    # canary_checks says this row is not an older one (whose one map held both)
    stable_only = replace(both, canary=None, canary_percent=0)
    with lifecycle._lock:
        lifecycle._active = {step: stable_only}
    resolved = lifecycle.route(lifecycle.catalog.resolve(), "1.2.3.4", PriorityClass.OUTPATIENT)
    meta = deployment_meta(resolved)
    assert meta == {
        "deployment": {step: "stable"},
        "shadows": {step: "1.3.0"},
        "canary_checks": {},
    }
