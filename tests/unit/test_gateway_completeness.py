"""Study completeness on a fake clock: quiet period, split associations, late instances,
failing intake and restart recovery — no sleeps."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from radserve.gateway.completeness import (
    HANDOVER_MARKER,
    INTERRUPTED_MARKER,
    RECEIVING_PREFIX,
    CompletedStudy,
    CompletionKind,
    LatePolicy,
    StudyTracker,
    receiving_token,
)
from radserve.store.errors import DatabaseUnavailableError

STUDY = "1.2.3.4"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _tracker(tmp_path: Path, **kwargs) -> tuple[StudyTracker, Clock, list[CompletedStudy]]:
    clock = Clock()
    handed: list[CompletedStudy] = []
    tracker = StudyTracker(handed.append, quiet_s=10.0, clock=clock, **kwargs)
    return tracker, clock, handed


def _arrive(tracker: StudyTracker, folder: Path, sop: str, *, new: bool = True) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{sop}.dcm").write_bytes(b"x")
    tracker.arrived(STUDY, folder, calling_ae="PACS", new=new)


def test_study_completes_once_after_the_quiet_period(tmp_path: Path) -> None:
    tracker, clock, handed = _tracker(tmp_path)
    folder = tmp_path / STUDY
    _arrive(tracker, folder, "1.1")
    _arrive(tracker, folder, "1.2")
    clock.now += 9.9
    assert tracker.poll() == [] and tracker.pending() == [STUDY]
    assert tracker.next_due_in() == pytest.approx(0.1)
    clock.now += 0.1
    [study] = tracker.poll()
    assert study.kind is CompletionKind.COMPLETE and study.generation == 1
    assert [p.name for p in study.instances] == ["1.1.dcm", "1.2.dcm"]
    assert study.new_instances == 2 and study.calling_ae_titles == ("PACS",)
    clock.now += 100
    assert tracker.poll() == [] and handed == [study] and tracker.pending() == []


def test_a_second_association_within_the_quiet_period_extends_the_study(tmp_path: Path) -> None:
    """Association release is not completeness: a PACS may send 1 + 9 instances."""
    tracker, clock, handed = _tracker(tmp_path)
    folder = tmp_path / STUDY
    _arrive(tracker, folder, "1.1")  # first association, then released
    clock.now += 8
    assert tracker.poll() == []
    for k in range(9):  # second association
        _arrive(tracker, folder, f"2.{k}")
    clock.now += 9
    assert tracker.poll() == []
    clock.now += 1
    [study] = tracker.poll()
    assert len(study.instances) == 10 and handed == [study]


@pytest.mark.parametrize(
    ("policy", "kind"),
    [(LatePolicy.RERUN, CompletionKind.RERUN), (LatePolicy.FLAG, CompletionKind.LATE_FLAGGED)],
)
def test_late_instances_follow_the_policy(tmp_path: Path, policy, kind) -> None:
    tracker, clock, handed = _tracker(tmp_path, late_policy=policy)
    folder = tmp_path / STUDY
    _arrive(tracker, folder, "1.1")
    clock.now += 10
    tracker.poll()
    clock.now += 3600
    _arrive(tracker, folder, "1.2")
    clock.now += 10
    [late] = tracker.poll()
    assert late.kind is kind and late.generation == 2
    assert late.new_instances == 1 and len(late.instances) == 2
    assert [s.generation for s in handed] == [1, 2]


def test_duplicates_keep_an_open_study_open_but_do_not_reopen_a_finished_one(
    tmp_path: Path,
) -> None:
    tracker, clock, handed = _tracker(tmp_path)
    folder = tmp_path / STUDY
    _arrive(tracker, folder, "1.1")
    clock.now += 9
    tracker.arrived(STUDY, folder, new=False)  # resent by the PACS: still sending
    clock.now += 9
    assert tracker.poll() == []
    clock.now += 1
    assert len(tracker.poll()) == 1
    tracker.arrived(STUDY, folder, new=False)
    clock.now += 60
    assert tracker.poll() == [] and len(handed) == 1


def test_quarantined_objects_keep_a_study_open_without_opening_one(tmp_path: Path) -> None:
    tracker, clock, _ = _tracker(tmp_path)
    tracker.touch("9.9.9")
    assert tracker.pending() == []
    _arrive(tracker, tmp_path / STUDY, "1.1")
    clock.now += 9
    tracker.touch(STUDY)
    clock.now += 9
    assert tracker.poll() == []
    clock.now += 1
    assert len(tracker.poll()) == 1


def test_failing_intake_is_retried_later_and_keeps_arrivals(tmp_path: Path) -> None:
    clock = Clock()
    calls: list[CompletedStudy] = []

    def intake(study: CompletedStudy) -> None:
        calls.append(study)
        if len(calls) == 1:
            raise RuntimeError("database down")

    tracker = StudyTracker(intake, quiet_s=10.0, clock=clock)
    folder = tmp_path / STUDY
    _arrive(tracker, folder, "1.1")
    clock.now += 10
    assert tracker.poll() == [] and tracker.pending() == [STUDY]
    assert not (folder / HANDOVER_MARKER).exists()
    _arrive(tracker, folder, "1.2")  # arrives while intake is failing
    clock.now += 19
    assert tracker.poll() == []  # back-off: 20 s after the failure
    clock.now += 1
    [study] = tracker.poll()
    assert study.generation == 1 and study.new_instances == 2 and len(study.instances) == 2
    assert (folder / HANDOVER_MARKER).is_file()


def test_a_database_outage_is_retried_often_enough_to_end_soon_after_it(
    tmp_path: Path,
) -> None:
    # the back-off doubles from the quiet period, but for a refusal by a database outage
    # it stops at 15 s (not 300 s): the acknowledged study gets its job soon after
    clock, calls = Clock(), []

    def intake(study: CompletedStudy) -> None:
        calls.append(clock.now)
        if len(calls) <= 6:
            raise DatabaseUnavailableError("database unavailable: connection refused")

    tracker = StudyTracker(intake, quiet_s=10.0, clock=clock)
    _arrive(tracker, tmp_path / STUDY, "1.1")
    handed: list[CompletedStudy] = []
    for _ in range(200):
        clock.now += 1
        handed += tracker.poll()
    assert len(handed) == 1
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert gaps == [15.0] * 6, gaps


def test_recover_reopens_studies_not_handed_over(tmp_path: Path) -> None:
    incoming = tmp_path / "incoming"
    first, clock, _ = _tracker(tmp_path)
    done = incoming / "1.1.1"
    _arrive(first, done, "5.1")
    clock.now += 10
    first.poll()
    waiting = incoming / "2.2.2"
    waiting.mkdir(parents=True)
    (waiting / "6.1.dcm").write_bytes(b"x")
    (done / "5.2.dcm").write_bytes(b"x")  # arrived after the hand-over, before a crash

    second, clock2, _ = _tracker(tmp_path)
    assert second.recover(incoming) == 2
    clock2.now += 10
    by_uid = {s.study_instance_uid: s for s in second.poll()}
    assert by_uid["2.2.2"].kind is CompletionKind.COMPLETE
    assert by_uid["1.1.1"].kind is CompletionKind.RERUN and by_uid["1.1.1"].generation == 2
    third, _, _ = _tracker(tmp_path)
    assert third.recover(incoming) == 0


def test_rescan_after_a_receiver_died_reopens_unreported_studies_and_spares_live_ones(
    tmp_path: Path,
) -> None:
    """gateway.receivers: a receiving process died after storing (its report lost);
    another still receives a study (its receiving marker must stay)."""
    incoming = tmp_path / "incoming"
    tracker, clock, _ = _tracker(tmp_path)
    live = incoming / "3.3.3"
    live.mkdir(parents=True)
    (live / "7.1.dcm").write_bytes(b"x")
    tracker.arrived("3.3.3", live, association="open")  # reported: open already
    marker = live / f"{RECEIVING_PREFIX}{receiving_token()}"
    marker.touch()
    lost = incoming / "4.4.4"
    lost.mkdir(parents=True)
    (lost / "8.1.dcm").write_bytes(b"x")  # stored and acknowledged, never reported
    assert tracker.recover(incoming, others_receiving=True) == 1
    assert marker.exists() and not (live / INTERRUPTED_MARKER).exists()
    assert tracker.pending() == ["3.3.3", "4.4.4"]
    clock.now += 10
    assert {s.study_instance_uid for s in tracker.poll()} == {"3.3.3", "4.4.4"}


@pytest.mark.parametrize("activity", ["refusal", "duplicate"])
def test_refusals_keep_a_study_open_only_so_long(tmp_path: Path, activity: str) -> None:
    """A sender that retries a refused instance more often than the quiet period keeps
    the study open at most ``max_extension_s`` after its last new instance, then it is
    handed over. Before, it stayed open for as long as the retries went on: the study's
    job never started. Re-sent instances still keep it open (a sender resuming a study
    re-sends it from its start)."""
    tracker, clock, handed = _tracker(tmp_path)
    folder = tmp_path / STUDY
    _arrive(tracker, folder, "1.1")
    assert tracker.max_extension_s == 60.0  # six quiet periods, at least a minute
    for _ in range(30):  # every 5 s for 150 s
        clock.now += 5
        if activity == "refusal":
            tracker.touch(STUDY)
        else:
            _arrive(tracker, folder, "1.1", new=False)
        if tracker.poll():
            break
    if activity == "duplicate":
        assert handed == [] and tracker.pending() == [STUDY]
        return
    [study] = handed
    # the last extension counted at 60 s after the instance, then one quiet period
    assert 70.0 <= clock.now - 1000.0 <= 75.0 and study.new_instances == 1


def test_a_new_instance_renews_the_extension(tmp_path: Path) -> None:
    """Refusals between new instances (a study whose second series is refused as it
    goes) do not cut the study short: each new instance starts the bound again."""
    tracker, clock, handed = _tracker(tmp_path)
    folder = tmp_path / STUDY
    for k in range(20):  # 100 s of a study: a new instance, a refusal, every 5 s
        _arrive(tracker, folder, f"1.{k}")
        clock.now += 2.5
        tracker.touch(STUDY)
        clock.now += 2.5
        assert tracker.poll() == []
    clock.now += 10.0
    [study] = tracker.poll()
    assert study.new_instances == 20 and handed == [study]
