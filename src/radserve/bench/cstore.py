"""``radserve bench --scenario cstore``: C-STORE ingest rate, per gateway configuration.

The bench's 512x512 phantom study (explicit VR little endian, ~512 KB an instance) is
sent by dcmtk's ``storescu`` to a :class:`~radserve.gateway.GatewaySCP` in this process,
from 1 and from ``associations`` concurrent associations (the files split between
them), for each configuration of :data:`MODES` in turn (the ``gateway.durability`` modes, a
larger advertised PDU, several receiving processes), ``repeats`` times alternating the
modes, each run into a fresh data folder on the file system of ``work_dir``. A run's
rate is instances / wall time from the first storescu start to the last one's exit
(association set-up included); every instance must have been answered with success and
be on disk. Medians per (mode, associations), and each mode's ratio to the default
configuration at the same concurrency. A mode's label says what it configures
(:func:`mode_label`: durability, advertised PDU, receiving processes).

Floors, measured in the same run and alternated with the modes (issue 19 goal 6: what
bounds the rate, with the measurement):

* ``disk``: this file system's rate for the same durable sequence radserve performs per
  instance (write the instance's bytes to a temporary file, fsync it, link it to its
  final name, fsync the folder), with 1 and with N writer threads — what the device
  allows with no DICOM at all;
* ``bare pynetdicom``: a bare pynetdicom storage SCP (no allow-list, no admission, no
  header read, no completeness tracking) that copies each received data set to its file,
  fsyncs file and folder and only then answers success, fed by the same storescu
  senders — what the DICOM stack radserve is built on allows here; beside it, the same
  SCP gathering the data set in memory (no spool file) and advertising a 1 MiB PDU.

Each run also reports the CPU it cost per instance (the SCP: this process's SCP and
committer threads, plus its receiving processes; children: the storescu senders), and
in ``group`` mode the committer's busy share: a committer idle most of the time cannot
group, whatever the concurrency.

From those, each row's CPU bound: the rate the machine's cores allow when the senders
share them (``cores x 1000 / (SCP + sender CPU-ms an instance)``, :func:`cpu_bound`), so
a rate comes with what bounds it from the same run. Where the SCP receives in this
process, its CPU an instance is split too (:data:`SPLIT`, from the SCP's
:class:`~radserve.gateway.cpu_ledger.CpuLedger`): pynetdicom's DUL threads (socket reads,
PDU decoding, the data set written to the spool file), the rest of pynetdicom (the
association threads' DIMSE work: command set, response, events; association set-up),
the header read, the durable save and radserve's other handler work.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydicom

from radserve.bench.errors import BenchError
from radserve.bench.study import ensure_study
from radserve.gateway import GatewaySCP, ScpConfig
from radserve.gateway.storage import study_instances
from radserve.host import usable_cores

BIG_PDU = 1024**2  # the largest P-DATA PDU gateway.max_pdu_bytes (default 1 MiB) lets in
SMALL_PDU = 16 * 1024  # pynetdicom's own maximum PDU (radserve advertised it before 1 MiB)
# the gateway settings each mode changes from ScpConfig's defaults (per_instance, a 1 MiB
# advertised PDU, receiving in one process): the durability modes; the cheap per-process
# cut measured by undoing it (a 16 KiB PDU: dcmtk's storescu follows what is advertised,
# ~32 PDUs an instance instead of ~1); several receiving processes behind the one port
# (radserve.gateway.receivers). Each label is made from the configuration the mode runs
# (mode_label), so it cannot say something else when a default changes.
MODE_SETTINGS: tuple[dict[str, Any], ...] = (
    {},
    {"durability": "group", "group_sync": "fsync"},
    {"durability": "group", "group_sync": "syncfs"},
    {"advertised_pdu_bytes": SMALL_PDU},
    {"receivers": 2},
    {"receivers": 2, "advertised_pdu_bytes": SMALL_PDU},
)


def mode_label(settings: dict[str, Any]) -> str:
    """What a mode configures, read back from the SCP configuration it builds: durability,
    the PDU the SCP advertises, the receiving processes."""
    config = ScpConfig(data_dir=Path("."), **settings)
    durability = "per_instance" if config.durability == "per_instance" else "group"
    if config.durability == "group":
        durability += f" ({config.group_sync})"
    pdu = min(config.advertised_pdu_bytes, config.max_pdu_bytes)
    size = f"{pdu // 1024**2} MiB" if pdu % 1024**2 == 0 else f"{pdu // 1024} KiB"
    processes = "1 process" if config.receivers == 1 else f"{config.receivers} receivers"
    return f"{durability}, {size} PDU, {processes}"


# (label, the gateway settings it changes); the first is the defaults, every ratio's base
MODES: tuple[tuple[str, dict[str, Any]], ...] = tuple((mode_label(s), s) for s in MODE_SETTINGS)
DEFAULT_MODE = MODES[0][0]
GOAL_RATE = 300.0


def dcmtk_storescu() -> str | None:
    """dcmtk's storescu binary (pynetdicom installs a Python script of that name)."""
    for folder in os.get_exec_path():
        candidate = Path(folder) / "storescu"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            with open(candidate, "rb") as handle:
                if handle.read(4) == b"\x7fELF":
                    return str(candidate)
    return None


