"""False drift alarms on a stable population, inputs and outputs (issue 14).

Runs the shipped pipeline (``ct-chest-abdomen``: organs + lesions) on phantoms of one
population, computes each study's drift features exactly as the server does
(:func:`radserve.pipeline.profile.volume_features` for the inputs,
:func:`~radserve.pipeline.profile.output_features` for each model's outputs: positive,
finding count and sizes, mean confidence, organ volumes), and feeds them to a
:class:`~radserve.lifecycle.drift.DriftMonitor` with the shipped settings: the
``--reference`` seeds become the reference, then the ``--normal`` seeds are served one by
one. Every judged window's state is counted per feature; with no shift, every warn or
alert is a false alarm.

Each study's features are appended to ``--cache`` (JSON lines, one per seed), so an
interrupted run resumes where it stopped. Usage::

    PYTHONPATH=src python tools/drift_false_alarms.py --reference 900-919 --normal 0-49 \
        --cache out/drift_features.jsonl --json out/drift_false_alarms.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from radserve.config import DriftSettings
from radserve.domain.input_domain import AcquisitionFacts
from radserve.evaluation.runner import parse_seeds
from radserve.lifecycle.drift import DriftMonitor, DriftState, model_record

SCANNER = {"manufacturer": "radserve phantom", "kernel": "STANDARD", "kvp": "120"}
MODELS = ("organs", "lesions")


def study_features(seed: int, small: bool, sessions: Any) -> dict[str, Any]:
    """One phantom through the real pipeline; the server's feature record of it."""
    from radserve.models.registry import ModelRegistry
    from radserve.phantom import PhantomSpec, generate_phantom
    from radserve.pipeline import load_pipeline, run_volume
    from radserve.pipeline.profile import output_features, volume_features

    spec = PhantomSpec.random(seed, small=small)
    ct = generate_phantom(spec).ct
    result = run_volume(
        ct, load_pipeline("ct-chest-abdomen"), registry=ModelRegistry(), sessions=sessions
    )
    facts = AcquisitionFacts(
        modality="CT",
        pixel_spacing_mm=spec.pixel_spacing_mm,
        slice_thickness_mm=spec.slice_thickness_mm,
        rows=spec.rows,
        columns=spec.columns,
        slices=spec.n_slices,
        body_part="CHEST",
    )
    record = volume_features(ct, facts, SCANNER)
    record["models"] = output_features(result)
    return record


def load_cache(path: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                out[int(row["seed"])] = row["features"]
    return out


def output_names(features: dict[str, Any], model: str) -> set[str]:
    outputs = features["models"].get(model) or {}
    return set(outputs.get("num") or {}) | set(outputs.get("cat") or {})


def judge(
    reference: list[dict[str, Any]], normal: list[dict[str, Any]], model: str
) -> dict[str, Any]:
    limits = DriftSettings()
    monitor = DriftMonitor(
        model, "test", limits, reference=[model_record(f, model) for f in reference]
    )
    outputs = set().union(*(output_names(f, model) for f in reference + normal))
    judged = 0
    by_feature: dict[str, dict[str, int]] = {}
    overall = {"warn": 0, "alert": 0}
    closest: dict[str, float] = {}  # output feature -> smallest p-value over the windows
    for features in normal:
        monitor.add(model_record(features, model))
        if not monitor.features:
            continue
        judged += 1
        for name, drift in monitor.features.items():
            if name in outputs and drift.p_value is not None:
                closest[name] = min(closest.get(name, 1.0), drift.p_value)
        if monitor.state is not DriftState.OK:
            overall[monitor.state.label] += 1
        for name, drift in monitor.features.items():
            if drift.state is not DriftState.OK:
                counts = by_feature.setdefault(name, {"warn": 0, "alert": 0})
                counts[drift.state.label] += 1
    worst = {name: drift.as_json() for name, drift in monitor.features.items() if name in outputs}
    return {
        "model": model,
        "judged_windows": judged,
        "overall": overall,
        "non_ok_by_feature": by_feature,
        "output_features": sorted(outputs),
        "output_feature_alarms": {n: c for n, c in by_feature.items() if n in outputs},
        # the Bonferroni-divided thresholds are p_warn / tests made (see lifecycle.drift)
        "tests_per_window": len(monitor.features),
        "smallest_output_p": dict(sorted(closest.items(), key=lambda kv: kv[1])),
        "last_window_outputs": worst,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", default="900-919", help="reference phantom seeds")
    parser.add_argument("--normal", default="0-49", help="normal (unshifted) phantom seeds")
    parser.add_argument("--small", action="store_true", help="small phantoms (not the domain)")
    parser.add_argument("--cache", type=Path, default=Path("out/drift_features.jsonl"))
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--cached-only",
        action="store_true",
        help="judge only the seeds already in --cache (a run cut short); run nothing",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from radserve.inference import choose_runtime
    from radserve.pipeline import SessionPool

    reference_seeds, normal_seeds = parse_seeds(args.reference), parse_seeds(args.normal)
    args.cache.parent.mkdir(parents=True, exist_ok=True)
    cache = load_cache(args.cache)
    sessions = SessionPool(choose_runtime())
    if args.cached_only:
        reference_seeds = [s for s in reference_seeds if s in cache]
        normal_seeds = [s for s in normal_seeds if s in cache]
    for seed in [*reference_seeds, *normal_seeds]:
        if seed in cache:
            continue
        t0 = time.perf_counter()
        cache[seed] = study_features(seed, args.small, sessions)
        with args.cache.open("a") as fh:
            fh.write(json.dumps({"seed": seed, "features": cache[seed]}) + "\n")
        print(f"seed {seed}: {time.perf_counter() - t0:.1f} s", flush=True)
    reference = [cache[s] for s in reference_seeds]
    normal = [cache[s] for s in normal_seeds]
    figures = {
        "reference_seeds": reference_seeds,
        "normal_seeds": normal_seeds,
        "small": args.small,
        "settings": DriftSettings().model_dump(),
        "models": [judge(reference, normal, m) for m in MODELS],
    }
    text = json.dumps(figures, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
