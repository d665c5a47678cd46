"""Drift monitoring in the running server: one :class:`~radserve.lifecycle.drift.DriftMonitor`
per model version that served a study. Each succeeded study's features (computed by the
run path, :mod:`radserve.pipeline.profile`) feed the monitors of the versions it ran.

* Reference: a file (``drift_reference.json`` in the bundle, else
  ``<data_dir>/drift/<model>/<version>.json``), or the first ``reference_studies``
  studies served, then written to that data-dir file so a restart keeps it
  (``lifecycle.drift.reference``).
* State changes are logged (an alert as an error line starting ``ALERT:``) and audited
  (``model.drift``, per feature and overall); states are metrics
  (``radserve_model_drift_state{model,version,feature}``: 0 ok, 1 warn, 2 alert) and
  ``GET /v1/models/drift``.
* Each monitor's window (and a reference still being collected) is written to
  ``<data_dir>/drift/<model>/<version>.window.json`` after every study it takes, so a
  restart goes on where the server left off: before, the windows started again empty and
  an alert went quiet until 20 more studies had been served. Replicas sharing a data dir
  (``outbox.replicas`` > 1) each keep their own window
  (``<version>.window.<instance_id>.json``): each sees only the studies it ran, and one
  file would hold whichever replica wrote last. A replica retired (or renamed: a pod's
  host name is new at each rollout) leaves its files behind; at start a server removes
  the other replicas' window files untouched for ``stale_window_days`` (30).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from radserve import durable
from radserve.audit import Action, AuditEvent
from radserve.config import DriftSettings
from radserve.errors import RadserveError
from radserve.lifecycle.drift import DriftMonitor, DriftState, StateChange, model_record
from radserve.models.registry import ModelRegistry
from radserve.store import Store

logger = logging.getLogger(__name__)

BUNDLE_REFERENCE = "drift_reference.json"
DRIFT_DIR = "drift"


def reference_path(data_dir: Path, model: str, version: str) -> Path:
    return Path(data_dir) / DRIFT_DIR / model / f"{version}.json"


def write_reference(path: Path, model: str, version: str, source: str, records: list[Any]) -> None:
    """Write a reference profile durably (a reader never sees half a file; a restart
    finds it)."""
    durable.write_json(
        path, {"model": model, "version": version, "source": source, "records": records}
    )


def window_path(data_dir: Path, model: str, version: str, replica: str | None = None) -> Path:
    """Where a monitor's window is kept; ``replica``: this server's instance id when
    replicas share the data dir."""
    return Path(data_dir) / DRIFT_DIR / model / f"{version}{_window_suffix(replica)}"


def _window_suffix(replica: str | None) -> str:
    """A window file's name after the version (characters a file name cannot hold in the
    replica's id become ``_``)."""
    if replica is None:
        return ".window.json"
    return f".window.{re.sub(r'[^A-Za-z0-9._-]', '_', replica)}.json"


def remove_stale_windows(data_dir: Path, replica: str | None, older_than_s: float) -> int:
    """Delete the replica window files (``<version>.window.<replica>.json``) of replicas
    other than ``replica`` that nobody wrote for ``older_than_s`` seconds (0: none);
    the window of a single server (``<version>.window.json``) is never one of them.
    Returns how many were deleted (named in the log)."""
    root = Path(data_dir) / DRIFT_DIR
    if older_than_s <= 0 or not root.is_dir():
        return 0
    own = None if replica is None else _window_suffix(replica)
    cutoff = time.time() - older_than_s
    removed = []
    for path in root.glob("*/*.window.*.json"):
        if own is not None and path.name.endswith(own):
            continue
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed.append(f"{path.parent.name}/{path.name}")
    if removed:
        logger.info("removed %d drift window(s) of replicas gone: %s", len(removed), removed)
    return len(removed)


