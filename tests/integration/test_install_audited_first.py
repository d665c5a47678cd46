"""A model install is audited before the version reaches the store: when the database
refuses the audit record (here a trigger in a throw-away PostgreSQL schema raises, as a
full disk would), nothing is installed, the answer says the store failed, and a retry
installs it. Before session 30 the version was installed first and the failed audit
answered 503, so the server served a version the trail did not know and the retry was
refused as "installed already". The same holds for an install that builds variants
after its answer: it ends ``failed`` ("send it again"), not installed unaudited."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy import create_engine, text
from tests.factories.postgres import postgres_schema
from tests.factories.service import ServerThread, auth, config_file, create_key
from tests.integration.test_install_variants import (
    STEP,
    VARIANTS,
    candidate,
    finished,
    zipped,
)

from radserve.api import create_app
from radserve.audit import Action
from radserve.config import load_settings
from radserve.lifecycle.install import verify_install
from radserve.service import Service
from radserve.store.db import normalise_url

REFUSE = """
CREATE FUNCTION refuse_model_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full';
END $$;
CREATE TRIGGER refuse_model_audit BEFORE INSERT ON audit_records FOR EACH ROW
WHEN (NEW.action = '{action}') EXECUTE FUNCTION refuse_model_audit();
"""


def _sql(url: str, statement: str) -> None:
    engine = create_engine(normalise_url(url))
    try:
        with engine.begin() as connection:
            connection.execute(text(statement))
    finally:
        engine.dispose()


def test_an_install_the_trail_refuses_installs_nothing_and_its_retry_installs_it(
    tmp_path: Path,
) -> None:
    with postgres_schema("radserve_audit_first") as url:
        config = config_file(
            tmp_path, database_url=url, lifecycle={"poll_s": 0.2, "variants": VARIANTS}
        )
        data = tmp_path / "data"
        service = Service(load_settings(config, data_dir=data))
        token = create_key(service.store, "admin")
        admin = auth(token)
        shipped = tmp_path / "assets" / "models"
        bundles = {
            v: zipped(candidate(tmp_path / v, shipped, v, fp16_fragile=False))
            for v in ("3.1.0", "3.2.0")
        }
        models = data / "models"
        with (
            ServerThread(create_app(service)) as thread,
            httpx.Client(base_url=thread.url, timeout=600) as c,
        ):
            _sql(url, REFUSE.format(action=Action.MODEL_CHANGED.value))
            refused = c.post("/v1/models", content=bundles["3.1.0"], headers=admin)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "store_error"
            assert not (models / STEP / "3.1.0").exists()
            listed = c.get("/v1/models", headers=admin).json()["versions"]
            assert "3.1.0" not in {r["version"] for r in listed if r["name"] == STEP}

            later = c.post(
                "/v1/models?build_variants=true&precisions=int8",
                content=bundles["3.2.0"],
                headers=admin,
            )
            assert later.status_code == 202, later.text
            failed = finished(c, token, later.headers["location"])
            assert failed["state"] == "failed" and failed["error"]["code"] == "store_error"
            assert "nothing was installed: send it again" in failed["error"]["message"]
            assert not (models / STEP / "3.2.0").exists()

            _sql(url, "DROP TRIGGER refuse_model_audit ON audit_records")
            retried = c.post("/v1/models", content=bundles["3.1.0"], headers=admin)
            assert retried.status_code == 201, retried.text
        assert verify_install(models / STEP / "3.1.0") == []
        events = [
            (e.subject, e.payload.get("event"))
            for e in service.store.iter_audit()
            if e.action == Action.MODEL_CHANGED.value and e.subject.startswith(f"{STEP}/")
        ]
        assert events == [(f"{STEP}/3.1.0", "installed")], events
