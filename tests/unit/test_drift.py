"""Drift statistics and the server's monitors (issue 14): PSI / KS / chi-square states,
state changes audited, a reference collected from the first studies and persisted, the
metric. Records are drawn from seeded distributions (the phantom measurement is in
tests/integration/test_drift_phantoms.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from radserve.audit import Action
from radserve.config import DriftSettings
from radserve.domain.input_domain import AcquisitionFacts, InputDomain, domain_violations
from radserve.lifecycle.drift import DriftState, compare, psi
from radserve.models.registry import ModelRegistry
from radserve.service.drift import DriftCollector, DriftService, reference_path, window_path
from radserve.store import init_store

LIMITS = DriftSettings()


def record(rng: np.random.Generator, *, shift: float = 0.0, vendor: str = "A") -> dict[str, Any]:
    centre = 40 + shift
    hist, _ = np.histogram(rng.normal(centre, 60, 5000), bins=np.arange(-300, 301, 25))
    return {
        "hist": {"hu_body": (hist / hist.sum()).tolist()},
        "num": {"noise_hu": float(rng.normal(15 + shift / 4, 2)), "missing": None},
        "cat": {"manufacturer": vendor},
        "models": {"lesions": {"num": {"finding_count": float(rng.poisson(2))}, "cat": {}}},
    }


def test_same_population_is_ok_shifted_alerts() -> None:
    rng = np.random.default_rng(0)
    ref = [record(rng) for _ in range(30)]
    same = compare(ref, [record(rng) for _ in range(20)], LIMITS)
    assert {f.test for f in same.values()} == {"psi", "ks", "chi2"}
    assert all(f.state is DriftState.OK for f in same.values())
    moved = compare(ref, [record(rng, shift=60, vendor="B") for _ in range(20)], LIMITS)
    assert moved["hu_body"].state is DriftState.ALERT and moved["hu_body"].p_value is None
    assert moved["noise_hu"].state is DriftState.ALERT
    assert moved["manufacturer"].state is DriftState.ALERT
    assert "missing" not in moved  # no values: not judged


def test_psi_is_zero_for_equal_histograms_and_grows_with_the_shift() -> None:
    a = np.array([1.0, 2.0, 3.0, 4.0])
    assert psi(a, a * 10) == 0.0
    assert 0 < psi(a, a[::-1]) < psi(a, np.array([0.0, 0.0, 0.0, 1.0]))


def test_domain_violations_name_each_reason() -> None:
    domain = InputDomain.model_validate(
        {
            "pixel_spacing_mm": {"min": 0.6, "max": 0.9},
            "matrix": {"min": 512, "max": 512},
            "body_parts": ["CHEST"],
        }
    )
    inside = AcquisitionFacts("CT", 0.7, 1.25, 512, 512, 300, "CHEST")
    assert domain_violations(domain, "CT", inside) == []
    outside = AcquisitionFacts("MR", 2.5, 5.0, 128, 512, 40, "HEAD")
    reasons = domain_violations(domain, "CT", outside)
    assert len(reasons) == 4 and any(r.startswith("rows 128") for r in reasons)
    no_part = AcquisitionFacts("CT", 0.7, 1.25, 512, 512, 300, "")
    assert domain_violations(domain, "CT", no_part) == []  # absent: not judged


def test_service_collects_reference_then_audits_state_changes(tmp_path: Path) -> None:
    store = init_store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    config = DriftSettings(reference_studies=10, window=10, min_window=10)
    drift = DriftService(config, data_dir=tmp_path, registry=ModelRegistry(), store=store)
    rng = np.random.default_rng(1)
    versions = {"lesions": "9.9.9"}
    for _ in range(10):
        assert drift.observe(versions, record(rng)) == []
    saved = reference_path(tmp_path, "lesions", "9.9.9")
    assert saved.is_file()  # the collected reference survives a restart
    for _ in range(10):
        drift.observe(versions, record(rng))
    assert drift.monitor("lesions", "9.9.9").state is DriftState.OK
    changes = []
    for _ in range(10):
        changes += drift.observe(versions, record(rng, shift=80, vendor="B"))
    assert any(c.feature == "" and c.after is DriftState.ALERT for c in changes)
    audited = [e for e in store.iter_audit() if e.action == Action.MODEL_DRIFT]
    assert len(audited) == len(changes) and audited[-1].subject == "lesions/9.9.9"
    registry = CollectorRegistry()
    registry.register(DriftCollector(drift))
    text = generate_latest(registry).decode()
    assert (
        'radserve_model_drift_state{feature="overall",model="lesions",version="9.9.9"} 2.0' in text
    )
    # a new service (a restart) reads the reference back instead of collecting again
    again = DriftService(config, data_dir=tmp_path, registry=ModelRegistry(), store=None)
    assert not again.monitor("lesions", "9.9.9").collecting


def test_a_restart_goes_on_with_the_window_and_the_alert_stays(tmp_path: Path) -> None:
    """The windows are kept on disk: after a restart an alert is still an alert (it went
    quiet until 20 more studies were served), with no second announcement of it; a
    reference half collected goes on being collected instead of starting again."""
    config = DriftSettings(reference_studies=10, window=10, min_window=10)
    rng = np.random.default_rng(2)
    versions = {"lesions": "9.9.9"}
    drift = DriftService(config, data_dir=tmp_path, registry=ModelRegistry(), store=None)
    for _ in range(10):
        drift.observe(versions, record(rng))
    for _ in range(10):
        drift.observe(versions, record(rng, shift=80, vendor="B"))
    before = drift.monitor("lesions", "9.9.9").summary()
    assert before["state"] == "alert"
    again = DriftService(config, data_dir=tmp_path, registry=ModelRegistry(), store=None)
    after = again.monitor("lesions", "9.9.9").summary()
    assert after["reference"]["source"].startswith("first 10 studies served (")  # its file
    after["reference"] = before["reference"]
    assert after == before  # state, features, window and studies as they were
    # the next study is judged on the window it joins; an unchanged state is not announced
    assert again.observe(versions, record(rng, shift=80, vendor="B")) == []
    assert again.monitor("lesions", "9.9.9").summary()["window"]["studies"] == 10

    # a reference cut off by a restart after 4 of its 10 studies needs 6 more, not 10
    fresh = {"organs": "1.0.0"}
    first = DriftService(config, data_dir=tmp_path, registry=ModelRegistry(), store=None)
    for _ in range(4):
        first.observe(fresh, record(rng))
    second = DriftService(config, data_dir=tmp_path, registry=ModelRegistry(), store=None)
    for _ in range(5):
        second.observe(fresh, record(rng))
    assert second.monitor("organs", "1.0.0").collecting
    second.observe(fresh, record(rng))
    assert not second.monitor("organs", "1.0.0").collecting
    assert reference_path(tmp_path, "organs", "1.0.0").is_file()

    # a torn window file is logged and the monitor starts again instead of failing
    window_path(tmp_path, "lesions", "9.9.9").write_text('{"window": [')
    torn = DriftService(config, data_dir=tmp_path, registry=ModelRegistry(), store=None)
    assert torn.monitor("lesions", "9.9.9").summary()["window"]["studies"] == 0


def test_replicas_sharing_a_data_dir_keep_their_own_windows(tmp_path: Path) -> None:
    """Two replicas on one data dir: each restarts with the window of the studies it ran
    (one file would hold whichever wrote last), and both use the one reference."""
    config = DriftSettings(reference_studies=10, window=10, min_window=10)
    rng = np.random.default_rng(3)
    versions = {"lesions": "9.9.9"}

    def replica(name: str) -> DriftService:
        return DriftService(
            config, data_dir=tmp_path, registry=ModelRegistry(), store=None, replica=name
        )

    a, b = replica("ct-a"), replica("site/b")  # a name with a character no file takes
    for _ in range(10):
        a.observe(versions, record(rng))
    assert reference_path(tmp_path, "lesions", "9.9.9").is_file()
    for _ in range(10):
        a.observe(versions, record(rng, shift=80, vendor="B"))  # a's studies moved
    for _ in range(4):
        b.observe(versions, record(rng))  # b ran four normal ones after the reference
    assert a.monitor("lesions", "9.9.9").summary()["state"] == "alert"
    assert {p.name for p in (tmp_path / "drift" / "lesions").iterdir()} == {
        "9.9.9.json",
        "9.9.9.window.ct-a.json",
        "9.9.9.window.site_b.json",
    }
    a_again, b_again = replica("ct-a"), replica("site/b")
    assert a_again.monitor("lesions", "9.9.9").summary()["state"] == "alert"
    assert a_again.monitor("lesions", "9.9.9").summary()["window"]["studies"] == 10
    b_summary = b_again.monitor("lesions", "9.9.9").summary()
    assert b_summary["window"]["studies"] == 4 and b_summary["state"] != "alert"
    assert (
        b_summary["reference"]["source"]
        == a_again.monitor("lesions", "9.9.9").summary()["reference"]["source"]
    )


def test_a_retired_replicas_window_files_are_removed_at_start(tmp_path: Path) -> None:
    """A replica retired or renamed (a pod's host name changes at each rollout) left its
    window files; a server starting removes the other replicas' files untouched for
    ``stale_window_days``, never its own, a recent one or a single server's."""
    folder = tmp_path / "drift" / "lesions"
    folder.mkdir(parents=True)
    names = {
        "9.9.9.window.pod-old.json": 31,  # days since written: a replica gone
        "9.9.9.window.pod-new.json": 1,  # a live replica's
        "9.9.9.window.ct-a.json": 90,  # this server's own: idle, kept
        "9.9.9.window.json": 90,  # a single server's
        "9.9.9.json": 90,  # the reference
        "1.0.0.window.a.json": 45,  # a replica "a", not "ct-a"
    }
    now = time.time()
    for name, days in names.items():
        path = folder / name
        path.write_text('{"window": []}')
        os.utime(path, (now - days * 86400, now - days * 86400))
    config = DriftSettings()
    DriftService(config, data_dir=tmp_path, registry=ModelRegistry(), store=None, replica="ct-a")
    kept = {p.name for p in folder.iterdir()}
    assert kept == set(names) - {"9.9.9.window.pod-old.json", "1.0.0.window.a.json"}
    off = DriftSettings(stale_window_days=0)
    os.utime(folder / "9.9.9.window.pod-new.json", (now - 400 * 86400,) * 2)
    DriftService(off, data_dir=tmp_path, registry=ModelRegistry(), store=None)
    assert (folder / "9.9.9.window.pod-new.json").exists()
    DriftService(config, data_dir=tmp_path, registry=ModelRegistry(), store=None)  # single
    assert not (folder / "9.9.9.window.pod-new.json").exists()
    assert not (folder / "9.9.9.window.ct-a.json").exists()  # a single server owns none
