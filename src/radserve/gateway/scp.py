"""The storage SCP: C-ECHO and C-STORE in, completed studies out to an intake callback.

One pynetdicom AE, one thread per association. Each handler answers exactly one DICOM
status, decided in one place (:meth:`GatewaySCP._on_store`): success only after the
instance is fsynced; 0xA700 when it cannot be made durable; 0xC000 when it cannot be
filed. The allow-list is checked on A-ASSOCIATE-RQ, before any data is accepted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pydicom.dataset import Dataset
from pynetdicom import AE, evt
from pynetdicom.events import Event
from pynetdicom.transport import ThreadedAssociationServer

from radserve.gateway import conformance
from radserve.gateway.completeness import CompletenessMonitor, StudyCallback, StudyTracker
from radserve.gateway.config import AllowList, ScpConfig
from radserve.gateway.conformance import Status, UnwantedPolicy
from radserve.gateway.errors import InstanceRejectedError, OutOfResourcesError
from radserve.gateway.storage import Disposition, InstanceStore, check_uid

logger = logging.getLogger(__name__)

_IMAGE_CLASSES = frozenset(conformance.IMAGE_STORAGE)
# A-ASSOCIATE-RJ: rejected-permanent, service-user, calling AE title not recognised
_REJECT_CALLING_AE = (conformance.REJECTED_PERMANENT, 0x01, 0x03)


def build_ae(config: ScpConfig) -> AE:
    """The acceptor AE with exactly the contexts of the conformance statement."""
    ae = AE(ae_title=config.ae_title)
    ae.require_called_aet = config.require_called_ae_title
    ae.maximum_associations = config.max_associations
    ae.acse_timeout = config.acse_timeout_s
    ae.dimse_timeout = config.dimse_timeout_s
    ae.network_timeout = config.network_timeout_s
    ae.add_supported_context(conformance.VERIFICATION, list(conformance.UNCOMPRESSED))
    accepted = (
        conformance.ALL_STORAGE
        if config.unwanted is UnwantedPolicy.QUARANTINE
        else conformance.IMAGE_STORAGE
    )
    for sop_class in accepted:
        ae.add_supported_context(sop_class, list(conformance.SCP_TRANSFER_SYNTAXES))
    return ae


def _status(code: int, comment: str | None = None) -> Dataset:
    status = Dataset()
    status.Status = code
    if comment:
        status.ErrorComment = comment[:64]
    return status


class GatewaySCP:
    """Receive studies over DICOM and hand each completed one to ``on_study``.

    ``on_study`` runs on the completeness thread, once per study per generation (see
    :class:`~radserve.gateway.completeness.CompletedStudy`); if it raises, the study is
    offered again later. Use as a context manager or call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        config: ScpConfig,
        on_study: StudyCallback,
        *,
        clock: Callable[[], float] = time.monotonic,
        run_monitor: bool = True,
    ) -> None:
        self.config = config
        self.instances = InstanceStore(config.data_dir, min_free_bytes=config.min_free_bytes)
        self.tracker = StudyTracker(
            on_study, quiet_s=config.quiet_s, late_policy=config.late_policy, clock=clock
        )
        self.allow_list = AllowList(config.allowed_peers)
        self._monitor = CompletenessMonitor(self.tracker) if run_monitor else None
        self._ae = build_ae(config)
        self._server: ThreadedAssociationServer | None = None
        self._stopped = threading.Event()

    @property
    def address(self) -> tuple[str, int]:
        """Where the SCP listens (the real port when the configured one was 0)."""
        if self._server is None:
            raise RuntimeError("the SCP is not started")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> tuple[str, int]:
        """Pick up studies left from before a restart, then listen; returns the address."""
        self.instances.remove_partials()
        reopened = self.tracker.recover(self.instances.incoming)
        if self.allow_list.open:
            logger.warning("no calling-AE allow-list: any DICOM peer may store to radserve")
        ssl_context = self.config.tls.server_context() if self.config.tls else None
        handlers: list[Any] = [
            (evt.EVT_REQUESTED, self._on_requested),
            (evt.EVT_C_STORE, self._on_store),
            (evt.EVT_C_ECHO, self._on_echo),
            (evt.EVT_ACCEPTED, self._on_accepted),
            (evt.EVT_ABORTED, self._on_aborted),
        ]
        self._server = self._ae.start_server(
            (self.config.host, self.config.port),
            block=False,
            evt_handlers=handlers,
            ssl_context=ssl_context,
        )
        if self._monitor is not None:
            self._monitor.start()
        host, port = self.address
        logger.info(
            "DICOM SCP %s listening on %s:%d%s (quiet period %.1f s, %d studies waiting)",
            self.config.ae_title,
            host,
            port,
            " with TLS" if ssl_context else "",
            self.config.quiet_s,
            reopened,
        )
        return host, port

    def stop(self) -> None:
        """Stop listening, end open associations, stop the completeness thread. Studies
        not yet handed over stay on disk and are picked up at the next start."""
        if self._server is not None:
            self._server.shutdown()
            self._server = None
        self._ae.shutdown()
        if self._monitor is not None:
            self._monitor.stop()
        self._stopped.set()

    def wait(self) -> None:
        """Block until :meth:`stop` (the standalone command's main loop)."""
        while not self._stopped.wait(1.0):
            pass

    def __enter__(self) -> GatewaySCP:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- handlers (association threads) ---------------------------------------------

    def _on_requested(self, event: Event) -> None:
        """Allow-list: unknown (AE title, host) pairs get A-ASSOCIATE-RJ, reason 3."""
        assoc = event.assoc
        calling = str(assoc.requestor.primitive.calling_ae_title or "").strip()
        address = str(assoc.requestor.address)
        if self.allow_list.allows(calling, address):
            return
        logger.warning(
            "association from AE %r at %s rejected: calling AE title not recognised",
            calling,
            address,
        )
        assoc.acse.send_reject(*_REJECT_CALLING_AE)
        assoc.kill()

    def _on_accepted(self, event: Event) -> None:
        logger.debug(
            "association accepted from %s at %s",
            event.assoc.requestor.ae_title,
            event.assoc.requestor.address,
        )

    def _on_aborted(self, event: Event) -> None:
        logger.info("association from %s aborted", event.assoc.requestor.ae_title)

    def _on_echo(self, event: Event) -> int:
        return Status.SUCCESS

    def _on_store(self, event: Event) -> Dataset:
        """File one instance; the returned status is the only answer the sender gets."""
        sop_class = str(event.request.AffectedSOPClassUID or "")
        calling = str(event.assoc.requestor.ae_title).strip()
        quarantine = sop_class not in _IMAGE_CLASSES
        try:
            dataset = event.dataset
            study_uid = check_uid(dataset.get("StudyInstanceUID"), "Study Instance UID")
            sop_uid = check_uid(
                dataset.get("SOPInstanceUID") or event.request.AffectedSOPInstanceUID,
                "SOP Instance UID",
            )
            stored = self.instances.save(
                event.encoded_dataset(),
                study_instance_uid=study_uid,
                sop_instance_uid=sop_uid,
                sop_class_uid=sop_class,
                quarantine=quarantine,
            )
        except OutOfResourcesError as exc:
            return _status(Status.OUT_OF_RESOURCES, exc.message)
        except InstanceRejectedError as exc:
            logger.warning("instance from %s refused: %s", calling, exc.message)
            return _status(Status.CANNOT_UNDERSTAND, exc.message)
        except Exception as exc:  # a failure, never a success that loses the instance
            # no traceback: parser messages may quote element values (patient data)
            logger.error("instance from %s not stored: %s", calling, type(exc).__name__)
            return _status(
                Status.CANNOT_UNDERSTAND, f"cannot read the instance: {type(exc).__name__}"
            )
        if quarantine:
            logger.info("instance %s of SOP class %s quarantined", sop_uid, sop_class)
            self.tracker.touch(study_uid)
        else:
            self.tracker.arrived(
                study_uid,
                stored.path.parent,
                calling_ae=calling,
                new=stored.disposition is Disposition.STORED,
            )
        return _status(Status.SUCCESS)
