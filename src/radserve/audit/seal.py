"""What makes the audit chain tamper-evident against a writer of its database.

* The HMAC key (:func:`load_key`): ``audit.key`` (``RADSERVE_AUDIT__KEY``, 64 hex
  digits) or the key file (``audit.key_file``, default ``<data_dir>/audit/audit.key``),
  created with mode 0600 at first start and refused when group or others may read it.
* Signed checkpoints (:class:`CheckpointFile`): lines ``{"seq", "head", "keyed_from",
  "ts", "key_id", "mac"}`` appended (``O_APPEND``, fsync) to a file outside the database;
  ``mac`` is the HMAC of the rest. ``radserve audit verify`` checks the chain against the
  newest valid line, which catches records cut from the end with the head moved back,
  and a wiped table (as far back as the last checkpoint).
* :class:`AuditSeal` writes those checkpoints: at once in a short-lived process (the
  CLI), at most every ``checkpoint_interval_s`` on a thread in the server, and at stop.

What it does not catch: records cut after the newest checkpoint (up to
``checkpoint_interval_s`` of history) when the syslog collector is not consulted, and
an attacker who can also write the checkpoint file *and* read the key.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import logging
import os
import re
import secrets
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radserve.audit.chain import AuditKey, AuditProblem, AuditRecord, VerifyReport, canonical_json
from radserve.errors import RadserveError
from radserve.loop_failures import LoopFailures

if TYPE_CHECKING:
    from radserve.config import Settings
    from radserve.store import Store

logger = logging.getLogger(__name__)
_HEX_KEY = re.compile(r"^[0-9a-fA-F]{64}$")


class AuditKeyError(RadserveError):
    """The audit key cannot be read, created, or is exposed."""

    code = "audit_key_invalid"


def key_file_path(settings: Settings) -> Path:
    return settings.audit.key_file or settings.data_dir / "audit" / "audit.key"


def checkpoint_path(settings: Settings) -> Path:
    return settings.audit.checkpoint_file or settings.data_dir / "audit" / "checkpoints.jsonl"


def load_key(
    settings: Settings, *, create: bool = True, chain_key_id: str | None = None
) -> AuditKey:
    """The chain's key: from the settings (environment), else the key file, which is
    created (0600, 256 random bits) when missing and ``create``.

    ``chain_key_id``: the key id of the chain's newest record (None: an empty or
    unkeyed chain). A keyed chain gets no new key (replicas sharing a database, or a
    lost key file: records under a second key verify nowhere), and a key of another id
    is refused; key rotation is not implemented."""
    key = _configured_key(
        settings, create=create and chain_key_id is None, chain_key_id=chain_key_id
    )
    if chain_key_id is not None and key.id != chain_key_id:
        where = "RADSERVE_AUDIT__KEY" if settings.audit.key is not None else key_file_path(settings)
        raise AuditKeyError(
            f"the audit key of {where} is audit key {key.id}, but the audit chain in the "
            f"database is keyed with audit key {chain_key_id}: records under a second key "
            f"would not verify. {_WHERE_THE_KEY_GOES}"
        )
    return key


_WHERE_THE_KEY_GOES = (
    "Every server and command writing one chain uses the same key: copy the key file of a "
    "server that writes it (its audit.key_file, default <its data_dir>/audit/audit.key) "
    "here with mode 0600, point audit.key_file at it, or set RADSERVE_AUDIT__KEY"
)


def _configured_key(settings: Settings, *, create: bool, chain_key_id: str | None) -> AuditKey:
    if settings.audit.key is not None:
        return AuditKey(bytes.fromhex(settings.audit.key.get_secret_value()))
    path = key_file_path(settings)
    if not path.exists():
        if chain_key_id is not None:
            raise AuditKeyError(
                f"no audit key file at {path}, and the audit chain in the database is keyed "
                f"with audit key {chain_key_id} (another server sharing the database, or a "
                f"lost key file): no new key was created. {_WHERE_THE_KEY_GOES}"
            )
        if not create:
            raise AuditKeyError(f"no audit key file at {path}")
        _create_key_file(path)
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AuditKeyError(
            f"audit key file {path} is open to group or others (mode {stat.filemode(mode)}); "
            f"`chmod 600 {path}`"
        )
    text = path.read_text(encoding="ascii", errors="replace").strip()
    if not _HEX_KEY.match(text):
        raise AuditKeyError(f"audit key file {path} does not hold 64 hex digits")
    return AuditKey(bytes.fromhex(text))


def _create_key_file(path: Path) -> None:
    """Write the key to a private temporary file, then link it into place: another
    process starting at the same moment either wins or reads a complete key."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
        logger.warning("created the audit key file %s (mode 0600): back it up", path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


# --- checkpoints -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    """The chain had ``seq`` records with head ``head`` at ``ts``; keyed from ``keyed_from``."""

    seq: int
    head: str
    keyed_from: int
    ts: str
    key_id: str

    def body(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "head": self.head,
            "keyed_from": self.keyed_from,
            "ts": self.ts,
            "key_id": self.key_id,
        }

    def signed(self, key: AuditKey) -> dict[str, Any]:
        body = self.body()
        return {**body, "mac": key.mac("checkpoint" + canonical_json(body))}


class CheckpointFile:
    """An append-only JSON-lines file of signed checkpoints, shared by every process that
    appends to the chain (the server, each of its reader processes, the CLI).

    Safe across processes: an append holds an exclusive ``flock`` while it writes its
    whole line (looping over short writes) and fsyncs; a line left unfinished by a writer
    that died mid-write (a short write, disk full) is ended first, so it cannot swallow
    the next checkpoint; a read holds a shared lock, so it never sees half a line."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, checkpoint: Checkpoint, key: AuditKey) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        line = (json.dumps(checkpoint.signed(key), sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # an unfinished line: end it, keep it (it is evidence)
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)  # releases the lock

    def newest(self, key: AuditKey) -> CheckpointScan:
        """The valid checkpoint with the highest seq, what is wrong with the other lines,
        and which lines are torn appends (see :func:`torn_append`)."""
        scan = CheckpointScan()
        if not self.path.exists():
            return scan
        best: Checkpoint | None = None
        problems = scan.problems
        with open(self.path, encoding="utf-8", errors="replace") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH)  # no writer is mid-line
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                torn = torn_append(line, number)
                if torn is not None:
                    scan.torn.append(torn)
                    continue
                try:
                    data = json.loads(line)
                    checkpoint = Checkpoint(
                        seq=int(data["seq"]),
                        head=str(data["head"]),
                        keyed_from=int(data["keyed_from"]),
                        ts=str(data["ts"]),
                        key_id=str(data["key_id"]),
                    )
                    mac = str(data["mac"])
                except (ValueError, KeyError, TypeError):
                    problems.append(f"checkpoint line {number} is unreadable (edited)")
                    continue
                if checkpoint.key_id != key.id:
                    problems.append(
                        f"checkpoint line {number} is signed with audit key "
                        f"{checkpoint.key_id}, not {key.id}"
                    )
                    continue
                if not secrets.compare_digest(mac, checkpoint.signed(key)["mac"]):
                    problems.append(f"checkpoint line {number} has a wrong MAC (forged or edited)")
                    continue
                if best is None or checkpoint.seq >= best.seq:
                    best = checkpoint
        scan.newest = best
        return scan


@dataclass
class CheckpointScan:
    """What :meth:`CheckpointFile.newest` found: the newest valid checkpoint, the lines
    that fail verification (edited, forged, another key), the torn appends."""

    newest: Checkpoint | None = None
    problems: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)


def torn_append(line: str, number: int) -> str | None:
    """What line ``number`` is when a writer stopped in the middle of appending it (power
    cut, full disk), else None: the start of a checkpoint object that ends before its
    closing brace, either the file's last line (no newline) or ended by the next append.

    Not an edit, and not a checkpoint (the one before it is checked). Anything after it
    on its own line is no torn append (a line that swallowed the next checkpoint is
    unreadable), and the lines after it are checked as any other.
    """
    text = line.rstrip("\n")
    if not text.startswith("{") or "}" in text:
        return None
    where = "final append" if text == line else "append (ended by the next append)"
    return f"checkpoint line {number} is a torn {where}: a writer stopped mid-line"


# --- verification against what is kept outside the database ---------------------------------
@dataclass(frozen=True)
class ExpectedHead:
    """A ``SEQ:HASH`` the chain must contain (a checkpoint, or what a collector saw)."""

    seq: int
    hash: str
    source: str

    @classmethod
    def parse(cls, text: str) -> ExpectedHead:
        seq, _, digest = text.partition(":")
        if not seq.isdigit() or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ValueError(f"expected SEQ:HASH (e.g. 42:{'ab' * 32}), got {text!r}")
        return cls(int(seq), digest, "--expect-head")


def verify_sealed(
    store: Store,
    checkpoints: CheckpointFile | None,
    expected: Sequence[ExpectedHead] = (),
) -> tuple[VerifyReport, Checkpoint | None]:
    """The chain's own verification (links, HMACs, head) plus: the newest valid checkpoint
    and every ``expected`` head must be records of this chain, with the same hash, at or
    before its head; from the checkpoint's ``keyed_from`` on every record must be keyed."""
    key = store.audit_key
    if key is None:
        raise AuditKeyError("verifying against checkpoints needs the audit key")
    report = store.verify_audit()
    problems = list(report.problems)
    checkpoint: Checkpoint | None = None
    notes: list[str] = []
    anchors = list(expected)
    if checkpoints is not None:
        scan = checkpoints.newest(key)
        checkpoint, notes = scan.newest, scan.torn
        problems += [AuditProblem(None, line) for line in scan.problems]
        if checkpoint is not None:
            anchors.append(
                ExpectedHead(checkpoint.seq, checkpoint.head, f"the checkpoint of {checkpoint.ts}")
            )
            unkeyed = store.audit_unkeyed_from(checkpoint.keyed_from)
            if unkeyed is not None:
                problems.append(
                    AuditProblem(
                        unkeyed,
                        "unkeyed record where the checkpoints say the chain is keyed "
                        f"(from seq {checkpoint.keyed_from}): the chain was rehashed without "
                        "the key",
                    )
                )
    for anchor in anchors:
        problems += _check_anchor(store, report, anchor)
    return (
        VerifyReport(
            records=report.records,
            head_seq=report.head_seq,
            head_hash=report.head_hash,
            problems=problems,
            notes=notes,
            last_seq=report.last_seq,
        ),
        checkpoint,
    )


def _check_anchor(store: Store, report: VerifyReport, anchor: ExpectedHead) -> list[AuditProblem]:
    if anchor.seq == 0:
        return []
    record = store.audit_record(anchor.seq)
    if report.records == 0:
        why = f"the chain is empty but {anchor.source} saw {anchor.seq} record(s) (wiped)"
        return [AuditProblem(None, why)]
    if record is None or report.head_seq < anchor.seq:
        # the last record, not the head row's seq: with the last records deleted and the
        # head row left, "the chain now ends at seq 2407" named a record that was gone
        head = (
            f" (its head row still says seq {report.head_seq})"
            if report.head_seq != report.last_seq
            else " (head moved back)"
        )
        return [
            AuditProblem(
                anchor.seq,
                f"{anchor.source} saw the chain at seq {anchor.seq}; its last record is now "
                f"seq {report.last_seq}: records were cut from the end{head}",
            )
        ]
    if record.hash != anchor.hash:
        return [
            AuditProblem(
                anchor.seq,
                f"hash differs from what {anchor.source} saw (the chain up to here was rewritten)",
            )
        ]
    return []


# --- writing checkpoints ---------------------------------------------------------------------
class AuditSeal:
    """Writes a signed checkpoint of the newest record this process appended.

    ``appended`` is the store's audit listener. Without :meth:`start` it writes at once
    (a CLI command appends a record or two); after it, a thread writes at most every
    ``interval_s``. ``listeners`` are told of every checkpoint (the syslog exporter)."""

    def __init__(
        self,
        key: AuditKey,
        checkpoints: CheckpointFile,
        *,
        interval_s: float = 5.0,
        keyed_from: Callable[[], int] | None = None,
    ) -> None:
        self.key = key
        self.checkpoints = checkpoints
        self.interval_s = interval_s
        self._keyed_from = keyed_from
        self.listeners: list[Callable[[Checkpoint], None]] = []
        self._newest: AuditRecord | None = None
        self._written_seq = -1
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        # a database outage fails every round: logged once, then rarely
        self._failures = LoopFailures(logger, "audit checkpoint")
        self._thread: threading.Thread | None = None

    def appended(self, records: Iterable[AuditRecord]) -> None:
        with self._lock:
            for record in records:
                if self._newest is None or record.seq > self._newest.seq:
                    self._newest = record
        if self._thread is None:
            self.checkpoint()
        else:
            self._wake.set()

    def checkpoint(self, *, at: tuple[int, str] | None = None) -> Checkpoint | None:
        """Write a checkpoint of the newest appended record (or ``at``); None if nothing new."""
        with self._lock:
            if at is None:
                if self._newest is None or self._newest.seq <= self._written_seq:
                    return None
                at = (self._newest.seq, self._newest.hash)
            keyed_from = self._keyed_from() if self._keyed_from is not None else 1
            checkpoint = Checkpoint(
                seq=at[0],
                head=at[1],
                keyed_from=keyed_from,
                ts=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
                key_id=self.key.id,
            )
            self.checkpoints.append(checkpoint, self.key)
            self._written_seq = max(self._written_seq, at[0])
        for listener in self.listeners:
            try:
                listener(checkpoint)
            except Exception:
                logger.exception("audit checkpoint listener failed")
        return checkpoint

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="radserve-audit-seal", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self._checkpoint_logged()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            self._checkpoint_logged()
            self._stop.wait(self.interval_s)

    def _checkpoint_logged(self) -> None:
        try:
            self.checkpoint()
        except OSError as exc:
            logger.error("cannot write the audit checkpoint %s: %s", self.checkpoints.path, exc)
        except RadserveError as exc:  # the database is away: the next round checkpoints
            self._failures.failed(exc)
        else:
            self._failures.succeeded()


__all__ = [
    "AuditKeyError",
    "AuditSeal",
    "Checkpoint",
    "CheckpointFile",
    "CheckpointScan",
    "ExpectedHead",
    "checkpoint_path",
    "key_file_path",
    "load_key",
    "torn_append",
    "verify_sealed",
]
