"""``python -m radserve.training``: train, export, validate and bundle the reference models.

    python -m radserve.training --model all --seed 0 --out src/radserve/assets/models

``--model all`` first makes the training slices of every phantom once (two worker
processes), then trains ``organs`` and ``lesions`` at the same time in two processes
with their recipes' thread count (one each), so each run is the same on any machine
with two cores; the lesion model's ``min_confidence`` / ``min_component_ml`` are tuned
after both finish, through the real pipeline with the new organs model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from radserve.models.manifest import ModelSpec
from radserve.training.recipes import (
    RECIPES,
    TRAIN_SEED_RANGE,
    VAL_SEED_RANGE,
    Recipe,
    TrainSettings,
)

logger = logging.getLogger(__name__)


def train_seeds(seed: int, n: int) -> list[int]:
    """``n`` distinct phantom seeds from the training range, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    lo, hi = TRAIN_SEED_RANGE
    # A prefix of one permutation: more phantoms extend the list, never reshuffle it.
    return sorted(int(s) for s in rng.permutation(np.arange(lo, hi + 1))[:n])


def val_seeds(n: int) -> list[int]:
    return list(range(VAL_SEED_RANGE[0], VAL_SEED_RANGE[0] + n))


def _prepare_one(args: tuple[int, tuple[str, ...], bool, str | None]) -> int:
    """Make (or find cached) slices of one phantom for each named recipe."""
    seed, names, small, cache = args
    from radserve.training.data import build_slices_multi

    return build_slices_multi(
        [RECIPES[n] for n in names], seed, small=small, cache_dir=Path(cache) if cache else None
    )


def prepare(
    names: list[str], seeds: list[int], *, small: bool, cache: str | None, workers: int
) -> None:
    """Slices of every phantom for every model, each phantom generated only once."""
    jobs = [(s, tuple(names), small, cache) for s in seeds]
    t0 = time.perf_counter()
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_prepare_one, jobs))
    else:
        for job in jobs:
            _prepare_one(job)
    logger.info("prepared %d phantoms in %.0f s", len(seeds), time.perf_counter() - t0)


