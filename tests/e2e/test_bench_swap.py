"""``radserve bench --scenario swap`` at its smallest (issue 14): a real spawned server,
steady submissions and status reads, the lesions step swapped to another shipped
version mid-run. No request and no job may fail; jobs submitted after the swap run the
new version; the straddling figure is reported (never asserted: the host is shared)."""

from __future__ import annotations

import pytest

from radserve.bench.swap import run_swap_bench

pytestmark = pytest.mark.slow


def test_swap_under_load_fails_nothing() -> None:
    summary = run_swap_bench(n_studies=4, interval_s=1.0, readers=2, log=lambda _: None)
    swap = summary["swap"]
    assert swap["deploy_status"] == 200 and swap["from"] != swap["to"]
    assert summary["failed_requests"] == 0, summary["requests"]
    assert summary["failed_jobs"] == 0, summary["jobs"]
    reads = sum(v for k, v in summary["requests"].items() if k == "200")
    assert reads > summary["studies"]  # the status readers ran throughout
    jobs = summary["jobs"]
    assert [j["version"] for j in jobs[:2]] == [swap["from"]] * 2  # bound at submission
    assert [j["version"] for j in jobs[2:]] == [swap["to"]] * 2
    assert summary["median_other_service_s"] is not None
    print("\nswap:", {k: summary[k] for k in ("straddling_jobs", "added_latency_s")})
