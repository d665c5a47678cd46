"""The storage SCP: C-ECHO and C-STORE in, completed studies out to an intake callback.

One pynetdicom AE, one thread per association. Each handler answers exactly one DICOM
status, decided in one place (:meth:`GatewaySCP._on_store`): success only after the
instance is durable (per instance or by group commit: :mod:`radserve.gateway.storage`);
0xA700 when it cannot be made durable; 0xC000 when it cannot be filed. The allow-list
is checked on A-ASSOCIATE-RQ, before any data is accepted.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydicom.dataset import Dataset
from pynetdicom import AE, _config, build_context, evt, register_uid
from pynetdicom import sop_class as pynetdicom_classes
from pynetdicom.association import Association
from pynetdicom.events import Event
from pynetdicom.pdu_primitives import MaximumLengthNotification
from pynetdicom.service_class import StorageServiceClass
from pynetdicom.sop_class import uid_to_service_class

from radserve import error_table
from radserve.gateway import commitment, conformance, reactor
from radserve.gateway.completeness import (
    INTERRUPTED_MARKER,
    RECEIVING_PREFIX,
    Arrivals,
    CompletenessMonitor,
    LatePolicy,
    RefusalReason,
    StudyCallback,
    StudyTracker,
    note_refused,
    receiving_token,
)
from radserve.gateway.config import AllowList, CertificateBinding, PeerCertificate, ScpConfig
from radserve.gateway.conformance import Status, UnwantedPolicy
from radserve.gateway.cpu_ledger import CpuLedger
from radserve.gateway.errors import InstanceRejectedError, OutOfResourcesError
from radserve.gateway.own_results import OwnResults
from radserve.gateway.receive_limit import (
    Exceeded,
    StoreLimit,
    clear_spool,
    install,
    refused_for_space,
)
from radserve.gateway.receivers import ReceiverPool
from radserve.gateway.storage import Disposition, InstanceStore, check_uid
from radserve.gateway.stray_meta import remove_stray_meta
from radserve.gateway.transport import Admission, GatewayServer, make_server, serve_in_thread
from radserve.ingest.headers import UnreadableHeaderError, header_text, read_header
from radserve.ingest.sources import InputTooLargeError
from radserve.security.logs import redact
from radserve.tls import server_context

logger = logging.getLogger(__name__)
# refused presentation contexts named in one log line (senders may propose 100+)
_REFUSED_SHOWN = 5

SPOOL_DIR = "receiving"
_IMAGE_CLASSES = frozenset(conformance.IMAGE_STORAGE)
# A-ASSOCIATE-RJ: rejected-permanent, service-user, calling AE title not recognised
_REJECT_CALLING_AE = (conformance.REJECTED_PERMANENT, 0x01, 0x03)
# A-ASSOCIATE-RJ: rejected-permanent, service-user, no reason given
_REJECT_MALFORMED = (conformance.REJECTED_PERMANENT, 0x01, 0x01)
# A-ASSOCIATE-RJ: rejected-permanent, service-user, called AE title not recognised
_REJECT_CALLED_AE = (conformance.REJECTED_PERMANENT, 0x01, 0x07)
# the least maximum length (PS3.8 D.1: of a P-DATA-TF PDU's variable field) that carries
# data: one PDV item is its length (4 bytes), context ID and control header (1 each) and
# at least 1 byte; 0 means no limit. 1-6 were accepted, and the association aborted at
# its first answer ("division by zero", "... cannot be between 1 and 7")
MIN_PEER_PDU_BYTES = 7


class _OneLine(logging.Filter):
    """pynetdicom logs peers' protocol errors with tracebacks (a reset connection, an
    undecodable PDU): keep them one line, the message plus the exception's type, no
    traceback (the server's log handler still redacts the message).

    A warning or error logged on an association's own threads also names the peer's
    address ("The received PDU is shorter than expected" said nothing of who sent it).
    The log handler redacts a library's messages (a dotted address reads as a UID), so
    the message is redacted here first and the address added after, marked as done; the
    address and not the port, so that the handler's once-per-message rule still holds a
    port scan to one line per source."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            name = record.exc_info[0].__name__ if record.exc_info[0] else "error"
            record.msg, record.args = f"{record.getMessage()} ({name})", ()
            record.exc_info = record.exc_text = None
        if record.levelno >= logging.WARNING and not getattr(record, "_radserve_redacted", False):
            peer = _peer_of_this_thread()
            if peer:
                record.msg, record.args = f"{redact(record.getMessage())} [peer {peer}]", ()
                record._radserve_redacted = True
        return True


def _peer_of_this_thread() -> str | None:
    """The address of the association whose thread this is (pynetdicom runs each
    association and its DUL reader as threads), or None."""
    thread = threading.current_thread()
    assoc = thread if isinstance(thread, Association) else getattr(thread, "assoc", None)
    info = getattr(getattr(assoc, "requestor", None), "address_info", None)
    address = getattr(info, "address", None)
    return str(address) if address else None


def quiet_pynetdicom() -> None:
    """Once per process: no tracebacks from pynetdicom, and none of its debug-only
    PDU/DIMSE dump handlers (one of them raises on an A-ASSOCIATE-RQ without user
    information)."""
    _config.LOG_HANDLER_LEVEL = "none"
    # A C-STORE data set is written to a temporary file as its PDUs arrive (read in
    # _on_store with bounded memory), not gathered in memory and decoded whole: a
    # 256 MB private element, or a Deflated data set inflating to 256 MB, took the
    # server's RSS up by 500 MB. It only changes how this process receives C-STOREs.
    _config.STORE_RECV_CHUNKED_DATASET = True
    # ... into the spool folder under the data dir, bounded as it arrives (receive_limit)
    install()
    # each association's two threads block instead of polling (radserve.gateway.reactor)
    reactor.check()
    _check_unregistering()
    # a logger's filters see only its own records, so each pynetdicom module's logger
    names = [name for name in logging.root.manager.loggerDict if name.startswith("pynetdicom")]
    for name in ["pynetdicom", *names]:
        library = logging.getLogger(name)
        if not any(isinstance(f, _OneLine) for f in library.filters):
            library.addFilter(_OneLine())


def build_ae(config: ScpConfig, *, commitment_reports: bool = False) -> AE:
    """The acceptor AE with exactly the contexts of the conformance statement;
    ``commitment_reports``: also Storage Commitment Push Model with the peer in the SCP
    role, for the N-EVENT-REPORTs of the destinations radserve asked to commit."""
    quiet_pynetdicom()
    ae = AE(ae_title=config.ae_title)
    ae.require_called_aet = config.require_called_ae_title
    ae.maximum_associations = config.max_associations
    ae.acse_timeout = config.acse_timeout_s
    ae.dimse_timeout = config.dimse_timeout_s
    ae.network_timeout = config.network_timeout_s
    # what a peer may send in one P-DATA PDU: fewer, larger PDUs cost the receiving
    # Python less per instance (never above the cap BoundedSocket enforces)
    ae.maximum_pdu_size = min(config.advertised_pdu_bytes, config.max_pdu_bytes)
    ae.add_supported_context(conformance.VERIFICATION, list(conformance.UNCOMPRESSED))
    accepted = (
        conformance.ALL_STORAGE
        if UnwantedPolicy(config.unwanted) is UnwantedPolicy.QUARANTINE
        else conformance.IMAGE_STORAGE + conformance.RESULT_STORAGE
    )
    for sop_class in accepted:
        ae.add_supported_context(sop_class, list(conformance.SCP_TRANSFER_SYNTAXES))
    if commitment_reports:
        ae.add_supported_context(
            commitment.PUSH_MODEL, list(conformance.UNCOMPRESSED), scu_role=False, scp_role=True
        )
    return ae


def _accept_unlisted_storage(assoc: Any, cap: int | None = None) -> None:
    """Widen what this association accepts to every object quarantine can keep: the
    proposed private / newer storage classes (:func:`conformance.unlisted_storage`), and
    for every class that is not an image, each transfer syntax proposed for it (a
    quarantined object is stored as received and never decoded: an MPEG-4 video, say).
    A rejected context can make a PACS send none of the study (Orthanc 1.10.1). The
    classes are held until the association's connection closes (:func:`_release_storage`);
    ``cap``: how many may be held at once."""
    proposed = assoc.requestor.primitive.presentation_context_definition_list or []
    supported = {
        cx.abstract_syntax: list(cx.transfer_syntax) for cx in assoc.acceptor.supported_contexts
    }
    extra = conformance.unlisted_storage((cx.abstract_syntax for cx in proposed), supported)
    for uid in extra:
        if _register_storage(uid, _holder(assoc), cap):
            supported[uid] = list(conformance.SCP_TRANSFER_SYNTAXES)
    changed = bool(extra)
    for cx in proposed:
        syntaxes = supported.get(cx.abstract_syntax)
        if syntaxes is None or cx.abstract_syntax in _IMAGE_CLASSES:
            continue
        for syntax in cx.transfer_syntax:
            if syntax not in syntaxes and conformance.is_uid(syntax):
                syntaxes.append(syntax)
                changed = True
    if changed:
        assoc.acceptor.supported_contexts = [build_context(a, ts) for a, ts in supported.items()]


_REGISTERING = threading.Lock()
# the unlisted classes radserve registered with pynetdicom, each with the open associations
# that proposed it (keys: :func:`_holder`); a class none holds is unregistered
_registered: dict[str, set[int]] = {}
# pynetdicom keeps a registered class until it is unregistered: the registry must not grow
# without bound. Each class is held by the open associations that proposed it and dropped
# when the last of them closes, so it holds at most the classes of the open associations
# (at most 128 contexts each, PS3.8 9.3.2.2): a process-wide cap that was never given back
# (256 classes, first come first served) was filled by one peer's two associations of 128
# made-up private UIDs, and from then until a restart a Siemens CSA Non-Image object was
# refused at association, and with it (Orthanc) the whole study
CONTEXTS_PER_ASSOCIATION = 128
MAX_UNLISTED_CLASSES = 16 * CONTEXTS_PER_ASSOCIATION  # gateway.max_associations' default


def _holder(assoc: Any) -> int:
    return id(assoc)


def _register_storage(uid: str, holder: int = 0, cap: int | None = None) -> bool:
    """Tell pynetdicom ``uid`` is a storage class (it dispatches a C-STORE only for SOP
    classes it knows to belong to the Storage Service Class), held by the association
    ``holder`` until :func:`_release_storage`; False, and the context stays rejected,
    past ``cap`` classes held (:data:`MAX_UNLISTED_CLASSES`)."""
    cap = MAX_UNLISTED_CLASSES if cap is None else cap
    with _REGISTERING:
        if uid in _registered:
            _registered[uid].add(holder)
            return True
        if uid_to_service_class(uid) is StorageServiceClass:
            return True  # pynetdicom's own
        if len(_registered) >= cap:
            logger.warning("SOP class %s not accepted: %d unlisted classes taken in", uid, cap)
            return False
        register_uid(uid, _keyword(uid), StorageServiceClass)
        _registered[uid] = {holder}
        return True


def _release_storage(holder: int) -> int:
    """The association ``holder`` closed: the unlisted classes no open association holds
    any more are unregistered from pynetdicom; returns how many."""
    with _REGISTERING:
        dropped = []
        for uid, holders in _registered.items():
            holders.discard(holder)
            if not holders:
                dropped.append(uid)
        for uid in dropped:
            del _registered[uid]
            _unregister(uid)
    return len(dropped)


def _keyword(uid: str) -> str:
    return "RadserveUnlisted_" + uid.replace(".", "_")


def _unregister(uid: str) -> None:
    """Undo pynetdicom's ``register_uid(uid, _keyword(uid), StorageServiceClass)``: the
    keyword in its storage classes and in its ``sop_class`` module (pynetdicom has no
    call for it; :func:`_check_unregistering` refuses to start if these are gone)."""
    keyword = _keyword(uid)
    pynetdicom_classes._STORAGE_CLASSES.pop(keyword, None)
    vars(pynetdicom_classes).pop(keyword, None)


def _check_unregistering() -> None:
    if not isinstance(getattr(pynetdicom_classes, "_STORAGE_CLASSES", None), dict):
        raise RuntimeError(
            "pynetdicom.sop_class._STORAGE_CLASSES is gone or changed: the unlisted storage "
            "classes quarantine takes in could not be given back"
        )


def instance_uids(dataset: Dataset, affected_sop_uid: object, *, image: bool) -> tuple[str, str]:
    """(Study, SOP Instance UID) of a received instance's header, checked against the UID
    rules (:class:`InstanceRejectedError` names the one broken); an image's Series
    Instance UID is checked too when present (ingest's rule; missing: skipped there)."""
    study_uid = check_uid(header_text(dataset, "StudyInstanceUID"), "Study Instance UID")
    sop_uid = check_uid(
        header_text(dataset, "SOPInstanceUID") or affected_sop_uid, "SOP Instance UID"
    )
    if image and (series := header_text(dataset, "SeriesInstanceUID")):
        check_uid(series, "Series Instance UID")
    return study_uid, sop_uid


@dataclass(frozen=True)
class _Named:
    """The Study and SOP Instance UID a received image names, each None when missing
    or against the UID rules (such a UID names no folder or file)."""

    study_uid: str | None = None
    sop_uid: str | None = None

    @classmethod
    def of(cls, dataset: Dataset, affected_sop_uid: object) -> _Named:
        study = header_text(dataset, "StudyInstanceUID")
        sop = header_text(dataset, "SOPInstanceUID") or str(affected_sop_uid or "")
        return cls(
            _rule_abiding(study, "Study Instance UID"), _rule_abiding(sop, "SOP Instance UID")
        )


def _rule_abiding(value: str, what: str) -> str | None:
    try:
        return check_uid(value, what)
    except InstanceRejectedError:
        return None


def _too_small_pdu(items: list[Any]) -> int | None:
    """The peer's maximum PDU length when it is 1 to 6 (no answer fits), else None."""
    for item in items:
        if isinstance(item, MaximumLengthNotification):
            length = int(item.maximum_length_received or 0)
            if 0 < length < MIN_PEER_PDU_BYTES:
                return length
    return None


def _command_mismatch(dataset: Dataset, request: Any) -> str | None:
    """Which of the C-STORE request's Affected SOP Class / Instance UID the data set
    contradicts (PS3.4 B.2.3: 0xA900), or None. The SCP files and quarantines by the
    request's class: an image sent under a non-image class was quarantined, never run
    (its study one slice short), and a non-image under an image class was filed as one."""
    for keyword, affected, what in (
        ("SOPClassUID", request.AffectedSOPClassUID, "SOP Class"),
        ("SOPInstanceUID", request.AffectedSOPInstanceUID, "SOP Instance"),
    ):
        value = header_text(dataset, keyword)
        if value and affected and value != str(affected):
            return f"{what} UID differs from the request's"
    return None


def _status(code: int, reason: str = "", error_code: str = "") -> Dataset:
    """A C-STORE response status. A failure's Error Comment (0000,0902) carries radserve's
    error code and reason, ``<error code>: <reason>`` cut to LO's 64 characters, as a
    failed STOW-RS item carries them in (0009,1001)/(0009,1002): the same answer at either
    door. Reasons are radserve's own words (rules, sizes, errno names), never a value of
    the instance, so no patient data reaches the sender's log."""
    status = Dataset()
    status.Status = code
    comment = ": ".join(part for part in (error_code, reason) if part)
    if comment:
        status.ErrorComment = comment.replace("\\", "/")[:64]  # LO: no backslash
    return status


class NotBindableError(OSError):
    """The SCP cannot listen on its address: one line naming it and the system's reason
    (worded as ``radserve doctor``'s port check words it)."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        super().__init__(f"{host}:{port} not bindable: {cause.strerror or cause}")


class GatewaySCP:
    """Receive studies over DICOM and hand each completed one to ``on_study``.

    ``on_study`` runs on the completeness thread, once per study per generation (see
    :class:`~radserve.gateway.completeness.CompletedStudy`); if it raises, the study is
    offered again later. Use as a context manager or call :meth:`start` / :meth:`stop`.
    With ``receivers`` > 1 this process accepts and admits connections and runs the
    tracker, and receiving processes run the associations
    (:mod:`radserve.gateway.receivers`). ``arrivals`` and ``spool`` are for such a
    receiving process: where its stored instances are reported, its own spool folder.
    """

    def __init__(
        self,
        config: ScpConfig,
        on_study: StudyCallback,
        *,
        clock: Callable[[], float] = time.monotonic,
        run_monitor: bool = True,
        own_results: OwnResults | None = None,
        on_durable: Callable[[list[Path]], None] | None = None,
        on_oversize: Callable[[Exceeded], None] | None = None,
        arrivals: Arrivals | None = None,
        spool: Path | None = None,
        on_commitment: commitment.ReportHandler | None = None,
    ) -> None:
        self.config = config
        # C-STORE data sets being received (pynetdicom's temporary files): under the
        # data dir, never past max_file_bytes; on_oversize audits a refused one
        self.spool = spool or config.data_dir / SPOOL_DIR
        self.on_durable = on_durable
        self.on_oversize = on_oversize
        # radserve's own SEG/SR/SC re-sent by a PACS: acknowledged, never input
        self.own_results = own_results or OwnResults()
        self.instances = InstanceStore(
            config.data_dir,
            min_free_bytes=config.min_free_bytes,
            durability=config.durability,
            group_sync=config.group_sync,
            on_durable=on_durable,
        )
        self.tracker = StudyTracker(
            on_study,
            quiet_s=config.quiet_s,
            interrupted_quiet_s=config.interrupted_quiet_s,
            late_policy=LatePolicy(config.late_policy),
            clock=clock,
        )
        self.arrivals: Arrivals = arrivals or self.tracker
        self._receiving = _Receiving(self.arrivals)
        self.allow_list = AllowList(config.allowed_peers)
        # calling AE titles tied to TLS client certificates (gateway.ae_certificates)
        self.certificates = CertificateBinding(config.ae_certificates)
        self.admission = Admission(
            total=config.max_associations,
            per_host=config.max_associations_per_host,
            reserved=config.reserved_for_peers,
            known_addresses=self.allow_list.addresses,
        )
        self._monitor = CompletenessMonitor(self.tracker) if run_monitor else None
        # storage commitment reports from destinations (radserve.gateway.commitment_ledger)
        self.on_commitment = on_commitment
        self._ae = build_ae(config, commitment_reports=on_commitment is not None)
        # DICOM TLS when the gateway has a certificate; the files are checked here, so a
        # bad path stops the server at start rather than at the first association
        self._ssl_context = None
        if config.tls is not None and config.tls.cert is not None:
            self._ssl_context = server_context(config.tls, "the DICOM SCP")
        # this process's receiving CPU by section (the bench's split; radserve.gateway.cpu_ledger)
        self.cpu = CpuLedger()
        self._server: GatewayServer | None = None
        self._pool: ReceiverPool | None = None
        self._stopped = threading.Event()
        self._stop_requested = False  # set by request_stop (a signal handler)
        self._stop_begun = False
        self._stop_lock = threading.Lock()

    @property
    def tls(self) -> bool:
        """Whether the SCP accepts only TLS connections."""
        return self._ssl_context is not None

    @property
    def address(self) -> tuple[str, int]:
        """Where the SCP listens (the real port when the configured one was 0)."""
        if self._server is None:
            raise RuntimeError("the SCP is not started")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> tuple[str, int]:
        """Bind, pick up studies left from before a restart, then serve; returns the
        address. An address it cannot listen on (not an address, not this host's, the
        port taken) raises :class:`NotBindableError` before anything else is done: no
        receiving process started (each failed with a traceback of its own), nothing
        on disk touched. Connections wait in the backlog until the SCP is ready."""
        ssl_context = self._ssl_context
        options = self.server_options(self.admission)
        pool = None
        if self.config.receivers > 1:
            # this process accepts and admits; the receiving processes run associations
            # (TLS, handlers, receive limits), each with its own interpreter
            pool = ReceiverPool(self, self.config.receivers)
            options.update(evt_handlers=[], ssl_context=None, limit_store=None, hand_over=pool.hand)
        address = (self.config.host, self.config.port)
        try:
            server = make_server(self._ae, address, **options)
        except OSError as exc:
            raise NotBindableError(*address, exc) from exc
        try:
            self.instances.remove_partials()
            self.spool.mkdir(parents=True, exist_ok=True)
            clear_spool(self.spool)
            reopened = self.tracker.recover(self.instances.incoming)
            if self.allow_list.open:
                logger.warning("no calling-AE allow-list: any DICOM peer may store to radserve")
            if self.certificates.active:
                logger.info(
                    "DICOM TLS: %d calling AE title(s) tied to client certificates "
                    "(gateway.ae_certificates)",
                    len(self.config.ae_certificates),
                )
            if pool is not None:
                pool.start()
        except BaseException:
            server.server_close()
            raise
        self._pool = pool
        self._server = serve_in_thread(self._ae, server)
        if self._monitor is not None:
            self._monitor.start()
        host, port = self.address
        logger.info(
            "DICOM SCP %s listening on %s:%d%s (quiet period %.1f s, %d studies waiting)",
            self.config.ae_title,
            host,
            port,
            (" with TLS" if ssl_context else "")
            + (f", {self.config.receivers} receiving processes" if self._pool else ""),
            self.config.quiet_s,
            reopened,
        )
        return host, port

    def request_stop(self) -> None:
        """Ask for a stop from a signal handler: :meth:`wait` returns, and no receiving
        process that ends from now on is started again. Only flags are set (no lock is
        taken, nothing is joined): the handler may run inside :meth:`stop` itself, as a
        second SIGTERM (``timeout``, systemd's group kill) does."""
        self._stop_requested = True
        if self._pool is not None:
            self._pool.stopping()

    def stop(self) -> None:
        """Stop listening, end open associations, stop the completeness thread. Studies
        not yet handed over stay on disk and are picked up at the next start. A second
        call returns at once (pynetdicom's server shutdown cannot run twice)."""
        with self._stop_lock:
            if self._stop_begun:
                return
            self._stop_begun = True
        if self._pool is not None:
            self._pool.stopping()  # the receiving processes end now: none is restarted
        if self._server is not None:
            self._server.shutdown()
            self._server = None
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
        self._ae.shutdown()
        self.instances.close()
        if self._monitor is not None:
            self._monitor.stop()
        self._stopped.set()

    def wait(self) -> None:
        """Block until :meth:`stop` or :meth:`request_stop` (the standalone command's
        main loop; it then calls :meth:`stop` itself, outside any signal handler)."""
        while not self._stop_requested and not self._stopped.wait(0.2):
            pass

    def __enter__(self) -> GatewaySCP:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def server_options(self, admission: Any) -> dict[str, Any]:
        """What an association server of this SCP runs with: the handlers, TLS, the
        bounds (this process's, or a receiving process's, with ``admission`` relayed)."""
        handlers: list[Any] = [
            (evt.EVT_REQUESTED, self._on_requested),
            (evt.EVT_C_STORE, self._on_store),
            (evt.EVT_C_ECHO, self._on_echo),
            (evt.EVT_N_EVENT_REPORT, self._on_event_report),
            (evt.EVT_ACCEPTED, self._on_accepted),
            (evt.EVT_ABORTED, self._on_aborted),
            (evt.EVT_RELEASED, self._receiving.released),
            (evt.EVT_CONN_CLOSE, self._on_closed),
        ]
        return {
            "evt_handlers": handlers,
            "ssl_context": self._ssl_context,
            "admission": admission,
            "handshake_timeout_s": self.config.acse_timeout_s,
            "pdu_timeout_s": self.config.pdu_timeout_s,
            "max_pdu_bytes": self.config.max_pdu_bytes,
            "limit_store": self._limit_store,
            "cpu_ledger": self.cpu,
        }

    def receiver_pids(self) -> list[int]:
        """The receiving processes' ids (none with ``receivers: 1``)."""
        return self._pool.pids() if self._pool is not None else []

    @property
    def ae(self) -> AE:
        return self._ae

    # -- handlers (association threads) ---------------------------------------------

    def _limit_store(self, assoc: Any) -> StoreLimit:
        return StoreLimit(
            assoc,
            max_bytes=self.config.max_file_bytes,
            spool=self.spool,
            on_exceeded=self.on_oversize,
            reserve=lambda: self.instances.min_free_bytes,
            max_memory_bytes=self.config.max_header_bytes,
        )

    def _on_requested(self, event: Event) -> None:
        """Malformed requests (no maximum length item, or one of 1-6 bytes, too small
        for any answer) get A-ASSOCIATE-RJ (no reason given); a called AE title
        that is not this SCP's, reason 7; unknown (AE title, host) pairs, and a calling
        AE title with a TLS client certificate ``gateway.ae_certificates`` does not tie
        to it, reason 3. One log line each (the titles, the address, the certificate's
        SHA-256 fingerprint)."""
        assoc = event.assoc
        primitive = assoc.requestor.primitive
        calling = str(primitive.calling_ae_title or "").strip()
        address = str(assoc.requestor.address)
        items = primitive.user_information or []
        if not any(isinstance(item, MaximumLengthNotification) for item in items):
            # PS3.8 9.3.2.3: User Information with Maximum Length is mandatory
            logger.warning(
                "association from AE %r at %s rejected: no user information item "
                "(maximum length) in the A-ASSOCIATE-RQ",
                calling,
                address,
            )
            self._reject(assoc, _REJECT_MALFORMED)
            return
        too_small = _too_small_pdu(items)
        if too_small is not None:
            logger.warning(
                "association from AE %r at %s rejected: its maximum PDU length %d is too "
                "small to carry any data (0 for no limit, or at least %d)",
                calling,
                address,
                too_small,
                MIN_PEER_PDU_BYTES,
            )
            self._reject(assoc, _REJECT_MALFORMED)
            return
        called = str(primitive.called_ae_title or "").strip()
        if self.config.require_called_ae_title and called != self.config.ae_title.strip():
            # pynetdicom refuses it too, after this handler, without a word in the log:
            # a sender set up with another title (storescu's ANY-SCP) saw only a refusal
            logger.warning(
                "association from AE %r at %s rejected: it called AE %r, this SCP is %r "
                "(gateway.ae_title)",
                calling,
                address,
                called,
                self.config.ae_title.strip(),
            )
            self._reject(assoc, _REJECT_CALLED_AE)
            return
        if not self.allow_list.allows(calling, address):
            logger.warning(
                "association from AE %r at %s rejected: calling AE title not recognised",
                calling,
                address,
            )
            self._reject(assoc, _REJECT_CALLING_AE)
            return
        if self.certificates.active:
            certificate = PeerCertificate.of(getattr(assoc.dul.socket, "socket", None))
            why = self.certificates.refusal(calling, certificate)
            if why is not None:
                logger.warning(
                    "association from AE %r at %s rejected: %s (certificate SHA-256 %s)",
                    calling,
                    address,
                    why,
                    certificate.fingerprint if certificate is not None else "none",
                )
                self._reject(assoc, _REJECT_CALLING_AE)
                return
        if UnwantedPolicy(self.config.unwanted) is UnwantedPolicy.QUARANTINE:
            cap = max(MAX_UNLISTED_CLASSES, self.config.max_associations * CONTEXTS_PER_ASSOCIATION)
            _accept_unlisted_storage(assoc, cap)

    @staticmethod
    def _reject(assoc: Any, reason: tuple[int, int, int]) -> None:
        assoc.acse.send_reject(*reason)
        assoc.kill()

    def _on_accepted(self, event: Event) -> None:
        assoc = event.assoc
        logger.debug(
            "association accepted from %s at %s", assoc.requestor.ae_title, assoc.requestor.address
        )
        self._log_refused_contexts(assoc)

    @staticmethod
    def _log_refused_contexts(assoc: Any) -> None:
        """The sender sees only "no presentation context" for what the SCP refused in
        negotiation; the operator sees why here: a warning when a transfer syntax was
        refused or nothing was accepted, else (SOP classes a ``refuse`` policy keeps
        out, routine for senders that propose every class) at debug level."""
        rejected = list(assoc.rejected_contexts)
        if not rejected:
            return
        proposed = {
            cx.context_id: list(cx.transfer_syntax)
            for cx in assoc.requestor.primitive.presentation_context_definition_list or []
        }
        phrases = [
            conformance.refused_context(
                str(cx.abstract_syntax), proposed.get(cx.context_id, cx.transfer_syntax), cx.result
            )
            for cx in rejected
        ]
        nothing = not assoc.accepted_contexts
        serious = nothing or any(cx.result == 0x04 for cx in rejected)
        logger.log(
            logging.WARNING if serious else logging.DEBUG,
            "association from AE %r at %s: %d presentation context(s) refused%s: %s%s",
            str(assoc.requestor.ae_title).strip(),
            assoc.requestor.address,
            len(rejected),
            " and none accepted, so it can store nothing" if nothing else "",
            "; ".join(phrases[:_REFUSED_SHOWN]),
            f"; and {len(phrases) - _REFUSED_SHOWN} more" if len(phrases) > _REFUSED_SHOWN else "",
        )

    def _on_aborted(self, event: Event) -> None:
        requestor = event.assoc.requestor
        logger.info("association from %r at %s aborted", requestor.ae_title, requestor.address)
        self._receiving.cut_off(event)

    def _on_closed(self, event: Event) -> None:
        try:
            self._receiving.closed(event)
        finally:
            _release_storage(_holder(event.assoc))

    def _on_echo(self, event: Event) -> int:
        return Status.SUCCESS

    def _on_event_report(self, event: Event) -> tuple[Dataset, None]:
        """A destination's storage commitment report (the only N-EVENT-REPORT accepted:
        the context exists only with ``on_commitment``); the allow-list already
        admitted the peer, the ledger checks it is the one the transaction was asked of."""
        calling = str(event.assoc.requestor.ae_title).strip()
        if self.on_commitment is None:
            return _status(Status.PROCESSING_FAILURE, "no storage commitment here"), None
        code, comment = commitment.answer(calling, event.event_information, self.on_commitment)
        return _status(code, comment), None

    def _on_store(self, event: Event) -> Dataset:
        """File one instance; the returned status is the only answer the sender gets."""
        with self.cpu.section("handler"):
            return self._store(event)

    def _store(self, event: Event) -> Dataset:
        sop_class = str(event.request.AffectedSOPClassUID or "")
        calling = str(event.assoc.requestor.ae_title).strip()
        quarantine = sop_class not in _IMAGE_CLASSES
        # what the instance names, once its header is read: a refused image (by its own
        # SOP Class UID) of a readable study is noted in the study's folder, so the job
        # of the rest of the study names the refusal
        named = _Named()
        try:
            short_of_space = refused_for_space(event.request)
            if short_of_space is not None:  # dropped as it arrived (receive_limit)
                raise OutOfResourcesError(short_of_space)
            path = event.dataset_path
            if path is None:  # the command said no data set follows (0x0101)
                raise InstanceRejectedError("the C-STORE request carries no data set")
            received = Path(path)  # preamble, meta, data set as received
            transfer_syntax = str(event.context.transfer_syntax)
            with self.cpu.section("parse"):
                self._remove_stray_meta(event, received, transfer_syntax)
                dataset = self._header(received, transfer_syntax)
            if (header_text(dataset, "SOPClassUID") or sop_class) in _IMAGE_CLASSES:
                named = _Named.of(dataset, event.request.AffectedSOPInstanceUID)
            mismatch = _command_mismatch(dataset, event.request)
            if mismatch is not None:
                logger.warning("instance from %s refused: %s", calling, mismatch)
                return self._refused(named, Status.DATA_SET_MISMATCH, mismatch, "instance_invalid")
            if self.own_results.check(dataset, "C-STORE"):
                return _status(Status.SUCCESS)  # the PACS must not retry it; never input
            if quarantine and UnwantedPolicy(self.config.unwanted) is UnwantedPolicy.REFUSE:
                # accepted at association only so that radserve's own results are
                # acknowledged; anyone else's object of these classes is refused
                return _status(Status.SOP_CLASS_NOT_SUPPORTED, "not an image storage object")
            study_uid, sop_uid = instance_uids(
                dataset, event.request.AffectedSOPInstanceUID, image=not quarantine
            )
            with self.cpu.section("durable"):
                stored = self.instances.save(
                    received,
                    study_instance_uid=study_uid,
                    sop_instance_uid=sop_uid,
                    sop_class_uid=sop_class,
                    quarantine=quarantine,
                )
        except (
            OutOfResourcesError,
            InstanceRejectedError,
            InputTooLargeError,
            UnreadableHeaderError,  # names its cause (a bound: the setting), never a value
        ) as exc:
            if not isinstance(exc, OutOfResourcesError):
                logger.warning("instance from %s refused: %s", calling, exc.message)
            return self._refused(named, error_table.lookup(exc).dicom, exc.message, exc.code)
        except Exception as exc:  # a failure, never a success that loses the instance
            # no traceback: parser messages may quote element values (patient data)
            logger.error("instance from %s not stored: %s", calling, type(exc).__name__)
            return self._refused(
                named, Status.CANNOT_UNDERSTAND, f"cannot read the instance: {type(exc).__name__}"
            )
        if quarantine:
            logger.info("instance %s of SOP class %s quarantined", sop_uid, sop_class)
            self.arrivals.touch(study_uid)
        else:
            # noted first: the study counts as being received before it counts as arrived
            self._receiving.note(event, study_uid, stored.path.parent)
            self.arrivals.arrived(
                study_uid,
                stored.path.parent,
                calling_ae=calling,
                new=stored.disposition is Disposition.STORED,
                association=_Receiving.key(event),
            )
        return _status(Status.SUCCESS)

    def _refused(self, named: _Named, code: int, reason: str, error_code: str = "") -> Dataset:
        """The failure status ``code`` (:func:`_status`) for an instance that named
        ``named``: noted in its study's folder before the answer when that study is
        known (an image whose Study Instance UID is readable), so the job of the rest of
        the study names the refusal; the study is kept open as by an arrival. An object
        of a class radserve does not read is never noted: it is in no result anyway."""
        if named.study_uid is not None:
            try:
                folder = self.instances.study_dir(named.study_uid)
                note_refused(folder, [(named.sop_uid, RefusalReason(error_code, int(code)))])
                self.arrivals.touch(named.study_uid)
            except Exception as exc:  # the refusal is answered whatever happens here
                logger.error("a refused instance was not noted: %s", type(exc).__name__)
        return _status(code, reason, error_code)

    def _remove_stray_meta(self, event: Event, received: Path, transfer_syntax: str) -> None:
        """File Meta elements (group 0002) inside the data set are removed from the
        received file (:mod:`radserve.gateway.stray_meta`): the negotiated transfer syntax
        governs, not a stray Transfer Syntax UID. One log line per association."""
        try:
            removed = remove_stray_meta(
                received,
                transfer_syntax,
                max_bytes=self.config.max_header_bytes,
                max_elements=self.config.max_header_elements,
            )
        except OSError as exc:
            reason = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
            logger.error("instance not stored: removing its stray File Meta failed: %s", reason)
            raise OutOfResourcesError(f"cannot store the instance: {reason}") from exc
        assoc = event.assoc
        if removed and not getattr(assoc, "_radserve_stray_meta", False):
            assoc._radserve_stray_meta = True
            logger.warning(
                "instances from %s carry File Meta elements (group 0002) inside the data "
                "set (%d in the first): removed; the negotiated transfer syntax applies",
                str(assoc.requestor.ae_title).strip(),
                removed,
            )

    def _header(self, received: Path, transfer_syntax: str) -> Dataset:
        """The received instance's header, read within the ingest bounds: the file at
        most ``max_file_bytes``; at most ``max_header_bytes`` of header in memory (a
        Deflated data set inflated only that far), never the pixel data. pynetdicom
        wrote the file's meta with the context's ``transfer_syntax``: it is not parsed
        again to tell whether the data set is Deflated."""
        size = received.stat().st_size
        if size > self.config.max_file_bytes:
            raise InputTooLargeError(
                f"the instance is {size} bytes, over ingest.max_file_bytes="
                f"{self.config.max_file_bytes}"
            )
        return read_header(
            received,
            max_header_bytes=self.config.max_header_bytes,
            max_header_elements=self.config.max_header_elements,
            transfer_syntax=transfer_syntax,
        )


class _Receiving:
    """Which studies each open association is delivering, on disk as a marker file per
    (study, association): a study whose association ends without a release — an abort,
    or a server crash (the marker survives it) — is marked interrupted and waits
    ``interrupted_quiet_s`` for its sender (see :mod:`radserve.gateway.completeness`)."""

    def __init__(self, tracker: Arrivals) -> None:
        self.tracker = tracker
        self._open: dict[int, tuple[str, dict[str, Path]]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(event: Event) -> int:
        """The open association of ``event``, as the tracker knows it."""
        return id(event.assoc)

    def note(self, event: Event, study_uid: str, folder: Path) -> None:
        key = self.key(event)
        with self._lock:
            # the process id first: a parent tells a dead receiving process's markers
            token, studies = self._open.setdefault(key, (receiving_token(), {}))
            if study_uid in studies:
                return
            studies[study_uid] = folder
        try:
            (folder / f"{RECEIVING_PREFIX}{token}").touch()
        except OSError as exc:
            logger.warning("cannot mark study %s as being received: %s", study_uid, exc)

    def released(self, event: Event) -> None:
        """A normal end: the sender finished what it meant to send in this association."""
        for study_uid, _folder in self._end(event):
            self.tracker.resumed(study_uid, self.key(event))

    def cut_off(self, event: Event) -> None:
        for study_uid, folder in self._end(event):
            try:
                (folder / INTERRUPTED_MARKER).touch()
            except OSError as exc:
                logger.warning("cannot mark study %s as interrupted: %s", study_uid, exc)
            self.tracker.interrupted(study_uid, self.key(event))

    def closed(self, event: Event) -> None:
        """The connection closed: an association neither released nor aborted before
        (a dropped connection, a timeout) was cut off too. One whose peer asked for the
        release was not: the peer may close before EVT_RELEASED reaches us."""
        if reactor.release_requested(event.assoc):
            self.released(event)
        else:
            self.cut_off(event)

    def _end(self, event: Event) -> list[tuple[str, Path]]:
        with self._lock:
            token, studies = self._open.pop(self.key(event), ("", {}))
        for folder in studies.values():
            with contextlib.suppress(OSError):
                (folder / f"{RECEIVING_PREFIX}{token}").unlink(missing_ok=True)
        return list(studies.items())
