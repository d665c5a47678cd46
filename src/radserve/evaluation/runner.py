"""Run a pipeline over held-out phantoms and score it against their ground truth.

Held-out seeds are below :data:`HELD_OUT_SEED_LIMIT`; the training recipes draw their
phantoms from seeds at or above it, so an evaluation never sees a training study.
Each phantom is generated once and every requested precision runs on it, so variants
are compared on identical studies.

The pipeline is reached through a :class:`Predictor`: any callable
``predict(ct, precision)`` returning the organ label map (values as in the organ model's
``model.yaml``), the lesion *instance* map (one value per predicted lesion, 0 elsewhere)
and the findings. :func:`radserve.commands.evaluate.pipeline_predictor` builds one from
:mod:`radserve.pipeline`; tests pass plain functions.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from radserve.domain.findings import Finding
from radserve.domain.volume import Volume
from radserve.evaluation.agreement import AgreementCounter, StepOutput, fp32_first
from radserve.evaluation.lesions import GtLesion, gt_lesions_from, match_lesions
from radserve.evaluation.metrics import dice, hd95
from radserve.evaluation.summary import EvalSummary, StudyScores, summarise

logger = logging.getLogger(__name__)

__all__ = [
    "HELD_OUT_SEED_LIMIT",
    "GroundTruth",
    "Predictor",
    "StudyPrediction",
    "TruthSource",
    "evaluate",
    "parse_seeds",
    "phantom_truth",
    "score_study",
]

HELD_OUT_SEED_LIMIT = 1000


@dataclass(frozen=True)
class StudyPrediction:
    """What the pipeline produced for one study, on the CT's voxel grid."""

    organ_labels: np.ndarray
    lesion_labels: np.ndarray
    findings: tuple[Finding, ...] = ()
    # the varied model's own step output, for its agreement with FP32 (None: not given)
    step: StepOutput | None = None


class Predictor(Protocol):
    def __call__(
        self, ct: Volume, precision: str
    ) -> StudyPrediction | tuple[np.ndarray, np.ndarray, Sequence[Finding]]: ...


@dataclass(frozen=True)
class GroundTruth:
    """One phantom study: the CT and what it truly contains."""

    seed: int
    ct: Volume
    organs: np.ndarray
    organ_values: Mapping[str, int]
    lesions: np.ndarray
    lesion_list: tuple[GtLesion, ...] = field(default=())


TruthSource = Callable[[int], GroundTruth]


MAX_SEEDS = 10_000  # phantoms per run: ~10 s each, so days of work already


def parse_seeds(text: str) -> list[int]:
    """``"0-19"``, ``"0,3,5-7"`` -> sorted unique seeds, at most :data:`MAX_SEEDS` (a
    range such as ``0-99999999999`` built its whole list first: gigabytes, then the
    run never ended)."""
    seeds: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not match:
            raise ValueError(f"bad seed range {part!r}; expected e.g. '0-19' or '0,3,5-7'")
        lo = int(match.group(1))
        hi = int(match.group(2) or lo)
        if hi < lo:
            raise ValueError(f"bad seed range {part!r}: end before start")
        if hi - lo + 1 + len(seeds) > MAX_SEEDS:
            raise ValueError(f"{text[:40]!r} names more than {MAX_SEEDS} seeds")
        seeds.update(range(lo, hi + 1))
    if not seeds:
        raise ValueError(f"no seeds in {text!r}")
    return sorted(seeds)


def phantom_truth(seed: int, *, small: bool = True) -> GroundTruth:
    """Generate the phantom for ``seed`` (``radserve.phantom``) as ground truth."""
    from radserve.phantom import ORGAN_LABELS, PhantomSpec, generate_phantom

    phantom = generate_phantom(PhantomSpec.random(seed, small=small))
    return GroundTruth(
        seed=seed,
        ct=phantom.ct,
        organs=phantom.organs.array,
        organ_values=dict(ORGAN_LABELS),
        lesions=phantom.lesions.array,
        lesion_list=tuple(gt_lesions_from(phantom.lesion_list)),
    )


def _array(value: Any) -> np.ndarray:
    return value.array if isinstance(value, Volume) else np.asarray(value)


def _as_prediction(result: Any) -> StudyPrediction:
    if isinstance(result, StudyPrediction):
        return result
    organ_labels, lesion_labels, findings = result
    return StudyPrediction(
        organ_labels=np.asarray(_array(organ_labels)),
        lesion_labels=np.asarray(_array(lesion_labels)),
        findings=tuple(findings),
    )


