"""The accuracy of a model at one precision over held-out studies, as numbers.

Produced by :func:`radserve.evaluation.summarise`, printed by ``radserve evaluate`` and
kept as evidence in each bundle's ``gate.json`` (:mod:`radserve.models.gate`). It lives
here, below both, so the model registry can read a gate record without importing the
evaluation (which runs the pipeline, which loads models: an import cycle).

Recall and precision are fractions in [0, 1]; ``None`` means "undefined" (no GT lesions
in a stratum, no organ in any study, no predicted component at all) and is never
silently turned into 0 or 1, so the summary serialises to strict JSON.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "LESION_MAX_FP_PER_STUDY",
    "LESION_RECALL_FLOORS",
    "ORGAN_MEAN_DICE_FLOOR",
    "EvalSummary",
]

# The project floors: what the reference models are held to on held-out phantoms when
# trained (radserve.training) and in every in-domain cell of ``radserve evaluate --grid``.
# Recall floors by lesion diameter: ">=10mm" pools the 10-20 and >20 mm strata.
ORGAN_MEAN_DICE_FLOOR = 0.90
LESION_RECALL_FLOORS: dict[str, float] = {">=10mm": 0.90, "5-10mm": 0.70}
LESION_MAX_FP_PER_STUDY = 1.0


class EvalSummary(BaseModel):
    """Accuracy of one precision of a pipeline over held-out phantom studies."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    variant: str = Field("fp32", description="precision of the models evaluated")
    n_studies: int
    seeds: list[int]
    dice_mean: float | None = Field(description="mean over organs of each organ's mean Dice")
    dice: dict[str, float | None]
    hd95: dict[str, float | None] = Field(
        description="mm; mean over studies where both masks are non-empty"
    )
    recall_by_size: dict[str, float | None]
    recall_by_type: dict[str, float | None]
    n_lesions_by_size: dict[str, int]
    n_detected_by_size: dict[str, int]
    n_lesions_by_type: dict[str, int]
    precision: float | None = Field(
        default=None, description="lesions: matched components / predicted components"
    )
    fp_per_study: float
    n_predicted: int = 0
    mean_predict_seconds: float | None = None
    agreement_vs_fp32: dict[str, float | None] | None = Field(
        default=None,
        description=(
            "a variant's agreement with the FP32 model on the same studies: per label of "
            "the varied model, the Dice of its voxels pooled over the studies (None: "
            "neither labelled any); for a classification step, the share of studies "
            "answered alike ('class answer'). None: not measured (FP32 itself, or no "
            "single model varied)"
        ),
    )
    notes: list[str] = Field(default_factory=list)
