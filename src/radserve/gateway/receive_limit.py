"""The per-instance size limit, applied while a C-STORE's data set arrives.

pynetdicom (with ``STORE_RECV_CHUNKED_DATASET``) writes each incoming data set to a
``NamedTemporaryFile`` as its P-DATA fragments arrive, and radserve could only check the
size once the whole instance was on disk: one hostile peer could fill the disk before
being refused. Here, per association:

- :class:`StoreLimit` wraps the association's ``dimse.receive_primitive`` (called by the
  DUL thread for each P-DATA-TF PDU) and counts the data set bytes of the message being
  received *before* pynetdicom writes them; a message that would exceed ``max_bytes``
  has its temporary file removed and the association aborted (A-ABORT), so nothing past
  the limit is ever written;
- the same count keeps the disk's reserve while the data set arrives: every
  ``SPACE_CHECK_BYTES`` (and at a data set's first fragment) the spool's free space is
  read, and once a data set's next fragment would leave less than ``min_free_bytes``
  (``gateway.min_free_bytes``) its partial file is removed and the rest of it is written
  to a :class:`Discarded` sink (dropped as it arrives: memory stays bounded); the C-STORE
  handler sees the sink (:func:`refused_for_space`) and answers 0xA700 naming the
  reserve, and the association goes on. (The reserve was checked only when the received
  file was copied into its study folder, so an instance of up to ``max_bytes`` (4 GiB)
  per association had filled the spool first.)
- what a message holds in memory while it arrives is bounded too: its command set
  (pynetdicom gathers the fragments of a command set in memory, and counted nothing of
  them: 300 MB of command fragments that never ended took a receiving process up by
  300 MB, kept after the association ended) at :data:`MAX_COMMAND_BYTES`, and a data
  set not written to a file (any message but a C-STORE-RQ: a C-ECHO-RQ declaring a data
  set, data set fragments before any command, a storage commitment report) at
  ``max_memory_bytes`` (``ingest.max_header_bytes``): such a data set was bounded only
  by ``max_bytes`` (4 GiB an association, in memory); past either, the association is
  aborted as for ``max_bytes``;
- the temporary files go to ``spool`` (a folder under the data dir, so the disk budget
  is the data dir's, not TMPDIR's): pynetdicom has no setting for that, so
  :func:`install` routes its ``NamedTemporaryFile`` through :func:`_spooled`, which uses
  the folder of the association whose DUL thread is decoding (or the sink, when that
  association's data set is being discarded).

Both hooks touch pynetdicom internals; :func:`install` refuses to start when they are
missing, and tests/integration/test_gateway_store_limit.py fails if an upgrade moves them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pynetdicom import dimse_messages
from pynetdicom.dimse import DIMSEServiceProvider

logger = logging.getLogger(__name__)

_local = threading.local()  # .limit: the StoreLimit of the association decoding here
_ORIGINAL = tempfile.NamedTemporaryFile
# how many data set bytes may arrive between two reads of the spool's free space: with
# gateway.max_associations (16) receiving at once, the reserve can be overrun by at
# most 16 x this (64 MiB of the default 512 MiB reserve)
SPACE_CHECK_BYTES = 4 * 2**20
# the most a DIMSE message's command set may hold: one is a few hundred bytes (a C-STORE-RQ
# with a Move Originator, some 300); pynetdicom gathers its fragments in memory, unbounded
MAX_COMMAND_BYTES = 64 * 1024
# the default bound on a message's data set held in memory (not a C-STORE-RQ's, which goes
# to a file): ingest.max_header_bytes' default; the SCP passes the site's setting
MAX_MEMORY_BYTES = 64 * 2**20


def _spooled(*args: Any, **kwargs: Any) -> Any:
    """``NamedTemporaryFile`` in the decoding association's spool folder, if any — or
    a :class:`Discarded` sink when that association is short of space."""
    limit = getattr(_local, "limit", None)
    if limit is None:
        return _ORIGINAL(*args, **kwargs)
    if limit.short_of_space:
        return limit.sink()
    kwargs.setdefault("dir", limit.spool)
    return _ORIGINAL(*args, **kwargs)


class Discarded:
    """Stands in for pynetdicom's temporary file of a data set refused for space: what
    arrives is dropped, so neither the disk nor memory holds it. ``name`` is never
    created (pynetdicom unlinks it after the handler: nothing there)."""

    def __init__(self, spool: Path, reason: str) -> None:
        self.name = str(spool / f"discarded-{uuid.uuid4().hex}.dcm")
        self.reason = reason
        self.file = self  # pynetdicom flushes ``.file``

    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        """Nothing is buffered."""

    def close(self) -> None:
        """Nothing is open."""


def refused_for_space(request: Any) -> str | None:
    """Why the C-STORE ``request``'s data set was discarded while it arrived, if it was."""
    sink = getattr(request, "_dataset_file", None)
    return sink.reason if isinstance(sink, Discarded) else None


