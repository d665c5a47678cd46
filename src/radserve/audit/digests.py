"""SHA-256 of a job's outputs and of the model files that made them, for its audit record:
with the HMAC chain they prove later which report, SEG and SR a job produced and with
exactly which weights."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radserve.report.schema import Report

# the result files that leave radserve: the report, DICOM SEG/SR/SC, NIfTI label maps
OUTPUT_PATTERNS = ("report.json", "*.dcm", "*.nii.gz", "fhir*.json")
_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def output_digests(out_dir: Path) -> dict[str, str]:
    """``{file name: sha256}`` of the result files in ``out_dir`` (top level)."""
    found: dict[str, str] = {}
    for pattern in OUTPUT_PATTERNS:
        for path in sorted(Path(out_dir).glob(pattern)):
            if path.is_file():
                found[path.name] = file_sha256(path)
    return dict(sorted(found.items()))


def model_digests(report: Report) -> dict[str, str]:
    """``{model name@version/precision: sha256 of the ONNX file that ran}``."""
    return {
        f"{m.name}@{m.version}/{m.precision}": m.onnx_sha256
        for m in report.models
        if m.onnx_sha256 is not None
    }


__all__ = ["OUTPUT_PATTERNS", "file_sha256", "model_digests", "output_digests"]
