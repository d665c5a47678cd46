"""Write a model bundle: ``model.yaml``, ``training_log.json`` and ``MODEL_CARD.md``.

The ONNX file is written by :mod:`radserve.training.export`; this module writes the
text around it and re-reads ``model.yaml`` through ``load_manifest`` so a bundle that
radserve could not load is never left behind. No torch here.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import yaml

from radserve.domain.accuracy import (
    LESION_MAX_FP_PER_STUDY,
    LESION_RECALL_FLOORS,
    ORGAN_MEAN_DICE_FLOOR,
)
from radserve.models.manifest import ModelSpec, load_manifest
from radserve.training.recipes import (
    TRAIN_SEED_RANGE,
    VAL_SEED_RANGE,
)

logger = logging.getLogger(__name__)

_YAML_HEADER = """\
# {key}: reference model trained by `python -m radserve.training` on synthetic phantoms.
# A stand-in for testing radserve; NOT for clinical use. See MODEL_CARD.md.
"""


def write_manifest(spec: ModelSpec, directory: Path) -> Path:
    """``model.yaml`` for ``spec``; validated by loading it back."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.yaml"
    body = yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False, width=90)
    path.write_text(_YAML_HEADER.format(key=spec.key) + body)
    loaded = load_manifest(path)
    if loaded != spec:
        raise RuntimeError(f"{path} does not round-trip to the spec it was written from")
    return path


def write_training_log(log: dict[str, Any], directory: Path) -> Path:
    path = directory / "training_log.json"
    path.write_text(json.dumps(log, indent=2, sort_keys=False) + "\n")
    return path


def _table(rows: list[tuple[str, str]]) -> str:
    out = ["| | |", "|---|---|"]
    out += [f"| {a} | {b} |" for a, b in rows]
    return "\n".join(out)


def write_model_card(spec: ModelSpec, log: dict[str, Any], directory: Path) -> Path:
    """``MODEL_CARD.md``: intended use, data, architecture, validation, limits."""
    arch = log["architecture"]
    labels = "\n".join(
        f"| {lab.value} | {lab.name} | {lab.concept.value} {lab.concept.meaning} | "
        f"{lab.category.meaning} | {', '.join(lab.within) or '—'} |"
        for lab in spec.labels
    )
    norm = spec.input.normalisation.model_dump()
    val = log.get("validation", {})
    val_lines = _validation_lines(spec, val)
    extra_limits = "\n".join(f"- {line}" for line in log.get("limits", []))
    text = f"""# Model card — {spec.name} {spec.version}

{spec.description}

## Intended use
A small, honest stand-in model so that radserve can be built, tested and demonstrated
end to end without patient data or downloaded weights. It was trained **only on
radserve's synthetic CT phantoms** (`radserve.phantom`). **Not for clinical use**: it
has never seen a real CT scan, and its numbers below say nothing about real patients.

## Training data
- Phantoms from `PhantomSpec.random(seed)` with training seeds drawn from
  {TRAIN_SEED_RANGE[0]}–{TRAIN_SEED_RANGE[1]} (this run: {log["data"]["train_seeds"]}),
  varied size, spacing, anatomy and noise as the generator draws them.
- Validation ({_val_use_text(spec, log)}) from {VAL_SEED_RANGE[0]}–{VAL_SEED_RANGE[1]}.
- **Evaluation uses phantom seeds below 1000** (outside the validation range
  {VAL_SEED_RANGE[0]}–{VAL_SEED_RANGE[1]}); no evaluation seed was ever used in training.
- Slices are made by the same functions inference uses (`radserve.preprocess`:
  {
        "body crop"
        if not spec.input.roi_labels
        else "ROI crop to "
        + ", ".join(spec.input.roi_labels)
        + f" + {spec.input.roi_margin_mm:g} mm"
    }, `resample_inplane`, `normalise`).
  {log["data"]["slices_train"]} training / {log["data"]["slices_val"]} validation slices.
  Augmentation: random crops, mild intensity gain/offset; no left/right mirroring.

## Model
{
        _table(
            [
                ("task", f"{spec.task}, {spec.modality}"),
                (
                    "input",
                    f"{spec.input.mode}, {spec.input.in_channels} channels "
                    f"(slice ± {spec.input.context_slices}"
                    + (
                        f" neighbours every {spec.input.context_mm:g} mm in z, interpolated"
                        if spec.input.context_mm
                        else ""
                    )
                    + f"), in-plane spacing {spec.input.spacing[1]:g} mm, native slices",
                ),
                ("normalisation", ", ".join(f"{k} {v}" for k, v in norm.items())),
                (
                    "architecture",
                    f"2D U-Net, widths {arch['channels']}, 2×(conv3×3+BN+ReLU) per "
                    "level, max-pool down, transposed-conv up, BN folded at export",
                ),
                ("parameters", f"{arch['parameters']:,}"),
                (
                    "output",
                    f"logits N×{spec.num_classes}×H×W, {spec.activation}; H, W multiples of "
                    f"{spec.input.divisible_by}",
                ),
                (
                    "ONNX",
                    f"opset {log['export']['opset']}, dynamic batch/height/width, "
                    f"{log['export']['size_bytes'] / 1e6:.2f} MB (fp32); "
                    "max abs difference torch vs onnxruntime "
                    f"{log['export']['max_abs_diff']:.1e}",
                ),
                (
                    "speed",
                    f"{log['export']['ms_per_slice']:.1f} ms/slice, onnxruntime CPU, 2 threads, "
                    f"{log['export']['timing_shape']}",
                ),
            ]
        )
    }

### Labels
| value | name | SNOMED CT | category | within |
|---|---|---|---|---|
{labels}

## Training
`{log["command"]}` — seed {log["seed"]}, {log["steps"]} steps of batch
{log["batch"]} × {log["patch"]}² patches, AdamW, cosine LR, {_loss_text(log)},
{_where_trained(log)}, {log["seconds"] / 60:.1f} min. Best checkpoint at step
{log["best_step"]} by slice-level validation Dice.

## Validation (held-out phantoms {_val_seed_text(log)})
{val_lines}

## Metrics on evaluation phantoms
{_evaluation_lines(log.get("evaluation"))}

## Limits
- Synthetic phantoms only; real anatomy, pathology, contrast phases, artefacts,
  implants and scanners are all unseen. Expect failure on real data.
{extra_limits}
"""
    path = directory / "MODEL_CARD.md"
    path.write_text(text)
    return path


