"""Per-batch cost of a delivery to a destination with storage commitment, against a
real Orthanc 1.10.1 that reports on a new association to radserve's SCP: the wall time
and radserve's CPU (process time, all threads: outbox, SCU, the SCP that takes the
report) of one ``Outbox.deliver_pending`` that stores a SEG + SR and sends the N-ACTION,
then until the report has settled the rows.

    PYTHONPATH=src:. python tools/commitment_batch_cost.py --rounds 10

Two ways, alternating within each round so load drifts hit both alike, in one Orthanc
run: ``wait`` keeps the N-ACTION's association up to 1 s for a report there, as every
batch did before (``wait_for_report`` forced true); ``release`` is radserve's behaviour:
once Orthanc has reported on an association of its own (round 0, the warm-up), each
N-ACTION's association is released at once.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pydicom
from pydicom.uid import generate_uid
from tests.factories.dicom_net import Orthanc, study_with_results
from tests.factories.ports import free_port
from tests.factories.waits import until

from radserve.gateway import Destination, GatewaySCP, Outbox, Peer, ScpConfig, StoreSCU
from radserve.gateway.commitment import ReportHandler
from radserve.gateway.scu import OutgoingFile, SendResult
from radserve.store import init_store
from radserve.store.outbox import OutboxState, OutboxStore


class AlwaysWaits(StoreSCU):
    """The behaviour before: every batch waits for a report on the N-ACTION's association."""

    def request_commitment(
        self,
        destination: Destination,
        transaction_uid: str,
        files: Sequence[OutgoingFile],
        on_report: ReportHandler,
        *,
        wait_for_report: bool = True,
    ) -> SendResult:
        return super().request_commitment(
            destination, transaction_uid, files, on_report, wait_for_report=True
        )


def _copies(results: list[Path], folder: Path) -> list[Path]:
    """The result files under new SOP Instance UIDs (a new batch for the outbox)."""
    folder.mkdir(parents=True)
    out = []
    for path in results:
        ds = pydicom.dcmread(path)
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.save_as(folder / path.name)
        out.append(folder / path.name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _, results = study_with_results(root / "results")
        scp_port = free_port()
        orthanc = Orthanc(
            root / "orthanc",
            peers={
                "radserve": {
                    "AET": "RADSERVE",
                    "Host": "127.0.0.1",
                    "Port": scp_port,
                    "AllowStorageCommitment": True,
                }
            },
        )
        store = init_store(f"sqlite:///{root / 'radserve.db'}")
        rows = OutboxStore(store.engine)
        pacs = Destination(
            name="pacs",
            ae_title="ORTHANC",
            host="127.0.0.1",
            port=orthanc.dicom_port,
            storage_commitment=True,
        )
        outboxes = {
            "wait": Outbox(rows, [pacs], AlwaysWaits()),
            "release": Outbox(rows, [pacs], StoreSCU()),
        }
        current = {"outbox": outboxes["wait"]}
        config = ScpConfig(
            data_dir=root / "scp",
            port=scp_port,
            allowed_peers=[Peer("ORTHANC", "127.0.0.1", orthanc.dicom_port)],
        )
        scp = GatewaySCP(
            config,
            lambda _: None,
            on_commitment=lambda calling, report: current["outbox"].commitments.on_report(
                calling, report
            ),
        )
        orthanc.start()
        scp.start()
        figures: dict[str, dict[str, list[float]]] = {
            way: {"deliver_wall": [], "deliver_cpu": [], "settled_wall": [], "settled_cpu": []}
            for way in outboxes
        }
        try:
            for n in range(args.rounds + 1):  # round 0 warms up
                for way, outbox in outboxes.items():
                    current["outbox"] = outbox
                    batch = _copies(results, root / f"batch-{n}-{way}")
                    outbox.enqueue(batch, now=dt.datetime.now(dt.UTC))
                    wall, cpu = time.perf_counter(), time.process_time()
                    report = outbox.deliver_pending(dt.datetime.now(dt.UTC))
                    deliver = time.perf_counter() - wall, time.process_time() - cpu
                    assert report.claimed == len(batch), report
                    until(
                        lambda: not rows.items(state=OutboxState.COMMITTING),
                        "Orthanc's report settles the batch",
                    )
                    settled = time.perf_counter() - wall, time.process_time() - cpu
                    if n:
                        figures[way]["deliver_wall"].append(deliver[0])
                        figures[way]["deliver_cpu"].append(deliver[1])
                        figures[way]["settled_wall"].append(settled[0])
                        figures[way]["settled_cpu"].append(settled[1])
            states = {item.state for item in rows.items()}
        finally:
            scp.stop()
            orthanc.stop()
            store.close()
    print(f"{args.rounds} rounds of {len(results)} instances, every row ends {states}")
    for way, values in figures.items():
        line = ", ".join(
            f"{name} median {1000 * statistics.median(v):.0f} ms "
            f"(min {1000 * min(v):.0f}, max {1000 * max(v):.0f})"
            for name, v in values.items()
        )
        print(f"{way}: {line}")


if __name__ == "__main__":
    main()
