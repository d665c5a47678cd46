"""Waits on peers and retry/poll intervals have both ends bounded, refused at start in one
``config_invalid`` line naming the setting and the range it takes.

Before: a critical receiver with ``timeout_s`` of a year that never answered held its
lane with the row ``sending`` and no error anywhere, and ``retry_first_s: 5e-324``
retried a down receiver ~15 times a second, each attempt a warning line. Every setting
named as a timeout, a retry wait or a poll interval must say which range it takes (or
be listed below with why not), so a new one cannot slip past."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from tests.factories.server_process import run_radserve

from radserve.config import (
    PEER_TIMEOUT,
    POLL_INTERVAL,
    RETRY_INTERVAL,
    ConfigError,
    SecondsRange,
    load_settings,
    number_settings,
)

# timeouts that are no wait on a peer's answer, each bounded by a year as every duration
NOT_PEER_TIMEOUTS = {
    "server.request_timeout_s": "the API's own limit on a request it serves",
    "jobs.timeout_s": "a job's whole run time",
    "ray.batch_timeout_s": "a worker's run of one batch",
    "ray.startup_timeout_s": "the cluster's start",
    "storage.probe_timeout_s": "a write to the local data folder",
    "gateway.commitment_timeout_s": "an asynchronous report that may come hours later",
    "console.idle_timeout_s": "a signed-in session's idle time",
}
# 0 means "every record" (a checkpoint per audit record), by design
NOT_POLL_INTERVALS = {"audit.checkpoint_interval_s"}


def range_of(path: str) -> SecondsRange | None:
    setting = next(s for s in number_settings() if s.path == path)
    return next((m for m in setting.field.metadata if isinstance(m, SecondsRange)), None)


def expected_range(path: str) -> SecondsRange | None:
    leaf = path.rsplit(".", 1)[-1]
    if leaf.endswith("timeout_s") and path not in NOT_PEER_TIMEOUTS:
        return PEER_TIMEOUT
    if leaf in ("retry_first_s", "retry_max_s"):
        return RETRY_INTERVAL
    if (leaf.endswith("poll_s") or leaf.endswith("interval_s")) and path not in NOT_POLL_INTERVALS:
        return POLL_INTERVAL
    return None


PATHS = sorted(s.path for s in number_settings() if s.unit_s is not None)
BOUNDED = [p for p in PATHS if expected_range(p) is not None]


def test_every_timeout_retry_and_poll_setting_has_its_range() -> None:
    wrong = {p: range_of(p) for p in PATHS if range_of(p) != expected_range(p)}
    assert wrong == {}
    assert {"fhir.timeout_s", "critical.retry_first_s", "gateway.dimse_timeout_s"} <= set(BOUNDED)
    assert "turnaround.risk_syslog.timeout_s" in BOUNDED  # a critical syslog receiver's too


@pytest.mark.parametrize("path", BOUNDED)
def test_out_of_range_is_refused_naming_the_setting_and_the_range(path: str) -> None:
    bounds = range_of(path)
    assert bounds is not None
    key = path.replace(".", "__")
    extra = {"audit__syslog__host": "127.0.0.1"} if path.startswith("audit.syslog.") else {}
    if path.startswith("turnaround.risk_syslog."):
        extra = {"turnaround__risk_syslog__host": "127.0.0.1"}
    words = rf"'{path}': .*must be from {bounds.low_s:g} to {bounds.high_s:g} s"
    for wrong in (bounds.high_s * 1.01, bounds.low_s / 2, 5e-324, 366 * 86_400.0):
        with pytest.raises(ConfigError, match=words):
            load_settings(None, **extra, **{key: wrong})
    for right in (bounds.low_s, bounds.high_s):
        # a back-off's first wait and cap go together (first <= cap)
        section = key.rsplit("__", 1)[0]
        pair = {f"{section}__{leaf}": right for leaf in ("retry_first_s", "retry_max_s")}
        values = {**extra, **(pair if "__retry_" in key else {}), key: right}
        assert load_settings(None, **values) is not None


def write(tmp_path: Path, config: dict[str, object]) -> Path:
    path = tmp_path / "radserve.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_critical_receiver_waiting_a_year_is_refused_at_start(tmp_path: Path) -> None:
    """The receivers are a list (no walk above reaches them): the reported case, through
    ``radserve serve`` as a site starts it."""
    receiver = {"name": "ward", "url": "http://127.0.0.1:9/hook", "timeout_s": 366 * 86_400}
    config = write(
        tmp_path,
        {"data_dir": str(tmp_path / "data"), "critical": {"receivers": [receiver]}},
    )
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("RADSERVE_")}
    done = run_radserve("serve", "--config", str(config), env={**clean, "COLUMNS": "400"})
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error [config_invalid]: "), line
    assert "'critical.receivers.0.timeout_s'" in line and "must be from 0.1 to 300 s" in line


@pytest.mark.parametrize("kind", ["webhook", "syslog", "fhir"])
def test_every_receiver_kind_takes_only_a_bounded_timeout(kind: str) -> None:
    receiver: dict[str, object] = {"name": "r", "kind": kind, "timeout_s": 1e6}
    receiver |= {"host": "127.0.0.1"} if kind == "syslog" else {"url": "http://127.0.0.1:9/"}
    with pytest.raises(ConfigError, match=r"'critical.receivers.0.timeout_s'.*0.1 to 300 s"):
        load_settings(None, critical={"receivers": [receiver]})
    receiver["timeout_s"] = 300
    assert load_settings(None, critical={"receivers": [receiver]}).critical.receivers


def test_retry_intervals_below_the_floor_are_refused() -> None:
    """The reported case: 5e-324 s between attempts to a down receiver."""
    with pytest.raises(ConfigError, match=r"'critical.retry_first_s'.*0.1 to 86400 s"):
        load_settings(None, critical__retry_first_s=5e-324, critical__retry_max_s=5e-324)
