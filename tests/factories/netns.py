"""A second "host" on this machine: a network namespace joined to this one by a veth pair.

The pair gets a free /30 from 10.213.0.0/16 (its first address at this end, its second
inside the namespace): a link between the two ends only, with no route to anything outside the
machine, so a test can bind a server to a real, non-loopback interface address and
reach it from another network stack (a program run with :meth:`VethLink.exec`).

Needs root (network namespaces) and ``ip``; :func:`netns_unavailable` says why not and
:meth:`VethLink.start` skips the test when the kernel refuses (a container without
CAP_SYS_ADMIN). Teardown always runs: every process left in the namespace is killed,
then the namespace and the link are deleted.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import uuid
from types import TracebackType
from typing import Self

import pytest


def netns_unavailable() -> str | None:
    """Why this machine cannot make network namespaces here, or ``None``."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    return None


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    """``ip ARGS`` (inside ``netns`` when given); its stdout."""
    command = ["ip", *args] if netns is None else ["ip", "netns", "exec", netns, "ip", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")
    return done.stdout


def free_subnet() -> tuple[str, str]:
    """Both ends of a /30 of 10.213.0.0/16 that no interface here uses."""
    used = ip("-4", "-o", "addr", "show")
    for _ in range(200):
        third, fourth = random.randrange(256), random.randrange(0, 256, 4)
        prefix = f"10.213.{third}."
        if f" {prefix}{fourth + 1}/" not in used and f" {prefix}{fourth + 2}/" not in used:
            return f"{prefix}{fourth + 1}", f"{prefix}{fourth + 2}"
    raise RuntimeError("no free /30 in 10.213.0.0/16")


class StartStop:
    """``with`` for a fixture of real processes: :meth:`start`, and :meth:`stop` on the
    way out, also when the start fails half-way (stop must tolerate a partial start)."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.stop()


class VethLink(StartStop):
    """Namespace :attr:`netns` at :attr:`ns_ip`, reached from here at :attr:`host_ip`."""

    def __init__(self, name: str = "link") -> None:
        why = netns_unavailable()
        if why is not None:
            pytest.skip(why)
        tag = uuid.uuid4().hex[:6]
        self.netns = f"rs-{name}-{tag}"
        self.host_link, self.ns_link = f"rsh{tag}", f"rsn{tag}"
        self.host_ip, self.ns_ip = free_subnet()

    def exec(self, *command: str) -> list[str]:
        """``command`` as run inside the namespace."""
        return ["ip", "netns", "exec", self.netns, *command]

    def pids(self) -> set[int]:
        """The processes running in the namespace."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.netns], capture_output=True, text=True, timeout=30
        ).stdout
        return {int(p) for p in out.split()}

    def start(self) -> None:
        try:
            ip("netns", "add", self.netns)
        except RuntimeError as exc:  # root without CAP_SYS_ADMIN (a container), say
            pytest.skip(f"cannot create a network namespace: {exc}")
        ip("link", "add", self.host_link, "type", "veth", "peer", "name", self.ns_link)
        ip("link", "set", self.ns_link, "netns", self.netns)
        ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_link)
        ip("link", "set", self.host_link, "up")
        ip("addr", "add", f"{self.ns_ip}/30", "dev", self.ns_link, netns=self.netns)
        ip("link", "set", self.ns_link, "up", netns=self.netns)
        ip("link", "set", "lo", "up", netns=self.netns)

    def stop(self) -> None:
        for pid in self.pids():  # only processes of the namespace this test made
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        ip("netns", "del", self.netns, check=False)
        ip("link", "del", self.host_link, check=False)  # gone with the namespace, normally
