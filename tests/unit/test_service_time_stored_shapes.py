"""A stored report whose geometry is no study's shape is unreadable, not a traceback
(user trial, 2026-12-07).

The server's start (``learn_from_store``, outside its own ``try``) and ``radserve plan``
read every succeeded job's ``report.json`` for its size. A shape of ``[]`` ended both in
an IndexError, ``[1e400, 1, 1]`` (JSON reads it as inf) in an OverflowError, and
``[-40, 8, 8]`` was learned as a study of -40 slices. Each is now skipped as an
unreadable report (the job is not learned from), as a report that is not JSON was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from radserve.cli import cli
from radserve.domain.priority import PriorityClass
from radserve.service.turnaround import learn_from_store
from radserve.turnaround.service_time import Prior, ServiceTimeModel, StudySize

BAD_SHAPES = ["[]", "[1e400, 1, 1]", "[-40, 8, 8]", "[0, 8, 8]", '"40x8x8"', "{}"]


def _store_with_one_bad_report(tmp_path: Path, shape: str) -> Path:
    """Three succeeded jobs (tests.factories.finished_jobs), the first one's report
    holding ``shape``; the data folder."""
    from tests.factories.finished_jobs import finished_jobs

    from radserve.store import init_store

    data = tmp_path / "data"
    data.mkdir()
    store = init_store(f"sqlite:///{data / 'radserve.db'}")
    try:
        ids = finished_jobs(store, tmp_path / "results", 3, PriorityClass.OUTPATIENT, 600)
    finally:
        store.close()
    report = tmp_path / "results" / ids[0] / "report.json"
    report.write_text('{"geometry": {"shape": ' + shape + "}}")
    return data


@pytest.mark.parametrize("shape", BAD_SHAPES)
def test_a_report_with_no_studys_shape_is_unreadable(tmp_path: Path, shape: str) -> None:
    (tmp_path / "report.json").write_text('{"geometry": {"shape": ' + shape + "}}")
    assert StudySize.of_report(tmp_path) is None
    with pytest.raises(ValueError, match="shape"):
        StudySize.from_stored_shape(json.loads(shape))


@pytest.mark.parametrize("shape", BAD_SHAPES)
def test_the_servers_start_learns_past_a_bad_report(tmp_path: Path, shape: str) -> None:
    from radserve.store import init_store

    data = _store_with_one_bad_report(tmp_path, shape)
    store = init_store(f"sqlite:///{data / 'radserve.db'}")
    try:
        model = ServiceTimeModel(Prior())
        assert learn_from_store(model, store, "cpu", 200) == 2  # the other two
    finally:
        store.close()
    assert model.sizes() == [40, 40]


@pytest.mark.parametrize("shape", ["[]", "[1e400, 1, 1]", "[-40, 8, 8]"])
def test_plan_learns_past_a_bad_report(tmp_path: Path, shape: str) -> None:
    data = _store_with_one_bad_report(tmp_path, shape)
    args = ["plan", "--data-dir", str(data), "--rate", "urgent=20/h", "--hours", "1", "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["service_times"]["jobs_seen"] == 2


def test_a_studys_shape_is_still_read() -> None:
    assert StudySize.from_stored_shape([40, 8, 8]) == StudySize(40, 2560)
