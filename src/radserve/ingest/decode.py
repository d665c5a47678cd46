"""Decode frames in parallel straight into one preallocated array, in physical units.

Decoding goes through pydicom's pixel-data plugins (pylibjpeg, pyjpegls, gdcm, pillow).
Native data is decoded in threads; every encapsulated syntax radserve decodes goes to
worker processes (:data:`ISOLATED_SYNTAXES`), where a decoder that aborts on damaged
data ends one worker and fails one job, not the server (:func:`decode_stack` decides;
``processes=`` overrides). Each worker returns its frames already converted, which the
parent copies into place and drops. The JPEG 2000 family went there first for speed:
no plugin lets go of the GIL (pylibjpeg-openjpeg and Pillow read through Python file
objects, GDCM's binding holds it). Measured on the 2-core development machine, 300
512 x 512 lossless JPEG 2000 frames: GDCM 5.7 s (it runs OpenJPEG on all cores itself,
~1.7 cores busy), pylibjpeg 9.1 s in one process and 4.4 s in two. For these syntaxes
pylibjpeg is therefore preferred whenever it is installed, in processes and threads
alike (one decoder for one syntax, whatever the mode), and GDCM is the fallback.

Each stored frame becomes ``slope × stored + intercept`` with Pixel Padding Value
replaced by air. The result is int16 when every slope and intercept is integral and the
values fit (a 512×512×300 CT costs 157 MB), float32 otherwise; if an int16 decode meets
a value it cannot hold, the stack is decoded again as float32 rather than wrapped
around.

Errors name the file and say what is wrong in one line; the decoder's own exception is
logged at DEBUG. pydicom logs a full traceback for every plugin that fails before it
tries the next one (4–6 per damaged frame); :class:`_QuietPluginFallbacks` keeps those
to one DEBUG line each, since the final error already lists every plugin's message.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import threading
import zipfile
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import (
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    wait,
)
from concurrent.futures.process import BrokenProcessPool
from typing import BinaryIO

import numpy as np
from pydicom.pixels import get_decoder, iter_pixels, pixel_array
from pydicom.uid import (
    UID,
    DeflatedExplicitVRLittleEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
)

from radserve.checkpoints import carry, checkpoint
from radserve.errors import DecodeError
from radserve.host import usable_cores
from radserve.ingest.arrival import DecodeAbandonedError, SliceArrival
from radserve.ingest.headers import GREYSCALE, FrameRef, native_pixel_value, part10_stream
from radserve.ingest.policy import IngestPolicy
from radserve.ingest.sources import SourceFile, SourceReader
from radserve.log_routing import WorkerLogs, forward_worker_logs

log = logging.getLogger(__name__)

_DEFAULT_MAX_FILE_BYTES = IngestPolicy().max_file_bytes
# what a decoder's failure never is: the process or the generator being stopped
_NOT_DECODER_FAILURES = (KeyboardInterrupt, SystemExit, GeneratorExit)


class _QuietPluginFallbacks(logging.Filter):
    """Turns pydicom's per-plugin ``LOGGER.exception`` (a traceback on the terminal for
    each decoder tried) into a DEBUG line without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and "decoders" in record.pathname.replace("\\", "/"):
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def _install_quiet_fallbacks() -> None:
    # A logger's filters see only the records it creates: attach to the decoders' own.
    from pydicom.pixels.decoders import base

    for logger in {base.LOGGER, logging.getLogger("pydicom")}:
        if not any(isinstance(f, _QuietPluginFallbacks) for f in logger.filters):
            logger.addFilter(_QuietPluginFallbacks())


_install_quiet_fallbacks()

