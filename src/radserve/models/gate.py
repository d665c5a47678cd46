"""The gate record of a bundle: ``gate.json``, the evidence a variant may serve on.

A reduced-precision variant (``fp16``, ``int8``, ``bf16``) is built and judged against
FP32 by :mod:`radserve.variants` with the rule in :mod:`radserve.evaluation.gate`. The
decision and the evidence (both sets of metrics, speed, seeds, file hashes) are kept in
``gate.json`` beside ``model.yaml``; the registry serves a variant only when that file
says it was accepted and the file's SHA-256 still matches. This module is the file's
schema and its reader/writer only, so the registry imports no evaluation code.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from radserve import durable
from radserve.domain.accuracy import EvalSummary
from radserve.errors import ModelError
from radserve.models.manifest import GateSpec
from radserve.validation_text import describe_problems

logger = logging.getLogger(__name__)

__all__ = [
    "CPU_PROVIDERS",
    "GATE_FILE",
    "SHIPPED_GATE_FILE",
    "GateReport",
    "SpeedResult",
    "VariantGate",
    "file_sha256",
    "read_gate_report",
    "write_gate_report",
]

GATE_FILE = "gate.json"
# A gate.json that came inside a bundle installed without --build-variants or
# --trust-gate, set aside under this name: it was measured elsewhere (a vendor's data, its
# CPU), not on this site's held-out phantoms or studies, so no variant serves on it
# (radserve.lifecycle.install.finish_install); kept as the vendor's evidence.
SHIPPED_GATE_FILE = "gate.shipped.json"
# Providers whose arithmetic is the host CPU's: a gate through them holds for CPUs whose
# kernels compute the same numbers (radserve.host.kernel_family).
CPU_PROVIDERS = ("OpenVINOExecutionProvider", "CPUExecutionProvider")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SpeedResult(_Frozen):
    """Speed of one model file on a representative preprocessed batch."""

    ms_per_batch: float
    ms_per_slice: float
    batch_size: int
    threads: int
    repeats: int
    provider: str | None = Field(
        default=None, description="execution provider it ran on (absent in older reports)"
    )
    ratio_vs_fp32: float | None = Field(
        default=None, description="variant time / fp32 time; below 1 is faster"
    )


class VariantGate(_Frozen):
    """One variant's gate record in ``gate.json``."""

    file: str
    sha256: str
    accepted: bool
    reasons: list[str]
    notes: list[str] = Field(default_factory=list)
    dice_drop: float | None = None
    recall_drop_points: dict[str, float | None] = Field(default_factory=dict)
    metrics: EvalSummary
    speed: SpeedResult | None = None
    providers: list[str] = Field(
        default_factory=list,
        description="execution providers the evaluation ran on (absent in older reports)",
    )
    cpu_kernel: str | None = Field(
        default=None,
        description=(
            "the CPU instruction set that computed this precision when it was gated "
            "(radserve.host.cpu_kernel: e.g. amx_int8, avx2); absent in older reports"
        ),
    )


class GateReport(_Frozen):
    """Contents of ``gate.json``: the evidence behind each variant's acceptance."""

    model: str
    version: str
    created: datetime = Field(default_factory=lambda: datetime.now(UTC))
    gate: GateSpec
    seeds: list[int] = Field(description="held-out evaluation seeds")
    calibration_seeds: list[int] = Field(default_factory=list)
    # a gate on a site's own studies instead of phantoms: the study folders' names
    studies: list[str] = Field(default_factory=list)
    calibration_studies: list[str] = Field(default_factory=list)
    fp32_file: str
    fp32_sha256: str
    fp32_metrics: EvalSummary
    fp32_speed: SpeedResult | None = None
    variants: dict[str, VariantGate]


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_gate_report(directory: Path, report: GateReport) -> Path:
    """Write ``gate.json`` into a bundle folder, durably (:mod:`radserve.durable`); readable
    by all, like the rest of the bundle (an administrator's gate, the service's reads)."""
    path = directory / GATE_FILE
    text = json.dumps(report.model_dump(mode="json"), indent=2) + "\n"
    durable.write_text(path, text, mode=0o644)
    logger.info("wrote %s", path)
    return path


def read_gate_report(directory: Path) -> GateReport | None:
    """Parse a bundle's ``gate.json``; ``None`` when there is none."""
    path = directory / GATE_FILE
    if not path.is_file():
        return None
    try:
        return GateReport.model_validate_json(path.read_text())
    except (OSError, ValidationError) as exc:
        why = describe_problems(exc) if isinstance(exc, ValidationError) else str(exc)
        raise ModelError(
            f"unreadable gate report {path}: {why}; rebuild it with "
            "`radserve models build-variants`"
        ) from exc