def run_one(recipe: Recipe, args: argparse.Namespace) -> dict:
    """Train, export, validate and write the bundle of one model; returns its log."""
    import torch

    from radserve.training import bundle, checkpoint, export, validate
    from radserve.training.data import build_slices, load_phantom
    from radserve.training.train import train_model

    overrides = {"batch": args.batch, "val_every": args.val_every, "autocast": args.autocast}
    if any(overrides.values()):
        changes = {k: v for k, v in overrides.items() if v}
        recipe = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, **changes))
    settings = recipe.train
    threads = args.threads or settings.threads
    torch.set_num_threads(threads)
    n_train = args.phantoms or settings.train_phantoms
    tr_seeds = train_seeds(args.seed, n_train)
    va_seeds = val_seeds(args.val_phantoms or settings.val_phantoms)
    cache = Path(args.cache) if args.cache else None
    t_start = time.perf_counter()
    if args.from_checkpoint:
        # The slices were the training machine's; their counts travel in the checkpoint.
        result = checkpoint.load(args.from_checkpoint, recipe)
        n_slices = result.slices or (None, None)
        t_data = 0.0
        logger.info("%s: weights from %s", recipe.name, args.from_checkpoint)
    else:
        train_slices = build_slices(recipe, tr_seeds, cache_dir=cache, small=args.small)
        val_slices = build_slices(recipe, va_seeds, cache_dir=cache, small=args.small)
        n_slices = (len(train_slices), len(val_slices))
        t_data = time.perf_counter() - t_start
        logger.info("%s: %d train / %d val slices (%.0f s)", recipe.name, *n_slices, t_data)
        device = args.device
        save = None
        if args.checkpoint:

            def save(partial, path=Path(args.checkpoint)):
                partial.slices = n_slices
                checkpoint.save(partial, path, recipe=recipe, args=args, device=device)

        result = train_model(
            recipe,
            train_slices,
            val_slices,
            seed=args.seed,
            steps=args.steps or settings.steps,
            minutes=args.minutes,
            device=device,
            loader_workers=args.loader_workers,
            on_validation=save,
        )
        result.slices = n_slices
        if args.checkpoint:
            checkpoint.save(result, Path(args.checkpoint), recipe=recipe, args=args, device=device)
        if args.train_only:
            return {"model": recipe.spec.key, "validation": {"pending": "train-only run"}}
    spec = recipe.spec
    directory = Path(args.out) / spec.name / spec.version
    onnx_path = directory / spec.files["fp32"]
    export.export_onnx(result.model, onnx_path, in_channels=spec.input.in_channels)
    diff = export.verify_onnx(result.model, onnx_path, in_channels=spec.input.in_channels)
    timing_shape = (8, spec.input.in_channels, *settings.timing_hw)
    ms = export.time_onnx(onnx_path, shape=timing_shape, threads=2)

    t_val = time.perf_counter()
    phantoms = (
        []
        if settings.tune_with_organ_model
        else [load_phantom(s, small=args.small) for s in va_seeds]
    )
    validation: dict = {}
    if spec.task == "segmentation":
        per = [validate.organ_dice(onnx_path, spec, p, threads=threads) for p in phantoms]
        dice = {k: round(float(np.nanmean([d[k] for d in per])), 4) for k in per[0]}
        validation = {"dice": dice, "mean_dice": round(float(np.mean(list(dice.values()))), 4)}
        logger.info("%s: whole-volume validation Dice %s", spec.name, validation)
    elif settings.tune_with_organ_model:
        if args.defer_tuning:
            validation = {"pending": "tuned after the organs model is trained (finalize)"}
        else:
            validation = tune_detection(spec, onnx_path, settings, args, threads)
            spec = _with_rules(spec, validation["chosen"])
    else:
        thresholds = [round(float(t), 2) for t in np.arange(0.35, 0.96, 0.05)] + [0.97, 0.99]
        sweep = validate.lesion_sweep(onnx_path, spec, phantoms, thresholds, threads)
        _ti, chosen = validate.choose_min_confidence(sweep, settings.max_fp_per_study)
        validation = {
            "chosen": chosen,
            "sweep": [sweep.row(i) for i in range(len(thresholds))],
            "max_fp_per_study_target": settings.max_fp_per_study,
        }
        spec = spec.with_finding_rules(min_confidence=chosen["min_confidence"])
        logger.info("%s: chose %s", spec.name, chosen)
    t_val = time.perf_counter() - t_val

    log = {
        "model": spec.key,
        "command": result.command or "python -m radserve.training " + " ".join(args.argv),
        "bundled_by": "python -m radserve.training " + " ".join(args.argv),
        "seed": args.seed,
        "threads": threads,
        "torch": result.torch_version or torch.__version__,
        "device": result.device or "cpu",
        "loader_workers": result.loader_workers,
        "data": {
            "train_seed_range": list(TRAIN_SEED_RANGE),
            "train_seeds": tr_seeds,
            "val_seeds": va_seeds,
            "small_phantoms": args.small,
            "slices_train": n_slices[0],
            "slices_val": n_slices[1],
            "data_seconds": round(t_data, 1),
        },
        "architecture": {"channels": list(settings.channels), "parameters": result.parameters},
        "sampling": {
            "lesion_sampling": settings.sampling,
            "lesion_fraction": settings.lesion_fraction,
            "hard_negative_fraction": settings.hard_negative_fraction,
            "lesions_per_phantom": list(settings.lesions_per_phantom),
            "small_lesion_phantoms": settings.small_lesion_phantoms,
            "lesion_max_diameter_mm": settings.lesion_max_diameter_mm,
            "loss": settings.loss,
            "class_weights": list(settings.class_weights or ()),
        },
        "steps": result.steps,
        "batch": result.batch or settings.batch,
        "autocast": result.autocast or settings.autocast,
        "patch": settings.patch,
        "lr": settings.lr,
        "seconds": round(result.seconds, 1),
        "best_step": result.best_step,
        "best_val_slice_dice": round(result.best_val, 4),
        "history": result.history,
        "export": {
            "opset": export.OPSET,
            "size_bytes": onnx_path.stat().st_size,
            "max_abs_diff": diff,
            "ms_per_slice": round(ms, 2),
            "timing_shape": list(timing_shape),
        },
        "validation": validation,
        "validation_seconds": round(t_val, 1),
        "limits": list(recipe.limits),
    }
    bundle.write_manifest(spec, directory)
    bundle.write_training_log(log, directory)
    bundle.write_model_card(spec, log, directory)
    logger.info("%s: bundle written to %s", spec.key, directory)
    return log


