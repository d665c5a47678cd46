"""Every audit record, as it happens, to an IHE ATNA audit record repository: RFC 5424
syslog messages over TLS (RFC 5425, octet-counting framing), each carrying a DICOM
PS3.15 A.5 audit message (or a FHIR AuditEvent).

Delivery never blocks the request path and survives a collector that is down: the
database *is* the buffer. A thread reads the chain after a cursor (``seq hash`` in a
file outside the database), checks each record's link and HMAC before sending it (a
record that does not verify stops the export and raises a critical alert), sends it,
and moves the cursor on. Appends in this process wake it at once; records other
processes wrote (CLI commands) are picked up every ``poll_s``. While the collector is
unreachable it retries with back-off (``retry_first_s`` doubling to ``retry_max_s``),
and sends everything it missed when it is back, oldest first.

RFC 5425 has no acknowledgement: records written to the socket in the moment the
collector fails may be lost *to the collector* (they stay in the chain and the
checkpoints; ``radserve audit export`` replays them). A restart resends from the cursor,
so a collector may see a record twice: the seq identifies it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from radserve import durable
from radserve.audit.atna import dicom_audit_message, fhir_audit_event
from radserve.audit.chain import GENESIS_HASH, AuditKey, AuditRecord
from radserve.loop_failures import LoopFailures

if TYPE_CHECKING:
    from radserve.audit.seal import Checkpoint
    from radserve.config import SyslogSettings, TlsSettings
    from radserve.store import Store

logger = logging.getLogger(__name__)

FACILITY_AUTHPRIV = 10  # security/authorization messages (RFC 5424 table 1)
FACILITY_LOCAL0 = 16
NOTICE, WARNING, CRITICAL, ALERT = 5, 4, 2, 1
SD_ID = "radserve@32473"  # 32473: the enterprise number RFC 5612 reserves for examples
MSGID = {"dicom": "IHE+RFC-3881", "fhir": "IHE+FHIR"}
_BOM = b"\xef\xbb\xbf"
_PAGE = 200


def rfc5424(
    body: bytes,
    *,
    msgid: str,
    ts: dt.datetime,
    app_name: str,
    structured: dict[str, str],
    severity: int = NOTICE,
    facility: int = FACILITY_AUTHPRIV,
) -> bytes:
    """One RFC 5424 message: header, one SD element, BOM + UTF-8 body."""
    pri = facility * 8 + severity
    stamp = ts.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    host = "".join(c for c in socket.gethostname() if "!" <= c <= "~")[:255] or "-"
    params = " ".join(f'{k}="{_sd_escape(v)}"' for k, v in structured.items())
    header = f"<{pri}>1 {stamp} {host} {app_name} {os.getpid()} {msgid} [{SD_ID} {params}] "
    return header.encode("ascii") + _BOM + body


def _sd_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("]", "\\]")


def frame(message: bytes) -> bytes:
    """RFC 5425 octet counting: ``MSG-LEN SP SYSLOG-MSG``."""
    return f"{len(message)} ".encode("ascii") + message


def record_message(record: AuditRecord, *, format: str, app_name: str, source_id: str) -> bytes:
    body = (
        dicom_audit_message(record, source_id=source_id)
        if format == "dicom"
        else fhir_audit_event(record, source_id=source_id)
    )
    return rfc5424(
        body,
        msgid=MSGID[format],
        ts=record.ts,
        app_name=app_name,
        structured={"seq": str(record.seq), "hash": record.hash, "action": record.action},
    )


def checkpoint_message(checkpoint: Checkpoint, key: AuditKey, *, app_name: str) -> bytes:
    return rfc5424(
        json.dumps(checkpoint.signed(key), sort_keys=True).encode(),
        msgid="RADSERVE-CHECKPOINT",
        ts=dt.datetime.now(dt.UTC),
        app_name=app_name,
        structured={"seq": str(checkpoint.seq), "hash": checkpoint.head},
    )


class SyslogTarget(Protocol):
    """The settings of an alert collector (config: a syslog critical receiver,
    ``turnaround.risk_syslog``)."""

    @property
    def host(self) -> str | None: ...
    @property
    def syslog_port(self) -> int: ...
    @property
    def transport(self) -> str: ...
    @property
    def tls(self) -> TlsSettings: ...
    @property
    def server_name(self) -> str | None: ...
    @property
    def timeout_s(self) -> float: ...


@dataclass(frozen=True)
class SyslogEndpoint:
    """Where a syslog stream goes: ``tls`` set: RFC 5425 (TLS 1.2+, ``tls.ca`` verifies
    the collector, ``tls.cert`` + ``key`` is the client certificate); ``tls`` None: plain
    TCP (RFC 6587 octet counting), for a collector on a trusted network only."""

    host: str
    port: int
    tls: TlsSettings | None
    server_name: str | None = None
    timeout_s: float = 10.0

    @classmethod
    def of(cls, settings: SyslogSettings) -> SyslogEndpoint:
        """The audit collector: always TLS (IHE ATNA)."""
        return cls(
            settings.host, settings.port, settings.tls, settings.server_name, settings.timeout_s
        )

    @classmethod
    def of_target(cls, target: SyslogTarget) -> SyslogEndpoint:
        """An alert collector (a critical-finding receiver, the deadline-risk one): TLS
        unless its ``transport`` is tcp."""
        if target.host is None:
            raise ValueError("a syslog collector needs a host")
        tls = target.tls if target.transport == "tls" else None
        return cls(target.host, target.syslog_port, tls, target.server_name, target.timeout_s)

    def describe(self) -> str:
        return f"{'tls' if self.tls is not None else 'tcp'}://{self.host}:{self.port}"


class CollectorClosedError(ConnectionError):
    """The collector closed or reset the stream a message was written to: it was not
    delivered (it is sent again)."""


# a new connection is watched this long after its first write (at most its timeout_s):
# a collector that accepts and closes at once does so within it
FRESH_WATCH_S = 0.25
_DRAIN_READS = 16  # reads of what a collector wrote (it should write nothing) per check


class SyslogClient:
    """One connection to a collector (TLS or TCP), opened on demand, closed on any error.

    A kept connection is checked before each write: a collector sends nothing on a syslog
    stream, so an end of stream or a reset means it closed it (a restart). Writing on such
    a connection would "succeed" into the kernel's buffer and be lost; the client opens a
    new one instead. After each write the stream is checked again without waiting, and
    after the first write on a new connection for up to :data:`FRESH_WATCH_S`: a
    collector that closed or reset it meanwhile (one that accepts and closes at once) did
    not take the message, and :class:`CollectorClosedError` says so (a user trial's
    collector logged 82 connections and 0 bytes while every notice was marked sent).

    Delivery means the bytes were written to a connected stream that the collector had not
    closed when last looked at: syslog has no acknowledgement, so a collector that reads
    and then loses a message, or closes later than that, loses it unseen; one that closes
    right after reading gets it again (the message's ids let it drop the repeat)."""

    def __init__(self, endpoint: SyslogEndpoint | SyslogSettings) -> None:
        if not isinstance(endpoint, SyslogEndpoint):
            endpoint = SyslogEndpoint.of(endpoint)
        self.endpoint = endpoint
        self._sock: socket.socket | None = None
        self._opening: socket.socket | None = None  # connected, TLS handshake under way

    def _context(self, tls: TlsSettings) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(tls.ca) if tls.ca else None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if tls.cert is not None and tls.key is not None:
            context.load_cert_chain(str(tls.cert), str(tls.key))
        return context

    def _connect(self) -> socket.socket:
        end = self.endpoint
        raw = socket.create_connection((end.host, end.port), timeout=end.timeout_s)
        if end.tls is None:
            return raw
        try:
            sock = self._context(end.tls).wrap_socket(
                raw, server_hostname=end.server_name or end.host, do_handshake_on_connect=False
            )
        except BaseException:
            raw.close()
            raise
        self._opening = sock  # the handshake apart, so that abort() can end it
        try:
            sock.do_handshake()
        except BaseException:
            sock.close()
            raise
        finally:
            self._opening = None
        return sock

    def send(self, frames: list[bytes]) -> None:
        """Write ``frames`` to the collector; raises ``OSError`` (or ``ssl.SSLError``)
        when they were not delivered: no connection, a failed write, or a stream the
        collector closed (:class:`CollectorClosedError`)."""
        if self._sock is not None and _peer_closed(self._sock):
            self.close()
        fresh = self._sock is None
        if self._sock is None:
            self._sock = self._connect()
        try:
            self._sock.sendall(b"".join(frames))
            watch_s = min(FRESH_WATCH_S, self.endpoint.timeout_s) if fresh else 0.0
            if _peer_closed(self._sock, watch_s):
                raise CollectorClosedError(
                    f"the syslog collector {self.endpoint.describe()} closed the connection "
                    "the message was written to"
                )
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def abort(self) -> None:
        """From another thread: end a handshake or a write blocked on a collector that
        accepted the connection and does not answer (shutdown wakes the blocked call;
        the sending thread then fails it as it fails any unreachable collector)."""
        for sock in (self._opening, self._sock):
            if sock is not None:
                with contextlib.suppress(OSError):  # the descriptor's, not TLS's close_notify
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _peer_closed(sock: socket.socket, wait_s: float = 0.0) -> bool:
    """True when the collector closed or reset the connection, now or within ``wait_s``
    seconds. A collector never writes to us: what it wrote all the same (a TLS 1.3
    session ticket, handled by the TLS layer) is read and dropped, and only an end of
    stream or an error counts."""
    ends_at = time.monotonic() + wait_s
    while True:
        closed = _stream_ended(sock)
        if closed is not None:
            return closed
        left = ends_at - time.monotonic()
        if left <= 0 or not _readable(sock, left):
            return False


def _readable(sock: socket.socket, wait_s: float) -> bool:
    """Whether ``sock`` has something to read (data, an end, an error) within ``wait_s``."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    try:  # poll, not select: select() refuses descriptors >= 1024, common in a busy server
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(max(0, int(wait_s * 1000))))
    except (OSError, ValueError):
        return True


def _stream_ended(sock: socket.socket) -> bool | None:
    """Without waiting: True when the stream is closed or reset; None when it is open and
    nothing is left to read now; False when it is open but the collector keeps writing
    (more than a few reads' worth)."""
    timeout = sock.gettimeout()
    try:
        sock.setblocking(False)  # a socket with a timeout would wait for it in recv()
        for _ in range(_DRAIN_READS):
            try:
                data = sock.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return None  # open, nothing to read
            except (OSError, ValueError):  # reset, TLS alert or EOF, a closed socket
                return True
            if not data:
                return True  # the collector's end of stream (or TLS close_notify)
        return False
    except (OSError, ValueError):  # a closed socket
        return True
    finally:
        with contextlib.suppress(OSError, ValueError):
            sock.settimeout(timeout)


class ChainBrokenError(Exception):
    """A record after the cursor does not link to it or fails its HMAC."""


class SyslogExporter:
    """The thread that delivers the chain to the collector (see the module docstring)."""

    def __init__(
        self,
        settings: SyslogSettings,
        store: Store,
        key: AuditKey,
        cursor_file: Path,
        *,
        source_id: str | None = None,
        keyed_from: Callable[[], int] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.key = key
        self.cursor_file = Path(cursor_file)
        self.source_id = source_id or f"{settings.app_name}@{socket.gethostname()}"
        self._keyed_from = keyed_from or store.audit_keyed_from
        self.client = SyslogClient(settings)
        self._checkpoint: Checkpoint | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.broken_at: int | None = None
        self.down_since: dt.datetime | None = None

    # --- listeners (cheap: they only wake the thread) ---------------------------------------
    def notify(self, _records: object = None) -> None:
        self._wake.set()

    def offer_checkpoint(self, checkpoint: Checkpoint) -> None:
        with self._lock:
            self._checkpoint = checkpoint
        self._wake.set()

    # --- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="radserve-audit-syslog", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                # blocked on a collector that accepted and does not answer (a handshake
                # or a write, for up to syslog.timeout_s): the last round would block the
                # stop as long, and race the thread for the connection and the cursor
                logger.warning(
                    "audit collector %s:%d did not answer within %.0f s of the stop; "
                    "stopping without the last round (the records stay in the chain and "
                    "are sent at the next start)",
                    self.settings.host,
                    self.settings.port,
                    timeout,
                )
                self.client.abort()
                self._thread.join(timeout)
                self.client.close()
                return
        if self.down_since is None and self.broken_at is None:
            self._stop.clear()  # one last round for what the last requests appended
            try:
                self.deliver()
            except (OSError, ssl.SSLError, ChainBrokenError):
                pass  # still in the chain: sent at the next start
            finally:
                self._stop.set()
        self.client.close()

    def _run(self) -> None:
        backoff = self.settings.retry_first_s
        failures = LoopFailures(logger, "audit export")
        while not self._stop.is_set():
            try:
                self.deliver()
            except (OSError, ssl.SSLError) as exc:
                if self.down_since is None:
                    self.down_since = dt.datetime.now(dt.UTC)
                    logger.warning(
                        "audit collector %s:%d unreachable (%s); records stay queued in the "
                        "chain and are sent when it is back",
                        self.settings.host,
                        self.settings.port,
                        type(exc).__name__,
                    )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.settings.retry_max_s)
                continue
            except ChainBrokenError:  # logged and alerted once per broken record
                self._stop.wait(self.settings.poll_s)
                continue
            except Exception as exc:  # the database away: the chain cannot be read
                failures.failed(exc)
                self._stop.wait(backoff)
                continue
            failures.succeeded()
            if self.down_since is not None:
                logger.warning("audit collector reachable again; queued records sent")
                self.down_since = None
            backoff = self.settings.retry_first_s
            self._wake.wait(self.settings.poll_s)
            self._wake.clear()

    # --- one round ----------------------------------------------------------------------------
    def deliver(self) -> int:
        """Send every record after the cursor (page by page), then the newest checkpoint."""
        sent = 0
        seq, prev = self.read_cursor()
        keyed_from = self._keyed_from()
        while not self._stop.is_set():
            page: list[AuditRecord] = []
            for record in self.store.iter_audit(after=seq):
                page.append(record)
                if len(page) >= _PAGE:
                    break
            if not page:
                break
            frames = []
            for record in page:
                self._check(record, seq, prev, keyed_from)
                frames.append(
                    frame(
                        record_message(
                            record,
                            format=self.settings.format,
                            app_name=self.settings.app_name,
                            source_id=self.source_id,
                        )
                    )
                )
                seq, prev = record.seq, record.hash
            self.client.send(frames)
            self.write_cursor(seq, prev)
            sent += len(page)
        with self._lock:
            checkpoint, self._checkpoint = self._checkpoint, None
        if checkpoint is not None and checkpoint.seq <= seq:
            try:
                self.client.send(
                    [
                        frame(
                            checkpoint_message(
                                checkpoint, self.key, app_name=self.settings.app_name
                            )
                        )
                    ]
                )
            except BaseException:
                self.offer_checkpoint(checkpoint)
                raise
        elif checkpoint is not None:  # its records are not delivered yet: keep it
            self.offer_checkpoint(checkpoint)
        return sent

    def _check(self, record: AuditRecord, seq: int, prev: str, keyed_from: int) -> None:
        keyed = record.key_id is not None
        problem = None
        if record.seq != seq + 1 or record.prev_hash != prev:
            problem = f"record {record.seq} does not link to record {seq} (deleted or inserted)"
        elif not keyed and record.seq >= keyed_from:
            problem = f"record {record.seq} is unkeyed in a keyed chain (forged)"
        elif keyed and record.key_id != self.key.id:
            problem = f"record {record.seq} is keyed with another audit key"
        else:
            if record.expected_hash(self.key if keyed else None) != record.hash:
                problem = f"record {record.seq} does not match its HMAC (edited)"
        if problem is not None:
            if self.broken_at != record.seq:
                self.broken_at = record.seq
                self._alert(problem)
            raise ChainBrokenError(problem)
        self.broken_at = None

    def _alert(self, problem: str) -> None:
        """Log, and tell the collector, that the chain is broken (best effort)."""
        logger.critical("audit export stopped: %s", problem)
        message = rfc5424(
            json.dumps({"alert": "audit chain broken", "problem": problem}).encode(),
            msgid="RADSERVE-ALERT",
            ts=dt.datetime.now(dt.UTC),
            app_name=self.settings.app_name,
            structured={"problem": problem[:200]},
            severity=CRITICAL,
        )
        with contextlib.suppress(OSError, ssl.SSLError):
            self.client.send([frame(message)])

    # --- the cursor ---------------------------------------------------------------------------
    def read_cursor(self) -> tuple[int, str]:
        try:
            seq, digest = self.cursor_file.read_text(encoding="ascii").split()
            return int(seq), digest
        except FileNotFoundError:
            return 0, GENESIS_HASH
        except (ValueError, OSError) as exc:
            raise ChainBrokenError(f"the export cursor {self.cursor_file} is unreadable") from exc

    def write_cursor(self, seq: int, digest: str) -> None:
        self.cursor_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        durable.write_text(self.cursor_file, f"{seq} {digest}\n", encoding="ascii")


__all__ = [
    "FRESH_WATCH_S",
    "ChainBrokenError",
    "CollectorClosedError",
    "SyslogClient",
    "SyslogEndpoint",
    "SyslogExporter",
    "SyslogTarget",
    "checkpoint_message",
    "frame",
    "record_message",
    "rfc5424",
]
