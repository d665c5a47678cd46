"""Every numeric setting at its extreme, each in a real ``radserve serve`` of its own.

    PYTHONPATH=src:. python tools/settings_extremes.py            # every setting (~25 min)
    PYTHONPATH=src:. python tools/settings_extremes.py --ci       # the short mode the test runs
    PYTHONPATH=src:. python tools/settings_extremes.py jobs.lease_s runtime.threads

Per number setting (found by walking :class:`radserve.config.Settings`), the value is
the largest the settings take (a field's own upper bound; a year for a duration; else
1e300 for a float and 10**18 for an integer) and, with ``--beyond``, that much again
past it. Each value starts ``radserve serve`` with the DICOM gateway on, waits for
``/healthz``, C-ECHOes it and C-STOREs a small phantom study with dcmtk, then stops it.

A value is fine when it is refused at load with a configuration error that names it
(exit code 2, ``config_invalid``), or when the server starts, answers, takes the study
and stops cleanly with no traceback and no error line in its log. Anything else is a
finding: before session 32, 1e300 s in ``jobs.lease_s`` ended the start in a
traceback, in ``storage.probe_interval_s`` it killed the storage probe's thread, and
``runtime.threads`` at 10**18 failed every model's warm-up (docs/hostile-input.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types
import httpx
from tests.factories.dicom_net import dcmtk_tool
from tests.factories.ports import free_port
from tests.factories.server_process import radserve_command

from radserve.config import MAX_DURATION_S, SecondsRange, number_settings

# the ports the probe chooses itself (the value under test would replace them)
NOT_PROBED = frozenset(
    {"server.port", "gateway.port", "audit.syslog.port", "turnaround.risk_syslog.port"}
)
# a C-STORE refused at the extreme is what the setting asks for: no disk space is free
# above a minimum of 10**18 bytes ("out of resources", 0xA7)
STORE_REFUSED = {"gateway.min_free_bytes": 0xA7}
# the settings whose extremes broke the server before session 32 (one per kind of harm)
CI_FIELDS = (
    "jobs.lease_s",
    "storage.probe_interval_s",
    "gateway.network_timeout_s",
    "scheduler.max_running",
    "runtime.threads",
)


def extremes() -> Iterator[tuple[str, Any]]:
    """(dotted path, the largest value the settings take) for every number setting."""
    for setting in number_settings():
        bound: float | None = None
        for meta in setting.field.metadata:
            if isinstance(meta, annotated_types.Le):
                bound = float(meta.le)  # type: ignore[arg-type]
            elif isinstance(meta, annotated_types.Lt):
                bound = float(meta.lt) * (1 - 1e-9)  # type: ignore[operator]
            elif isinstance(meta, SecondsRange):
                bound = meta.high_s
        if setting.unit_s is not None:
            longest = MAX_DURATION_S / setting.unit_s
            bound = longest if bound is None else min(bound, longest)
        if bound is None:
            bound = 1e300 if setting.kind is float else 10**18
        yield setting.path, int(bound) if setting.kind is int else bound


def dcmtk_commands(port: int, study: Path) -> tuple[list[str], list[str]]:
    """dcmtk's C-ECHO, and C-STORE of ``study``, to the gateway on ``port``. dcmtk's own
    binaries, found by content: pynetdicom installs Python scripts of the same names, and
    with a virtual environment's ``bin`` first on PATH they ran instead (other options),
    so every case was reported a finding."""
    echoscu, storescu = _dcmtk_binaries()
    echo = [echoscu, "-to", "10", "-aec", "RADSERVE", "127.0.0.1", str(port)]
    store = [storescu, "-to", "20", "-aec", "RADSERVE", "+sd", "127.0.0.1", str(port), str(study)]
    return echo, store


def _dcmtk_binaries() -> tuple[str, str]:
    echoscu, storescu = dcmtk_tool("echoscu"), dcmtk_tool("storescu")
    if echoscu is None or storescu is None:
        raise SystemExit("dcmtk's echoscu and storescu are not on PATH (apt-get install dcmtk)")
    return echoscu, storescu


def _dcmtk(command: list[str], timeout: float) -> int | str:
    try:
        return subprocess.run(command, capture_output=True, timeout=timeout, check=False).returncode
    except subprocess.TimeoutExpired:
        return "timeout"


def _bad_lines(text: str) -> list[str]:
    bad = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            if line.strip():
                bad.append(line[:240])  # a traceback, or any line that is not a record
            continue
        if isinstance(record, dict) and record.get("level") in ("error", "critical"):
            bad.append(str(record.get("msg"))[:240])
    return bad


# optional sections that need their other fields to be on at all: a syslog collector on
# loopback, the probe's own listener, which reads and drops what it gets (plain TCP; the
# audit export speaks TLS only, so its handshake fails there, as with a collector down)
NEEDS = {
    "audit.syslog.": ("host", "port"),
    "turnaround.risk_syslog.": ("host", "transport", "port"),
}


class Collector:
    """A TCP listener on loopback that accepts connections and drains them."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    @staticmethod
    def _drain(conn: socket.socket) -> None:
        with conn:
            while conn.recv(65536):
                pass

    def env_for(self, path: str) -> dict[str, str]:
        """The other fields ``path``'s section needs, as environment variables."""
        for prefix, fields in NEEDS.items():
            if path.startswith(prefix):
                values = {"host": "127.0.0.1", "transport": "tcp", "port": str(self.port)}
                key = "RADSERVE_" + prefix.upper().replace(".", "__")
                return {key + f.upper(): values[f] for f in fields if prefix + f != path}
        return {}


