"""Several receiving processes behind one listening port (``gateway.receivers``).

Why: pynetdicom decodes every P-DATA PDU in Python, 4.5-6 CPU-ms per 514 KiB instance
under one GIL, so one process stays far below what the disk makes durable
(docs/performance.md, goal 6). Each receiving process has its own interpreter.

How the work is split:

- this (parent) process keeps the listening socket, the accept loop and the
  :class:`~radserve.gateway.transport.Admission` (total, per-address and reserved slots
  stay exact: every connection is admitted here), the completeness tracker and monitor;
- each admitted socket is passed (SCM_RIGHTS) to the receiving process with the fewest
  open connections, which runs the association with the very handlers of
  :class:`~radserve.gateway.scp.GatewaySCP` (allow-list, PDU bounds, receive limit,
  header read, own-result check, durable save before the success status);
- before answering success it reports the stored instance over its own pipe, with the
  ends of its associations, the slots it gives back, own results ignored, oversize
  audits and its log records (handled here: redaction, format). One pipe per process:
  a process that dies mid-message garbles only its own. The own-result check asks this
  process's result index over a second pipe, and a storage commitment report (an
  N-EVENT-REPORT from a destination) is settled by this process's outbox over it too,
  its answer going back to the peer;
- a receiving process that dies: what it sent is handled, its slots are released, the
  studies of its open associations are marked interrupted (as a crash of a single SCP
  process would leave them), the temporary instance files it was writing are deleted
  (by the owner in their names: the live processes' stay), ``incoming`` is rescanned for
  instances whose report never came (durable before their success, so on disk), and
  another process is started (its spool folder cleared first).

Limits across processes: association slots are the parent's; the free-space reserve is
read from the file system at each save; ``max_file_bytes`` applies per instance; each
process spools under a folder of its own (cleared when it is started).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radserve.gateway.commitment import CommitmentReport
from radserve.gateway.completeness import INTERRUPTED_MARKER, RECEIVING_PREFIX, receiving_token
from radserve.gateway.conformance import Status
from radserve.gateway.own_results import OwnResults
from radserve.gateway.receive_limit import Exceeded, clear_spool
from radserve.gateway.transport import HandedServer, make_server
from radserve.log_routing import forward_worker_logs, levels, route_record

if TYPE_CHECKING:
    from radserve.gateway.config import ScpConfig
    from radserve.gateway.scp import GatewaySCP

logger = logging.getLogger(__name__)

_READY_TIMEOUT_S = 120.0  # a receiving process imports pydicom and pynetdicom
_QUESTION_TIMEOUT_S = 10.0
_RESTART_PAUSE_S = 1.0  # between starts of a process that keeps dying at once
_STOP_TIMEOUT_S = 5.0
# what stops a server: its receiving processes ignore them and end when the parent
# closes their hand-over socket (a SIGTERM to the whole process group, as systemd's
# KillMode=control-group and ``timeout`` send, killed them before the parent knew it
# was stopping, and the parent started others)
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


class _Channel:
    """A receiving process's end of its pipes, shared by its association threads."""

    def __init__(self, notices: Connection, questions: Connection) -> None:
        self._notices = notices
        self._questions = questions
        self._lock = threading.Lock()
        self._ask = threading.Lock()
        self._numbers = itertools.count()

    def send(self, *message: Any) -> None:
        with self._lock:
            self._notices.send(message)

    def put_nowait(self, record: logging.LogRecord) -> None:
        """What a logging ``QueueHandler`` calls: the record goes to the parent."""
        self.send("log", record)

    def _ask_parent(self, question: tuple[Any, ...], what: str) -> Any:
        """The parent's answer to ``question`` (one at a time per process)."""
        with self._ask:
            number = next(self._numbers)
            self._questions.send((number, question))
            deadline = time.monotonic() + _QUESTION_TIMEOUT_S
            while self._questions.poll(max(0.0, deadline - time.monotonic())):
                answered, answer = self._questions.recv()
                if answered == number:  # an answer to a question that timed out: skip
                    return answer
        raise TimeoutError(f"the gateway process did not answer the {what} question")

    def known(self, sop_uid: str) -> bool:
        """Whether the parent's result index holds ``sop_uid`` (radserve wrote it)."""
        return bool(self._ask_parent(("known", sop_uid), "own-result"))

    def commitment(self, calling: str, report: CommitmentReport) -> tuple[int, str]:
        """A storage commitment report received here, settled by the parent's outbox
        (its :class:`~radserve.gateway.commitment_ledger.CommitmentLedger`): the answer
        for the peer. Not settled in time: 0x0110, the peer may send it again (a report
        already settled is answered success)."""
        try:
            status, comment = self._ask_parent(("commitment", calling, report), "commitment")
        except TimeoutError as exc:
            return Status.PROCESSING_FAILURE, str(exc)
        return int(status), str(comment)


