"""Re-prioritising one waiting job from several clients at once, and the queue positions
of the job list, through a real server.

Before session 35 the scheduler's change and the row's write were not taken in one order:
twelve requests at once left the row (and the API, the console, a restart) with one class
and the scheduler with the other, and audited "old" values read before another request's
change. ``GET /v1/jobs`` gave every waiting job ``queue_position: null``."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.factories.service import auth, live_server, make_study, settings_for, upload

from radserve.domain.priority import PriorityClass


def test_concurrent_reprioritisations_leave_row_scheduler_and_audit_agreeing(
    tmp_path: Path,
) -> None:
    with live_server(settings_for(tmp_path), roles=("submit", "read", "admin")) as live:
        c, service = live["client"], live["service"]
        admin, submit = auth(live["admin"]), auth(live["submit"])
        service.scheduler.hold("test", "jobs stay waiting")
        try:
            ids = []
            for name in ("a", "b", "c"):
                r = c.post("/v1/studies", files=upload(make_study(tmp_path / name)), headers=submit)
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])
            listed = {j["id"]: j for j in c.get("/v1/jobs", headers=admin).json()["items"]}
            for job_id in ids:
                alone = c.get(f"/v1/jobs/{job_id}", headers=admin).json()
                assert alone["queue_position"] is not None
                assert listed[job_id]["queue_position"] == alone["queue_position"]

            target, answers = ids[1], []
            classes = ["inpatient", "outpatient"] * 6

            def change(cls: str) -> None:
                r = c.post(
                    f"/v1/jobs/{target}/priority", json={"priority_class": cls}, headers=admin
                )
                answers.append(r.status_code)

            threads = [threading.Thread(target=change, args=(cls,)) for cls in classes]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert answers == [200] * len(classes)
            info = service.scheduler.job_info(target)
            row = service.store.get_job(target)
            assert info is not None and row.priority_class == info.cls
            shown = c.get(f"/v1/jobs/{target}", headers=admin).json()
            assert shown["priority_class"] == info.cls.value
            tat = service.scheduler.config.tat(info.cls)
            assert abs((row.deadline - row.arrival).total_seconds() - tat) < 1e-3
            changes = [
                r.payload
                for r in service.store.iter_audit()
                if r.action == "job.reprioritised" and r.subject == target
            ]
            assert len(changes) == len(classes)
            previous = PriorityClass.OUTPATIENT.value
            for payload in changes:  # each change starts where the one before ended
                assert payload["old_priority_class"] == previous, changes
                previous = str(payload["new_priority_class"])
            assert previous == info.cls.value
        finally:
            service.scheduler.release()