def score_study(
    truth: GroundTruth, prediction: StudyPrediction, *, organ_labels: Mapping[str, int]
) -> StudyScores:
    """Dice and HD95 per organ (matched by name) and lesion matching for one study.

    ``organ_labels`` maps organ name -> value in the *predicted* label map (the organ
    model's ``model.yaml``); organs the ground truth does not know are skipped.
    """
    shape = truth.ct.shape
    for name, array in (
        ("organ label map", prediction.organ_labels),
        ("lesion label map", prediction.lesion_labels),
    ):
        if array.shape != shape:
            raise ValueError(f"predicted {name} has shape {array.shape}, the CT is {shape}")
    organ_dice: dict[str, float] = {}
    organ_hd95: dict[str, float] = {}
    for name, value in organ_labels.items():
        gt_value = truth.organ_values.get(name)
        if gt_value is None:
            continue
        gt_mask = truth.organs == gt_value
        pred_mask = prediction.organ_labels == value
        organ_dice[name] = dice(gt_mask, pred_mask)
        organ_hd95[name] = hd95(gt_mask, pred_mask, truth.ct.spacing)
    lesions = match_lesions(truth.lesions, truth.lesion_list, prediction.lesion_labels, truth.ct)
    return StudyScores(seed=truth.seed, dice=organ_dice, hd95=organ_hd95, lesions=lesions)


def evaluate(
    predict: Predictor,
    *,
    seeds: Iterable[int],
    organ_labels: Mapping[str, int],
    precisions: Sequence[str] = ("fp32",),
    truth: TruthSource | None = None,
    small: bool = True,
    allow_training_seeds: bool = False,
    outside_domain: Callable[[Volume], Sequence[str]] | None = None,
    step_labels: Mapping[int, str] | None = None,
) -> dict[str, EvalSummary]:
    """Score every precision on every seed's phantom; one summary per precision.

    ``truth`` makes the ground truth for a seed (default: :func:`phantom_truth`).
    Where the predictions carry the varied model's own step output and FP32 is among
    ``precisions``, every other precision's summary also has its agreement with FP32
    (``agreement_vs_fp32``, labels named by ``step_labels``: value -> name).
    ``outside_domain`` names each way a phantom lies outside the models' declared input
    domain; phantoms that do are counted in a note (their scores are not the models'
    accuracy: ``--small`` phantoms are 128x128 with 2.6-3 mm pixels).
    """
    seeds = list(seeds)
    if not seeds:
        raise ValueError("evaluation needs at least one seed")
    if not precisions:
        raise ValueError("evaluation needs at least one precision")
    leaked = [s for s in seeds if s >= HELD_OUT_SEED_LIMIT]
    if leaked and not allow_training_seeds:
        raise ValueError(
            f"seeds {leaked[:5]} are training seeds (>= {HELD_OUT_SEED_LIMIT}); "
            f"evaluate on held-out seeds below {HELD_OUT_SEED_LIMIT}"
        )
    make_truth = truth or (lambda seed: phantom_truth(seed, small=small))
    scores: dict[str, list[StudyScores]] = {p: [] for p in precisions}
    agreement = {p: AgreementCounter(step_labels or {}) for p in precisions if p != "fp32"}
    compared = "fp32" in precisions
    unknown = set(organ_labels)
    outside: dict[int, Sequence[str]] = {}
    for seed in seeds:
        study = make_truth(seed)
        unknown -= set(study.organ_values)
        if outside_domain is not None and (violations := outside_domain(study.ct)):
            outside[seed] = violations
        reference: StepOutput | None = None
        for precision in fp32_first(precisions):
            start = time.perf_counter()
            prediction = _as_prediction(predict(study.ct, precision))
            seconds = time.perf_counter() - start
            scored = score_study(study, prediction, organ_labels=organ_labels)
            scores[precision].append(replace(scored, predict_seconds=seconds))
            if precision == "fp32":
                reference = prediction.step
            elif reference is not None and prediction.step is not None:
                agreement[precision].add(reference, prediction.step)  # compared, then dropped
            else:
                compared = False
        logger.info("evaluated seed %d at %s", seed, ", ".join(precisions))
    summaries = {p: summarise(s, variant=p) for p, s in scores.items()}
    if compared:
        summaries |= {
            p: summaries[p].model_copy(update={"agreement_vs_fp32": counter.result()})
            for p, counter in agreement.items()
        }
    notes = []
    if unknown:
        notes.append(f"organs {sorted(unknown)} are not in the ground truth: not scored")
    if outside:
        first, violations = next(iter(outside.items()))
        notes.append(
            f"{len(outside)} of {len(seeds)} phantoms lie outside the models' declared "
            f"input_domain (seed {first}: {'; '.join(violations)}): their scores are not "
            "the models' accuracy"
        )
    if notes:
        summaries = {
            p: s.model_copy(update={"notes": [*s.notes, *notes]}) for p, s in summaries.items()
        }
    return summaries