def _val_seed_text(log: dict[str, Any]) -> str:
    seeds = log.get("validation", {}).get("tuning", {}).get("seeds") or log["data"]["val_seeds"]
    return (
        f"{seeds[0]}–{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else str(seeds)
    )


def _val_use_text(spec: ModelSpec, log: dict[str, Any]) -> str:
    checkpoint = f"checkpoint choice: seeds {log['data']['val_seeds']}"
    if spec.task != "detection":
        return checkpoint
    tuning = log.get("validation", {}).get("tuning")
    if not tuning:
        return f"{checkpoint}, min_confidence tuning"
    return f"{checkpoint}; min_confidence / min_component_ml tuning: seeds {_val_seed_text(log)}"


def _where_trained(log: dict) -> str:
    """'on cuda (NVIDIA H200), 12 sampling processes' or '2 CPU thread(s), bfloat16
    autocast'."""
    device = log.get("device", "cpu")
    amp = ", bfloat16 autocast" if log.get("autocast") == "bf16" else ""
    if device == "cpu" or device.startswith("cpu "):
        return f"{log['threads']} CPU thread(s){amp}"
    workers = log.get("loader_workers") or 0
    return f"torch {log['torch']} on {device}, {workers} batch-sampling processes{amp}"


def _loss_text(log: dict[str, Any]) -> str:
    sampling = log.get("sampling", {})
    if sampling.get("loss") != "sample_dice":
        return "Dice + cross-entropy loss"
    return (
        "cross-entropy + soft Dice per patch and class present (a small lesion weighs "
        "as much as a large one); lesion patches drawn per lesion (each lesion equally "
        f"likely, {sampling['lesion_fraction']:.0%} of patches), hard negatives centred "
        f"on lung vessels and lesion-free liver ({sampling['hard_negative_fraction']:.0%}); "
        f"training phantoms with {sampling['lesions_per_phantom'][0]}–"
        f"{sampling['lesions_per_phantom'][1]} lesions, "
        f"{sampling['small_lesion_phantoms']:.0%} of them capped at "
        f"{sampling['lesion_max_diameter_mm']:g} mm"
    )


