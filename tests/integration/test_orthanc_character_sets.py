"""Patient and study text in other character sets comes back from a real PACS as it went
in: the source study (stored in Orthanc over REST) and radserve's SEG and SR (sent by the
outbox SCU) carry the same decoded names in Orthanc's own JSON, in one study, and the
results pass dciodvfy. Skips without Orthanc or dciodvfy."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydicom
import pytest
from tests.factories.dciodvfy import dciodvfy_errors
from tests.factories.dicom_net import Orthanc
from tests.factories.results import relabel, run_test_pipeline

from radserve.gateway import Destination, Outbox, StoreSCU
from radserve.phantom import PhantomSpec, generate_phantom, write_dicom_series
from radserve.report.dicom import write_dicom_results
from radserve.report.schema import Report
from radserve.store import init_store
from radserve.store.outbox import OutboxStore

pytestmark = [
    pytest.mark.tools,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("Orthanc") is None, reason="Orthanc is not installed"),
    pytest.mark.skipif(shutil.which("dciodvfy") is None, reason="dciodvfy is not installed"),
]

# (Specific Character Set, Patient Name, Referring Physician's Name, Study Description)
CASES = {
    "latin-1": ("ISO_IR 100", "Müller^Jürgen", "Größe^Åsa", "Thorax/Abdomen nativ, Ø 5 mm"),
    "japanese-iso2022": (
        ["", "ISO 2022 IR 87"],
        "Yamada^Tarou=山田^太郎=やまだ^たろう",
        "Sato^Hanako=佐藤^花子=さとう^はなこ",
        "胸部CT",
    ),
    "chinese-gb18030": ("GB18030", "王^小明", "李^医生", "胸部平扫"),
    "utf-8": ("ISO_IR 192", "Ωμέγα^Łukasz", "Žižek^Søren", "Тело — КТ 胸部"),
}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, list[Path], Path]:
    root = tmp_path_factory.mktemp("charsets")
    phantom = generate_phantom(PhantomSpec.random(3, small=True), range(10, 30))
    files = write_dicom_series(phantom, root / "study")
    result = run_test_pipeline(root, organ_hu=90, lesion_hu=140)
    return result.report, files, root / "out"


@pytest.fixture
def orthanc(tmp_path: Path) -> Iterator[Orthanc]:
    server = Orthanc(tmp_path / "orthanc")
    server.start()
    yield server
    server.stop()


def _text(tags: dict[str, Any], keyword: str) -> str:
    return str(tags.get(keyword, ""))


@pytest.mark.parametrize("case", sorted(CASES))
def test_names_in_other_character_sets_read_the_same_in_the_pacs(
    study, orthanc: Orthanc, tmp_path: Path, case: str
) -> None:
    charset, patient, physician, description = CASES[case]
    report, files, out = study
    sources = relabel(
        files,
        tmp_path / "source",
        patient,
        charset=charset,
        ReferringPhysicianName=physician,
        StudyDescription=description,
    )
    result_dir = tmp_path / "out"
    shutil.copytree(out, result_dir)
    results = write_dicom_results(report, result_dir, sources)
    for path in results:
        assert dciodvfy_errors(path) == [], path.name
    study_id = orthanc.upload(sources)

    store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    try:
        destination = Destination(
            name="pacs", ae_title=orthanc.aet, host="127.0.0.1", port=orthanc.dicom_port
        )
        outbox = Outbox(OutboxStore(store.engine), [destination], StoreSCU())
        outbox.enqueue(results, job_id=f"job-{case}")
        assert outbox.deliver_pending().sent == len(results)
    finally:
        store.close()

    assert orthanc.get("/studies") == [study_id]  # the results joined the source study
    instances = orthanc.get(f"/studies/{study_id}/instances")
    assert len(instances) == len(sources) + len(results)
    for instance in instances:
        tags = orthanc.get(f"/instances/{instance['ID']}/simplified-tags")
        what = f"{tags.get('Modality')} {tags.get('SOPInstanceUID')}"
        assert _text(tags, "PatientName") == patient, what
        assert _text(tags, "ReferringPhysicianName") == physician, what
        assert _text(tags, "StudyDescription") == description, what
    sent = {pydicom.dcmread(p, stop_before_pixels=True).Modality for p in results}
    assert sent == {"SEG", "SR"}
