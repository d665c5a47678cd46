"""The accuracy gate a reduced-precision variant must pass before it may serve.

A variant (``fp16``, ``int8``, ``bf16``) is compared with the FP32 model evaluated on the
*same* held-out studies. It is accepted only when

* mean Dice drops by at most ``GateSpec.max_dice_drop`` (absolute), and
* lesion recall in every size stratum drops by at most ``GateSpec.max_recall_drop_points``
  percentage points. A stratum with no GT lesions cannot be judged: it is skipped and a
  note says so;
* where its agreement with FP32 was measured (the varied model's own output on the same
  studies, :mod:`radserve.evaluation.agreement`), every label it or FP32 produced agrees
  at least ``GateSpec.min_agreement`` (pooled Dice; a classification step's share of
  studies answered alike), and there was something to compare: a variant of a model
  that labelled nothing on the gate's studies was measured by nothing and is rejected.
  Ground truth scores organs by name and lesions by size only, so without this a model
  whose labels the phantoms do not know passed whatever its variant did.

The decision is recorded in the bundle's ``gate.json`` (:mod:`radserve.models.gate`) by
the variant builder (:mod:`radserve.variants`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from radserve.domain.accuracy import EvalSummary
from radserve.evaluation.agreement import CLASS_ANSWER
from radserve.evaluation.lesions import SIZE_STRATA
from radserve.models.manifest import GateSpec

__all__ = ["GateDecision", "gate_decision"]

_EPS = 1e-9  # tolerance for float noise at the threshold itself


class GateDecision(BaseModel):
    """Outcome of comparing one variant with FP32."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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
    agreement = variant.agreement_vs_fp32
    if agreement is not None:
        measured = {label: value for label, value in agreement.items() if value is not None}
        if not measured:
            reasons.append(
                f"nothing to compare: neither fp32 nor {name} labelled any of "
                f"{sorted(agreement) or 'its labels'} on the gate's "
                f"{variant.n_studies} studies; gate it on studies where the model finds something"
            )
        for label, value in measured.items():
            if value < spec.min_agreement - _EPS:
                reasons.append(
                    f"{label} agrees with fp32 at {value:.4f} < {spec.min_agreement} "
                    f"({'share of studies answered alike' if label == CLASS_ANSWER else 'Dice'})"
                )
    return GateDecision(
        accepted=not reasons,
        reasons=reasons,
        notes=notes,
        dice_drop=dice_drop,
        recall_drop_points=drops,
        fp_per_study_increase=fp_rise,
    )
