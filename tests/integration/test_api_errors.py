"""Bad input and overload: refused at submission with a clear 4xx/503 when that is
cheap to see, otherwise the job fails with an error code and message. Never a crash,
and never another study's data lost."""

from __future__ import annotations

import gzip
import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.factories.dicom_series import make_mr_series
from tests.factories.service import (
    ServerThread,
    auth,
    create_key,
    live_server,
    make_study,
    settings_for,
    upload,
    wait_job,
)
from tests.factories.waits import WAIT_SCALE

from radserve.api import create_app
from radserve.errors import InferenceError
from radserve.service import Service

LIMIT = 400_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("api-errors")
    settings = settings_for(root, server__max_upload_bytes=LIMIT, server__request_timeout_s=2.0)
    with live_server(settings, roles=("admin",)) as live:
        yield {**live, "key": live["admin"]}


def _count_jobs(service: Service) -> int:
    return len(service.store.list_jobs(limit=1000).items)


def _stored_studies(service: Service) -> set[Path]:
    return set((service.settings.data_dir / "studies").glob("*/*"))


def _error(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"%PDF-1.4 not an image", "not DICOM"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 600, "not DICOM"),
        (b"", "empty"),
    ],
)
def test_files_that_are_no_image_are_refused_at_once(
    server: dict[str, Any], tmp_path: Path, content: bytes, why: str
) -> None:
    c, key, service = server["client"], server["key"], server["service"]
    before, studies = _count_jobs(service), _stored_studies(service)
    good = upload(make_study(tmp_path / "s"))
    r = c.post("/v1/studies", files=[*good, ("files", ("x", content, "x/y"))], headers=auth(key))
    assert r.status_code == 415 and _error(r) == "unsupported_media_type"
    assert f"file {len(good) + 1} of {len(good) + 1} is {why}" in r.json()["error"]["message"]
    assert _count_jobs(service) == before and _stored_studies(service) == studies


def test_requests_the_server_cannot_serve(server: dict[str, Any], tmp_path: Path) -> None:
    c, key = server["client"], server["key"]
    files = upload(make_study(tmp_path / "s"))
    r = c.post("/v1/studies", params={"pipeline": "no-such"}, files=files, headers=auth(key))
    assert r.status_code == 422 and _error(r) == "pipeline_invalid"
    assert "test-pipeline" in r.json()["error"]["message"].split("available:")[1]
    r = c.post(
        "/v1/studies", params={"pipeline": "../../etc/x.yaml"}, files=files, headers=auth(key)
    )
    assert r.status_code == 422 and _error(r) == "pipeline_invalid"
    r = c.post("/v1/studies", params={"priority": "asap"}, files=files, headers=auth(key))
    assert r.status_code == 400 and _error(r) == "invalid_request"
    r = c.post(
        "/v1/studies", content=b"{}", headers={**auth(key), "content-type": "application/json"}
    )
    assert r.status_code == 415 and _error(r) == "unsupported_media_type"
    r = c.post("/v1/studies", files={"notes": (None, "only a field")}, headers=auth(key))
    assert r.status_code == 400 and _error(r) == "empty_upload"


