"""Decode frames in parallel straight into one preallocated array, in physical units.

Decoding goes through pydicom's pixel-data plugins (pylibjpeg, pyjpegls, gdcm, pillow),
which release the GIL, so threads scale. Each stored frame becomes
``slope × stored + intercept`` with Pixel Padding Value replaced by air. The result is
int16 when every slope and intercept is integral and the values fit (a 512×512×300 CT
costs 157 MB), float32 otherwise; if an int16 decode meets a value it cannot hold, the
stack is decoded again as float32 rather than wrapped around.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import BinaryIO

import numpy as np
import pydicom
from pydicom.dataset import Dataset
from pydicom.pixels import get_decoder, iter_pixels, pixel_array
from pydicom.uid import UID, DeflatedExplicitVRLittleEndian

from radserve.errors import DecodeError
from radserve.ingest.headers import FrameRef
from radserve.ingest.sources import SourceFile, SourceReader

log = logging.getLogger(__name__)

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


class _NeedFloat(Exception):
    """Internal signal: int16 cannot hold the values, decode as float32."""


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
) -> np.ndarray:
    """Decode ``frames`` into slices 0..n-1 of a new (n, rows, columns) array."""
    dtype = _output_dtype(frames)
    try:
        return _decode(frames, reader, dtype, air, workers)
    except _NeedFloat:
        log.info("values do not fit int16; decoding the stack again as float32")
        return _decode(frames, reader, np.dtype(np.float32), air, workers)


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
) -> np.ndarray:
    rows, cols = frames[0].pixel.rows, frames[0].pixel.columns
    out = np.empty((len(frames), rows, cols), dtype=dtype)
    workers = max(1, workers or min(16, os.cpu_count() or 1))
    jobs = list(_jobs(frames, workers))
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        futures = [pool.submit(_decode_job, reader, src, items, out, air) for src, items in jobs]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        for future in done:
            future.result()  # re-raise the first failure
    return out


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
) -> None:
    uid = items[0][1].pixel.transfer_syntax_uid
    syntax = UID(uid).name
    try:
        pixels: str | BinaryIO | Dataset = reader.pixel_source(src)
        if uid == DeflatedExplicitVRLittleEndian:
            # pydicom's file-based pixel path does not inflate: read the whole dataset.
            pixels = pydicom.dcmread(pixels)
        if items[0][1].frame_index is None:
            arrays: Iterable[np.ndarray] = [pixel_array(pixels)]
        else:
            arrays = iter_pixels(pixels, indices=[f.frame_index for _, f in items])
        for (k, frame), stored in zip(items, arrays, strict=True):
            _store(out, k, stored, frame, air)
    except (_NeedFloat, DecodeError):
        raise
    except Exception as exc:  # plugins raise many types on damaged or truncated data
        hint = _INSTALL_HINTS.get(uid)
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise DecodeError(
            f"could not decode pixel data of instance {items[0][1].sop_instance_uid} "
            f"({syntax}): {type(exc).__name__}: {detail}. The file may be truncated or "
            "damaged, or no installed decoder supports it"
            + (f"; decoders for this syntax: {hint}" if hint else "")
        ) from exc


def _store(out: np.ndarray, k: int, stored: np.ndarray, frame: FrameRef, air: float) -> None:
    fmt = frame.pixel
    if stored.shape != (fmt.rows, fmt.columns):
        raise DecodeError(
            f"a frame of instance {frame.sop_instance_uid} decoded to shape {stored.shape}, "
            f"expected ({fmt.rows}, {fmt.columns}) from Rows/Columns"
        )
    padding = None
    if fmt.padding is not None:
        low, high = fmt.padding
        padding = (stored >= low) & (stored <= high)
    slope, intercept = frame.rescale_slope, frame.rescale_intercept
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
