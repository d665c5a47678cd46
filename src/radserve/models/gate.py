"""The accuracy gate a reduced-precision variant must pass before it may serve.

A variant (``fp16``, ``int8``) is compared with the FP32 model evaluated on the *same*
held-out studies. It is accepted only when

* mean Dice drops by at most ``GateSpec.max_dice_drop`` (absolute), and
* lesion recall in every size stratum drops by at most ``GateSpec.max_recall_drop_points``
  percentage points. A stratum with no GT lesions cannot be judged: it is skipped and a
  note says so.

The decision and the evidence (both sets of metrics, speed, seeds, file hashes) are kept
in ``gate.json`` beside ``model.yaml``; the registry serves a variant only when that file
says it was accepted and the file's SHA-256 still matches.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from radserve.errors import ModelError
from radserve.evaluation.lesions import SIZE_STRATA
from radserve.evaluation.summary import EvalSummary
from radserve.models.manifest import GateSpec

logger = logging.getLogger(__name__)

__all__ = [
    "GATE_FILE",
    "GateDecision",
    "GateReport",
    "SpeedResult",
    "VariantGate",
    "file_sha256",
    "gate_decision",
    "read_gate_report",
    "write_gate_report",
]

GATE_FILE = "gate.json"
_EPS = 1e-9  # tolerance for float noise at the threshold itself


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GateDecision(_Frozen):
    """Outcome of comparing one variant with FP32."""

    accepted: bool
    reasons: list[str] = Field(description="why it was rejected; empty when accepted")
    notes: list[str] = Field(default_factory=list, description="checks that were skipped")
    dice_drop: float | None = None
    recall_drop_points: dict[str, float | None] = Field(default_factory=dict)
    fp_per_study_increase: float | None = None


def gate_decision(fp32: EvalSummary, variant: EvalSummary, spec: GateSpec) -> GateDecision:
    """Accept ``variant`` only if it loses no more than ``spec`` allows against ``fp32``."""
    reasons: list[str] = []
    notes: list[str] = []
    name = variant.variant
    if sorted(fp32.seeds) != sorted(variant.seeds):
        reasons.append(
            f"{name} was evaluated on seeds {variant.seeds}, fp32 on {fp32.seeds}; "
            "the gate needs both on the same studies"
        )

    dice_drop: float | None = None
    if fp32.dice_mean is None or variant.dice_mean is None:
        notes.append("mean Dice undefined (no organ scored): Dice check skipped")
    else:
        dice_drop = fp32.dice_mean - variant.dice_mean
        if dice_drop > spec.max_dice_drop + _EPS:
            reasons.append(
                f"mean Dice dropped {dice_drop:.4f} > {spec.max_dice_drop} "
                f"({fp32.dice_mean:.4f} -> {variant.dice_mean:.4f})"
            )

    drops: dict[str, float | None] = {}
    for stratum in SIZE_STRATA:
        before = fp32.recall_by_size.get(stratum)
        after = variant.recall_by_size.get(stratum)
        n = fp32.n_lesions_by_size.get(stratum, 0)
        if before is None or after is None or n == 0:
            drops[stratum] = None
            notes.append(f"recall {stratum} mm: no GT lesions, stratum skipped")
            continue
        points = 100.0 * (before - after)
        drops[stratum] = points
        if points > spec.max_recall_drop_points + _EPS:
            reasons.append(
                f"recall {stratum} mm dropped {points:.1f} points > "
                f"{spec.max_recall_drop_points} ({100 * before:.1f}% -> {100 * after:.1f}% "
                f"of {n} lesions)"
            )
    # False positives: a reader pays for each one, so the change is always on record,
    # and gated when the model's gate asks for it.
    fp_rise = variant.fp_per_study - fp32.fp_per_study
    change = f"false positives per study {fp32.fp_per_study:.2f} -> {variant.fp_per_study:.2f}"
    limit = spec.max_fp_per_study_increase
    if limit is not None and fp_rise > limit + _EPS:
        reasons.append(f"{change}: rose {fp_rise:.2f} > {limit}")
    elif abs(fp_rise) > _EPS:
        notes.append(change + (" (not gated)" if limit is None else f" (within +{limit})"))
    return GateDecision(
        accepted=not reasons,
        reasons=reasons,
        notes=notes,
        dice_drop=dice_drop,
        recall_drop_points=drops,
        fp_per_study_increase=fp_rise,
    )


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


class GateReport(_Frozen):
    """Contents of ``gate.json``: the evidence behind each variant's acceptance."""

    model: str
    version: str
    created: datetime = Field(default_factory=lambda: datetime.now(UTC))
    gate: GateSpec
    seeds: list[int] = Field(description="held-out evaluation seeds")
    calibration_seeds: list[int] = Field(default_factory=list)
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
    """Write ``gate.json`` into a bundle folder (atomically: temp file, then rename)."""
    path = directory / GATE_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
    tmp.replace(path)
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
        raise ModelError(
            f"unreadable gate report {path}: {exc}; rebuild it with "
            "`radserve models build-variants`"
        ) from exc
