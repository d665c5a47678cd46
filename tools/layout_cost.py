"""What the process layouts cost: ``radserve serve`` (test models, gateway on) started
with the one-process layout (``server.read_processes`` 0, ``gateway.receivers`` 1) and
with readers and receiving processes, alternating, ROUNDS times each: seconds to
``/healthz``, memory of the process tree (PSS and RSS from ``/proc/*/smaps_rollup``)
and seconds from SIGTERM to exit. Why: the layouts are not the defaults until their
memory, start and stop are known beside their throughput (docs/scaling.md).

    PYTHONPATH=src:. python tools/layout_cost.py [ROUNDS] [READERS] [RECEIVERS]

(defaults 2, 2, 2; ``RADSERVE_*`` variables of the caller are not passed on; the
server runs as tests.factories.server_process starts it, one CPU worker).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.factories.ports import free_port_on
from tests.factories.serve import listening
from tests.factories.server_process import start_server
from tests.factories.service import config_file

from radserve.service.metrics import rollup_bytes

SETTLE_S = 5.0  # after the ports answer: the spawned children finish importing


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").iterdir():
            todo += [int(child) for child in (task / "children").read_text().split()]
    return found


def memory_mib(pid: int) -> dict[str, int]:
    """PSS and RSS of ``pid`` in MiB, read as ``/metrics`` reads them
    (``radserve_process_pss_bytes``); 0 for a process gone meanwhile."""
    return {field: int((rollup_bytes(pid, field) or 0) // 2**20) for field in ("Pss", "Rss")}


def once(readers: int, receivers: int, root: Path) -> str:
    port, gateway_port = free_port_on("127.0.0.1"), free_port_on("127.0.0.1")
    config = config_file(
        root,
        server={"read_processes": readers},
        gateway={"enabled": True, "port": gateway_port, "receivers": receivers},
    )
    started = time.monotonic()
    server = start_server(config, root / "data", port, root / "serve.log")
    try:
        up = time.monotonic() - started
        while not listening("127.0.0.1", gateway_port):
            time.sleep(0.05)
        time.sleep(SETTLE_S)
        pids = tree(server.pid)
        memory = [memory_mib(pid) for pid in pids]
        stopping = time.monotonic()
        server.send_signal(signal.SIGTERM)
        code = server.wait(300)
        stop = time.monotonic() - stopping
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return (
        f"read_processes={readers} receivers={receivers}: /healthz {up:.1f} s, "
        f"{len(pids)} processes, PSS {sum(m['Pss'] for m in memory)} MiB "
        f"({', '.join(str(m['Pss']) for m in memory)}), RSS {sum(m['Rss'] for m in memory)} "
        f"MiB, SIGTERM to exit {stop:.1f} s (exit {code})"
    )


def main() -> None:
    for name in [n for n in os.environ if n.startswith("RADSERVE_")]:
        del os.environ[name]  # the layouts are the config file's, nothing else
    if {"-h", "--help"} & set(sys.argv[1:]):  # the usage is the docstring
        sys.exit(__doc__)
    rounds, readers, receivers = (int(a) for a in [*sys.argv[1:], "2", "2", "2"][:3])
    print(f"load average {os.getloadavg()}", flush=True)
    for _ in range(rounds):
        for layout in ((0, 1), (readers, receivers)):
            print(once(*layout, Path(tempfile.mkdtemp(prefix="layout-cost-"))), flush=True)
    print(f"load average {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
