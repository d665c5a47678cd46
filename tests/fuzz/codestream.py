"""``python -m tests.fuzz.codestream [--unrefused] [SECONDS_PER_PAIR] [OUT_DIR] [SYNTAX ...]``:
a structure-aware mutator for the native decoders, beside the atheris targets.

atheris mutates a whole DICOM file, and most of its changes land in the DICOM header,
which radserve refuses long before a decoder runs. This mutator takes each compressed
seed frame (:func:`tests.fuzz.targets._phantom.compressed_slices`), finds the header
segments of its codestream (JPEG / JPEG-LS: SOF, DHT, DQT, DRI, LSE, SOS; JPEG 2000: SIZ,
COD, QCD and the other main-header and tile-part-header segments; RLE: the 64-byte
header), and changes bytes and 16-bit fields inside them, duplicates, drops or moves
whole segments, or cuts the frame. Each mutant is decoded by one pydicom plugin in a
forked child, and a child that dies by a signal, runs over ``TIMEOUT_S`` or grows past
``RSS_LIMIT_MB`` is a finding: its frame is written to ``OUT_DIR``, with what radserve's
header check (:func:`radserve.ingest.codestream.frame_problem`) says of it (a finding it
refuses cannot reach that decoder through radserve). With ``--unrefused`` only the
mutants that check lets through are decoded: what could still reach a decoder.

It runs every (syntax, plugin) pair radserve can reach, including the fallbacks that
pydicom tries when the preferred plugin fails."""

from __future__ import annotations

import faulthandler
import io
import os
import random
import resource
import signal
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pydicom
from pydicom.encaps import encapsulate, generate_frames
from pydicom.pixels import get_decoder

from radserve.ingest import codestream

TIMEOUT_S = 10.0
RSS_LIMIT_MB = 1536
_ADDRESS_LIMIT = 6 << 30  # a child allocating without bound fails here, not the host
_INTERESTING8 = (0x00, 0x01, 0x02, 0x03, 0x07, 0x08, 0x0F, 0x10, 0x7F, 0x80, 0xFE, 0xFF)
_INTERESTING16 = (0, 1, 2, 3, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF)
_JPEG_STANDALONE = frozenset({0x01, 0xD8, *range(0xD0, 0xD8)})
_J2K_STANDALONE = frozenset({0x4F, 0x93, 0xD9})  # SOC, SOD, EOC
_JPEG_LS = frozenset({"1.2.840.10008.1.2.4.80", "1.2.840.10008.1.2.4.81"})


@dataclass(frozen=True)
class Seed:
    syntax: str
    frame: bytes
    rows: int
    columns: int
    samples_per_pixel: int
    bits_allocated: int
    dataset: pydicom.Dataset  # the seed's header, given each mutant frame as Pixel Data


@dataclass(frozen=True)
class Finding:
    syntax: str
    plugin: str
    kind: str  # "signal N", "timeout", "rss"
    path: Path
    refused: str  # what radserve's header check says, "" when it lets the frame through


def seeds() -> list[Seed]:
    from tests.fuzz.targets import _phantom

    out = []
    for data in _phantom.compressed_slices():
        ds = pydicom.dcmread(io.BytesIO(data))
        frame = next(generate_frames(ds.PixelData, number_of_frames=1))
        out.append(
            Seed(
                str(ds.file_meta.TransferSyntaxUID),
                bytes(frame),
                ds.Rows,
                ds.Columns,
                ds.SamplesPerPixel,
                ds.BitsAllocated,
                ds,
            )
        )
    return out


def segments(syntax: str, frame: bytes) -> list[tuple[int, int]]:
    """``(start, end)`` of each header segment, marker included; the last one ends
    where the entropy-coded data (or, in RLE, the first segment) begins."""
    if syntax == "1.2.840.10008.1.2.5":
        return [(0, 64)]
    j2k = frame[:2] == b"\xff\x4f"
    standalone = _J2K_STANDALONE if j2k else _JPEG_STANDALONE
    out, position = [], 2
    while position + 4 <= len(frame) and frame[position] == 0xFF:
        marker = frame[position + 1]
        if marker in standalone:
            if j2k and marker == 0x93:  # SOD: tile data follows
                out.append((position, position + 2))
                position += 2
                if position + 2 > len(frame) or frame[position : position + 2] != b"\xff\x90":
                    break
                continue
            position += 2
            continue
        (size,) = struct.unpack(">H", frame[position + 2 : position + 4])
        end = position + 2 + size
        if j2k and marker == 0x90:  # SOT: the tile-part header follows, then SOD
            out.append((position, end))
            position = end
            continue
        out.append((position, min(end, len(frame))))
        position = end
        if not j2k and marker == 0xDA:  # SOS: the scan's entropy-coded data follows
            break
    return out


