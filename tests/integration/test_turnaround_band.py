"""The ETA band's late end learned from finished jobs (turnaround.band: conformal, the
default), seen through a real server running real (slow, tiny) studies."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import httpx
import pytest
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    make_models_slow,
    make_study,
    settings_for,
    upload,
    wait_job,
)

from radserve.api import create_app
from radserve.service import Service


def _at(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def _band_jobs(c: httpx.Client, key: str) -> int:
    return int(c.get("/v1/ops/turnaround", headers=auth(key)).json()["eta_band"]["jobs"])


def _submit(c: httpx.Client, key: str, study: list[Path]) -> str:
    answer = c.post("/v1/studies", files=upload(study), headers=auth(key))
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


def _submit_all(c: httpx.Client, key: str, folders: list[Path]) -> list[str]:
    """The studies are made first and then sent back to back, so every job is queued
    before the first one ends: how far a job's first ETA reaches (and so whether its
    ratio is learned) then depends on its place in the queue, not on how fast this
    host made the studies between two submissions (a quiet host finished each job
    before the next was sent, and only 2 of 6 were predicted a second or more away)."""
    studies = [make_study(folder) for folder in folders]
    return [_submit(c, key, study) for study in studies]


def test_late_end_is_the_learned_ratio_of_the_time_to_finish(tmp_path: Path) -> None:
    settings = settings_for(
        tmp_path,
        # a prior faster than the slow model: queued jobs are predicted early, and one
        # at a time each waits for all before it: actual / predicted well above 1
        turnaround__prior_fixed_s=0.5,
        turnaround__prior_per_slice_s=0.0,
        turnaround__recompute_interval_s=0.05,
        scheduler__max_running=1,
    )
    make_models_slow(tmp_path / "assets" / "models", layers=8, channels=48)
    service = Service(settings)
    key = create_key(service.store, "admin")
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url) as c:
        view = c.get("/v1/ops/turnaround", headers=auth(key)).json()
        assert view["eta_band"] == {"band": "conformal", "jobs": 0, "ratio": None}
        # jobs predicted to finish within a second of their submission teach nothing, and
        # how many of a wave are predicted further depends on this host's speed (2 to 5
        # of 6 on a loaded host, 2 in 24 on session 29's quiet AMX one, whose service
        # times learned are short): each wave is longer than the one before, so the jobs
        # at its end wait long enough behind the others, until 3 have taught the band
        ended = 0
        for wave in range(6):
            size = 6 * (wave + 1)
            jobs = _submit_all(c, key, [tmp_path / f"a{wave}-{i}" for i in range(size)])
            assert [wait_job(c, j, key)["state"] for j in jobs] == ["succeeded"] * size
            ended += size
            band = c.get("/v1/ops/turnaround", headers=auth(key)).json()["eta_band"]
            if band["jobs"] >= 3:
                break
        assert 3 <= band["jobs"] <= ended
        ratio = band["ratio"]
        assert ratio is not None and ratio > 0

        # held (the scheduler's own hold: no unit handed out) while it reads: on a fast
        # host a job could end between every pair of readings until the last one started.
        # While held the API gives no ETA (no work moves: waiting_for names the hold), so
        # the walk's ETA is read in the process, as the API gives it once work runs
        service.scheduler.hold("test", "steady readings")
        later = _submit_all(c, key, [tmp_path / f"b{i}" for i in range(5)])
        shown = c.get(f"/v1/jobs/{later[-1]}", headers=auth(key)).json()
        assert shown["eta"] is None and shown["waiting_for"]["reason"] == "test", shown
        checked = False
        while not checked:  # a reading with no job ended between it and the ratio's
            job = c.get(f"/v1/jobs/{later[-1]}", headers=auth(key)).json()
            assert job["state"] == "queued", "the last job started before one steady reading"
            eta = service.jobs.eta_of(later[-1])
            band = c.get("/v1/ops/turnaround", headers=auth(key)).json()["eta_band"]
            if band["jobs"] != _band_jobs(c, key) or service.jobs.eta_of(later[-1]) != eta:
                continue
            assert eta is not None
            at = eta.computed_at.timestamp()
            finish = eta.predicted_finish.timestamp()
            # the late end: the walk's time to finish scaled by the learned ratio (a
            # ratio under 1 never narrows the band below the finish)
            assert eta.predicted_finish_late.timestamp() - at == pytest.approx(
                max(band["ratio"], 1.0) * (finish - at), abs=2e-3
            )
            checked = True
        service.scheduler.release()
        assert [wait_job(c, j, key)["state"] for j in later] == ["succeeded"] * 5
    assert len(service.turnaround.band.first) == 0  # no job's first reading kept after it


def test_own_band_keeps_the_walks_late_end(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, turnaround__band="own")
    service = Service(settings)
    key = create_key(service.store, "admin")
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url) as c:
        view = c.get("/v1/ops/turnaround", headers=auth(key)).json()
        assert view["eta_band"] == {"band": "own"}
        job_id = _submit(c, key, make_study(tmp_path / "s"))
        assert wait_job(c, job_id, key)["state"] == "succeeded"
    assert service.turnaround.band is None