BARE = "bare pynetdicom"
DISK = "disk"
# the bare SCP's cheap per-process cuts, measured beside it (label, variant settings):
# the data set gathered in memory instead of spooled to a file (what radserve gives up
# for bounded memory), and the larger advertised PDU
# radserve's receive path on the same stack minus radserve's own work: the 1 MiB PDU and
# the association threads that wait instead of polling (radserve.gateway.reactor)
BARE_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    (BARE, {}),
    (f"{BARE}, in memory", {"chunked": False}),
    (f"{BARE}, 1 MiB PDU", {"max_pdu": BIG_PDU}),
    (f"{BARE}, 1 MiB PDU, waiting threads", {"max_pdu": BIG_PDU, "waiting": True}),
)


# the parts of the SCP's CPU an instance, in the order they happen to an instance
SPLIT = ("pynetdicom_receive", "pynetdicom_dimse_and_rest", "parse", "durable", "handler_other")


def cpu_bound(cores: int, scp_ms: float, sender_ms: float) -> float | None:
    """Instances a second the cores allow at these CPU-ms an instance (None at 0 ms)."""
    spent = scp_ms + sender_ms
    return cores * 1000 / spent if spent > 0 else None


def _cpu() -> tuple[float, float]:
    """CPU seconds of this process (all threads, the kernel's nanosecond clock) and of
    its waited-for children (clock ticks: what the kernel keeps for them)."""
    t = os.times()
    return time.process_time(), t.children_user + t.children_system


def _split(total_ms: float, ledger: dict[str, float], files: int) -> dict[str, float]:
    """The SCP's CPU-ms an instance in :data:`SPLIT`'s parts (summing to ``total_ms``)."""
    ms = {name: 1000 * seconds / files for name, seconds in ledger.items()}
    return {
        "pynetdicom_receive": ms["receive"],
        "pynetdicom_dimse_and_rest": total_ms - ms["receive"] - ms["handler"],
        "parse": ms["parse"],
        "durable": ms["durable"],
        "handler_other": ms["handler"] - ms["parse"] - ms["durable"],
    }


def _settled(scp: GatewaySCP, timeout_s: float = 10.0) -> None:
    """Wait until every association's threads have ended (a DUL thread's CPU is counted
    when it ends), at most ``timeout_s``."""
    from pynetdicom.association import Association
    from pynetdicom.dul import DULServiceProvider

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not scp.admission.open_connections() and not any(
            isinstance(t, Association | DULServiceProvider) for t in threading.enumerate()
        ):
            return
        time.sleep(0.01)


