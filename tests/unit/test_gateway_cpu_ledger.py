"""The receiving CPU ledger: each section adds the CPU its own thread spent inside it,
whatever other threads do meanwhile, and the bench's bound is cores x 1000 / CPU-ms."""

from __future__ import annotations

import threading
import time

import pytest

from radserve.bench.cstore import cpu_bound
from radserve.gateway.cpu_ledger import SECTIONS, CpuLedger


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_section_counts_its_threads_cpu_not_time_asleep() -> None:
    ledger = CpuLedger()
    with ledger.section("parse"):
        _spin(0.02)
        time.sleep(0.05)  # waiting is not CPU
    spent = ledger.snapshot()
    assert 0.02 <= spent["parse"] < 0.05
    assert all(spent[name] == 0.0 for name in SECTIONS if name != "parse")


def test_sections_from_several_threads_add_up() -> None:
    ledger = CpuLedger()

    def work() -> None:
        with ledger.section("durable"):
            _spin(0.01)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ledger.snapshot()["durable"] >= 0.04


def test_a_section_that_raises_is_still_counted() -> None:
    ledger = CpuLedger()
    with pytest.raises(RuntimeError, match="refused"), ledger.section("handler"):
        _spin(0.01)
        raise RuntimeError("refused")
    assert ledger.snapshot()["handler"] >= 0.01


def test_the_cpu_bound_is_what_the_cores_allow() -> None:
    bound = cpu_bound(2, 5.0, 1.0)
    assert bound is not None and bound * (5.0 + 1.0) == pytest.approx(2 * 1000)
    assert cpu_bound(4, 5.0, 1.0) == pytest.approx(2 * bound)
    assert cpu_bound(2, 0.0, 0.0) is None
