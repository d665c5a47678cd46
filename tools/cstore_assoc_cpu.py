"""CPU a DICOM association costs the radserve SCP process: set-up, one instance, release.

    PYTHONPATH=src python tools/cstore_assoc_cpu.py [ASSOCIATIONS]

dcmtk's ``storescu`` is run ASSOCIATIONS times (default 30), one after another, each
sending one instance of the bench's study (``radserve bench --scenario cstore``'s
phantom, 514 KiB) to a :class:`~radserve.gateway.GatewaySCP` in this process; it proposes
128 presentation contexts, as a PACS proposing every storage class does. Prints this
process's CPU per association and the part its DUL threads took (the SCP's CPU ledger,
``receive``). Run it with another tree's ``src`` on PYTHONPATH for a before/after (the
DUL part needs a tree with radserve.gateway.cpu_ledger).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from radserve.bench.cstore import dcmtk_storescu
from radserve.bench.study import ensure_study
from radserve.gateway import GatewaySCP, ScpConfig


def association_cpu_ms(associations: int) -> tuple[float, float | None]:
    """(SCP CPU-ms an association, of which its DUL threads' or None)."""
    tool = dcmtk_storescu()
    if tool is None:
        raise SystemExit("dcmtk's storescu is not installed (apt-get install dcmtk)")
    instance = sorted(
        ensure_study(Path(tempfile.gettempdir()) / "radserve-bench", "explicit", 150).glob("*.dcm")
    )[0]
    config = ScpConfig(data_dir=Path(tempfile.mkdtemp()), port=0, quiet_s=3600)
    with GatewaySCP(config, lambda _study: None, run_monitor=False) as scp:
        host, port = scp.address
        ledger = getattr(scp, "cpu", None)
        dul0 = ledger.snapshot()["receive"] if ledger else 0.0
        cpu0 = time.process_time()
        for _ in range(associations):
            sent = [tool, "-aet", "BENCH", "-aec", "RADSERVE", host, str(port), str(instance)]
            subprocess.run(sent, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while scp.admission.open_connections():  # the last association's threads end
            time.sleep(0.01)
        time.sleep(0.2)
        cpu = 1000 * (time.process_time() - cpu0) / associations
        dul = 1000 * (ledger.snapshot()["receive"] - dul0) / associations if ledger else None
    return cpu, dul


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # the usage is the docstring
        sys.exit(__doc__)
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    cpu, dul = association_cpu_ms(count)
    part = f", DUL threads {dul:.1f}" if dul is not None else ""
    print(
        f"{count} associations of one instance: {cpu:.1f} CPU-ms an association{part} "
        f"(load average {os.getloadavg()[0]:.1f})"
    )