_INT16 = np.iinfo(np.int16)
_INSTALL_HINTS = {
    "1.2.840.10008.1.2.4.57": "python-gdcm (pylibjpeg-libjpeg also works but is GPLv3)",
    "1.2.840.10008.1.2.4.70": "python-gdcm (pylibjpeg-libjpeg also works but is GPLv3)",
    "1.2.840.10008.1.2.4.80": "pyjpegls or python-gdcm",
    "1.2.840.10008.1.2.4.81": "pyjpegls or python-gdcm",
    "1.2.840.10008.1.2.4.50": "pillow or python-gdcm",
    "1.2.840.10008.1.2.4.51": "pillow or python-gdcm (8-bit); pylibjpeg-libjpeg (GPLv3) for 12-bit",
    "1.2.840.10008.1.2.4.90": "pylibjpeg with pylibjpeg-openjpeg",
    "1.2.840.10008.1.2.4.91": "pylibjpeg with pylibjpeg-openjpeg",
    "1.2.840.10008.1.2.4.201": "pylibjpeg with pylibjpeg-openjpeg",
    "1.2.840.10008.1.2.4.202": "pylibjpeg with pylibjpeg-openjpeg",
    "1.2.840.10008.1.2.4.203": "pylibjpeg with pylibjpeg-openjpeg",
    "1.2.840.10008.1.2.5": "pylibjpeg-rle",
}


# Decoders of these hold the GIL for a whole frame (pylibjpeg-openjpeg, GDCM): JPEG 2000
# lossless / lossy and HTJ2K lossless / RPCL / lossy.
PROCESS_SYNTAXES = frozenset(
    {
        "1.2.840.10008.1.2.4.90",
        "1.2.840.10008.1.2.4.91",
        "1.2.840.10008.1.2.4.201",
        "1.2.840.10008.1.2.4.202",
        "1.2.840.10008.1.2.4.203",
    }
)
# Decoded by GDCM, whose libjpeg writes on its process's stderr for a damaged fragment
# ("Bogus marker length"; gdcm.Trace.ErrorOff() does not silence it): always in the
# decoding processes, whose stderr is relayed as log records (log_routing.WorkerLogs),
# never in the server, where it was a plain line among the JSON log. JPEG Lossless
# process 14 and its selection value 1. RLE Lossless since 2026-12-07: pylibjpeg-rle
# (Rust) panics on a segment that decodes past Rows x Columns and prints the panic (and,
# under RUST_BACKTRACE, a backtrace of ~100 lines) on its process's stderr; the panic is
# caught as a decoding failure (_decode_job), its text is relayed as log records. Cost,
# 24 RLE frames of 512 x 512 measured as tools/decode_cost.py does (host load ~7):
# 0.02-0.04 CPU-s in threads, 0.06-0.08 in the processes.
STDERR_SYNTAXES = frozenset(
    {"1.2.840.10008.1.2.4.57", "1.2.840.10008.1.2.4.70", "1.2.840.10008.1.2.5"}
)
# Decoded by GDCM first (pydicom's order), which ended its process on damaged headers
# found by tests/fuzz/codestream.py (2026-12-08): JPEG Baseline (and Extended, refused
# upstream but decoded by the same codec) aborted on any libjpeg warning while reading
# the header, JPEG-LS segfaulted on a second frame header and ran for ever on preset
# parameters out of bounds. radserve.ingest.codestream now refuses those, but in the
# server's threads any abort left would end every job in flight; in the decoding
# processes it fails one job (BrokenProcessPool -> DecodeError). Cost, 300 phantom
# slices of 512 x 512 (`tools/decode_cost.py 300 --phantom`, 2 workers, 2-core host,
# load ~1, medians of 4 and 6 alternating runs): JPEG Baseline 0.37-0.39 s wall /
# 0.43-0.46 CPU-s in threads, 0.46-0.50 s / 0.79-0.84 CPU-s in processes (+25-27 % wall:
# the decoded frames cross a pipe); JPEG-LS 1.97-2.12 s / 2.2-2.3 CPU-s in threads,
# 1.16-1.28 s / 2.2-2.4 CPU-s in processes (-40 % wall: GDCM holds the GIL, so its
# threads decoded one frame at a time); near-lossless alike (2.09 s -> 1.33 s).
CRASH_SYNTAXES = frozenset(
    {
        "1.2.840.10008.1.2.4.50",
        "1.2.840.10008.1.2.4.51",
        "1.2.840.10008.1.2.4.80",
        "1.2.840.10008.1.2.4.81",
    }
)
ISOLATED_SYNTAXES = PROCESS_SYNTAXES | STDERR_SYNTAXES | CRASH_SYNTAXES
_FRAMES_PER_TASK = 4  # frames one worker task decodes: amortises the round trip
_TASKS_AHEAD = 2  # tasks queued per worker: bounds the finished frames awaiting copy
_ABANDON_POLL_S = 0.1  # how often a streamed decode looks whether its run was abandoned


