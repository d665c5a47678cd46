"""`radserve serve` with its DICOM gateway configured from the settings file alone: bound
to the address in ``gateway.host`` (127.0.0.2, a loopback address other than 127.0.0.1,
stands for a hospital network interface), with the quiet period of ``gateway.quiet_s``,
receiving a study from dcmtk's storescu and turning it into a job."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.factories.dicom_net import dcmtk_tool, free_port, storescu
from tests.factories.ports import free_port_on
from tests.factories.serve import RadserveServe, listening
from tests.factories.service import config_file, make_study
from tests.factories.tls import HAVE_OPENSSL, make_pki
from tests.factories.waits import wait_until

from radserve.store import init_store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tools,
    pytest.mark.skipif(dcmtk_tool("storescu") is None, reason="dcmtk is not installed"),
]
HOST = "127.0.0.2"


def test_serve_binds_the_gateway_to_gateway_host_and_runs_what_arrives(tmp_path: Path) -> None:
    gateway_port = free_port_on(HOST)
    gateway = {
        "enabled": True,
        "host": HOST,
        "port": gateway_port,
        "quiet_s": 0.5,
        "late_policy": "flag",
        "allowed_peers": [{"ae_title": "STORESCU", "host": "127.0.0.1"}],
    }
    config, data = config_file(tmp_path, gateway=gateway), tmp_path / "data"
    log = tmp_path / "serve.log"
    with RadserveServe(config, data, free_port(), log):
        assert wait_until(lambda: listening(HOST, gateway_port), timeout=30)
        assert not listening("127.0.0.1", gateway_port)  # only where gateway.host says
        text = log.read_text()
        assert f"listening on {HOST}:{gateway_port}" in text and "quiet period 0.5 s" in text

        files = make_study(tmp_path / "study")
        run = storescu(HOST, gateway_port, files)
        assert run.returncode == 0, run.stderr

        store = init_store(f"sqlite:///{data / 'radserve.db'}")
        try:
            assert wait_until(lambda: store.list_jobs(limit=5).items, timeout=60)
            [job] = store.list_jobs(limit=5).items
            assert job.queue_meta["source"] == "dicom" and job.client_address == "STORESCU"
        finally:
            store.close()


@pytest.mark.skipif(not HAVE_OPENSSL, reason="openssl is not installed")
def test_serve_gateway_speaks_dicom_tls_from_the_settings(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    gateway_port = free_port_on(HOST)
    gateway = {
        "enabled": True,
        "host": HOST,
        "port": gateway_port,
        "quiet_s": 0.5,
        "tls": {"cert": str(pki.server_cert), "key": str(pki.server_key), "ca": str(pki.ca)},
    }
    config, data = config_file(tmp_path, gateway=gateway), tmp_path / "data"
    log = tmp_path / "serve.log"
    files = make_study(tmp_path / "study")
    tls = ["+tls", str(pki.client_key), str(pki.client_cert), "+cf", str(pki.ca)]
    with RadserveServe(config, data, free_port(), log):
        assert wait_until(lambda: listening(HOST, gateway_port), timeout=30)
        assert f"listening on {HOST}:{gateway_port} with TLS" in log.read_text()
        assert storescu(HOST, gateway_port, files[:1]).returncode != 0  # plain TCP: refused
        run = storescu(HOST, gateway_port, files, extra=tls)
        assert run.returncode == 0, run.stderr
        store = init_store(f"sqlite:///{data / 'radserve.db'}")
        try:
            assert wait_until(lambda: store.list_jobs(limit=5).items, timeout=60)
        finally:
            store.close()
