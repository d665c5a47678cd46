"""A study handed over while an association that delivered it is still open is marked
maybe-incomplete, as a cut-off one is. Before, a sender that sent 3 slices and then only
C-ECHOs (or half a data set and then silence) had its study handed over unmarked after
``interrupted_quiet_s``, and an abort after the hand-over changed nothing. Fake clock."""

from __future__ import annotations

from pathlib import Path

from radserve.gateway.completeness import CompletedStudy, StudyTracker

STUDY = "1.2.3"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _tracker() -> tuple[StudyTracker, Clock, list[CompletedStudy]]:
    clock, handed = Clock(), []
    tracker = StudyTracker(handed.append, quiet_s=10, interrupted_quiet_s=300, clock=clock)
    return tracker, clock, handed


def _arrive(tracker: StudyTracker, folder: Path, name: str, association: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.dcm").write_bytes(b"x")
    tracker.arrived(STUDY, folder, calling_ae="MODALITY", association=association)


def test_a_hand_over_while_the_delivering_association_is_open_marks_the_study(
    tmp_path: Path,
) -> None:
    tracker, clock, _ = _tracker()
    folder = tmp_path / STUDY
    for i in range(3):
        _arrive(tracker, folder, str(i), "assoc-1")
    clock.now += 300  # then only C-ECHOs: the association stays open
    [study] = tracker.poll()
    assert study.interrupted and len(study.instances) == 3
    # the abort (or time-out) that ends the association afterwards: nothing left to mark,
    # nothing reopened, no second hand-over
    tracker.interrupted(STUDY, "assoc-1")
    clock.now += 1000
    assert tracker.poll() == [] and tracker.pending() == []


def test_one_open_association_of_two_is_enough_to_mark_it(tmp_path: Path) -> None:
    tracker, clock, _ = _tracker()
    folder = tmp_path / STUDY
    _arrive(tracker, folder, "1", "released")
    _arrive(tracker, folder, "2", "still-open")
    tracker.resumed(STUDY, "released")
    clock.now += 300
    [study] = tracker.poll()
    assert study.interrupted


def test_a_study_whose_associations_were_released_is_not_marked(tmp_path: Path) -> None:
    tracker, clock, _ = _tracker()
    folder = tmp_path / STUDY
    _arrive(tracker, folder, "1", "assoc-1")
    clock.now += 60
    tracker.resumed(STUDY, "assoc-1")
    clock.now += 10
    [study] = tracker.poll()
    assert not study.interrupted


def test_a_failed_hand_over_is_marked_again_only_while_the_association_is_open(
    tmp_path: Path,
) -> None:
    calls: list[CompletedStudy] = []

    def intake(study: CompletedStudy) -> None:
        calls.append(study)
        if len(calls) == 1:
            raise RuntimeError("intake down")

    clock = Clock()
    tracker = StudyTracker(intake, quiet_s=10, interrupted_quiet_s=300, clock=clock)
    folder = tmp_path / STUDY
    _arrive(tracker, folder, "1", "assoc-1")
    clock.now += 300
    assert tracker.poll() == [] and calls[0].interrupted  # offered marked, then failed
    tracker.resumed(STUDY, "assoc-1")  # the sender released meanwhile
    clock.now += 1000
    [study] = tracker.poll()
    assert not study.interrupted
