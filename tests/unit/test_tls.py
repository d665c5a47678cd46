"""TLS settings: what a half-configured endpoint is told at load time."""

from __future__ import annotations

from pathlib import Path

import pytest

from radserve.config import ConfigError, load_settings
from radserve.tls import TlsConfigError, server_context


def test_https_needs_certificate_and_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"HTTPS needs server\.tls\.cert and server\.tls\.key"):
        load_settings(None, server__tls={"ca": str(tmp_path / "ca.pem")})
    with pytest.raises(ConfigError, match="cert and key go together"):
        load_settings(None, server__tls={"cert": str(tmp_path / "c.pem")})


def test_unreadable_files_name_the_endpoint(tmp_path: Path) -> None:
    settings = load_settings(
        None, server__tls={"cert": str(tmp_path / "c.pem"), "key": str(tmp_path / "k.pem")}
    )
    assert settings.server.tls is not None
    with pytest.raises(TlsConfigError, match="cannot load the TLS files for HTTPS"):
        server_context(settings.server.tls, "HTTPS")
