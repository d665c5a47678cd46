"""A new server's data folder has no install root until the first install: every
command warned "model root .../data/models does not exist; skipped" (twice at serve),
which an engineer reads as a broken installation. A configured root that is missing is
still warned about (a mistyped ``models.dirs``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tests.factories.service import settings_for

from radserve.lifecycle.doctor import run_doctor
from radserve.models.registry import ModelRegistry
from radserve.service.catalog import Catalog

MISSING = "does not exist; skipped"


def test_a_new_data_folder_s_install_root_is_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(tmp_path)
    assert not (settings.data_dir / "models").exists()
    with caplog.at_level(logging.DEBUG, logger="radserve.models.registry"):
        catalog = Catalog.from_settings(settings)
        assert catalog.registry.names()  # the bundled models are found
    warned = [r for r in caplog.records if MISSING in r.getMessage()]
    assert warned and all(r.levelno == logging.DEBUG for r in warned)


def test_a_missing_configured_root_is_still_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    typo = tmp_path / "site-modles"
    installed = tmp_path / "data" / "models"
    registry = ModelRegistry([typo, installed], missing_ok=[installed])
    with caplog.at_level(logging.DEBUG, logger="radserve.models.registry"):
        assert registry.names() == []
    levels = {r.getMessage(): r.levelno for r in caplog.records if MISSING in r.getMessage()}
    assert levels == {
        f"model root {typo} {MISSING}": logging.WARNING,
        f"model root {installed} {MISSING}": logging.DEBUG,
    }


def test_doctor_on_a_new_data_folder_does_not_warn_either(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="radserve.models.registry"):
        run_doctor(settings_for(tmp_path), check_ports=False)
    assert not [r for r in caplog.records if MISSING in r.getMessage()]
