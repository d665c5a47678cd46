"""CPU per audit record appended by ``Store.append_audits``, by records per transaction.

    PYTHONPATH=src python tools/audit_append_cpu.py this
    PYTHONPATH=/tmp/rs-main/src python tools/audit_append_cpu.py main   # another tree

One thread, a real keyed SQLite store with the server's settings (WAL, synchronous=FULL),
batches of 1, 8 and 32 ``phi.read`` events (what the reads' group commit hands the
writer); the thread's CPU clock, so waiting on the disk is not counted. The chain is
verified at the end. Alternate two trees for a before/after (docs/api-performance.md).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from radserve.audit.chain import AuditKey
from radserve.bench.audit_reads import read_event
from radserve.store import init_store


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="radserve-audit-cpu-"))
    store = init_store(f"sqlite:///{folder / 'r.db'}", audit_key=AuditKey(os.urandom(32)))
    out = {}
    try:
        for batch in (1, 8, 32):
            n, c0 = 0, time.thread_time()
            for _ in range(max(20, 320 // batch)):
                store.append_audits([read_event(i) for i in range(batch)])
                n += batch
            out[batch] = round((time.thread_time() - c0) * 1e6 / n, 1)
        assert store.verify_audit().ok
    finally:
        store.close()
    label = sys.argv[1] if len(sys.argv) > 1 else "this"
    print(label, "CPU-us per record by records per commit", out)


if __name__ == "__main__":
    main()