class _NeedFloat(Exception):
    """Internal signal: int16 cannot hold the values, decode as float32."""


class StackNeedsFloatError(DecodeError):
    """A stack decoded while it was being read (:func:`start_decode_stack`) met a value
    int16 cannot hold: the reader must load it again with :func:`decode_stack`."""


def ensure_decoders(transfer_syntaxes: Iterable[str]) -> None:
    """Fail before any work if a transfer syntax has no installed decoder."""
    for uid in sorted(set(transfer_syntaxes)):
        name = f"{UID(uid).name} ({uid})" if UID(uid).name != uid else uid
        try:
            decoder = get_decoder(uid)
        except NotImplementedError as exc:
            raise DecodeError(
                f"no pixel-data decoder exists for transfer syntax {name}; convert the "
                "study to a supported syntax (e.g. with gdcmconv --raw) before sending it"
            ) from exc
        if not decoder.is_available:
            missing = "; ".join(decoder.missing_dependencies) or "no plugin found"
            hint = _INSTALL_HINTS.get(uid, "a pydicom pixel-data plugin for it")
            raise DecodeError(
                f"cannot decode transfer syntax {name}: no decoder plugin is installed "
                f"(pydicom: {missing}). Install {hint}"
            )


def decode_stack(
    frames: Sequence[FrameRef],
    reader: SourceReader,
    *,
    air: float,
    workers: int | None = None,
    processes: bool | None = None,
    max_file_bytes: int = _DEFAULT_MAX_FILE_BYTES,
) -> np.ndarray:
    """Decode ``frames`` into slices 0..n-1 of a new (n, rows, columns) array.

    ``workers`` threads or processes (default: the usable cores). ``processes``: decode
    in worker processes (True), threads (False), or decide by transfer syntax (None:
    processes whenever a frame is in :data:`ISOLATED_SYNTAXES`, see :func:`use_processes`).
    ``max_file_bytes`` bounds what is read from a zip member or inflated from a
    Deflated file (``IngestPolicy.max_file_bytes``).
    """
    dtype = _output_dtype(frames)
    if processes is None:
        processes = use_processes(frames, workers)
    decode = _decode_in_processes if processes else _decode
    try:
        return decode(frames, reader, dtype, air, workers, max_file_bytes)
    except _NeedFloat:
        log.info("values do not fit int16; decoding the stack again as float32")
        return decode(frames, reader, np.dtype(np.float32), air, workers, max_file_bytes)


def start_decode_stack(
    frames: Sequence[FrameRef],
    *,
    air: float,
    first: Sequence[int] = (),
    workers: int | None = None,
    max_file_bytes: int = _DEFAULT_MAX_FILE_BYTES,
) -> tuple[np.ndarray, SliceArrival] | None:
    """Start decoding ``frames`` in the worker processes and return at once: the array
    being filled and its :class:`SliceArrival` (slots in ``first`` land first).

    ``None`` when this stack is not decoded that way: it would not go to processes
    (:func:`use_processes`), or the header cannot promise that every value fits the
    output type (the whole stack might have to be decoded again as float32, see
    :func:`decode_stack`): the caller then decodes it with :func:`decode_stack`.
    A decoding failure is raised by the arrival's waits.
    """
    if not frames or not use_processes(frames, workers):
        return None
    dtype = _output_dtype(frames)
    if dtype == np.int16 and not all(_fits_int16(f) for f in frames):
        return None
    rows, cols = frames[0].pixel.rows, frames[0].pixel.columns
    out = np.empty((len(frames), rows, cols), dtype=dtype)
    arrival = SliceArrival(len(frames))

    def run() -> None:
        try:
            _decode_in_processes(
                frames,
                SourceReader(),  # unused by the process path: each worker opens its own
                dtype,
                air,
                workers,
                max_file_bytes,
                out=out,
                first=first,
                arrival=arrival,
            )
        except _NeedFloat:
            arrival.fail(
                StackNeedsFloatError(
                    f"a decoded value lies outside the {frames[0].pixel.bits_stored}-bit "
                    "range Bits Stored declares: decode the stack whole, as float32"
                )
            )
        except BaseException as exc:  # handed to every reader, which raises it
            arrival.fail(exc)
        finally:
            arrival.stopped()

    # carried: a routine study's streamed decoding yields to URGENT work as a whole one does
    threading.Thread(target=carry(run), name="decode-stack", daemon=True).start()
    return out, arrival


