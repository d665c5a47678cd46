"""Bundles validated against FHIR R4 4.0.1 structures, not only R4B (issue 11, 5).

fhir.resources 8 (radserve's) has R5 and R4B models; the last R4 4.0.1 models are in
fhir.resources 6.4, which needs pydantic 1 and so lives in a side venv
(``.venv-fhir-r4``, made by ``.ci/run``; ``RADSERVE_TEST_FHIR_R4_PYTHON`` names another
interpreter). :file:`tools/fhir_r4_validate.py` runs there, in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pydicom
import pytest
from tests.factories.results import lesion_study

from radserve.ingest import PatientInfo
from radserve.report.dicom import write_dicom_results
from radserve.report.fhir.patient import IdentifierSystems

pytest.importorskip("fhir.resources")
from radserve.report.fhir import build_fhir_bundle

REPO = Path(__file__).resolve().parents[2]
PYTHON = Path(
    os.environ.get("RADSERVE_TEST_FHIR_R4_PYTHON", REPO / ".venv-fhir-r4" / "bin" / "python")
)
VALIDATOR = REPO / "tools" / "fhir_r4_validate.py"

pytestmark = pytest.mark.skipif(
    not PYTHON.is_file(),
    reason=f"no FHIR R4 4.0.1 validator venv at {PYTHON} (.ci/run makes .venv-fhir-r4)",
)

PATIENTS = {
    "latin": PatientInfo(
        patient_name="Müller^Jürgen^^Dr.", patient_id="PID-1", patient_birth_date="19700101",
        patient_sex="M", issuer_of_patient_id="1.2.840.99",
    ),
    "japanese": PatientInfo(
        patient_name="Yamada^Tarou=山田^太郎=やまだ^たろう", patient_id="J-1", patient_sex="F",
        issuer_of_patient_id="HOSP_B",
    ),
    "korean-unknown-issuer": PatientInfo(
        patient_name="Hong^Gildong=洪^吉洞=홍^길동", patient_id="K-1",
        issuer_of_patient_id="ELSEWHERE",
    ),
    "anonymous": PatientInfo(),
}  # fmt: skip


def _validate(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PYTHON), str(VALIDATOR), *map(str, paths)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Transaction and collection bundles of a lesion study (2 lesions, a partial organ)
    and of the same report with its organ not found, for several patients."""
    root = tmp_path_factory.mktemp("fhir-r4")
    study = lesion_study(root)
    results = [
        pydicom.dcmread(p, stop_before_pixels=True)
        for p in write_dicom_results(study.report, study.out, study.files)
    ]
    organ = study.report.organ_measurements[0]
    absent = study.report.model_copy(
        update={
            "organ_measurements": [
                organ.model_copy(
                    update={
                        "coverage": "not_found",
                        "edges": (),
                        "volume_ml": None,
                        "mean_hu": None,
                    }
                )
            ],
            "findings": [],
            "finding_axes": [],
        }
    )
    systems = IdentifierSystems(by_issuer={"HOSP_B": "https://b.example/pid"})
    paths = []
    for name, patient in PATIENTS.items():
        for kind in ("transaction", "collection"):
            for label, report in (("study", study.report), ("absent", absent)):
                bundle = build_fhir_bundle(
                    report, patient, bundle_type=kind, dicom_results=results,
                    identifier_systems=systems,
                )  # fmt: skip
                path = root / f"{name}-{kind}-{label}.json"
                path.write_text(json.dumps(bundle, ensure_ascii=False), encoding="utf-8")
                paths.append(path)
    return paths


def test_bundles_validate_against_r4_4_0_1(bundles: list[Path]) -> None:
    run = _validate(bundles)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("ok (FHIR 4.0.1)") == len(bundles)


def test_the_validator_rejects_what_r4_does_not_have(bundles: list[Path], tmp_path: Path) -> None:
    """The check has teeth: an element R4 lacks is reported (by location, no values)."""
    bundle = json.loads(bundles[0].read_text(encoding="utf-8"))
    patient = bundle["entry"][0]["resource"]
    patient["bogusElement"] = True
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(bundle), encoding="utf-8")
    run = _validate([broken])
    assert run.returncode == 1
    assert "bogusElement" in run.stdout and "Müller" not in run.stdout