def test_uploads_over_the_limit_are_stopped_while_streaming(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, key, service = server["client"], server["key"], server["service"]
    before = _count_jobs(service)
    request = c.build_request("POST", "/v1/studies", files=upload(make_study(tmp_path / "s")))
    body = request.read() + b"\0" * LIMIT  # padding in the epilogue: only the size matters
    headers = {**auth(key), "content-type": request.headers["content-type"]}
    declared = c.post("/v1/studies", content=body, headers=headers)
    assert declared.status_code == 413 and _error(declared) == "upload_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
        for start in range(0, len(body), 32_768):
            yield body[start : start + 32_768]

    streamed = c.post("/v1/studies", content=chunks(), headers=headers)
    assert streamed.status_code == 413 and _error(streamed) == "upload_too_large"
    assert _count_jobs(service) == before
    assert not list((service.settings.data_dir / "staging").glob("*"))


def test_truncated_and_stalled_uploads(server: dict[str, Any], tmp_path: Path) -> None:
    c, key, service = server["client"], server["key"], server["service"]
    before = _count_jobs(service)
    request = c.build_request("POST", "/v1/studies", files=upload(make_study(tmp_path / "s")))
    body = request.read()
    cut = body[:-200]  # the last file is cut short; the length header says so
    headers = {**auth(key), "content-type": request.headers["content-type"]}
    r = c.post("/v1/studies", content=cut, headers=headers)
    assert r.status_code == 400 and _error(r) == "upload_incomplete"
    # cut short in transit: sending it again can succeed, as the message says
    assert r.json()["error"]["retryable"] is True and "send it again" in r.text

    head = (
        "POST /v1/studies HTTP/1.1\r\nHost: radserve\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: {request.headers['content-type']}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=10) as sock:
        sock.sendall(head + body[:4000])  # the client goes away mid-upload
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=10) as sock:
        sock.sendall(head + body[:4000])  # the client stalls mid-upload
        t0 = time.monotonic()
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
    assert 1.5 < time.monotonic() - t0 < 10
    assert c.get("/healthz").status_code == 200
    assert _count_jobs(service) == before


def test_a_request_head_that_trickles_in_or_never_comes_gets_408(server: dict[str, Any]) -> None:
    """Slowloris: connections that send their head a line at a time, or nothing, are
    answered 408 and closed after ``server.request_timeout_s`` (2 s here); they were
    held open for as long as the client liked."""
    with (
        socket.create_connection(("127.0.0.1", server["port"]), timeout=30) as trickle,
        socket.create_connection(("127.0.0.1", server["port"]), timeout=30) as silent,
    ):
        trickle.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: radserve\r\n")
        answer = b""
        for _ in range(120):  # a header line every 0.25 s until the server answers
            try:
                trickle.sendall(b"X-Slow: 1\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            if select.select([trickle], [], [], 0.25)[0]:
                break
        answer = trickle.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
        assert silent.recv(4096).startswith(b"HTTP/1.1 408")  # the socket's 30 s bound it
    assert server["client"].get("/healthz").status_code == 200


def _read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return data
        if not chunk:
            return data
        data += chunk


def _trickle(sock: socket.socket, seconds: float) -> bool:
    """Send a byte every 0.2 s until the server answers or closes (True), or for
    ``seconds`` (False)."""
    for _ in range(int(seconds / 0.2)):
        try:
            sock.sendall(b"x")
        except (BrokenPipeError, ConnectionResetError):
            return True
        if select.select([sock], [], [], 0.2)[0]:
            return True
    return False


def test_a_body_that_trickles_in_gets_408_and_the_connection_closed(
    server: dict[str, Any],
) -> None:
    """A byte every 0.2 s never passed the idle bound between chunks, so the upload was
    read for as long as it came. Under ``server.min_body_rate_bytes_s`` (1 KiB/s) after a
    head start of ``server.request_timeout_s`` (2 s here) it is answered 408 with the
    JSON error body and closed; a route that answered without reading the body has its
    connection closed too."""
    c, key, service = server["client"], server["key"], server["service"]
    before = _count_jobs(service)
    upload_head = (
        "POST /v1/studies HTTP/1.1\r\nHost: radserve\r\n"
        f"Authorization: Bearer {key}\r\n"
        "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=30) as sock:
        sock.sendall(upload_head + b"--b\r\n")
        assert _trickle(sock, 60), "the trickling upload was never answered"
        answer = _read_to_close(sock)  # and then closed
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"application/json" in head
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert "server.min_body_rate_bytes_s" in json.loads(body)["error"]["message"]

    read_head = (
        f"GET /v1/jobs HTTP/1.1\r\nHost: radserve\r\nAuthorization: Bearer {key}\r\n"
        "Content-Length: 100000\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=30) as sock:
        sock.sendall(read_head)
        answered = sock.recv(65536)  # answered without reading the body
        assert answered.startswith(b"HTTP/1.1 200")
        assert _trickle(sock, 60), "the connection was held while the body trickled on"
        _read_to_close(sock)
    assert c.get("/healthz").status_code == 200
    assert _count_jobs(service) == before


def test_an_upload_with_pauses_is_not_cut_while_its_rate_holds(
    server: dict[str, Any], tmp_path: Path
) -> None:
    """The rate bound is an average with credit, not a deadline: an upload that pauses
    three times for 1.5 s (4.5 s in all, over the 2 s head start, each pause under the
    2 s idle bound) after sending most of its bytes at once is stored (202)."""
    c, key = server["client"], server["key"]
    request = c.build_request("POST", "/v1/studies", files=upload(make_study(tmp_path / "s")))
    body = request.read()
    head = (
        "POST /v1/studies HTTP/1.1\r\nHost: radserve\r\nConnection: close\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: {request.headers['content-type']}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    cuts = [len(body) // 2, len(body) * 3 // 4, len(body) - 10]
    with socket.create_connection(("127.0.0.1", server["port"]), timeout=60) as sock:
        sent = 0
        sock.sendall(head)
        for cut in cuts:
            sock.sendall(body[sent:cut])
            sent = cut
            time.sleep(1.5)
        sock.sendall(body[sent:])
        answer = _read_to_close(sock)
    assert answer.startswith(b"HTTP/1.1 202"), answer[:300]


def test_bad_studies_fail_with_a_code_and_others_are_unharmed(
    server: dict[str, Any], tmp_path: Path
) -> None:
    c, key = server["client"], server["key"]
    good = make_study(tmp_path / "good")
    corrupt = [b"\0" * 128 + b"DICM" + b"\x02\x00garbage" * 50 for _ in range(3)]
    truncated = make_study(tmp_path / "truncated")
    cut = [p.read_bytes()[: len(p.read_bytes()) // 2] for p in truncated]
    mr = make_mr_series(tmp_path / "mr", n_slices=6, rows=24, cols=24)
    submissions = {
        "corrupt": [
            ("files", (f"c{i}.dcm", data, "application/dicom")) for i, data in enumerate(corrupt)
        ],
        "truncated": [
            ("files", (f"t{i}.dcm", data, "application/dicom")) for i, data in enumerate(cut)
        ],
        "good": upload(good),
    }
    # no series the pipeline can use (a CT pipeline, an MR study): refused at the door,
    # 422 with the code its job would have failed with, no job
    r = c.post("/v1/studies", files=upload(mr), headers=auth(key))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "unsupported_modality"
    ids = {}
    for name, files in submissions.items():
        r = c.post("/v1/studies", files=files, headers=auth(key))
        assert r.status_code == 202, (name, r.text)
        ids[name] = r.json()["id"]
    jobs = {name: wait_job(c, job_id, key) for name, job_id in ids.items()}
    assert jobs["good"]["state"] == "succeeded"
    assert c.get(f"/v1/jobs/{ids['good']}/report", headers=auth(key)).json()["findings"]
    expected = {
        "corrupt": {"not_dicom"},
        "truncated": {"not_dicom", "decode_failed"},
    }
    for name, codes in expected.items():
        job = jobs[name]
        assert job["state"] == "failed", (name, job)
        assert job["error"]["code"] in codes, (name, job["error"])
        assert job["error"]["message"]
    metrics = c.get("/metrics").text
    assert 'radserve_errors_total{code="unsupported_modality"}' in metrics


def test_full_queue_refuses_routine_work_never_urgent(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, scheduler__queue_limits__outpatient=1)
    service = Service(settings)  # not started: nothing leaves the queue
    key = create_key(service.store, "submit")
    with (
        ServerThread(create_app(service, manage_service=False)) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as c,
    ):
        first = c.post("/v1/studies", files=upload(make_study(tmp_path / "a")), headers=auth(key))
        assert first.status_code == 202
        full = c.post("/v1/studies", files=upload(make_study(tmp_path / "b")), headers=auth(key))
        assert full.status_code == 503 and _error(full) == "queue_full"
        assert int(full.headers["retry-after"]) >= 1 and full.json()["error"]["retryable"]
        stated = c.post(
            "/v1/studies",
            params={"priority": "outpatient"},
            files=upload(make_study(tmp_path / "c")),
            headers=auth(key),
        )
        assert stated.status_code == 503  # refused before the upload was read
        for name in ("u1", "u2", "u3"):
            urgent = c.post(
                "/v1/studies",
                params={"priority": "urgent"},
                files=upload(make_study(tmp_path / name)),
                headers=auth(key),
            )
            assert urgent.status_code == 202 and urgent.json()["priority_class"] == "URGENT"
        depth = c.get("/metrics").text
        assert 'radserve_queue_depth{cls="URGENT"} 3.0' in depth
        assert 'radserve_queue_depth{cls="OUTPATIENT"} 1.0' in depth
    service.store.close()


def test_circuit_breaker_shows_in_readyz_until_reset(tmp_path: Path) -> None:
    service = Service(
        settings_for(
            tmp_path,
            jobs__max_retries=5,
            jobs__retry_backoff_s=0.1,  # the retry runs at once, not 5 s later
            scheduler__breaker_threshold=2,
        )
    )
    admin = create_key(service.store, "admin")
    with ServerThread(create_app(service)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        assert service.wait_warm(60 * WAIT_SCALE)
        assert c.get("/readyz", headers=auth(admin)).status_code == 200
        catalog = service.catalog
        session = catalog.sessions.get(catalog.registry.get("organs-test"), "fp32")

        def broken(batch: Any) -> Any:
            raise InferenceError("device lost (test)")

        session.run = broken  # type: ignore[method-assign]
        job = c.post("/v1/studies", files=upload(make_study(tmp_path / "a")), headers=auth(admin))
        failed = wait_job(c, job.json()["id"], admin)
        assert failed["state"] == "failed" and failed["error"]["code"] == "model_unavailable"
        ready = c.get("/readyz", headers=auth(admin))
        assert ready.status_code == 503
        assert ready.json()["open_models"] == ["organs-test"]
        assert "model organs-test circuit breaker is open" in ready.json()["reasons"]
        refused = c.post(
            "/v1/studies", files=upload(make_study(tmp_path / "b")), headers=auth(admin)
        )
        assert refused.status_code == 503 and _error(refused) == "model_unavailable"
        del session.run  # the instance attribute: the real method again
        reset = c.post("/v1/admin/models/organs-test/reset", headers=auth(admin))
        assert reset.json() == {"model": "organs-test", "was_open": True}
        assert c.get("/readyz", headers=auth(admin)).status_code == 200
        again = c.post("/v1/studies", files=upload(make_study(tmp_path / "c")), headers=auth(admin))
        assert wait_job(c, again.json()["id"], admin)["state"] == "succeeded"
    changes = [r.payload for r in service.store.iter_audit() if r.action == "model.changed"]
    assert {"event": "breaker_reset", "was_open": True} in changes


def test_slow_requests_get_504_uploads_are_exempt() -> None:
    import anyio

    from radserve.api.middleware import TimeoutMiddleware

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        await anyio.sleep(0.3)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    async def run() -> tuple[httpx.Response, httpx.Response]:
        app = TimeoutMiddleware(slow, timeout_s=0.05, exempt=("/v1/studies",))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://radserve") as c:
            return await c.get("/v1/jobs"), await c.post("/v1/studies")

    timed_out, upload_ = anyio.run(run)
    assert timed_out.status_code == 504 and _error(timed_out) == "request_timeout"
    assert upload_.status_code == 200 and upload_.content == b"done"


def _gzipped_nifti() -> bytes:
    import nibabel as nib
    import numpy as np

    image = nib.Nifti1Image(np.zeros((8, 8, 4), dtype=np.int16), np.eye(4))
    return gzip.compress(image.to_bytes())


@pytest.mark.parametrize(
    ("inner", "what"),
    [
        (b"patient notes, not an image\n" * 40, "not DICOM, a zip archive or NIfTI"),
        (b"\0" * 128 + b"DICM" + b"\x02\x00" * 300, "a DICOM file"),
        (b"tiny", "not DICOM, a zip archive or NIfTI"),
    ],
)
def test_a_gzip_that_holds_no_nifti_is_refused_at_once(
    server: dict[str, Any], inner: bytes, what: str
) -> None:
    """Only NIfTI is accepted gzip-compressed; any gzip was taken for one and became a job
    that failed (``nifti_invalid``) until 2026-12-07. Its first bytes are inflated at the
    door now (bounded), as the other kinds are told by theirs."""
    c, key, service = server["client"], server["key"], server["service"]
    before, studies = _count_jobs(service), _stored_studies(service)
    files = [("files", ("study.nii.gz", gzip.compress(inner), "application/gzip"))]
    r = c.post("/v1/studies", files=files, headers=auth(key))
    assert r.status_code == 415 and _error(r) == "unsupported_media_type", r.text
    message = r.json()["error"]["message"]
    assert "file 1 of 1 is gzip-compressed" in message and f"({what})" in message, message
    assert _count_jobs(service) == before and _stored_studies(service) == studies
    # a real .nii.gz still passes the door (its job is the pipeline's business; the
    # module's one server answers the same volume's second upload with its first job)
    files = [("files", ("volume.nii.gz", _gzipped_nifti(), "application/gzip"))]
    assert c.post("/v1/studies", files=files, headers=auth(key)).status_code in (200, 202)