def _send(tool: str, files: list[Path], host: str, port: int, aec: str, n_assoc: int) -> float:
    """``n_assoc`` storescu processes, the files split between them; the wall seconds
    from the first start to the last exit. Raises when a sender failed."""
    chunks = [files[k::n_assoc] for k in range(n_assoc)]
    start = time.perf_counter()
    senders = [
        subprocess.Popen(
            [tool, "-aet", "BENCH", "-aec", aec, host, str(port), *map(str, chunk)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for chunk in chunks
    ]
    errors = [p.communicate(timeout=600)[1] for p in senders]
    seconds = time.perf_counter() - start
    failed = [
        e.decode(errors="replace")[-300:]
        for p, e in zip(senders, errors, strict=True)
        if p.returncode
    ]
    if failed:
        raise BenchError(f"storescu failed: {failed}")
    return seconds


def _measured(files: int, seconds: float, cpu0: tuple[float, float]) -> dict[str, Any]:
    cpu1 = _cpu()
    return {
        "seconds": seconds,
        "rate": files / seconds,
        "cpu_ms_per_instance": 1000 * (cpu1[0] - cpu0[0]) / files,
        "sender_cpu_ms_per_instance": 1000 * (cpu1[1] - cpu0[1]) / files,
    }


def _process_cpu(pids: list[int]) -> float:
    """CPU seconds so far of running processes (the receiving ones: not waited for yet,
    so ``os.times`` has not counted them)."""
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _one_run(
    tool: str, files: list[Path], data_dir: Path, settings: dict[str, Any], n_assoc: int
) -> dict[str, Any]:
    config = ScpConfig(data_dir=data_dir, port=0, quiet_s=3600, **settings)
    with GatewaySCP(config, lambda study: None, run_monitor=False) as scp:
        host, port = scp.address
        pids = scp.receiver_pids()
        cpu0, receivers0, ledger0 = _cpu(), _process_cpu(pids), scp.cpu.snapshot()
        seconds = _send(tool, files, host, port, "RADSERVE", n_assoc)
        _settled(scp)
        result = _measured(len(files), seconds, cpu0)
        # the receiving processes' CPU is the SCP's too
        result["cpu_ms_per_instance"] += 1000 * (_process_cpu(pids) - receivers0) / len(files)
        if not pids:  # received here: the ledger saw every association
            ledger = {k: v - ledger0[k] for k, v in scp.cpu.snapshot().items()}
            result["cpu_split_ms"] = _split(result["cpu_ms_per_instance"], ledger, len(files))
        committer = scp.instances.committer
        if committer is not None and committer.batches:
            result["mean_batch"] = len(files) / committer.batches
            result["largest_batch"] = committer.largest_batch
            result["committer_busy"] = committer.busy_s / seconds
    stored = sum(len(study_instances(d)) for d in (data_dir / "incoming").iterdir())
    if stored != len(files):
        raise BenchError(f"{settings}: {stored}/{len(files)} stored")
    return result


def _durable_copy(source: Path, folder: Path, name: str) -> None:
    """The sequence radserve's per-instance path performs: temporary file, fsync, link
    to the final name, folder fsync (the temporary name removed)."""
    with open(source, "rb") as src:
        _durable_write(src, folder, name)


def _durable_write(data: bytes | Any, folder: Path, name: str) -> None:
    """:func:`_durable_copy` of ``data`` (bytes, or a file object to copy)."""
    temporary = folder / f".{name}.part"
    with open(temporary, "xb") as handle:
        if isinstance(data, bytes):
            handle.write(data)
        else:
            shutil.copyfileobj(data, handle, 1 << 20)
        handle.flush()
        os.fsync(handle.fileno())
    os.link(temporary, folder / name)
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    temporary.unlink()


def _disk_run(files: list[Path], data_dir: Path, writers: int) -> dict[str, Any]:
    """The file system's floor: the durable sequence for every instance file, from
    ``writers`` threads (fsync releases the GIL), no DICOM."""
    data_dir.mkdir(parents=True)
    chunks = [files[k::writers] for k in range(writers)]
    errors: list[BaseException] = []

    def write(chunk: list[Path]) -> None:
        try:
            for path in chunk:
                _durable_copy(path, data_dir, path.name)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(chunk,)) for chunk in chunks]
    cpu0 = _cpu()
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result = _measured(len(files), time.perf_counter() - start, cpu0)
    if errors:
        raise BenchError(f"disk floor: {errors[0]!r}")
    return result


