"""The web console: served at ``/`` by ``radserve serve`` (see the README's "Web console").

:func:`install` adds it to the API app: the session table and sign-in limiter, the
sign-in endpoints, the live job feed (fed by the job cache), the console's endpoints
and the built front end (``static/``, made from ``console/`` in the repository by
``npm run build``; no Node.js at run time).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response

from radserve.api.files import FileAnswer, StaticFileAnswers
from radserve.config import load_settings
from radserve.console.accessions import AccessionBackfill
from radserve.console.auth import session_principal
from radserve.console.events import JobFeed
from radserve.console.ops import OpsHistory
from radserve.console.routes import api_router, router
from radserve.console.sessions import EVENTS_PATH, SessionTable
from radserve.console.signin import limiter_for
from radserve.console.signin import router as signin_router
from radserve.console.studyinfo import StudyInfo
from radserve.console.users import LocalUsers
from radserve.service import Service

STATIC = Path(__file__).parent / "static"
# the page: no inline script, nothing from other origins, no framing
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; worker-src 'self' blob:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def install(app: FastAPI, service: Service, config_file: Path | None = None) -> None:
    """Add the console to ``app`` (when ``console.enabled``); ``config_file``: the
    settings file whose ``console.users`` are re-read when it changes (:class:`LocalUsers`)."""
    settings = service.settings.console
    if not settings.enabled:
        return
    app.state.console_users = LocalUsers(
        settings.users,
        config_file,
        load=lambda path: load_settings(path, data_dir=service.settings.data_dir),
    )
    # the session cookie is Secure when so configured, else with this server's TLS, else
    # per request by its trusted scheme (None; radserve.console.auth.session_cookie)
    app.state.console_secure_cookie = (
        settings.secure_cookie
        if settings.secure_cookie is not None
        else (True if service.settings.server.tls is not None else None)
    )
    app.state.console_sessions = SessionTable(
        service.store, ttl_s=settings.session_ttl_s, idle_s=settings.idle_timeout_s
    )
    feed = JobFeed()
    service.cache.subscribe(feed.publish)
    app.state.console_feed = feed
    app.state.console_info = StudyInfo()
    app.state.console_accessions = AccessionBackfill(service.store, app.state.console_info)
    app.state.console_ops = OpsHistory(service)
    app.state.console_limiter = limiter_for(settings, service.store)
    app.state.session_principal = session_principal
    app.include_router(signin_router)
    app.include_router(router)
    app.include_router(api_router)
    index = STATIC / "index.html"

    async def page(request: Request) -> Response:
        if not index.is_file():
            return HTMLResponse(
                "<p>The console's front end is not built: run <code>make console</code>.</p>",
                status_code=503,
            )
        # Range as every file answer reads it (RFC 9110 14.2: an invalid one is ignored)
        return FileAnswer(index, media_type="text/html", headers=_HEADERS)

    app.add_api_route("/", page, methods=["GET"], include_in_schema=False, response_model=None)
    if (STATIC / "assets").is_dir():
        assets = StaticFileAnswers(directory=STATIC / "assets")
        app.mount("/console/assets", assets, name="console")


__all__ = ["EVENTS_PATH", "install"]