def _fits_int16(frame: FrameRef) -> bool:
    """Whether every value Bits Stored allows, rescaled, fits int16 (padding becomes
    air, which the caller's policy keeps in range)."""
    fmt = frame.pixel
    if fmt.pixel_representation:
        low, high = -(2 ** (fmt.bits_stored - 1)), 2 ** (fmt.bits_stored - 1) - 1
    else:
        low, high = 0, 2**fmt.bits_stored - 1
    ends = [v * frame.rescale_slope + frame.rescale_intercept for v in (low, high)]
    return _INT16.min <= min(ends) and max(ends) <= _INT16.max


@functools.cache
def preferred_plugin(transfer_syntax_uid: str) -> str:
    """The pydicom decoding plugin radserve asks for ("" lets pydicom choose): the
    single-threaded pylibjpeg for :data:`PROCESS_SYNTAXES`, where processes give the
    parallelism (see the module docstring)."""
    if transfer_syntax_uid not in PROCESS_SYNTAXES:
        return ""
    try:
        available = get_decoder(transfer_syntax_uid).available_plugins
    except NotImplementedError:
        return ""
    return "pylibjpeg" if "pylibjpeg" in available else ""


def use_processes(frames: Sequence[FrameRef], workers: int | None = None) -> bool:
    """Whether :func:`decode_stack` decodes ``frames`` in processes by default."""
    # Whatever the count and cores: a JPEG 2000 decoder fed a damaged codestream can
    # throw a C++ exception nobody catches (abort: it took the whole server down when a
    # study of under 8 frames was decoded in its threads), so can GDCM's JPEG and
    # JPEG-LS codecs (CRASH_SYNTAXES), and what GDCM's libjpeg writes on stderr is
    # relayed only from the processes. A worker that dies fails the job
    # (decode_failed); the server goes on.
    return any(f.pixel.transfer_syntax_uid in ISOLATED_SYNTAXES for f in frames)


def _output_dtype(frames: Sequence[FrameRef]) -> np.dtype:
    integral = all(
        float(f.rescale_slope).is_integer()
        and float(f.rescale_intercept).is_integer()
        and f.pixel.bits_allocated <= 16
        for f in frames
    )
    return np.dtype(np.int16 if integral else np.float32)


def _decode(
    frames: Sequence[FrameRef],
    reader: SourceReader,
    dtype: np.dtype,
    air: float,
    workers: int | None,
    max_bytes: int,
) -> np.ndarray:
    rows, cols = frames[0].pixel.rows, frames[0].pixel.columns
    out = np.empty((len(frames), rows, cols), dtype=dtype)
    # The cores this process may use (affinity, container quota), not the host's count.
    workers = max(1, workers or min(16, usable_cores()))
    jobs = list(_jobs(frames, workers))
    job = carry(_decode_job)  # a routine study's decoding yields to URGENT work, job by job
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        futures = [pool.submit(job, reader, src, items, out, air, max_bytes) for src, items in jobs]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        for future in done:
            future.result()  # re-raise the first failure
    return out