COLLECTOR: Collector | None = None


def probe(path: str, value: Any, study: Path, work: Path) -> dict[str, Any]:
    """Start a server with ``path`` set to ``value``; what happened."""
    folder = work / path
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    http, dicom = free_port(), free_port()
    (folder / "radserve.yaml").write_text(f"gateway:\n  enabled: true\n  port: {dicom}\n")
    global COLLECTOR
    COLLECTOR = COLLECTOR or Collector()
    env = {**os.environ, **COLLECTOR.env_for(path)}
    env["RADSERVE_" + path.upper().replace(".", "__")] = str(value)
    command = radserve_command(
        "serve", "--port", str(http), "--config", str(folder / "radserve.yaml"),
        "--data-dir", str(folder / "data"), "--cpu-workers", "1",
    )  # fmt: skip
    log = folder / "log"
    with open(log, "wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    result: dict[str, Any] = {"value": value}
    try:
        up = False
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and server.poll() is None and not up:
            try:
                up = httpx.get(f"http://127.0.0.1:{http}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                time.sleep(0.1)
        result["up"] = up
        if up:
            echo, store = dcmtk_commands(dicom, study)
            result["echo"] = _dcmtk(echo, 30)
            result["store"] = _dcmtk(store, 60)
            time.sleep(3)  # the background threads' first rounds
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
                result["hung_on_stop"] = True
    result["exit"] = server.returncode
    text = log.read_text(errors="replace")
    refused = not result["up"] and server.returncode == 2 and "config_invalid" in text
    # named as a dotted path, or by its name in a check across its section's fields
    section, _, name = path.rpartition(".")
    result["refused"] = refused and (
        f"'{path}'" in text or f"'{section}': Value error, {name}" in text
    )
    result["bad"] = [] if refused else _bad_lines(text)
    result["fine"] = bool(
        result["refused"]
        or (
            result["up"]
            and result.get("echo") == 0
            and result.get("store") == STORE_REFUSED.get(path, 0)
            and result["exit"] == 0
            and not result["bad"]
            and not result.get("hung_on_stop")
        )
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fields", nargs="*", help="dotted settings (default: every one)")
    parser.add_argument("--ci", action="store_true", help=f"only {', '.join(CI_FIELDS)}")
    parser.add_argument("--beyond", action="store_true", help="also the extreme x 10")
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args(argv)
    _dcmtk_binaries()  # before any server starts: every case would fail without them
    wanted = set(args.fields) | (set(CI_FIELDS) if args.ci else set())
    cases = [(p, v) for p, v in extremes() if (not wanted or p in wanted) and p not in NOT_PROBED]
    if args.beyond:
        cases += [(p, v * 10) for p, v in list(cases)]
    with tempfile.TemporaryDirectory(prefix="radserve-extremes-") as tmp:
        work = Path(tmp)
        subprocess.run(
            radserve_command("phantom", "--seed", "1", "--small", "--out", str(work / "study")),
            check=True, capture_output=True,
        )  # fmt: skip
        results = {}
        for path, value in cases:
            results[f"{path}={value}"] = outcome = probe(
                path, value, work / "study" / "dicom", work
            )
            verdict = "refused" if outcome["refused"] else "ok" if outcome["fine"] else "FINDING"
            print(f"{verdict:8} {path} = {value!r} {'' if outcome['fine'] else outcome}")
            sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    findings = [k for k, r in results.items() if not r["fine"]]
    print(f"{len(results)} values, {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