def _organ_roots(args: argparse.Namespace) -> list[Path]:
    from radserve.models.registry import bundled_model_dir

    return [Path(args.out), bundled_model_dir()]


def tune_detection(
    spec: ModelSpec,
    onnx_path: Path,
    settings: TrainSettings,
    args: argparse.Namespace,
    threads: int,
) -> dict:
    """min_confidence and min_component_ml from validation phantoms run through the real
    pipeline (the organs model's ROI and ``within``), as ``radserve evaluate`` runs it."""
    from radserve.training import validate
    from radserve.training.recipes import ORGANS_SPEC

    # Fine steps where the trade-off lives (confidence is a mean of uint8 probabilities).
    thresholds = [round(float(t), 2) for t in np.arange(0.5, 0.79, 0.05)]
    thresholds += [round(float(t), 2) for t in np.arange(0.8, 0.955, 0.01)] + [0.97, 0.99]
    min_mls = [0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.15]
    seeds = val_seeds(settings.tune_phantoms)
    sweep = validate.pipeline_lesion_sweep(
        spec,
        onnx_path,
        _organ_roots(args),
        ORGANS_SPEC.version,
        seeds,
        thresholds,
        min_mls,
        small=args.small,
        threads=threads,
    )
    chosen = validate.choose_rules(sweep, settings.max_fp_per_study)
    logger.info("%s: chose %s", spec.key, chosen)
    return {
        "chosen": chosen,
        "sweep": [r for r in sweep.rows() if r["min_component_ml"] == chosen["min_component_ml"]],
        "sweep_all": sweep.rows(),
        "max_fp_per_study_target": settings.max_fp_per_study,
        "tuning": {
            "seeds": seeds,
            "through": "radserve.pipeline.run_volume with organs "
            f"{ORGANS_SPEC.version} (predicted ROI and 'within')",
            "seconds_per_study": round(sweep.seconds_per_study, 1),
        },
    }


