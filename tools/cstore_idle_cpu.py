"""CPU a second that open, idle DICOM associations cost the radserve SCP process.

    PYTHONPATH=src python tools/cstore_idle_cpu.py 1 4 8

For each count, a pynetdicom requestor in another process opens that many associations
to a :class:`~radserve.gateway.GatewaySCP` in this process (one receiving process) and
leaves them idle; this process's CPU (user + system) over 4 seconds is printed per
second. With pynetdicom's polling reactors each association wakes its two threads ~2,000
times a second (radserve.gateway.reactor). Run it with another tree's ``src`` on
PYTHONPATH for a before/after.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from radserve.gateway import GatewaySCP, ScpConfig

_REQUESTOR = """
import sys, time
from pynetdicom import AE
ae = AE(ae_title="IDLE")
ae.add_requested_context("1.2.840.10008.1.1")
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
assocs = [ae.associate(host, port, ae_title="RADSERVE") for _ in range(n)]
assert all(a.is_established for a in assocs)
print("up", flush=True)
sys.stdin.readline()
for a in assocs:
    a.release()
"""


def idle_cpu_ms_per_s(count: int, seconds: float = 4.0) -> float:
    config = ScpConfig(data_dir=Path(tempfile.mkdtemp()), port=0, quiet_s=3600)
    with GatewaySCP(config, lambda _study: None, run_monitor=False) as scp:
        host, port = scp.address
        requestor = subprocess.Popen(
            [sys.executable, "-c", _REQUESTOR, host, str(port), str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert requestor.stdout is not None and requestor.stdin is not None
        requestor.stdout.readline()
        time.sleep(0.5)
        t0, w0 = os.times(), time.perf_counter()
        time.sleep(seconds)
        t1, w1 = os.times(), time.perf_counter()
        requestor.stdin.write("\n")
        requestor.stdin.flush()
        requestor.wait(30)
    return 1000 * (t1.user + t1.system - t0.user - t0.system) / (w1 - w0)


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # the usage is the docstring
        sys.exit(__doc__)
    for n in [int(a) for a in sys.argv[1:]] or [1, 4, 8]:
        print(
            f"{n} idle association(s): {idle_cpu_ms_per_s(n):.0f} CPU-ms a second "
            f"(load average {os.getloadavg()[0]:.1f})",
            flush=True,
        )
