"""Compare two results of the same study by two versions of one step: the serving one
(what was delivered) and the candidate (shadow, or the stable version re-run beside a
canary). Works from the two result folders (``report.json`` + NIfTI label maps), so it
needs nothing of the run that made them.

* per-label Dice on the step's label maps (a findings map's values are findings; they
  are merged per label name first);
* lesion detection agreement by size stratum (longest diameter < 10 mm, 10-20 mm,
  >= 20 mm): findings matched one-to-one by centroid distance (<= max(5 mm, half the
  larger diameter)), counted as both / serving only / candidate only;
* organ volume differences (candidate - serving, ml and relative);
* a classification step's answer (its class and whether it was reported positive), the
  same or not: such a step writes no label map and no finding, so without it a candidate
  classifier was compared on nothing and no answer it gave could roll it back;
* latency (each report's total seconds).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

STRATA: tuple[tuple[str, float, float], ...] = (
    ("<10mm", 0.0, 10.0),
    ("10-20mm", 10.0, 20.0),
    (">=20mm", 20.0, math.inf),
)


@dataclass(frozen=True)
class StratumAgreement:
    both: int = 0
    serving_only: int = 0
    candidate_only: int = 0

    @property
    def agreement(self) -> float | None:
        """both / (both + either only); None when neither found a lesion here."""
        total = self.both + self.serving_only + self.candidate_only
        return None if total == 0 else self.both / total


@dataclass(frozen=True)
class Comparison:
    """One study, two versions of one step."""

    job_id: str
    step: str
    serving_version: str
    candidate_version: str
    candidate_role: str  # shadow | stable (beside a canary)
    dice: dict[str, float] = field(default_factory=dict)
    lesions: dict[str, StratumAgreement] = field(default_factory=dict)
    volume_diff_ml: dict[str, float] = field(default_factory=dict)
    volume_diff_rel: dict[str, float] = field(default_factory=dict)
    # a classification step's answers alike (None: neither run classified with the step)
    answer_agrees: bool | None = None
    serving_seconds: float | None = None
    candidate_seconds: float | None = None

    @property
    def lesion_agreement(self) -> float | None:
        """Over all strata: both / (both + serving only + candidate only)."""
        both = sum(s.both for s in self.lesions.values())
        total = sum(s.both + s.serving_only + s.candidate_only for s in self.lesions.values())
        return None if total == 0 else both / total

    @property
    def mean_dice(self) -> float | None:
        return float(np.mean(list(self.dice.values()))) if self.dice else None

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["lesions"] = {
            k: {**asdict(v), "agreement": v.agreement} for k, v in self.lesions.items()
        }
        out["lesion_agreement"] = self.lesion_agreement
        out["mean_dice"] = self.mean_dice
        return out


def _report(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(folder) / "report.json").read_text())
    return data


def _label_masks(folder: Path, report: dict[str, Any], model: str) -> dict[str, np.ndarray]:
    """label name -> boolean mask, from the label maps of ``model`` in ``report``."""
    from radserve.report.nifti import read_nifti

    masks: dict[str, np.ndarray] = {}
    for output in report.get("outputs", {}).get("label_maps", []):
        segments = [s for s in output.get("segments", []) if s.get("model") == model]
        if not segments:
            continue
        array = np.asarray(read_nifti(Path(folder) / output["path"]).array)
        for segment in segments:
            mask = array == segment["value"]
            name = segment["label"]
            masks[name] = masks[name] | mask if name in masks else mask
    return masks


def _answers(report: dict[str, Any], model: str) -> list[tuple[str, bool]]:
    """The step's classification answers in ``report``: (class, reported positive)."""
    return sorted(
        (c["label"], bool(c["positive"]))
        for c in report.get("classifications", [])
        if c.get("model") == model
    )


