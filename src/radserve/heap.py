"""Freed heap back to the operating system, between the stages of one job.

One definition for the pipeline (between model steps) and the report writers (between
DICOM objects): both free large amounts of memory that glibc would otherwise keep.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable


def _load_malloc_trim() -> Callable[[int], int] | None:
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        return None


_MALLOC_TRIM = _load_malloc_trim()


def release_free_memory() -> None:
    """Hand memory that is already freed back to the operating system (glibc only).

    The stages allocate and free many arrays of a few MB on several threads (prepare,
    merge, ONNX Runtime's pool); glibc keeps such freed blocks in per-thread arenas,
    so without this the resident size after each stage stays at that stage's peak and
    the next stage's peak lands on top of it. Called between model steps, before the
    report and after each DICOM SEG is written (the next label map read landed on the
    SEG build's freed heap); costs about a millisecond. Frees nothing still in use.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


__all__ = ["release_free_memory"]