def install() -> None:
    """Route pynetdicom's C-STORE temporary files through :func:`_spooled` (idempotent).
    Raises RuntimeError when pynetdicom no longer has the hooked names."""
    current = getattr(dimse_messages, "NamedTemporaryFile", None)
    if current is not _ORIGINAL and current is not _spooled:
        raise RuntimeError(
            "pynetdicom.dimse_messages.NamedTemporaryFile is gone or changed: the C-STORE "
            "size limit and spool folder cannot be applied with this pynetdicom version"
        )
    if not callable(getattr(DIMSEServiceProvider, "receive_primitive", None)):
        raise RuntimeError("pynetdicom's DIMSEServiceProvider.receive_primitive is gone")
    dimse_messages.NamedTemporaryFile = _spooled  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Exceeded:
    """What is recorded about a refused instance: the peer and sizes, no patient data."""

    calling_ae: str
    address: str
    received_bytes: int
    limit_bytes: int


class StoreLimit:
    """One association's data set byte count and spool folder (see the module doc)."""

    def __init__(
        self,
        assoc: Any,
        *,
        max_bytes: int,
        spool: Path,
        on_exceeded: Callable[[Exceeded], None] | None = None,
        reserve: Callable[[], int] = lambda: 0,
        max_memory_bytes: int = MAX_MEMORY_BYTES,
    ) -> None:
        self.assoc = assoc
        self.max_bytes = max_bytes
        self.max_memory_bytes = max_memory_bytes
        self.reserve = reserve  # gateway.min_free_bytes, read live as the store does
        self.spool = spool
        self.on_exceeded = on_exceeded
        self.received = 0
        self.received_when_short = 0
        self.refused = False
        self.short_of_space = False  # the data set being received is being discarded
        self._receive = assoc.dimse.receive_primitive
        assoc.dimse.receive_primitive = self.receive

    def receive(self, primitive: Any) -> None:
        if self.refused:
            return  # aborting: nothing more is decoded or written
        dimse = self.assoc.dimse
        if dimse.message is None:  # a new DIMSE message begins
            self.received = 0
            self.short_of_space = False
        values = primitive.presentation_data_value_list
        incoming = sum(
            len(data) - 1
            for _cx, data in values
            if data and not data[0] & 1  # a data set fragment, not the command set
        )
        if self.received + incoming > self.max_bytes:
            self._refuse(self.received + incoming)
            return
        command, in_memory = _held_in_memory(dimse.message)
        command += sum(len(data) - 1 for _cx, data in values if data and data[0] & 1)
        if command > MAX_COMMAND_BYTES:
            what = "a DIMSE command set (a few hundred bytes in any service) passed"
            self._refuse(command, MAX_COMMAND_BYTES, what, "MAX_COMMAND_BYTES")
            return
        if not _to_file(dimse.message):
            in_memory += incoming
            if in_memory > self.max_memory_bytes:
                what = "a data set that is not a C-STORE's (held in memory) passed"
                self._refuse(in_memory, self.max_memory_bytes, what, "ingest.max_header_bytes")
                return
        if not self.short_of_space and self._leaves_too_little_space(incoming):
            self._discard_for_space(self.received + incoming)
        self.received += incoming
        _local.limit = self
        try:
            self._receive(primitive)
        finally:
            _local.limit = None

    def _leaves_too_little_space(self, incoming: int) -> bool:
        if incoming <= 0 or (reserve := self.reserve()) <= 0:
            return False
        step = SPACE_CHECK_BYTES
        if self.received and self.received // step == (self.received + incoming) // step:
            return False  # read at the first fragment and at each step only
        return shutil.disk_usage(self.spool).free - incoming < reserve

    def _discard_for_space(self, received: int) -> None:
        """From here on the data set is dropped: its partial file (if already open) is
        removed and replaced by a sink; one not yet open gets the sink (:func:`_spooled`).
        """
        self.short_of_space = True
        self.received_when_short = received
        message = self.assoc.dimse.message
        if message is not None and getattr(message, "_data_set_file", None) is not None:
            self.discard()
            sink = self.sink()
            message._data_set_file = sink
            message._data_set_path = Path(sink.name)

    def sink(self) -> Discarded:
        requestor = self.assoc.requestor
        logger.warning(
            "C-STORE from AE %r at %s refused (0xA700): receiving its data set (%d bytes "
            "so far) would leave less free space than gateway.min_free_bytes=%d; the "
            "rest of it is discarded",
            str(requestor.ae_title).strip(),
            requestor.address,
            self.received_when_short,
            self.reserve(),
        )
        # the C-STORE's Error Comment: 64 characters with the error code, the setting named
        return Discarded(self.spool, "free space below gateway.min_free_bytes")

    def discard(self) -> None:
        """Remove the temporary file of a message left unfinished (refused, or the
        connection ended mid-instance: pynetdicom would leave it behind)."""
        message = self.assoc.dimse.message
        handle = getattr(message, "_data_set_file", None) if message is not None else None
        if handle is None:
            return
        with contextlib.suppress(OSError):
            handle.close()
        with contextlib.suppress(OSError):
            Path(handle.name).unlink(missing_ok=True)
        message._data_set_file = None
        message._data_set_path = None

    def _refuse(
        self,
        received: int,
        limit: int | None = None,
        what: str = "a C-STORE data set passed",
        setting: str = "ingest.max_file_bytes",
    ) -> None:
        """Abort the association: a message passed ``limit`` (``max_bytes``) bytes of
        ``what``; ``setting`` names the limit (a setting, or what it is)."""
        limit = self.max_bytes if limit is None else limit
        self.refused = True
        self.discard()
        self.assoc.dimse.message = None
        requestor = self.assoc.requestor
        exceeded = Exceeded(
            calling_ae=str(requestor.ae_title).strip(),
            address=str(requestor.address),
            received_bytes=received,
            limit_bytes=limit,
        )
        logger.warning(
            "association from AE %r at %s aborted: %s %d bytes (limit %s=%d)",
            exceeded.calling_ae,
            exceeded.address,
            what,
            received,
            setting,
            limit,
        )
        if self.on_exceeded is not None:
            try:
                self.on_exceeded(exceeded)
            except Exception as exc:  # the abort must happen whatever the audit does
                logger.error("cannot record the refused instance: %s", type(exc).__name__)
        # the DUL thread sends the A-ABORT after this returns; later PDUs are ignored
        self.assoc.abort(block=False)


def _held_in_memory(message: Any) -> tuple[int, int]:
    """(command set bytes, data set bytes) the DIMSE ``message`` being received holds in
    memory (pynetdicom's buffers; a data set written to a file holds none)."""
    if message is None:
        return 0, 0
    command = getattr(message, "encoded_command_set", None)
    data = None if _to_file(message) else getattr(message, "data_set", None)
    return _buffered(command), _buffered(data)


def _buffered(buffer: Any) -> int:
    if not isinstance(buffer, io.BytesIO):
        return 0
    with buffer.getbuffer() as view:  # released at once: the buffer may grow again
        return view.nbytes


def _to_file(message: Any) -> bool:
    """Whether ``message``'s data set is written to a file as it arrives (a C-STORE-RQ's,
    once its command set is read)."""
    return message is not None and getattr(message, "_data_set_file", None) is not None


def clear_spool(spool: Path) -> int:
    """Delete temporary files left in ``spool`` by a crash (never acknowledged)."""
    removed = 0
    for leftover in spool.glob("*.dcm"):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
            removed += 1
    return removed
