"""A served model keeps no memory per input shape (OpenVINO's per-shape caches are off).

Every study brings its own crop, so its own input shapes; with the caches on, OpenVINO's
CPU plugin kept ~2 MiB per shape per model for the life of the process (163 MiB after
80 shapes of the organ model). Run in a fresh process: oneDNN reads its cache setting
once, when the plugin first runs, and an earlier test may already have run it here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from radserve.inference import choose_runtime

pytestmark = pytest.mark.skipif(
    choose_runtime().primary != "OpenVINOExecutionProvider",
    reason="OpenVINO's CPU plugin is not the provider on this host",
)

_CHILD = """
import json, numpy as np, psutil
from radserve.models.registry import ModelRegistry
from radserve.pipeline import SessionPool, release_free_memory
rss = lambda: psutil.Process().memory_info().rss / 2**20
session = SessionPool().get(ModelRegistry().get("organs", "1.0.0"), "fp32")
session.run(np.zeros((2, 3, 256, 288), np.float32))  # the largest shape first
session.release_memory(); release_free_memory()
start = rss()
for i in range(16):
    x = np.zeros((2, 3, 256 - 16 * (i % 8), 288 - 16 * (i // 8)), np.float32)
    session.run(x); session.run(x)
    session.release_memory(); release_free_memory()
print(json.dumps({"grew_mib": rss() - start}))
"""


def test_sixteen_new_shapes_leave_no_per_shape_memory() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    grew = json.loads(proc.stdout.strip().splitlines()[-1])["grew_mib"]
    # With the caches on this grew by ~31 MiB (2 MiB a shape); off, by ~1 MiB.
    assert grew < 10.0, f"{grew:.1f} MiB kept after 16 input shapes"