class _DecodePool:
    """The worker processes, started on first use (sized by the first caller's
    ``workers``, by default the usable cores) and kept for the process's life.

    ``forkserver`` (``spawn`` where there is none), never ``fork``: the server process
    runs ONNX Runtime's and the scheduler's threads, and forking a threaded process can
    leave a child holding a lock nobody will release. The fork server preloads the
    decoding modules once, so each worker starts in milliseconds; idle workers hold
    their imports (tens of MB each, reported by ``radserve bench``) and nothing else.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None
        self._logs: WorkerLogs | None = None
        self._size = 0

    def get(self, workers: int) -> tuple[ProcessPoolExecutor, int]:
        """The pool and its size; started with ``workers`` processes if none runs.

        A running pool is never resized: another thread may be decoding with it, and
        replacing it would cancel that thread's work.
        """
        with self._lock:
            if self._executor is None:
                methods = multiprocessing.get_all_start_methods()
                context = multiprocessing.get_context(
                    "forkserver" if "forkserver" in methods else "spawn"
                )
                if context.get_start_method() == "forkserver":
                    # "__main__": a script's main module is imported once, here, rather
                    # than by every worker (``python -m`` mains are imported per worker
                    # whatever we do, so they should import little at the top).
                    context.set_forkserver_preload(
                        ["__main__", "radserve.ingest.decode", "pydicom.pixels", "openjpeg"]
                    )
                # the workers' warnings and log records go through this process's
                # logging (redacted, structured), not as plain lines to stderr
                self._logs = WorkerLogs(context)
                self._executor = ProcessPoolExecutor(
                    max_workers=workers,
                    mp_context=context,
                    initializer=forward_worker_logs,
                    initargs=self._logs.initargs(),
                )
                self._size = workers
            return self._executor, self._size

    def discard(self, executor: ProcessPoolExecutor) -> None:
        """Drop a broken pool, so the next call starts a fresh one."""
        logs = None
        with self._lock:
            if self._executor is executor:
                self._executor = None
                logs, self._logs = self._logs, None
        executor.shutdown(wait=False, cancel_futures=True)
        if logs is not None:
            logs.stop()

    def shutdown(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
            logs, self._logs = self._logs, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        if logs is not None:
            logs.stop()


_POOL = _DecodePool()


def start_decode_workers(workers: int | None = None) -> int:
    """Start the decoding worker processes now, as a server warms its models, so the
    first compressed study does not wait for them; returns how many are running."""
    executor, size = _POOL.get(max(1, workers or usable_cores()))
    # One task per worker, each held until all have started: the pool starts a process
    # per task it cannot hand to an idle one.
    barrier = [executor.submit(_worker_ready) for _ in range(size)]
    ran = {future.result() for future in barrier}
    # a process the pool started may not have run a task: on a loaded host the first one
    # finished its task and took the next before the second was up (so counting the
    # tasks' pids alone said 1 of 2)
    started = getattr(executor, "_processes", None) or {}
    return max(len(ran), len(started))


def _worker_ready() -> int:
    import time

    time.sleep(0.05)  # keep this worker busy so the next task starts another
    return os.getpid()


def shutdown_decode_workers(*, helpers: bool = False) -> None:
    """Stop the decoding worker processes (they start again when next needed).

    ``helpers``: also stop multiprocessing's fork server and resource tracker, which
    outlive the pool and, when the server is ended by a signal, the server itself (a
    stopping server passes it; both restart on demand)."""
    _POOL.shutdown()
    if helpers:
        _stop_multiprocessing_helpers()


def _stop_multiprocessing_helpers() -> None:
    """Stop the fork server and the resource tracker of this process, if running (the
    stdlib keeps them for the process's life and has no public call to stop them).

    Not while other child processes live (another service's receiving processes, say):
    they hold the tracker's pipe open, and stopping it would wait for them forever."""
    import multiprocessing
    from multiprocessing import forkserver, resource_tracker

    if multiprocessing.active_children():
        log.debug("multiprocessing helpers left running: other child processes use them")
        return

    _unlink_own_semaphores()
    for name, helper in (
        ("fork server", getattr(forkserver, "_forkserver", None)),
        ("resource tracker", getattr(resource_tracker, "_resource_tracker", None)),
    ):
        stop = getattr(helper, "_stop", None)
        if stop is None:
            continue
        try:
            stop()
        except (OSError, ChildProcessError) as exc:  # already gone
            log.debug("stopping the %s: %s", name, exc)


def _unlink_own_semaphores() -> None:
    """Unlink the named semaphores this process still holds (a pool's queues) while the
    resource tracker runs. Stopped, the tracker unlinks every one it still tracks, and
    each semaphore's own finalizer then failed at the process's exit with a raw
    ``FileNotFoundError`` traceback on stderr (``sem_unlink``), beside the JSON log
    lines. Unlinking only removes the name: the semaphores stay usable here."""
    from multiprocessing import synchronize, util

    registry = getattr(util, "_finalizer_registry", {})
    for finalizer in list(registry.values()):
        if getattr(finalizer, "_callback", None) is synchronize.SemLock._cleanup:
            try:
                finalizer()  # runs once: it leaves the registry
            except OSError as exc:  # already gone
                log.debug("unlinking a semaphore: %s", exc)


def _decode_in_processes(
    frames: Sequence[FrameRef],
    reader: SourceReader,
    dtype: np.dtype,
    air: float,
    workers: int | None,
    max_bytes: int,
    *,
    out: np.ndarray | None = None,
    first: Sequence[int] = (),
    arrival: SliceArrival | None = None,
) -> np.ndarray:
    """Like :func:`_decode`, in worker processes; at most ``_TASKS_AHEAD`` tasks per
    worker are in flight, so finished frames never pile up beside the volume.

    ``first``: slots decoded before the others (which then follow in slot order);
    ``arrival`` is told of every slot as it lands in ``out``."""
    rows, cols = frames[0].pixel.rows, frames[0].pixel.columns
    if out is None:
        out = np.empty((len(frames), rows, cols), dtype=dtype)
    executor, size = _POOL.get(max(1, workers or usable_cores()))
    workers = min(size, workers or size)
    tasks = iter(_ordered_tasks(frames, first) if first else _process_tasks(frames, workers))
    pending: dict[Future[np.ndarray], list[int]] = {}

    def submit_next() -> bool:
        checkpoint()  # a routine study hands the decoding processes no more while URGENT runs
        if arrival is not None and arrival.abandoned:
            return False  # its run ended: nothing more of this stack to the processes
        task = next(tasks, None)
        if task is None:
            return False
        slots = [k for k, _ in task]
        pending[executor.submit(_decode_task, [f for _, f in task], dtype.str, air, max_bytes)] = (
            slots
        )
        return True

    try:
        while len(pending) < workers * _TASKS_AHEAD and submit_next():
            pass
        while pending:
            # a streamed stack looks up now and then: an abandoned one stops at once
            poll = None if arrival is None else _ABANDON_POLL_S
            done, _ = wait(pending, timeout=poll, return_when=FIRST_COMPLETED)
            if arrival is not None and arrival.abandoned:
                break  # what is in flight is dropped (the finally cancels what waits)
            for future in done:
                slots = pending.pop(future)
                out[slots] = future.result()  # re-raises the worker's DecodeError
                if arrival is not None:
                    arrival.mark(slots)
                del future
                submit_next()
        if arrival is not None and arrival.abandoned and not arrival.complete:
            raise DecodeAbandonedError(
                f"the run reading this stack of {len(frames)} frames ended; its decoding "
                "was abandoned"
            )
    except BrokenProcessPool as exc:
        _POOL.discard(executor)
        raise DecodeError(
            "a pixel-data decoding process died (out of memory, or a decoder crashed on "
            f"damaged data) while decoding this series of {len(frames)} frames; retry, "
            "or convert the study to an uncompressed syntax (gdcmconv --raw)"
        ) from exc
    finally:
        for future in pending:
            future.cancel()
    return out


def _process_tasks(
    frames: Sequence[FrameRef], workers: int
) -> Iterator[list[tuple[int, FrameRef]]]:
    """Consecutive runs of up to ``_FRAMES_PER_TASK`` frames, in source-file order."""
    items: list[tuple[int, FrameRef]] = []
    for _, chunk in _jobs(frames, max(workers, len(frames) // _FRAMES_PER_TASK)):
        for item in chunk:
            items.append(item)
            if len(items) == _FRAMES_PER_TASK:
                yield items
                items = []
    if items:
        yield items


def _ordered_tasks(
    frames: Sequence[FrameRef], first: Sequence[int]
) -> Iterator[list[tuple[int, FrameRef]]]:
    """Runs of up to ``_FRAMES_PER_TASK`` slots: ``first`` in its order, then the rest
    in slot order (a task may read several files, or scattered frames of one)."""
    head = list(dict.fromkeys(first))
    chosen = set(head)
    order = head + [k for k in range(len(frames)) if k not in chosen]
    for start in range(0, len(order), _FRAMES_PER_TASK):
        yield [(k, frames[k]) for k in order[start : start + _FRAMES_PER_TASK]]


def _decode_task(
    frames: list[FrameRef], dtype: str, air: float, max_bytes: int = _DEFAULT_MAX_FILE_BYTES
) -> np.ndarray:
    """In a worker process: ``frames`` decoded into a new (n, rows, columns) array."""
    block = np.empty((len(frames), frames[0].pixel.rows, frames[0].pixel.columns), dtype)
    by_source: dict[SourceFile, list[tuple[int, FrameRef]]] = defaultdict(list)
    for k, frame in enumerate(frames):
        by_source[frame.source].append((k, frame))
    with SourceReader() as reader:
        for src, items in by_source.items():
            items.sort(key=lambda item: item[1].frame_index or 0)  # the file's order
            _decode_job(reader, src, items, block, air, max_bytes)
    return block


def _jobs(
    frames: Sequence[FrameRef], workers: int
) -> Iterator[tuple[SourceFile, list[tuple[int, FrameRef]]]]:
    """One job per single-frame file; a multi-frame file is cut into ``workers`` chunks."""
    by_source: dict[SourceFile, list[tuple[int, FrameRef]]] = defaultdict(list)
    for k, frame in enumerate(frames):
        by_source[frame.source].append((k, frame))
    for src, items in by_source.items():
        items.sort(key=lambda item: item[1].frame_index or 0)
        size = max(1, -(-len(items) // workers))
        for start in range(0, len(items), size):
            yield src, items[start : start + size]


def _decode_job(
    reader: SourceReader,
    src: SourceFile,
    items: list[tuple[int, FrameRef]],
    out: np.ndarray,
    air: float,
    max_bytes: int = _DEFAULT_MAX_FILE_BYTES,
) -> None:
    checkpoint()  # on a thread (see _decode); a no-op in a decoding process
    uid = items[0][1].pixel.transfer_syntax_uid
    syntax = UID(uid).name
    plugin = preferred_plugin(uid)
    try:
        try:
            _decode_frames(reader, src, items, out, air, plugin, max_bytes)
        except (_NeedFloat, DecodeError, *_NOT_DECODER_FAILURES):
            raise
        except BaseException:
            if not plugin:
                raise
            # The preferred plugin is a speed choice: any other installed one may do.
            log.debug("%s failed on a %s frame; trying every installed plugin", plugin, syntax)
            _decode_frames(reader, src, items, out, air, "", max_bytes)
    except (_NeedFloat, DecodeError):
        raise
    except _NOT_DECODER_FAILURES:
        raise
    except BaseException as exc:  # plugins raise many types on damaged or truncated data
        # A Rust decoder's panic (pylibjpeg-rle's PanicException on an RLE segment that
        # decodes past Rows x Columns) is a BaseException: it passed `except Exception`,
        # ended the scheduler's worker thread and left the job running for ever, every
        # later job queued behind it (2026-12-07).
        # named by instance, never by file (folder and zip member names are the
        # sender's, and may name the patient); the text of an archive or I/O error
        # quotes them, so only its type is logged
        label = items[0][1].label
        quotes_names = isinstance(exc, OSError | zipfile.BadZipFile)
        said = type(exc).__name__ if quotes_names else f"{type(exc).__name__}: {exc}"
        log.debug("decoding %s failed: %s", label, said)
        hint = _INSTALL_HINTS.get(uid)
        raise DecodeError(
            f"{label}: the pixel data ({syntax}) could not be decoded: the file is damaged, "
            "or no installed decoder supports it"
            + (f" (decoders for this syntax: {hint})" if hint else "")
        ) from exc


_NATIVE_LITTLE = {ExplicitVRLittleEndian, ImplicitVRLittleEndian}


def _decode_frames(
    reader: SourceReader,
    src: SourceFile,
    items: list[tuple[int, FrameRef]],
    out: np.ndarray,
    air: float,
    plugin: str,
    max_bytes: int,
) -> None:
    uid = items[0][1].pixel.transfer_syntax_uid
    with contextlib.ExitStack() as stack:
        pixels: str | BinaryIO = stack.enter_context(reader.pixel_source(src, max_bytes))
        if uid == DeflatedExplicitVRLittleEndian:
            # pydicom would inflate the whole file in memory, unbounded: inflate it here
            # into a spooled temporary file (Explicit VR Little Endian), bounded.
            raw = stack.enter_context(open(pixels, "rb")) if isinstance(pixels, str) else pixels
            size = os.fstat(raw.fileno()).st_size if isinstance(pixels, str) else 0
            pixels = stack.enter_context(part10_stream(raw, size, False, max_bytes))[0]
        # native data: the encoding the header reader found (a file may say Explicit VR
        # and be Implicit VR: pydicom's file readers would trust the meta)
        options = {"transfer_syntax_uid": uid} if uid in _NATIVE_LITTLE else {}
        if len(items) == 1 and (native := _native_frame(pixels, items[0][1])) is not None:
            arrays: Iterable[np.ndarray] = [native]
        elif items[0][1].frame_index is None:
            arrays = [pixel_array(pixels, decoding_plugin=plugin, **options)]
        else:
            indices = [f.frame_index for _, f in items]
            arrays = iter_pixels(pixels, indices=indices, decoding_plugin=plugin, **options)
        for (k, frame), stored in zip(items, arrays, strict=True):
            _store(out, k, stored, frame, air)


def _native_frame(pixels: str | BinaryIO, frame: FrameRef) -> np.ndarray | None:
    """A single-frame native monochrome image read at the offset the header reader
    recorded and decoded by pydicom's own native decoder, as :func:`pixel_array` would
    decode it, without parsing the header again (~1 CPU-ms a 512² slice); None when
    this path does not apply and the caller reads the file the general way."""
    fmt = frame.pixel
    if (
        frame.pixel_offset is None
        or not isinstance(pixels, str)
        or fmt.transfer_syntax_uid not in _NATIVE_LITTLE
        or fmt.samples_per_pixel != 1
        or fmt.photometric_interpretation not in GREYSCALE
        or fmt.bits_allocated not in (8, 16, 32)
    ):
        return None
    with open(pixels, "rb") as raw:
        data = native_pixel_value(
            raw, frame.pixel_offset, fmt.rows * fmt.columns * fmt.bits_allocated // 8
        )
    if data is None:
        return None
    array, _ = get_decoder(fmt.transfer_syntax_uid).as_array(
        data,
        rows=fmt.rows,
        columns=fmt.columns,
        samples_per_pixel=1,
        bits_allocated=fmt.bits_allocated,
        bits_stored=fmt.bits_stored,
        pixel_representation=fmt.pixel_representation,
        photometric_interpretation=fmt.photometric_interpretation,
        number_of_frames=1,
        pixel_keyword="PixelData",
    )
    return array


def _store(out: np.ndarray, k: int, stored: np.ndarray, frame: FrameRef, air: float) -> None:
    fmt = frame.pixel
    if stored.shape != (fmt.rows, fmt.columns):
        raise DecodeError(
            f"{frame.label}: a frame decoded to {' × '.join(map(str, stored.shape))} pixels, "
            f"but Rows × Columns say {fmt.rows} × {fmt.columns}"
        )
    slope, intercept = frame.rescale_slope, frame.rescale_intercept
    if (
        out.dtype.kind != "f"
        and stored.dtype.kind in "iu"
        and fmt.padding is None
        and slope == 1.0
        and stored.size
    ):
        # The common CT case (integer stored values, slope 1, no padding): check the
        # range on the stored values and add the intercept straight into the volume,
        # without a full-frame int32 copy.
        shift = int(intercept)
        if int(stored.min()) + shift < _INT16.min or int(stored.max()) + shift > _INT16.max:
            raise _NeedFloat
        np.add(stored, np.int32(shift), out=out[k], dtype=np.int32, casting="unsafe")
        return
    padding = None
    if fmt.padding is not None:
        low, high = fmt.padding
        padding = (stored >= low) & (stored <= high)
    if out.dtype.kind == "f":
        values = stored.astype(np.float64)
        if slope != 1.0 or intercept != 0.0:
            values *= slope
            values += intercept
    else:
        if stored.dtype.kind == "f":
            raise _NeedFloat
        values = stored.astype(np.int32)
        if slope != 1.0:
            values *= int(slope)
        if intercept != 0.0:
            values += int(intercept)
    if padding is not None:
        values[padding] = air
    if (
        out.dtype.kind != "f"
        and values.size
        and (values.min() < _INT16.min or values.max() > _INT16.max)
    ):
        raise _NeedFloat
    out[k] = values
