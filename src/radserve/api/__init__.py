"""The HTTP API: FastAPI app factory, routers, schemas, auth, and the one error table.

Async lives here only; the service it calls is synchronous and runs on worker threads.
"""

from radserve.api.app import create_app

__all__ = ["create_app"]
