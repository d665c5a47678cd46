"""What this machine lets the process use: cores (affinity mask, container quota).

Shared by the runtime (ONNX Runtime thread counts) and ingest (decoder processes), so
both size themselves from the same number; imports nothing heavy.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["usable_cores"]


def _cgroup_cpu_limit() -> float | None:
    """cgroup v2 ``cpu.max`` quota in cores, if the process is limited."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return float(quota) / float(period)
    except (ValueError, ZeroDivisionError):
        return None


def usable_cores() -> int:
    """Cores this process may run on: affinity mask, capped by a container quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, max(1, math.floor(limit)))
    return max(1, cores)