def _evaluation_lines(evaluation: dict[str, Any] | None) -> str:
    """The held-out table from a ``radserve evaluate --json`` summary, if recorded."""
    if not evaluation:
        return (
            "Filled in by `radserve evaluate` (evaluation seeds < 1000): see the evaluation report."
        )
    summary = evaluation["summary"]
    n_by_size, hit_by_size = summary["n_lesions_by_size"], summary["n_detected_by_size"]
    sizes = "\n".join(
        f"| {k} mm | {hit_by_size.get(k, 0)}/{n} | "
        f"{(hit_by_size.get(k, 0) / n if n else float('nan')):.2f} |"
        for k, n in n_by_size.items()
    )
    kinds = "\n".join(
        f"| {k} | {summary['n_lesions_by_type'].get(k, 0)} | {r:.2f} |"
        for k, r in summary["recall_by_type"].items()
        if r is not None
    )
    return (
        f"`{evaluation['command']}` (seeds {summary['seeds'][0]}–{summary['seeds'][-1]}, "
        f"{summary['n_studies']} full-size studies, the whole reference pipeline: organs "
        f"model ROI, FP32). False positives per study **{summary['fp_per_study']:.2f}**, "
        f"lesion precision {summary['precision']:.2f}, organ mean Dice "
        f"{summary['dice_mean']:.3f}.\n\n| size | detected | recall |\n|---|---|---|\n"
        f"{sizes}\n\n| type | lesions | recall |\n|---|---|---|\n{kinds}"
    )


def _validation_lines(spec: ModelSpec, val: dict[str, Any]) -> str:
    if not val:
        return "Not run."
    if "pending" in val:
        return f"Pending: {val['pending']}."
    if spec.task == "segmentation":
        rows = "\n".join(f"| {name} | {d:.3f} |" for name, d in val["dice"].items())
        verdict = "meets" if val["mean_dice"] >= ORGAN_MEAN_DICE_FLOOR else "**does not meet**"
        return (
            f"Whole-volume Dice through radserve's inference path and `clean_labels`, "
            f"mean over structures **{val['mean_dice']:.3f}** ({verdict} the project floor "
            f"of {ORGAN_MEAN_DICE_FLOOR:.2f}).\n\n| structure | Dice |\n"
            f"|---|---|\n{rows}"
        )
    chosen = val["chosen"]
    short = [
        f"recall {k} {chosen['recall'].get(k, float('nan')):.2f} < {floor:.2f}"
        for k, floor in LESION_RECALL_FLOORS.items()
        if not chosen["recall"].get(k, 0.0) >= floor
    ]
    if chosen["fp_per_study"] > LESION_MAX_FP_PER_STUDY:
        short.append(f"{chosen['fp_per_study']:.2f} FP/study > {LESION_MAX_FP_PER_STUDY:g}")
    verdict = (
        "Meets the project floors (recall "
        + ", ".join(f"{k} ≥ {v:.2f}" for k, v in LESION_RECALL_FLOORS.items())
        + f", ≤ {LESION_MAX_FP_PER_STUDY:g} FP/study)."
        if not short
        else "**Below the project floors on validation: " + "; ".join(short) + ".**"
    )
    rows = "\n".join(
        f"| {r['min_confidence']:.2f} | "
        + " | ".join(f"{r['recall'].get(k, float('nan')):.2f}" for k in ("5-10mm", ">=10mm"))
        + f" | {r['fp_per_study']:.2f} |"
        for r in val["sweep"]
    )
    tuning = val.get("tuning")
    ml_note = (
        f" (min_component_ml {chosen['min_component_ml']:g})"
        if "min_component_ml" in chosen
        else ""
    )
    how = (
        f"the real pipeline ({tuning['through']}) on seeds {tuning['seeds']}"
        if tuning
        else "radserve's inference path and `find_lesions` (ROI and `within` from the "
        "phantoms' true organs)"
    )
    rules = f"`min_confidence` = **{chosen['min_confidence']:.2f}**"
    if "min_component_ml" in chosen:
        rules += f", `min_component_ml` = **{chosen['min_component_ml']:g}**"
    return (
        f"Lesions found through {how}, matched one-to-one by "
        f"`radserve.evaluation.lesions`. Chosen {rules}: recall {chosen['recall']}, "
        f"{chosen['fp_per_study']:.2f} false positives per study "
        f"(lesions per stratum: {chosen['lesions']}). {verdict}\n\n"
        f"| min_confidence{ml_note} | recall 5–10 mm | recall ≥10 mm | FP/study |\n"
        f"|---|---|---|---|\n"
        f"{rows}"
    )
