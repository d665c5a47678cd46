"""``kill -9`` of the SCP process right after a C-STORE success: the instance is there,
under its final name, whole (group commit and per-instance durability).

A killed process loses no page cache, so this checks the order of operations (success is
answered after the link, and a final name only ever names a complete file), not the
flush to the device; that is checked by the durable-hook tests in test_gateway_scp.py
and test_gateway_storage.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pydicom
import pytest
from pynetdicom import AE
from pynetdicom.sop_class import CTImageStorage
from tests.factories.dicom_net import small_study

from radserve.gateway.storage import study_instances

_CHILD = """
import sys, threading
from pathlib import Path
from radserve.gateway import GatewaySCP, ScpConfig
config = ScpConfig(data_dir=Path(sys.argv[1]), port=0, quiet_s=600, durability=sys.argv[2])
scp = GatewaySCP(config, lambda study: None, run_monitor=False)
host, port = scp.start()
print(port, flush=True)
threading.Event().wait()
"""


@pytest.mark.parametrize("durability", ["group", "per_instance"])
def test_kill_right_after_success_leaves_the_instance_whole(
    tmp_path: Path, durability: str
) -> None:
    files = small_study(tmp_path / "study", slices=range(10, 16))
    data = tmp_path / "gateway"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(data), durability],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        ae = AE("PYNETDICOM")
        ae.add_requested_context(CTImageStorage, ["1.2.840.10008.1.2.1"])
        assoc = ae.associate("127.0.0.1", port, ae_title="RADSERVE")
        assert assoc.is_established
        sent = [pydicom.dcmread(path) for path in files[:4]]
        statuses = [int(assoc.send_c_store(ds).Status) for ds in sent]
        os.kill(child.pid, signal.SIGKILL)  # at once after the last success
        assert child.wait(30) == -signal.SIGKILL
        assoc.abort()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    assert statuses == [0, 0, 0, 0]
    folder = data / "incoming" / sent[0].StudyInstanceUID
    kept = {path.name: path for path in study_instances(folder)}
    for ds in sent:
        path = kept[f"{ds.SOPInstanceUID}.dcm"]
        again = pydicom.dcmread(path)
        assert again.SOPInstanceUID == ds.SOPInstanceUID
        assert again.PixelData == ds.PixelData