def _bare_run(
    tool: str,
    files: list[Path],
    data_dir: Path,
    n_assoc: int,
    *,
    chunked: bool = True,
    max_pdu: int | None = None,
    waiting: bool = False,
) -> dict[str, Any]:
    """A bare pynetdicom storage SCP (pynetdicom's own server, its default PDU size, the
    data set spooled to a temporary file as radserve has it) that answers success only
    after a durable copy (:func:`_durable_copy`): the DICOM stack's floor. ``chunked``
    False: the data set gathered in memory and written from there; ``max_pdu``: the
    maximum PDU it advertises; ``waiting``: each association's threads wait instead of
    polling, as radserve's do."""
    from pynetdicom import AE, _config, evt
    from pynetdicom.transport import RequestHandler, ThreadedAssociationServer

    from radserve.gateway import reactor

    class WaitingHandler(RequestHandler):
        def _create_association(self) -> Any:
            assoc = super()._create_association()
            reactor.wait_instead_of_polling(assoc)
            return assoc

    data_dir.mkdir(parents=True)
    spooled = _config.STORE_RECV_CHUNKED_DATASET
    _config.STORE_RECV_CHUNKED_DATASET = chunked  # True: as radserve receives
    classes = {str(pydicom.dcmread(p, stop_before_pixels=True).SOPClassUID) for p in files[:1]}
    ae = AE(ae_title="BARE")
    if max_pdu is not None:
        ae.maximum_pdu_size = max_pdu
    ae.maximum_associations = max(10, n_assoc)
    for sop_class in classes:
        ae.add_supported_context(sop_class, ["1.2.840.10008.1.2.1", "1.2.840.10008.1.2"])

    def on_store(event: Any) -> int:
        uid = str(event.request.AffectedSOPInstanceUID)
        try:
            if chunked:
                _durable_copy(Path(event.dataset_path), data_dir, f"{uid}.dcm")
            else:
                _durable_write(event.encoded_dataset(), data_dir, f"{uid}.dcm")
        except OSError:
            return 0xA700
        return 0x0000

    handlers = [(evt.EVT_C_STORE, on_store)]
    if waiting:
        server = ae.make_server(
            ("127.0.0.1", 0),
            evt_handlers=handlers,
            server_class=ThreadedAssociationServer,
            request_handler=WaitingHandler,
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
        ae._servers.append(server)  # as AE.start_server does
    else:
        server = ae.start_server(("127.0.0.1", 0), block=False, evt_handlers=handlers)
    try:
        host, port = server.server_address[:2]
        cpu0 = _cpu()
        seconds = _send(tool, files, str(host), int(port), "BARE", n_assoc)
        result = _measured(len(files), seconds, cpu0)
    finally:
        server.shutdown()
        _config.STORE_RECV_CHUNKED_DATASET = spooled
    stored = len(list(data_dir.glob("*.dcm")))
    if stored != len(files):
        raise BenchError(f"bare pynetdicom SCP: {stored}/{len(files)} stored")
    return result


def run_cstore_bench(
    *,
    n_instances: int = 300,
    associations: tuple[int, ...] = (1, 4, 8),
    repeats: int = 3,
    cache_dir: Path | None = None,
    work_dir: Path | None = None,
    floors: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    tool = dcmtk_storescu()
    if tool is None:
        raise BenchError("dcmtk's storescu is not installed (apt-get install dcmtk)")
    cache = Path(cache_dir or Path(tempfile.gettempdir()) / "radserve-bench")
    study = ensure_study(cache, "explicit", n_instances)
    files = sorted(study.glob("*.dcm"))
    size = statistics.fmean(p.stat().st_size for p in files)
    log(f"{len(files)} instances of {size / 1024:.0f} KiB from {study}")
    root = Path(tempfile.mkdtemp(prefix="radserve-cstore-", dir=work_dir))
    bares = dict(BARE_VARIANTS)
    labels = [m[0] for m in MODES] + ([*bares, DISK] if floors else [])
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {
        label: {n: [] for n in associations} for label in labels
    }
    load0 = os.getloadavg()[0]
    try:
        for repeat in range(repeats):
            for n_assoc in associations:
                order = list(labels) if repeat % 2 == 0 else labels[::-1]
                for label in order:
                    data_dir = root / f"{repeat}-{n_assoc}-{labels.index(label)}"
                    if label == DISK:
                        result = _disk_run(files, data_dir, n_assoc)
                    elif label in bares:
                        result = _bare_run(tool, files, data_dir, n_assoc, **bares[label])
                    else:
                        settings = dict(MODES)[label]
                        result = _one_run(tool, files, data_dir, settings, n_assoc)
                    runs[label][n_assoc].append(result)
                    shutil.rmtree(data_dir, ignore_errors=True)
                    log(
                        f"repeat {repeat + 1}: {label}, {n_assoc} "
                        f"{'writer' if label == DISK else 'association'}(s): "
                        f"{result['rate']:.0f}/s, {result['cpu_ms_per_instance']:.1f} CPU-ms "
                        f"an instance (+{result['sender_cpu_ms_per_instance']:.1f} senders)"
                    )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load1 = os.getloadavg()[0]
    cores = usable_cores()  # what the SCP and its senders share
    rows = []
    for label in labels:
        for n_assoc in associations:
            cell = runs[label][n_assoc]
            rates = [r["rate"] for r in cell]
            base = statistics.median(r["rate"] for r in runs[DEFAULT_MODE][n_assoc])
            row: dict[str, Any] = {
                "mode": label,
                "associations": n_assoc,
                "instances_per_s": statistics.median(rates),
                "runs": [round(r, 1) for r in rates],
                "ratio_vs_default": statistics.median(rates) / base,
                "cpu_ms_per_instance": statistics.median(r["cpu_ms_per_instance"] for r in cell),
                "sender_cpu_ms_per_instance": statistics.median(
                    r["sender_cpu_ms_per_instance"] for r in cell
                ),
                "mean_batch": None,
                "largest_batch": None,
                "committer_busy": None,
                "cpu_split_ms": None,
            }
            row["cpu_bound_instances_per_s"] = cpu_bound(
                cores, row["cpu_ms_per_instance"], row["sender_cpu_ms_per_instance"]
            )
            if all("cpu_split_ms" in r for r in cell):
                row["cpu_split_ms"] = {
                    part: statistics.median(r["cpu_split_ms"][part] for r in cell) for part in SPLIT
                }
            if any("mean_batch" in r for r in cell):
                grouped = [r for r in cell if "mean_batch" in r]
                row["mean_batch"] = statistics.median(r["mean_batch"] for r in grouped)
                row["largest_batch"] = max(r["largest_batch"] for r in grouped)
                row["committer_busy"] = statistics.median(r["committer_busy"] for r in grouped)
            rows.append(row)
    summary: dict[str, Any] = {
        "instances": len(files),
        "instance_kib": size / 1024,
        "repeats": repeats,
        "file_system_of": str(root.parent),
        "goal_instances_per_s": GOAL_RATE,
        "load_average": [round(load0, 2), round(load1, 2)],
        "cpus": cores,
        "rows": rows,
    }
    if floors:
        summary["floors"] = _floor_summary(rows, associations)
    return summary


def _floor_summary(rows: list[dict[str, Any]], associations: tuple[int, ...]) -> dict[str, Any]:
    """Per concurrency: the best radserve mode against the bare SCP and the disk, and
    which of the three is below the goal."""
    by = {(r["mode"], r["associations"]): r["instances_per_s"] for r in rows}
    bounds = {(r["mode"], r["associations"]): r["cpu_bound_instances_per_s"] for r in rows}
    out: dict[str, Any] = {}
    for n in associations:
        best_label = max((m[0] for m in MODES), key=lambda label: by[(label, n)])
        best, bare, disk = by[(best_label, n)], by[(BARE, n)], by[(DISK, n)]
        out[str(n)] = {
            "radserve_best_mode": best_label,
            "radserve": best,
            "radserve_cpu_bound": bounds[(best_label, n)],
            "bare_pynetdicom": bare,
            "disk": disk,
            "radserve_vs_bare": best / bare if bare else None,
            "bare_vs_disk": bare / disk if disk else None,
            "below_goal": [
                name
                for name, rate in (("radserve", best), (BARE, bare), (DISK, disk))
                if rate < GOAL_RATE
            ],
        }
    return out
