"""A private PostgreSQL server for tests that stop or restart the database.

The machine's shared PostgreSQL (``RADSERVE_TEST_DATABASE_URL``) serves other tests
at the same time and must never be restarted; a test that needs a database outage
starts its own server from the installed binaries (``/usr/lib/postgresql/*/bin``):
``initdb`` into a fresh folder, ``pg_ctl`` on a free port on 127.0.0.1, its socket in
that folder. PostgreSQL refuses to run as root, so as root it runs as the ``postgres``
user (``runuser``). Tests skip when the binaries are absent.

Example::

    with PrivatePostgres() as pg:
        url = pg.url          # postgresql+psycopg://postgres@127.0.0.1:PORT/postgres
        pg.restart("fast", down_s=3.0)  # or "immediate": crash + recovery
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import pytest

from tests.factories.dicom_net import free_port


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's ``bin`` folder, or ``None``."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    return Path(found[-1]).parent if found else None


class PrivatePostgres:
    """One throw-away PostgreSQL server; :meth:`restart` with ``pg_ctl -m fast|immediate``,
    or an outage as long as the test wants (:meth:`shut_down`, :meth:`start_again`)."""

    def __init__(self) -> None:
        binaries = postgres_bin()
        if binaries is None:
            pytest.skip("PostgreSQL server binaries (/usr/lib/postgresql/*/bin) are not installed")
        self.bin = binaries
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root and there is no 'postgres' user to run PostgreSQL")
            self.user = "postgres"
        self.root = Path(tempfile.mkdtemp(prefix="radserve-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.log = self.root / "server.log"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str, timeout: float = 120) -> None:
        command = [str(self.bin / tool), *args]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(args[:2])} failed ({done.returncode}): "
                f"{done.stderr[-2000:]}{self._server_log()}"
            )

    def _server_log(self) -> str:
        try:
            return "\nserver log:\n" + self.log.read_text()[-2000:]
        except OSError:
            return ""

    def _pg_ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=on"
        self._run(
            "pg_ctl", action, "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
            *extra,
        )  # fmt: skip

    def start(self) -> None:
        if self.user is not None:
            shutil.chown(self.root, self.user)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self._pg_ctl("start")

    def restart(self, mode: str, *, down_s: float = 0.0) -> None:
        """Stop with ``-m fast`` (clean shutdown, sessions cut) or ``-m immediate`` (no
        shutdown checkpoint: crash recovery at start), stay down ``down_s`` seconds, start.

        A bare ``pg_ctl restart`` is down for well under a second, so whether a client
        meets the outage at all is luck; ``down_s`` longer than a client's polling
        interval makes it meet it."""
        if mode not in ("fast", "immediate"):
            raise ValueError(f"restart mode must be 'fast' or 'immediate', not {mode!r}")
        self._pg_ctl("stop", "-m", mode)
        time.sleep(down_s)
        self._pg_ctl("start")

    def shut_down(self) -> None:
        """Stop the server (``-m fast``) and keep its data, for :meth:`start_again`."""
        self._pg_ctl("stop", "-m", "fast")

    def start_again(self) -> None:
        self._pg_ctl("start")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("stop", "-m", "immediate")

    def __enter__(self) -> PrivatePostgres:
        try:
            self.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