def read_window(path: Path) -> dict[str, Any] | None:
    """A monitor's saved state (:meth:`DriftMonitor.saved_state`); None when absent or
    unreadable (logged: the monitor starts again, as before windows were kept)."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("window"), list):
            raise TypeError("no window list")
        return data
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        logger.error("drift window %s is unreadable (%s): started again", path, exc)
        return None


def read_reference(path: Path) -> tuple[str, list[dict[str, Any]]] | None:
    try:
        data = json.loads(path.read_text())
        records = data["records"]
        if not isinstance(records, list):
            raise TypeError("records is not a list")
        return str(data.get("source", path.name)), records
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.error("drift reference %s is unreadable (%s): ignored", path, exc)
        return None


class DriftService:
    """The server's monitors; thread-safe."""

    def __init__(
        self,
        config: DriftSettings,
        *,
        data_dir: Path,
        registry: ModelRegistry,
        store: Store | None = None,
        replica: str | None = None,
    ) -> None:
        self.config = config
        self.data_dir = Path(data_dir)
        self.replica = replica  # instance id when replicas share the data dir
        self.registry = registry
        self.store = store
        self._monitors: dict[tuple[str, str], DriftMonitor] = {}
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        remove_stale_windows(self.data_dir, replica, config.stale_window_days * 86400.0)

    def monitor(self, model: str, version: str) -> DriftMonitor:
        with self._lock:
            found = self._monitors.get((model, version))
            if found is None:
                found = self._monitors[(model, version)] = self._new(model, version)
            return found

    def _new(self, model: str, version: str) -> DriftMonitor:
        records: list[dict[str, Any]] = []
        source = "none"
        if self.config.reference in ("auto", "file"):
            candidates = [reference_path(self.data_dir, model, version)]
            with contextlib.suppress(RadserveError):  # not installed: only the data dir
                bundle = self.registry.get(model, version)
                candidates.insert(0, bundle.directory / BUNDLE_REFERENCE)
            for path in candidates:
                found = read_reference(path)
                if found is not None:
                    source, records = f"{found[0]} ({path})", found[1]
                    break
        collect = (
            self.config.reference_studies
            if not records and self.config.reference in ("auto", "first_studies")
            else 0
        )
        monitor = DriftMonitor(
            model,
            version,
            self.config,
            reference=records,
            collect=collect,
            reference_source=source,
            on_reference=self._save_reference,
        )
        saved = read_window(window_path(self.data_dir, model, version, self.replica))
        if saved is not None:
            monitor.restore(saved)
        return monitor

    def _save_reference(self, monitor: DriftMonitor) -> None:
        path = reference_path(self.data_dir, monitor.model, monitor.version)
        try:
            write_reference(
                path, monitor.model, monitor.version, monitor.reference_source, monitor.reference
            )
        except OSError as exc:
            logger.error("drift reference %s not written: %s", path, exc)
        logger.info(
            "drift reference of %s/%s: %s", monitor.model, monitor.version, monitor.reference_source
        )

    def observe(
        self, model_versions: Mapping[str, str], features: Mapping[str, Any]
    ) -> list[StateChange]:
        """One succeeded study: feed the monitor of each model version it ran."""
        if not self.config.enabled:
            return []
        changes: list[StateChange] = []
        for model, version in model_versions.items():
            monitor = self.monitor(model, version)
            changes += monitor.add(model_record(features, model))
            self._save_window(monitor)
        for change in changes:
            self._announce(change)
        return changes

    def _save_window(self, monitor: DriftMonitor) -> None:
        """Write the monitor's window; one writer at a time, so an older snapshot never
        lands after a newer one."""
        path = window_path(self.data_dir, monitor.model, monitor.version, self.replica)
        with self._save_lock:
            try:
                # not flushed: a power cut loses at most the last studies' records, and
                # a torn file is read as none (the window starts again); an fsync per
                # model and study on the finish path is not worth that
                durable.write_json(path, monitor.saved_state(), sync=False)
            except OSError as exc:
                logger.error("drift window %s not written: %s", path, exc)

    def _announce(self, change: StateChange) -> None:
        subject = f"{change.model}/{change.version}"
        what = change.feature or "overall"
        detail = change.detail
        figure = ""
        if detail is not None:
            figure = f" ({detail.test} {detail.statistic:.3g}" + (
                f", p {detail.p_value:.2g})" if detail.p_value is not None else ")"
            )
        line = f"drift of {subject} {what}: {change.before.label} -> {change.after.label}{figure}"
        if change.after is DriftState.ALERT and not change.feature:
            logger.error("ALERT: %s", line)
        else:
            logger.warning("%s", line) if change.after > change.before else logger.info("%s", line)
        if self.store is None:
            return
        payload: dict[str, Any] = {
            "feature": change.feature or None,
            "from": change.before.label,
            "to": change.after.label,
        }
        if detail is not None:
            payload["test"] = detail.test
            payload["statistic"] = detail.statistic
            payload["p_value"] = detail.p_value
            payload["n_reference"], payload["n_window"] = detail.n_reference, detail.n_window
        try:
            self.store.append_audit(
                AuditEvent(action=Action.MODEL_DRIFT, subject=subject, payload=payload)
            )
        except RadserveError as exc:
            logger.error("could not audit a drift change of %s: %s", subject, exc.code)

    def monitors(self) -> list[DriftMonitor]:
        with self._lock:
            return list(self._monitors.values())

    def summary(self) -> list[dict[str, Any]]:
        return [m.summary() for m in self.monitors()]


class DriftCollector(Collector):
    """Drift states per model version and feature, read at scrape."""

    def __init__(self, drift: DriftService) -> None:
        self.drift = drift

    def collect(self) -> Iterator[Any]:
        state = GaugeMetricFamily(
            "radserve_model_drift_state",
            "Drift of a model version against its reference: 0 ok, 1 warn, 2 alert "
            '(feature "overall": the worst feature)',
            labels=["model", "version", "feature"],
        )
        reference = GaugeMetricFamily(
            "radserve_model_drift_reference_studies",
            "Studies in a model version's drift reference profile",
            labels=["model", "version"],
        )
        for monitor in self.drift.monitors():
            summary = monitor.summary()
            labels = [monitor.model, monitor.version]
            reference.add_metric(labels, summary["reference"]["studies"])
            if summary["collecting_reference"]:
                continue
            state.add_metric([*labels, "overall"], int(monitor.state))
            for name, feature in monitor.features.items():
                state.add_metric([*labels, name], int(feature.state))
        yield state
        yield reference


__all__ = [
    "BUNDLE_REFERENCE",
    "DriftCollector",
    "DriftService",
    "read_reference",
    "reference_path",
    "write_reference",
]