def _dice(a: np.ndarray | None, b: np.ndarray | None) -> float:
    if a is None and b is None:
        return 1.0
    if a is None or b is None:
        return 0.0
    if a.shape != b.shape:
        return 0.0
    total = int(a.sum()) + int(b.sum())
    return 1.0 if total == 0 else 2.0 * int(np.logical_and(a, b).sum()) / total


def _stratum(diameter: float) -> str:
    for name, low, high in STRATA:
        if low <= diameter < high:
            return name
    return STRATA[-1][0]


def lesion_agreement(
    serving: list[dict[str, Any]], candidate: list[dict[str, Any]]
) -> dict[str, StratumAgreement]:
    """Greedy one-to-one matching of findings (same label) by centroid distance."""
    counts = {name: [0, 0, 0] for name, _, _ in STRATA}
    pairs = []
    for i, s in enumerate(serving):
        for j, c in enumerate(candidate):
            if s["label"] != c["label"]:
                continue
            distance = math.dist(s["centroid_mm"], c["centroid_mm"])
            limit = max(5.0, max(s["longest_diameter_mm"], c["longest_diameter_mm"]) / 2)
            if distance <= limit:
                pairs.append((distance, i, j))
    matched_s: set[int] = set()
    matched_c: set[int] = set()
    for _, i, j in sorted(pairs):
        if i in matched_s or j in matched_c:
            continue
        matched_s.add(i)
        matched_c.add(j)
        counts[_stratum(serving[i]["longest_diameter_mm"])][0] += 1
    for i, s in enumerate(serving):
        if i not in matched_s:
            counts[_stratum(s["longest_diameter_mm"])][1] += 1
    for j, c in enumerate(candidate):
        if j not in matched_c:
            counts[_stratum(c["longest_diameter_mm"])][2] += 1
    return {name: StratumAgreement(*values) for name, values in counts.items()}


def compare_results(
    serving_dir: Path,
    candidate_dir: Path,
    *,
    job_id: str,
    step: str,
    serving_version: str,
    candidate_version: str,
    candidate_role: str,
) -> Comparison:
    """Compare the step ``step`` in two result folders of one study."""
    serving, candidate = _report(serving_dir), _report(candidate_dir)
    s_masks = _label_masks(serving_dir, serving, step)
    c_masks = _label_masks(candidate_dir, candidate, step)
    dice = {name: _dice(s_masks.get(name), c_masks.get(name)) for name in s_masks | c_masks}
    s_findings = [f for f in serving.get("findings", []) if f.get("model") == step]
    c_findings = [f for f in candidate.get("findings", []) if f.get("model") == step]
    lesions = lesion_agreement(s_findings, c_findings) if s_findings or c_findings else {}
    s_answers, c_answers = _answers(serving, step), _answers(candidate, step)
    diff_ml: dict[str, float] = {}
    diff_rel: dict[str, float] = {}
    s_organs = {o["label"]: o for o in serving.get("organ_measurements", []) if o["model"] == step}
    for o in candidate.get("organ_measurements", []):
        before = s_organs.get(o["label"])
        if o["model"] != step or before is None:
            continue
        if o.get("volume_ml") is None or before.get("volume_ml") is None:
            continue
        diff_ml[o["label"]] = o["volume_ml"] - before["volume_ml"]
        if before["volume_ml"]:
            diff_rel[o["label"]] = diff_ml[o["label"]] / before["volume_ml"]
    return Comparison(
        job_id=job_id,
        step=step,
        serving_version=serving_version,
        candidate_version=candidate_version,
        candidate_role=candidate_role,
        dice=dice,
        lesions=lesions,
        volume_diff_ml=diff_ml,
        volume_diff_rel=diff_rel,
        answer_agrees=s_answers == c_answers if s_answers or c_answers else None,
        serving_seconds=serving.get("timings", {}).get("total"),
        candidate_seconds=candidate.get("timings", {}).get("total"),
    )


__all__ = ["STRATA", "Comparison", "StratumAgreement", "compare_results", "lesion_agreement"]
