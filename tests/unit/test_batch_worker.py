"""BatchWorker: what waits while a round runs goes in the next round, together; closing
hands over everything queued and refuses the rest."""

from __future__ import annotations

import threading

from radserve.batch_worker import BatchWorker


def test_items_queued_during_a_round_share_the_next_and_close_drains() -> None:
    rounds: list[list[int]] = []
    first_round_started = threading.Event()
    release_first_round = threading.Event()

    def handle(batch: list[int]) -> None:
        rounds.append(batch)
        if len(rounds) == 1:
            first_round_started.set()
            release_first_round.wait(10)

    worker: BatchWorker[int] = BatchWorker(handle, name="test-batch")
    assert worker.put(0)
    assert first_round_started.wait(10)
    for item in range(1, 6):  # all while round 1 is held: they wait together
        assert worker.put(item)
    release_first_round.set()
    worker.close(10)
    assert rounds == [[0], [1, 2, 3, 4, 5]]
    assert not worker.put(6)  # closed: refused, never handled
    assert rounds == [[0], [1, 2, 3, 4, 5]]


def test_close_with_nothing_queued_ends_the_thread() -> None:
    worker: BatchWorker[int] = BatchWorker(lambda batch: None, name="test-idle")
    worker.close(10)
    assert not worker._thread.is_alive()
