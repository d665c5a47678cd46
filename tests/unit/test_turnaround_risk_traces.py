"""The deadline-risk alerts replayed over the sixteen kept traces (session 20): the
server's walk, each ended job's predicted finishes fed to :class:`RiskTracker` under the
server's rule (``turnaround.risk_margin_s`` 10 s, ``risk_clear_s`` 15 s) and session 19's
(margin 30 s). Deterministic: a regression check of the figures in docs/turnaround.md
and docs/history/turnaround.md "Session 20" (``tools/risk_replay.py`` prints them), not a
measurement of time.

With 30 s every miss was announced a minute ahead but 121 jobs that made their deadline
were alerted: all URGENT (60 s deadlines in the bench), 120 of them predicted to finish
before the deadline itself, 107 finishing inside the 30 s margin as predicted. With
10 s: every miss still announced, at least 11 s ahead, and 20 false alerts, 13 of them
for jobs that finished within 10 s of the deadline.
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from tests.factories.eta_traces import TRACES, replayed

from radserve.config import TurnaroundSettings
from radserve.turnaround.replay import SERVER_WALK, Replayed, RiskRule, deadline_alerts

SESSION_19 = RiskRule(margin_s=30.0, clear_s=15.0)


@pytest.fixture(scope="module")
def traces() -> dict[str, list[Replayed]]:
    # the sixteen traces session 20 replayed; later recordings (session 25's "-emr-",
    # session 29's "-xeon-8ef0bfe-", session 30's "-xeon-180bc3a-" and "-xeon-d62e8a9-"
    # traces, session 41's "-long-" ones, no deadline missed) are not in its figures
    later = ("-emr-", "-xeon-8ef0bfe-", "-xeon-180bc3a-", "-xeon-d62e8a9-", "-long-")
    paths = sorted(
        p for p in TRACES.glob("eta-*.json.gz") if not any(tag in p.name for tag in later)
    )
    assert len(paths) == 16
    return {p.name: replayed(p, SERVER_WALK)[0] for p in paths}


def _summed(traces: dict[str, list[Replayed]], rule: RiskRule, seed0: bool | None = None) -> Any:
    names = [n for n in traces if seed0 is None or ("-s0" in n) == seed0]
    alerts = [deadline_alerts(traces[n], rule) for n in names]
    leads = [s for a in alerts for s in a["lead_s"]]
    slack = [s for a in alerts for s in a["false_slack_s"]]
    return (
        sum(a["misses"] for a in alerts),
        sum(a["predicted"] for a in alerts),
        round(min(leads), 1),
        round(statistics.median(leads), 1),
        sum(a["false_alerts"] for a in alerts),
        sum(s <= 10.0 for s in slack),
        sum(a["raised"] for a in alerts),
    )


def test_the_replay_reads_the_servers_rule() -> None:
    fields = TurnaroundSettings.model_fields
    assert RiskRule() == RiskRule(fields["risk_margin_s"].default, fields["risk_clear_s"].default)
    assert RiskRule().margin_s == 10.0


def test_the_servers_rule_announces_every_miss_with_a_sixth_of_the_false_alerts(
    traces: dict[str, list[Replayed]],
) -> None:
    # misses, predicted, lead min, lead median, false alerts, of them within 10 s, raises
    assert _summed(traces, SESSION_19) == (18, 18, 59.8, 59.9, 121, 13, 139)
    assert _summed(traces, RiskRule()) == (18, 18, 11.0, 59.8, 20, 13, 38)


def test_the_rule_holds_on_each_half_of_the_traces(traces: dict[str, list[Replayed]]) -> None:
    # seed 0 (8 traces, 6 misses) and the others (8 traces, 12 misses). Tuned on the
    # others, tools/risk_replay.py's grid picks the 10 s margin; tuned on seed 0 it picks
    # 12 s held 2 s, which scores on the others as the 10 s margin does
    assert _summed(traces, RiskRule(), seed0=True) == (6, 6, 11.0, 35.5, 10, 5, 16)
    assert _summed(traces, RiskRule(), seed0=False) == (12, 12, 11.0, 59.8, 10, 8, 22)
    assert _summed(traces, SESSION_19, seed0=True)[4] == 63
    assert _summed(traces, SESSION_19, seed0=False)[4] == 58