class _Relay:
    """The parent's tracker, admission and audit, seen from a receiving process."""

    def __init__(self, channel: _Channel) -> None:
        self.channel = channel

    def arrived(self, study_uid: str, folder: Path, **details: Any) -> None:
        self.channel.send("arrived", study_uid, folder, details)

    def interrupted(self, study_uid: str, association: object | None = None) -> None:
        self.channel.send("interrupted", study_uid, association)

    def resumed(self, study_uid: str, association: object | None = None) -> None:
        self.channel.send("resumed", study_uid, association)

    def touch(self, study_uid: str) -> None:
        self.channel.send("touch", study_uid)

    def release(self, address: str) -> None:
        """The association slot of a connection that ended (the parent admitted it)."""
        self.channel.send("released", address)

    def oversize(self, exceeded: Exceeded) -> None:
        self.channel.send("oversize", exceeded)

    def durable(self, paths: list[Path]) -> None:
        self.channel.send("durable", paths)


class _RelayedOwnResults(OwnResults):
    """The own-result check in a receiving process: the header checks here, the result
    index and the count (metrics, log line) in the parent."""

    def __init__(self, channel: _Channel, *, ask_index: bool) -> None:
        super().__init__(known=channel.known if ask_index else None)
        self.channel = channel

    def ignored(self, intake: str, sop_instance_uid: str, reason: str) -> None:
        self.channel.send("ignored", intake, sop_instance_uid, reason)


def _no_study(_study: object) -> None:
    """A receiving process hands no study over: the parent's tracker does."""


def _receive(
    config: ScpConfig,
    spool: Path,
    hand: socket.socket,
    notices: Connection,
    questions: Connection,
    ask_index: bool,
    report_durable: bool,
    commitment_reports: bool,
    log_levels: tuple[int, tuple[str, ...]],
) -> None:
    """A receiving process: run each connection the parent hands over until it closes
    its end of ``hand``."""
    # blocked since before exec (see ReceiverPool._spawn): ignored from now on, and a
    # pending one dropped; the parent stops this process by closing its end of ``hand``
    for number in _STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    from radserve.gateway.scp import GatewaySCP

    channel = _Channel(notices, questions)
    forward_worker_logs(channel, *log_levels)
    relay = _Relay(channel)
    scp = GatewaySCP(
        config.model_copy(update={"receivers": 1}),
        _no_study,
        run_monitor=False,
        own_results=_RelayedOwnResults(channel, ask_index=ask_index),
        on_durable=relay.durable if report_durable else None,
        on_oversize=relay.oversize,
        on_commitment=channel.commitment if commitment_reports else None,
        arrivals=relay,
        spool=spool,
    )
    server = make_server(
        scp.ae, (config.host, 0), server_class=HandedServer, **scp.server_options(relay)
    )
    channel.send("ready", os.getpid())
    try:
        while True:
            try:
                message, fds, _flags, _address = socket.recv_fds(hand, 1024, 1)
            except OSError:
                break
            if not fds:  # the parent closed its end: stopping
                break
            address = tuple(json.loads(message))
            server.process_request(socket.socket(fileno=fds[0]), address)
    finally:
        scp.instances.close()


@dataclass(eq=False)
class _Slot:
    """One receiving process, as the parent knows it."""

    index: int
    process: Any
    hand: socket.socket
    notices: Connection
    questions: Connection
    started: float
    pid: int = 0
    ready: bool = False
    closed: bool = False  # its notices pipe has ended
    open: Counter[str] = field(default_factory=Counter)  # admitted connections per address
    # its open associations (the parent's keys) and the studies each delivered
    associations: dict[object, dict[str, Path]] = field(default_factory=dict)