def mutate(syntax: str, frame: bytes, rng: random.Random) -> bytes:
    """One to three changes inside the frame's header segments (or its cut)."""
    data = bytearray(frame)
    spans = segments(syntax, frame) or [(0, min(len(frame), 64))]
    if syntax in _JPEG_LS and rng.random() < 0.3:
        # the seeds carry no LSE (the encoder's defaults): one before SOS, often odd
        at = spans[-1][0]
        data[at:at] = _lse(rng)
        spans = segments(syntax, bytes(data))
    for _ in range(rng.choice((1, 1, 2, 3))):
        start, end = rng.choice(spans)
        end = min(end, len(data))
        if end - start < 2:
            continue
        choice = rng.random()
        if choice < 0.40:  # one byte
            at = rng.randrange(start + 2 if end - start > 4 else start, end)
            data[at] = rng.choice(
                (*_INTERESTING8, rng.randrange(256), (data[at] + 1) & 0xFF, (data[at] - 1) & 0xFF)
            )
        elif choice < 0.65 and end - start >= 6:  # one 16-bit field
            at = rng.randrange(start + 2, end - 1)
            (old,) = struct.unpack(">H", data[at : at + 2])
            new = rng.choice((*_INTERESTING16, old + 1, old - 1, old * 2, old // 2, old ^ 0x8000))
            data[at : at + 2] = struct.pack(">H", new & 0xFFFF)
        elif choice < 0.75:  # a segment again, right after itself
            data[end:end] = data[start:end]
        elif choice < 0.82:  # a segment dropped
            del data[start:end]
        elif choice < 0.88:  # a segment moved after the next one
            later = [s for s in spans if s[0] >= end]
            if later:
                seg = bytes(data[start:end])
                at = later[0][1]
                del data[start:end]
                data[at - len(seg) : at - len(seg)] = seg
        elif choice < 0.94:  # a byte of the coded data
            if spans[-1][1] < len(data):
                at = rng.randrange(spans[-1][1], len(data))
                data[at] = rng.randrange(256)
        else:  # cut short
            del data[rng.randrange(2, len(data)) :]
    return bytes(data)


def _lse(rng: random.Random) -> bytes:
    """A JPEG-LS preset parameters segment (T.87 C.2.4.1.1: MAXVAL, T1, T2, T3, RESET)."""
    fields = [rng.choice((*_INTERESTING16, rng.randrange(1 << 16))) for _ in range(5)]
    return b"\xff\xf8\x00\x0d\x01" + struct.pack(">5H", *fields)


def refused(seed: Seed, frame: bytes) -> str:
    """What radserve's header check says of ``frame`` ("" when it passes)."""
    problem = codestream.frame_problem(
        seed.syntax,
        lambda at, size: frame[at : at + size],
        len(frame),
        rows=seed.rows,
        columns=seed.columns,
        samples_per_pixel=seed.samples_per_pixel,
        bits_allocated=seed.bits_allocated,
    )
    return "" if problem is None else f"{problem[0]}: {problem[1]}"


def plugins(syntax: str) -> tuple[str, ...]:
    return tuple(get_decoder(syntax).available_plugins)


def run_child(decode: Callable[[], object]) -> str:
    """``decode`` in a forked child: "" when it returned or raised, else what ended it."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            faulthandler.disable()  # pytest's would print every finding's stack
            resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_LIMIT, _ADDRESS_LIMIT))
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.dup2(devnull, 1)
            decode()
        except BaseException:  # a refusal, as radserve takes any decoder exception
            code = 1
        os._exit(code)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            if usage.ru_maxrss > RSS_LIMIT_MB * 1024:
                return "rss"
            return f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else ""
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.wait4(pid, 0)
            return "timeout"
        if _rss_mb(pid) > RSS_LIMIT_MB:
            os.kill(pid, signal.SIGKILL)
            os.wait4(pid, 0)
            return "rss"
        time.sleep(0.0005)


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, IndexError, ValueError):
        return 0.0


def _decoder(seed: Seed, frame: bytes, plugin: str) -> Callable[[], object]:
    def decode() -> object:  # in the child: a frame too short to encapsulate fails there
        ds = seed.dataset.copy()
        ds.PixelData = encapsulate([frame])
        return get_decoder(seed.syntax).as_array(ds, decoding_plugin=plugin)

    return decode


def fuzz_pair(
    seed: Seed,
    plugin: str,
    seconds: float,
    out: Path,
    rng: random.Random,
    *,
    unrefused: bool = False,
) -> tuple[int, list[Finding]]:
    """Mutants of ``seed`` decoded by ``plugin`` for ``seconds``: (count, findings);
    ``unrefused``: only those radserve's header check lets through."""
    findings: list[Finding] = []
    _decoder(seed, seed.frame, plugin)()  # the plugin imported here once, not per child
    count, stop = 0, time.monotonic() + seconds
    while time.monotonic() < stop:
        frame = mutate(seed.syntax, seed.frame, rng)
        if unrefused and refused(seed, frame):
            continue
        count += 1
        kind = run_child(_decoder(seed, frame, plugin))
        if kind:
            path = out / f"{seed.syntax}-{plugin}-{kind.replace(' ', '')}-{count}.bin"
            path.write_bytes(frame)
            findings.append(Finding(seed.syntax, plugin, kind, path, refused(seed, frame)))
    return count, findings


def main(argv: list[str]) -> None:
    if any(a in ("-h", "--help") for a in argv[1:]):
        print(__doc__.split("\n\n")[0])  # it read "--help" as the seconds: a traceback
        return
    unrefused = "--unrefused" in argv
    argv = [a for a in argv if a != "--unrefused"]
    seconds = float(argv[1]) if len(argv) > 1 else 20.0
    out = Path(argv[2] if len(argv) > 2 else "codestream-findings")
    only = set(argv[3:])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    for seed in seeds():
        if only and seed.syntax not in only:
            continue
        for plugin in plugins(seed.syntax):
            count, findings = fuzz_pair(seed, plugin, seconds, out, rng, unrefused=unrefused)
            kinds: dict[str, int] = {}
            passed: dict[str, int] = {}
            for f in findings:
                kinds[f.kind] = kinds.get(f.kind, 0) + 1
                if not f.refused:
                    passed[f.kind] = passed.get(f.kind, 0) + 1
            print(
                f"{seed.syntax} {plugin}: {count} mutants, findings {kinds or 'none'}"
                f" (past radserve's header check: {passed or 'none'})",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv)
