"""jobs.cache_records sizes the in-memory job records of the serving process."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.factories.service import config_file

from radserve.config import load_settings
from radserve.service import Service


def test_the_serving_process_keeps_as_many_job_records_as_set(tmp_path: Path) -> None:
    default = load_settings(config_file(tmp_path), data_dir=tmp_path / "a")
    assert Service(default).cache.capacity == 20_000
    small = load_settings(
        config_file(tmp_path, jobs={"cache_records": 500}), data_dir=tmp_path / "b"
    )
    assert Service(small).cache.capacity == 500


def test_no_cache_at_all_is_refused_with_the_setting_named(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="cache_records"):
        load_settings(config_file(tmp_path, jobs={"cache_records": 0}), data_dir=tmp_path)
