"""Access control: every route needs an API key except /healthz; roles read < submit <
admin; /metrics is public unless ``server.metrics_require_key``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.service import ServerThread, auth, create_key, live_server, settings_for

from radserve.api import create_app
from radserve.service import Service

PUBLIC = {("GET", "/healthz"), ("GET", "/metrics")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with live_server(
        settings_for(tmp_path_factory.mktemp("api-auth")),
        roles=("read", "submit", "admin"),
        warm=False,
        client_timeout=30,
        manage_service=False,
        key_ttl_s=0.0,
    ) as live:
        yield live
    live["service"].store.close()


def _routes(schema: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (method, concrete path) in the OpenAPI schema; path parameters filled in."""
    routes = []
    for template, operations in schema["paths"].items():
        path = re.sub(r"\{(\w+)\}", lambda m: "1" if m.group(1) == "number" else "x", template)
        routes += [(method.upper(), path) for method in operations]
    return routes


def test_every_route_in_the_schema_needs_a_key(server: dict[str, Any]) -> None:
    c = server["client"]
    assert c.get("/openapi.json").status_code == 401
    assert c.get("/docs").status_code == 401
    schema = c.get("/openapi.json", headers=auth(server["read"])).json()
    routes = _routes(schema)
    assert len(routes) >= 12
    assert {("POST", "/v1/studies"), ("GET", "/v1/jobs/x/fhir"), ("GET", "/readyz")} <= set(routes)
    for method, path in routes:
        for headers in (
            {},
            {"Authorization": "Bearer rsk_0000000000000000_" + "A" * 43},
            {"X-API-Key": "nonsense"},
        ):
            r = c.request(method, path, headers=headers)
            if (method, path) in PUBLIC:
                assert r.status_code == 200, (method, path)
                continue
            assert r.status_code in (401, 403), (method, path, headers, r.status_code)
            assert r.json()["error"]["code"] in ("unauthenticated", "forbidden")
            if r.status_code == 401:
                assert r.headers["www-authenticate"].startswith("Bearer")
    assert schema["components"]["securitySchemes"].keys() >= {"HTTPBearer", "APIKeyHeader"}


def test_roles(server: dict[str, Any]) -> None:
    c = server["client"]
    read, submit, admin = (auth(server[r]) for r in ("read", "submit", "admin"))
    assert c.get("/v1/jobs", headers=read).status_code == 200
    assert c.get("/v1/jobs", headers={"X-API-Key": server["read"]}).status_code == 200
    for headers in (read,):
        r = c.post("/v1/studies", files={"files": ("a.dcm", b"x")}, headers=headers)
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        assert c.delete("/v1/jobs/x", headers=headers).status_code == 403
    for headers in (read, submit):
        assert c.post("/v1/admin/models/organs-test/reset", headers=headers).status_code == 403
    assert c.post("/v1/admin/models/organs-test/reset", headers=admin).status_code == 200
    assert c.delete("/v1/jobs/x", headers=submit).status_code == 404  # past auth: no such job


def test_two_different_keys_in_one_request_are_refused(server: dict[str, Any]) -> None:
    """A user trial (session 42): with both headers, X-API-Key won, so an invalid Bearer
    key beside a valid X-API-Key answered 200, and a client behind a proxy that sets
    Authorization could act as another key by adding its own X-API-Key."""
    c = server["client"]
    read, admin = server["read"], server["admin"]
    bogus = "rsk_0000000000000000_" + "A" * 43
    for bearer, api_key in ((bogus, read), (read, admin), (admin, read)):
        r = c.get("/v1/jobs", headers={"Authorization": f"Bearer {bearer}", "X-API-Key": api_key})
        assert r.status_code == 401, (bearer[:8], api_key[:8], r.text)
        assert "two different API keys" in r.json()["error"]["message"]
    same = {"Authorization": f"Bearer {read}", "X-API-Key": read}
    assert c.get("/v1/jobs", headers=same).status_code == 200
    basic_and_key = {"Authorization": "Basic dXNlcjpwdw==", "X-API-Key": read}  # a proxy's
    assert c.get("/v1/jobs", headers=basic_and_key).status_code == 200


def test_resetting_a_model_that_does_not_exist_is_404_and_not_audited(
    server: dict[str, Any],
) -> None:
    c, store = server["client"], server["service"].store
    admin = auth(server["admin"])

    def resets() -> list[str | None]:
        return [r.subject for r in store.iter_audit() if r.action == "model.changed"]

    before = resets()
    for name in ("no-such-model", "organs-test.bak", "x" * 200):
        r = c.post(f"/v1/admin/models/{name}/reset", headers=admin)
        assert r.status_code == 404, (name, r.text)
        assert r.json()["error"]["code"] == "model_not_found"
        assert "organs-test" in r.json()["error"]["message"]  # says what is installed
    assert resets() == before  # nothing happened, so nothing was audited
    assert c.post("/v1/admin/models/organs-test/reset", headers=admin).status_code == 200
    assert resets() == [*before, "organs-test"]


def test_revoked_key_is_refused(server: dict[str, Any]) -> None:
    c, store = server["client"], server["service"].store
    record, token = store.create_api_key(name="short-lived", role="read")
    assert c.get("/v1/jobs", headers=auth(token)).status_code == 200
    store.revoke_api_key(record.id)
    r = c.get("/v1/jobs", headers=auth(token))
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]


def test_metrics_can_require_a_key(tmp_path: Path) -> None:
    service = Service(settings_for(tmp_path, server__metrics_require_key=True))
    key = create_key(service.store, "read")
    with (
        ServerThread(create_app(service, manage_service=False)) as srv,
        httpx.Client(base_url=srv.url) as c,
    ):
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers=auth(key)).status_code == 200
        assert c.get("/healthz").status_code == 200
    service.store.close()
