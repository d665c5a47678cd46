"""The floor of the API read load (issue 19 goal 5): what the same load generator gets
from an HTTP server that does nothing but answer, on the same cores, in the same run.

``python -m radserve.bench.load_floor --port P --framework fastapi|starlette
--status-bytes N --report-bytes M [--busy-threads K] [--nice 5]`` serves
``GET /v1/jobs/{job_id}`` with a constant JSON body of N bytes and
``GET /v1/jobs/{job_id}/report`` with one of M bytes (the sizes radserve answered in the
run it is compared with), through uvicorn with the settings ``radserve serve`` uses
(httptools, the default loop, no access log, no server header): no auth, no audit, no
job lookup, no serialisation. ``--busy-threads K`` adds K pure-Python threads spinning in
the server's own process (at ``--nice``, as radserve's inference workers run): a stand-in
for inference that holds the GIL the event loop needs, as radserve's in-process inference
threads do; :func:`busy_neighbours` starts the other stand-in, K processes that only take
the cores.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import threading
from typing import Any

STATUS_PATH = "/v1/jobs/{job_id}"
REPORT_PATH = "/v1/jobs/{job_id}/report"
FRAMEWORKS = ("fastapi", "starlette")


def constant_json(size: int) -> bytes:
    """A JSON object of exactly ``size`` bytes (at least 12)."""
    head = b'{"pad":"'
    tail = b'"}'
    return head + b"x" * max(0, size - len(head) - len(tail)) + tail


def build_app(framework: str, status_body: bytes, report_body: bytes) -> Any:
    """The bare ASGI app: two GET routes, each answering its constant body."""
    if framework == "fastapi":
        from fastapi import FastAPI, Response

        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

        @app.get(STATUS_PATH)
        async def status(job_id: str) -> Response:
            return Response(status_body, media_type="application/json")

        @app.get(REPORT_PATH)
        async def report(job_id: str) -> Response:
            return Response(report_body, media_type="application/json")

        return app
    if framework == "starlette":
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response as PlainResponse
        from starlette.routing import Route

        async def plain_status(request: Request) -> PlainResponse:
            return PlainResponse(status_body, media_type="application/json")

        async def plain_report(request: Request) -> PlainResponse:
            return PlainResponse(report_body, media_type="application/json")

        return Starlette(
            routes=[Route(STATUS_PATH, plain_status), Route(REPORT_PATH, plain_report)]
        )
    raise ValueError(f"unknown framework {framework!r}")


def _lower_this_thread(nice: int) -> None:
    if nice > 0:
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def _spin(nice: int) -> None:
    _lower_this_thread(nice)
    count = 0
    while True:  # pure Python: holds the GIL but at the interpreter's switch interval
        count += 1


def busy_neighbours(count: int, nice: int) -> list[subprocess.Popen[bytes]]:
    """``count`` processes that spin on a core each at ``nice``, until terminated."""
    code = f"import os; os.nice({int(nice)})\nwhile True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m radserve.bench.load_floor")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--framework", choices=FRAMEWORKS, default="fastapi")
    parser.add_argument("--status-bytes", type=int, default=600)
    parser.add_argument("--report-bytes", type=int, default=4000)
    parser.add_argument("--busy-threads", type=int, default=0)
    parser.add_argument("--nice", type=int, default=5)
    parser.add_argument(
        "--switch-interval-ms", type=float, default=None, help="sys.setswitchinterval"
    )
    args = parser.parse_args(argv)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)

    import uvicorn

    app = build_app(
        args.framework, constant_json(args.status_bytes), constant_json(args.report_bytes)
    )
    for _ in range(args.busy_threads):
        threading.Thread(target=_spin, args=(args.nice,), daemon=True).start()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        log_config=None,
        access_log=False,
        timeout_keep_alive=30,
        server_header=False,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
