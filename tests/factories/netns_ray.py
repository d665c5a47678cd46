"""A two-"host" Ray cluster on one machine: the head in this network namespace, a worker
node in a network namespace of its own, joined over a veth pair.

The namespace and the pair are a :class:`tests.factories.netns.VethLink` (a /30 from
10.213.0.0/16, nothing routed beyond it). The head
listens on the host end's address, the worker node runs inside the namespace
(``ip netns exec``) and joins it with ``ray start --address``: the same handshake,
object transfer and actor placement as two machines, over a non-loopback link. The
worker node offers one Ray custom resource (``RESOURCE``) so a radserve worker can be
placed on it (``ray.devices: ["cpu:1@<RESOURCE>"]``).

Needs root (network namespaces) and ``ip``; the caller skips otherwise. Teardown always
runs: both ``ray start --block`` process groups are stopped (SIGTERM, then SIGKILL),
any process left in the namespace is killed, the namespace and the link are deleted.
``ray stop`` is never used: it would stop every Ray on the machine.

Authentication: Ray >= 2.5x enables token authentication when ``~/.ray/auth_token``
exists (any local ``ray.init()`` creates it), and each party decides for itself, so the
cluster runs with an explicit per-cluster token (``RAY_AUTH_MODE=token``,
``RAY_AUTH_TOKEN``) in :attr:`env`, which a driver (``radserve serve``) must also get
(the test sets it in its environment).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.factories.dicom_net import free_port
from tests.factories.netns import StartStop, VethLink
from tests.factories.waits import until

RESOURCE = "radserve_netns"
_READY = "will now block forever"


class TwoHostRay(StartStop):
    """The head at :attr:`head_ip`:``port``, a worker node at :attr:`node_ip` in
    namespace :attr:`netns`; :attr:`address` is what ``ray.address`` takes."""

    def __init__(self) -> None:
        self.link = VethLink("ray")
        self.netns = self.link.netns
        self.head_ip, self.node_ip = self.link.host_ip, self.link.ns_ip
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="rs-ray-", dir="/tmp"))  # short socket paths
        self.processes: list[subprocess.Popen[bytes]] = []
        self.env = {
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
        }

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.port}"

    def netns_pids(self) -> set[int]:
        return self.link.pids()

    # --- set-up ---------------------------------------------------------------------------
    def start(self) -> None:
        self.link.start()
        common = ["--num-cpus", "1", "--object-store-memory", str(96 * 1024**2)]
        common += ["--disable-usage-stats", "--block"]
        self._ray(
            "head",
            ["--head", "--node-ip-address", self.head_ip, "--port", str(self.port)],
            ["--include-dashboard", "false", "--dashboard-agent-listen-port", "0"],
            ["--temp-dir", str(self.root), *common],
        )
        self._ray(
            "node",
            ["--address", self.address, "--node-ip-address", self.node_ip],
            ["--resources", f'{{"{RESOURCE}": 1}}', *common],
            netns=self.netns,
        )

    def _ray(self, name: str, *args: list[str], netns: str | None = None) -> None:
        ray = str(Path(sys.executable).with_name("ray"))
        command = [ray, "start", *(a for part in args for a in part)]
        if netns is not None:
            command = self.link.exec(*command)
        log = self.root / f"{name}.log"
        env = {**os.environ, **self.env}
        with open(log, "ab") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.processes.append(process)

        def ready() -> bool:
            text = log.read_text(errors="replace")
            assert _READY in text or process.poll() is None, (
                f"ray start ({name}) exited: {text[-3000:]}"
            )
            return _READY in text

        until(ready, f"ray start ({name}) to come up", 120, state=lambda: _tail(log), step=0.5)

    # --- teardown -------------------------------------------------------------------------
    def stop(self) -> None:
        for process in reversed(self.processes):
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for process in reversed(self.processes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            _signal_group(process, signal.SIGKILL)  # whatever of its group is left
            process.wait(30)
        self.link.stop()  # kills what is left in the namespace, deletes it and the link
        shutil.rmtree(self.root, ignore_errors=True)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)  # its own session (start_new_session): its group id
