"""A study whose association was cut off (abort, or the server died while receiving it)
waits ``interrupted_quiet_s`` for its sender instead of ``quiet_s``; a normal release of
a later association delivering it ends the interruption. Fake clock, no sleeps."""

from __future__ import annotations

from pathlib import Path

from radserve.gateway.completeness import (
    INTERRUPTED_MARKER,
    RECEIVING_PREFIX,
    CompletedStudy,
    StudyTracker,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _tracker() -> tuple[StudyTracker, Clock, list[CompletedStudy]]:
    clock, handed = Clock(), []
    tracker = StudyTracker(handed.append, quiet_s=10, interrupted_quiet_s=300, clock=clock)
    return tracker, clock, handed


def _arrive(tracker: StudyTracker, folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.dcm").write_bytes(b"x")
    tracker.arrived(folder.name, folder)


def test_cut_off_study_waits_for_its_sender_and_a_release_ends_the_wait(tmp_path: Path) -> None:
    tracker, clock, _ = _tracker()
    folder = tmp_path / "incoming" / "1.2.3"
    _arrive(tracker, folder, "1")
    tracker.interrupted("1.2.3")
    clock.now += 60
    assert tracker.poll() == [] and tracker.next_due_in() == 240
    _arrive(tracker, folder, "2")  # the sender resumes ...
    tracker.resumed("1.2.3")  # ... and releases its association normally
    clock.now += 10
    [study] = tracker.poll()
    assert len(study.instances) == 2 and not study.interrupted


def test_sender_that_never_resumes_hands_the_study_over_marked(tmp_path: Path) -> None:
    tracker, clock, _ = _tracker()
    folder = tmp_path / "incoming" / "1.2.3"
    _arrive(tracker, folder, "1")
    (folder / INTERRUPTED_MARKER).touch()
    tracker.interrupted("1.2.3")
    clock.now += 299
    assert tracker.poll() == []
    clock.now += 1
    [study] = tracker.poll()
    assert study.interrupted
    assert not (folder / INTERRUPTED_MARKER).exists()


def test_restart_after_a_crash_mid_association_waits_again(tmp_path: Path) -> None:
    incoming = tmp_path / "incoming"
    cut = incoming / "1.1.1"
    cut.mkdir(parents=True)
    (cut / "1.dcm").write_bytes(b"x")
    (cut / f"{RECEIVING_PREFIX}abc").touch()  # the association was open at the crash
    calm = incoming / "2.2.2"
    calm.mkdir()
    (calm / "1.dcm").write_bytes(b"x")
    tracker, clock, _ = _tracker()
    assert tracker.recover(incoming) == 2
    assert not list(cut.glob(f"{RECEIVING_PREFIX}*")) and (cut / INTERRUPTED_MARKER).exists()
    clock.now += 10
    assert [s.study_instance_uid for s in tracker.poll()] == ["2.2.2"]
    again, clock2, _ = _tracker()  # a second restart still knows it was cut off
    assert again.recover(incoming) == 1
    clock2.now += 299
    assert again.poll() == []
    clock2.now += 1
    [study] = again.poll()
    assert study.study_instance_uid == "1.1.1" and study.interrupted


def test_an_open_association_holds_its_study_until_it_is_released(tmp_path: Path) -> None:
    """Gaps longer than quiet_s inside one open association (a loaded server, a modality
    sending as it reconstructs) do not complete the study; the release starts the quiet
    period, and the study is handed over once, whole and not marked."""
    tracker, clock, _ = _tracker()
    folder = tmp_path / "incoming" / "1.2.3"
    folder.mkdir(parents=True)
    association = object()
    for i in range(3):
        (folder / f"{i}.dcm").write_bytes(b"x")
        tracker.arrived("1.2.3", folder, association=association)
        clock.now += 60  # six quiet periods between instances
        assert tracker.poll() == []
    tracker.resumed("1.2.3", association)  # released: quiet from now
    clock.now += 9
    assert tracker.poll() == []
    clock.now += 1
    [study] = tracker.poll()
    assert len(study.instances) == 3 and not study.interrupted


def test_an_open_association_holds_its_study_at_most_the_interrupted_wait(
    tmp_path: Path,
) -> None:
    tracker, clock, _ = _tracker()
    folder = tmp_path / "incoming" / "1.2.3"
    _arrive(tracker, folder, "1")
    tracker.arrived("1.2.3", folder, association="assoc-1")
    clock.now += 299
    assert tracker.poll() == []
    clock.now += 1
    [study] = tracker.poll()  # the sender never released nor aborted: not held for ever
    assert len(study.instances) == 1


def test_an_abort_after_the_last_instance_marks_the_study_whatever_the_delay(
    tmp_path: Path,
) -> None:
    """The abort may reach the tracker long after the last instance (a loaded server):
    the study was not handed over meanwhile, so it is marked interrupted."""
    tracker, clock, _ = _tracker()
    folder = tmp_path / "incoming" / "1.2.3"
    _arrive(tracker, folder, "1")
    tracker.arrived("1.2.3", folder, association="assoc-1")
    clock.now += 30  # three quiet periods before the abort is seen
    assert tracker.poll() == []
    tracker.interrupted("1.2.3", "assoc-1")
    clock.now += 270
    [study] = tracker.poll()
    assert study.interrupted
