"""Per-batch cost of a delivery to a destination with storage commitment, against a
real Orthanc 1.10.1 that reports on a new association to radserve's SCP: the wall time
and radserve's CPU (process time, all threads: outbox, SCU, the SCP that takes the
report) of one ``Outbox.deliver_pending`` that stores a SEG + SR + SC and sends the
N-ACTION, and until the report has settled the rows.

    PYTHONPATH=src:. python tools/commitment_batch_cost.py --rounds 10

Two ways, alternating within each round so load drifts hit both alike, in one Orthanc
run: ``wait`` keeps the N-ACTION's association up to 1 s for a report there, as every
batch did before session 20 (``RecordingSCU(always_wait=True)``); ``release`` is
radserve's behaviour: once Orthanc has reported on an association of its own (round 0,
the warm-up), each N-ACTION's association is released at once.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path

import pydicom
from pydicom.uid import generate_uid
from tests.factories.dicom_net import study_with_results
from tests.factories.pacs import RecordingSCU, committing_pacs
from tests.factories.waits import until

from radserve.gateway import Outbox
from radserve.store.outbox import OutboxState


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
        # one SCP settles both outboxes' reports: the ledger matches them in the database
        with committing_pacs(root, timeout_s=600.0) as (_orthanc, released, rows, _scp):
            waiting = Outbox(rows, released.destinations.values(), RecordingSCU(always_wait=True))
            outboxes = {"wait": waiting, "release": released}
            figures: dict[str, dict[str, list[float]]] = {
                way: {"deliver_wall": [], "deliver_cpu": [], "settled_wall": [], "settled_cpu": []}
                for way in outboxes
            }
            for n in range(args.rounds + 1):  # round 0 warms up
                for way, outbox in outboxes.items():
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
            states = {item.state.value for item in rows.items()}
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
