"""map_labels: label-by-label work on a thread pool keeps the serial contract."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from tests.factories.findings import label, spec

from radserve.checkpoints import yielding_to
from radserve.postprocess.components import clean_label_map
from radserve.postprocess.labelwise import map_labels


def test_results_come_back_in_item_order_whatever_starts_first() -> None:
    started: list[int] = []

    def square(x: int) -> int:
        started.append(x)
        return x * x

    assert map_labels(square, [1, 2, 3, 4], threads=1, weight=lambda x: x) == [1, 4, 9, 16]
    assert started == [1, 2, 3, 4]  # one thread: the items' order, weights unused
    assert map_labels(square, [1, 2, 3, 4], threads=2, weight=lambda x: x) == [1, 4, 9, 16]


def test_a_failing_item_raises_on_the_caller() -> None:
    def fail_on_two(x: int) -> int:
        if x == 2:
            raise ValueError("label 2 could not be cleaned")
        return x

    with pytest.raises(ValueError, match="label 2 could not be cleaned"):
        map_labels(fail_on_two, [1, 2, 3], threads=2)


def test_a_routine_clean_up_still_yields_to_urgent_work_on_the_pool_threads() -> None:
    """The scheduler's waiter (a routine job's checkpoint) is called for every label,
    on the pool's threads, as it was on the caller's."""
    a = np.zeros((8, 16, 16), np.uint8)
    a[1:4, 1:5, 1:5] = 1
    a[6, 14, 14] = 1  # a speck of organ 1
    a[2:5, 8:12, 8:12] = 2
    a[5:7, 1:4, 10:14] = 3
    organs = spec([label(v, f"organ{v}") for v in (1, 2, 3)], min_component_ml=0.002)
    seen: list[str] = []
    lock = threading.Lock()

    def waiter() -> None:
        with lock:
            seen.append(threading.current_thread().name)

    with yielding_to(waiter):
        cleaned = clean_label_map(a, organs, 1e-3, threads=2)
    assert cleaned.labels[6, 14, 14] == 0
    assert len(seen) == 3 and all(name.startswith("radserve-labels") for name in seen)


def test_label_boxes_found_in_slabs_on_threads_are_the_boxes_of_one_pass() -> None:
    from radserve.preprocess.crop import label_bboxes

    rng = np.random.default_rng(3)
    a = np.zeros((37, 20, 24), np.uint8)
    a.reshape(-1)[rng.integers(0, a.size, 80)] = rng.integers(1, 6, 80).astype(np.uint8)
    a[5:30, 2:9, 3:4] = 7  # one label across every slab
    one = label_bboxes(a, 8)  # value 6 and 8 absent: None
    assert one[5] is None and one[7] is None and one[6] is not None
    for threads in (2, 3, 5, 64):
        assert label_bboxes(a, 8, threads=threads) == one
