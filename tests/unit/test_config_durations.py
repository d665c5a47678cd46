"""Every duration setting is bounded above by a year: Python's waits, socket timeouts and
datetimes overflow long before the largest finite float, so a duration of 1e300 s killed
the thread that waited on it (``threading.Event.wait`` raises OverflowError) or ended
in a traceback (``radserve gateway echo --timeout 1e300``: tests/unit/test_cli_numbers.py)."""

from __future__ import annotations

import threading

import pytest

from radserve.config import MAX_DURATION_S, ConfigError, load_settings, number_settings

DURATIONS = sorted((s.path, s.unit_s, s.kind) for s in number_settings() if s.unit_s is not None)


def test_the_walk_finds_the_durations() -> None:
    paths = {path for path, _, _ in DURATIONS}
    named = {"fhir.timeout_s", "scheduler.tat_s.urgent", "lifecycle.drift.stale_window_days"}
    assert named <= paths
    assert "scheduler.max_queue_delay_ms" in paths and "server.min_body_rate_bytes_s" not in paths
    assert "scheduler.default_retry_after_s" in paths  # an int, at most a day
    assert len(paths) > 40


@pytest.mark.parametrize(("path", "unit_s", "kind"), DURATIONS)
def test_every_duration_is_refused_over_a_year_with_its_name(
    path: str, unit_s: float, kind: type
) -> None:
    key = path.replace(".", "__")
    # a wait on a peer, a retry or poll interval says its own range (test_config_peer_bounds)
    refused = rf"'{path}'.*(over a year|less than|must be from [0-9.]+ to [0-9.]+ s)"
    with pytest.raises(ConfigError, match=refused):
        load_settings(None, **{key: 1e300 if kind is float else 10**18})
    over = kind((MAX_DURATION_S + 86_400) / unit_s)
    with pytest.raises(ConfigError, match=rf"'{path}'"):
        load_settings(None, **{key: over})


def test_a_year_itself_is_taken_and_waits_on_it() -> None:
    settings = load_settings(None, jobs__lease_s=MAX_DURATION_S, jobs__timeout_s=1e6)
    assert settings.jobs.lease_s == MAX_DURATION_S
    assert MAX_DURATION_S < threading.TIMEOUT_MAX  # a thread can wait that long
    with pytest.raises(OverflowError):  # what 1e300 did to the waiting thread
        threading.Event().wait(1e300)