class ReceiverPool:
    """The receiving processes of one :class:`~radserve.gateway.scp.GatewaySCP`."""

    def __init__(self, scp: GatewaySCP, count: int) -> None:
        self.scp = scp
        self.count = count
        self.restarts = 0
        self._context = multiprocessing.get_context("spawn")
        self._slots: dict[int, _Slot] = {}
        self._lock = threading.Condition()
        self._stopping = False
        self._started = False  # every process was ready once: restart the ones that die
        self._thread = threading.Thread(target=self._run, name="radserve-receivers", daemon=True)

    def start(self) -> None:
        """Start every receiving process; return once each is ready."""
        for index in range(self.count):
            self._spawn(index)
        self._thread.start()
        deadline = time.monotonic() + _READY_TIMEOUT_S
        with self._lock:
            # a process that ends before it is ready is not replaced: start fails at once
            while not self._all_ready() and len(self._slots) == self.count:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            self._started = ready = self._all_ready()
        if not ready:
            self.stop()
            raise RuntimeError(
                f"the {self.count} receiving processes did not start (see the log above)"
            )

    def pids(self) -> list[int]:
        """The running receiving processes (tests, the bench)."""
        with self._lock:
            return [slot.pid for slot in self._slots.values() if slot.ready]

    def hand(self, request: socket.socket, client_address: Any) -> None:
        """Pass an admitted connection to the process with the fewest open; raises when
        none runs (the caller gives the slot back and closes the connection)."""
        host = str(client_address[0])
        with self._lock:
            live = [s for s in self._slots.values() if s.ready and not s.closed]
            if not live:
                raise ConnectionError("no receiving process is running")
            slot = min(live, key=lambda s: (sum(s.open.values()), s.index))
            slot.open[host] += 1
        try:
            address = json.dumps([host, int(client_address[1])]).encode()
            socket.send_fds(slot.hand, [address], [request.fileno()])
        except OSError:
            self._release(slot, host)
            raise

    def stopping(self) -> None:
        """No receiving process is started again from now on, nor its end warned of.
        Safe in a signal handler: it only sets a flag (no lock)."""
        self._stopping = True

    def stop(self) -> None:
        """Close every process's hand-over socket (it exits), then wait for them."""
        with self._lock:
            self._stopping = True
            slots = list(self._slots.values())
        for slot in slots:
            with contextlib.suppress(OSError):
                slot.hand.shutdown(socket.SHUT_RDWR)
        for slot in slots:
            slot.process.join(_STOP_TIMEOUT_S)
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join(_STOP_TIMEOUT_S)
        if self._thread.is_alive():
            self._thread.join(_STOP_TIMEOUT_S * 2)
        with self._lock:
            for slot in list(self._slots.values()):
                self._close(slot)
            self._slots.clear()

    # -- the parent's reader thread ------------------------------------------------

    def _all_ready(self) -> bool:
        return len(self._slots) == self.count and all(s.ready for s in self._slots.values())

    def _spawn(self, index: int) -> None:
        spool = self.scp.spool / f"receiver-{index}"
        spool.mkdir(parents=True, exist_ok=True)
        clear_spool(spool)  # a dead process's partial data sets: never acknowledged
        parent_hand, child_hand = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        notices, child_notices = self._context.Pipe(duplex=False)
        questions, child_questions = self._context.Pipe()
        process = self._context.Process(
            target=_receive,
            args=(
                self.scp.config,
                spool,
                child_hand,
                child_notices,
                child_questions,
                self.scp.own_results.known is not None,
                self.scp.on_durable is not None,
                self.scp.on_commitment is not None,
                levels(),
            ),
            name=f"radserve-receiver-{index}",
            daemon=True,
        )
        # the stop signals blocked across fork and exec, so that the child has them
        # blocked until it ignores them (_receive): a group signal at any time before
        # that would kill it
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        for end in (child_hand, child_notices, child_questions):
            end.close()
        slot = _Slot(index, process, parent_hand, notices, questions, time.monotonic())
        with self._lock:
            self._slots[index] = slot

    def _run(self) -> None:
        while True:
            with self._lock:
                slots = list(self._slots.values())
                if self._stopping and not slots:
                    return
            waiting: dict[Any, tuple[_Slot, str]] = {}
            for slot in slots:
                if not slot.closed:
                    waiting[slot.notices] = (slot, "notice")
                waiting[slot.questions] = (slot, "question")
                waiting[slot.process.sentinel] = (slot, "ended")
            for ready in wait(list(waiting), timeout=1.0):
                slot, what = waiting[ready]
                if self._slots.get(slot.index) is not slot:
                    continue  # ended earlier in this round
                try:
                    if what == "notice":
                        self._notice(slot)
                    elif what == "question":
                        self._answer(slot)
                    else:
                        self._ended(slot)
                except Exception as exc:  # the reader must outlive any one message
                    logger.error("receiving process %d: %s", slot.index, type(exc).__name__)

    def _notice(self, slot: _Slot) -> None:
        try:
            kind, *args = slot.notices.recv()
        except (EOFError, OSError):
            slot.closed = True
            return
        except Exception:  # a message cut short by a dying process
            slot.closed = True
            logger.warning("receiving process %d: unreadable notice", slot.index)
            return
        tracker = self.scp.tracker
        if kind == "arrived":
            study_uid, folder, details = args
            key = (slot.index, slot.pid, details.get("association"))
            slot.associations.setdefault(key, {})[study_uid] = folder
            tracker.arrived(study_uid, folder, **{**details, "association": key})
        elif kind in ("interrupted", "resumed"):
            study_uid, association = args
            key = (slot.index, slot.pid, association)
            studies = slot.associations.get(key, {})
            studies.pop(study_uid, None)
            if not studies:
                slot.associations.pop(key, None)
            getattr(tracker, kind)(study_uid, key)
        elif kind == "touch":
            tracker.touch(args[0])
        elif kind == "released":
            self._release(slot, args[0])
            self.scp.admission.release(args[0])
        elif kind == "oversize" and self.scp.on_oversize is not None:
            self.scp.on_oversize(args[0])
        elif kind == "ignored":
            self.scp.own_results.ignored(*args)
        elif kind == "durable" and self.scp.on_durable is not None:
            self.scp.on_durable(args[0])
        elif kind == "log":
            route_record(args[0])
        elif kind == "ready":
            with self._lock:
                slot.pid, slot.ready = int(args[0]), True
                self._lock.notify_all()

    def _answer(self, slot: _Slot) -> None:
        try:
            number, (kind, *args) = slot.questions.recv()
        except (EOFError, OSError):
            return
        if kind == "commitment":  # settles rows in the database: not on the reader thread
            threading.Thread(
                target=self._settle,
                args=(slot, number, *args),
                name=f"radserve-commitment-{slot.index}",
                daemon=True,
            ).start()
            return
        known = self.scp.own_results.known
        try:
            answer = bool(known is not None and known(str(args[0])))
        except Exception as exc:  # the index cannot be read: not evidence of anything
            logger.warning("own-result index not read: %s", type(exc).__name__)
            answer = False
        with contextlib.suppress(OSError):
            slot.questions.send((number, answer))

    def _settle(self, slot: _Slot, number: int, calling: str, report: CommitmentReport) -> None:
        """A storage commitment report a receiving process took: settled here, where the
        outbox is (the process waits for the answer, asking nothing else meanwhile)."""
        handler = self.scp.on_commitment
        try:
            answer = (
                handler(calling, report)
                if handler is not None
                else (Status.PROCESSING_FAILURE, "no storage commitment here")
            )
        except Exception as exc:  # the database is away: the peer may report again
            logger.warning("storage commitment report not settled: %s", type(exc).__name__)
            answer = (Status.PROCESSING_FAILURE, "the report could not be settled")
        with contextlib.suppress(OSError):
            slot.questions.send((number, answer))

    def _release(self, slot: _Slot, host: str) -> None:
        with self._lock:
            slot.open[host] -= 1
            if slot.open[host] <= 0:
                del slot.open[host]

    def _ended(self, slot: _Slot) -> None:
        """A receiving process exited: settle what it left, start another."""
        while not slot.closed and slot.notices.poll():
            self._notice(slot)  # what it sent before it ended
        slot.process.join(_STOP_TIMEOUT_S)
        with self._lock:
            del self._slots[slot.index]
            stopping = self._stopping or not self._started
            opened = list(slot.open.elements())
            slot.open.clear()
            self._lock.notify_all()
        for host in opened:
            self.scp.admission.release(host)
        self._cut_off(slot)
        # its temporary instance files (the other processes' are left: theirs are alive)
        swept = self.scp.instances.remove_partials()
        reopened = self.scp.tracker.recover(self.scp.instances.incoming, others_receiving=True)
        self._close(slot)
        if stopping:
            return
        if time.monotonic() - slot.started < _RESTART_PAUSE_S:
            time.sleep(_RESTART_PAUSE_S)  # one that dies at once must not spin
        with self._lock:  # stop() sets _stopping under it, then takes the slots
            if self._stopping:
                return  # a stop began meanwhile: it ended for that, or it no longer matters
            self.restarts += 1
            logger.warning(
                "receiving process %d (pid %d) ended with exit code %s: %d connections "
                "closed, %d partial files removed, %d studies found unreported; starting "
                "another",
                slot.index,
                slot.pid,
                slot.process.exitcode,
                len(opened),
                swept,
                reopened,
            )
            self._spawn(slot.index)

    def _cut_off(self, slot: _Slot) -> None:
        """The studies of a dead process's open associations: interrupted (marker and
        tracker), its receiving markers gone, as after a crash of a single process."""
        tracker = self.scp.tracker
        for key, studies in slot.associations.items():
            for study_uid, folder in studies.items():
                _touch(folder / INTERRUPTED_MARKER)
                tracker.interrupted(study_uid, key)
        slot.associations.clear()
        if not slot.pid:
            return
        pattern = f"*/{RECEIVING_PREFIX}{receiving_token(slot.pid)}*"
        for marker in self.scp.instances.incoming.glob(pattern):
            _touch(marker.parent / INTERRUPTED_MARKER)
            with contextlib.suppress(OSError):
                marker.unlink()

    @staticmethod
    def _close(slot: _Slot) -> None:
        for end in (slot.hand, slot.notices, slot.questions):
            with contextlib.suppress(OSError):
                end.close()


def _touch(path: Path) -> None:
    try:
        path.touch()
    except OSError as exc:
        logger.warning("cannot mark %s as interrupted: %s", path.parent.name, exc)
