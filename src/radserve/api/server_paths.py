"""Server file paths out of the messages the API sends.

Core errors name files by their full path, which is right for the server's log and for
the CLI user who gave the path, but not for an HTTP client: a bad model bundle uploaded
to ``POST /v1/models`` was answered with ``cannot read model manifest
/var/lib/radserve/models/.staging/tmpab12/zip/b/model.yaml: ...``, which tells a client
where the data folder is, how it is laid out and which user runs the server. Every error
message leaving the API goes through :func:`without_server_paths`, which keeps a path's
last component (what the client can act on: ``model.yaml``) and drops the folders.

Only paths whose first folder exists on this host (``/var``, ``/tmp``, ``/srv``,
``/home``...) are shortened, so a URL path quoted in a message (``/v1/jobs/...``,
``/dicomweb/studies``) or a media type (``application/dicom``) is left alone.
"""

from __future__ import annotations

import functools
import os
import re

# an absolute path of two or more components, not inside a word, URL or media type
_PATH = re.compile(r"(?<![\w.:/~@-])/([\w.@+-]+)(?:/[\w.@+-]+)+/?")


@functools.lru_cache(maxsize=256)
def _host_folder(name: str) -> bool:
    return os.path.isdir(os.path.join(os.sep, name))


def _shorten(match: re.Match[str]) -> str:
    if not _host_folder(match.group(1)):
        return match.group(0)
    return match.group(0).rstrip("/").rsplit("/", 1)[1]


def without_server_paths(message: str) -> str:
    """``message`` with each path on this host replaced by its last component."""
    return _PATH.sub(_shorten, message) if "/" in message else message


__all__ = ["without_server_paths"]
