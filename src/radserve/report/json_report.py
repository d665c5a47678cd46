"""Write and read the JSON report, and export its JSON Schema for integrators."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from radserve import durable
from radserve.errors import ReportError
from radserve.report.schema import SCHEMA_VERSION, Report
from radserve.validation_text import describe_problems

logger = logging.getLogger(__name__)

SCHEMA_PATH = Path("docs/report-schema.json")


def report_json(report: Report) -> str:
    """The report as indented JSON text (what ``write_report`` stores and the API serves)."""
    return report.model_dump_json(indent=2)


def write_report(report: Report, path: Path) -> Path:
    """Write ``report`` as UTF-8 JSON, durably (:mod:`radserve.durable`: readers, the API
    and the outbox, never see half a file, and a written report survives a power cut)."""
    durable.write_text(Path(path), report_json(report) + "\n")
    logger.info("report written: %d findings", len(report.findings))
    return Path(path)


def parse_report(text: str) -> Report:
    """Validate report JSON; a newer major schema version is refused, not guessed at."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"report is not valid JSON: {exc}") from exc
    version = str(raw.get("schema_version", "")) if isinstance(raw, dict) else ""
    if version.split(".")[0] not in (SCHEMA_VERSION.split(".")[0], "1"):
        raise ReportError(
            f"report schema_version {version!r} is not supported; this radserve reads "
            f"{SCHEMA_VERSION}. Upgrade radserve or re-run the job."
        )
    if version.split(".")[0] == "1":
        raw = _from_1(raw)
    elif version != SCHEMA_VERSION:  # an older 2.x: additive changes only
        raw = {**raw, "schema_version": SCHEMA_VERSION}
    try:
        return Report.model_validate(raw)
    except ValidationError as exc:
        raise ReportError(
            f"report does not match schema {SCHEMA_VERSION}: {describe_problems(exc)}"
        ) from exc


def _from_1(raw: dict[str, Any]) -> dict[str, Any]:
    """A 1.x report in 2.x form: an organ with 0 ml was not found (1.0 wrote no
    coverage), and a warning says that the others' coverage was never checked."""
    organs = []
    for organ in raw.get("organ_measurements") or []:
        organ = dict(organ)
        if not organ.get("volume_ml"):
            organ.update(volume_ml=None, coverage="not_found", edges=[])
        organs.append(organ)
    warnings = list(raw.get("warnings") or [])
    if organs:
        warnings.append(
            {
                "code": "coverage_not_checked",
                "message": f"report schema {raw['schema_version']}: whether each organ lay "
                "wholly inside the volume was not checked (organ volumes may be lower "
                "bounds); re-run the job for coverage",
                "stage": "report",
            }
        )
    return {
        **raw,
        "schema_version": SCHEMA_VERSION,
        "organ_measurements": organs,
        "warnings": warnings,
    }


def read_report(path: Path) -> Report:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"cannot read report {path}: {exc}") from exc
    return parse_report(text)


def report_json_schema() -> dict[str, object]:
    """JSON Schema (draft 2020-12) of :class:`Report`, as pydantic generates it."""
    schema = Report.model_json_schema()
    schema["$id"] = f"https://radserve.local/schemas/report-{SCHEMA_VERSION}.json"
    return schema


def write_json_schema(path: Path = SCHEMA_PATH) -> Path:
    """Export the schema (default ``docs/report-schema.json``); the CLI wires this."""
    text = json.dumps(report_json_schema(), indent=2, sort_keys=True) + "\n"
    durable.write_text(Path(path), text, mode=0o644)  # a published document, not a result
    return Path(path)