def _with_rules(spec: ModelSpec, chosen: dict) -> ModelSpec:
    return spec.with_finding_rules(
        min_confidence=chosen["min_confidence"], min_size_ml=chosen["min_component_ml"]
    )


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m radserve.training",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", choices=[*RECIPES, "all"], required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="src/radserve/assets/models")
    p.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="size the run by time instead of the recipe's step count",
    )
    p.add_argument("--steps", type=int, default=None, help="override the recipe's steps")
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads per model (default: recipe's)"
    )
    p.add_argument("--phantoms", type=int, default=None, help="training phantoms")
    p.add_argument("--val-phantoms", type=int, default=None)
    p.add_argument("--small", action="store_true", help="small phantoms (quick trials)")
    p.add_argument("--cache", default=None, help="slice cache folder (default: /tmp/...)")
    p.add_argument("--workers", type=int, default=2, help="processes making phantoms")
    p.add_argument("--prepare-only", action="store_true", help="only make the slice cache")
    p.add_argument("--device", default="cpu", help="torch device to train on (cpu, cuda)")
    p.add_argument("--batch", type=int, default=None, help="override the recipe's batch size")
    p.add_argument("--val-every", type=int, default=None, help="steps between validations")
    p.add_argument(
        "--autocast",
        choices=["off", "bf16"],
        default=None,
        help="override the recipe's autocast (bf16 forward pass, float32 weights)",
    )
    p.add_argument(
        "--loader-workers",
        type=int,
        default=0,
        help="processes sampling training batches (0: in the training process)",
    )
    p.add_argument(
        "--checkpoint", default=None, help="save the best weights here after each validation"
    )
    p.add_argument(
        "--train-only", action="store_true", help="stop after training (with --checkpoint)"
    )
    p.add_argument(
        "--from-checkpoint",
        default=None,
        help="skip training: export, validate and bundle the weights of this checkpoint",
    )
    p.add_argument(
        "--defer-tuning",
        action="store_true",
        help=argparse.SUPPRESS,  # set by --model all: tuning needs the finished organs model
    )
    args = p.parse_args(argv)
    args.argv = argv
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    names = list(RECIPES) if args.model == "all" else [args.model]
    # Phantoms first, each generated once for every model that needs it.
    n_train = {n: args.phantoms or RECIPES[n].train.train_phantoms for n in names}
    seeds = sorted(set(train_seeds(args.seed, max(n_train.values()))))
    n_val = max(args.val_phantoms or RECIPES[n].train.val_phantoms for n in names)
    if not args.from_checkpoint:  # bundling a checkpoint needs no training slices
        prepare(
            names,
            seeds + val_seeds(n_val),
            small=args.small,
            cache=args.cache,
            workers=args.workers,
        )
    if args.prepare_only:
        return 0
    if len(names) == 1:
        log = run_one(RECIPES[names[0]], args)
        logger.info("done: %s", json.dumps({"model": log["model"], "val": log["validation"]}))
        return 0
    # Both models at once, with their recipes' threads, as separate processes; the
    # lesion model's threshold tuning runs the organs model, so it waits for the end.
    procs = []
    for name in names:
        sub = list(argv)
        i = sub.index("--model")
        sub[i + 1] = name
        if RECIPES[name].train.tune_with_organ_model:
            sub.append("--defer-tuning")
        procs.append(subprocess.Popen([sys.executable, "-m", "radserve.training", *sub]))
    codes = [p.wait() for p in procs]
    if max(codes) == 0:
        finalize(names, args)
    return max(codes)


def finalize(names: list[str], args: argparse.Namespace) -> None:
    """After a concurrent run: re-time each model on the now idle machine (the in-run
    timing overlapped the other model's training) and record the command that was run."""
    from radserve.models.manifest import load_manifest
    from radserve.training import bundle, export

    for name in names:
        template = RECIPES[name].spec
        directory = Path(args.out) / template.name / template.version
        spec = load_manifest(directory / "model.yaml")
        log = json.loads((directory / "training_log.json").read_text())
        if "pending" in log.get("validation", {}):
            settings = RECIPES[name].train
            t_val = time.perf_counter()
            onnx_path = directory / spec.files["fp32"]
            log["validation"] = tune_detection(
                spec, onnx_path, settings, args, args.threads or settings.threads
            )
            log["validation_seconds"] = round(time.perf_counter() - t_val, 1)
            spec = _with_rules(spec, log["validation"]["chosen"])
            bundle.write_manifest(spec, directory)
        shape = tuple(log["export"]["timing_shape"])
        ms = export.time_onnx(directory / spec.files["fp32"], shape=shape, threads=2, repeats=20)
        log["export"]["ms_per_slice"] = round(ms, 2)
        log["command"] = "python -m radserve.training " + " ".join(args.argv)
        bundle.write_training_log(log, directory)
        bundle.write_model_card(spec, log, directory)
        logger.info("%s: %.1f ms/slice at %s", spec.key, ms, shape)
