"""``python -m radserve.training``: train, export, validate and bundle the reference models.

    python -m radserve.training --model all --seed 0 --out src/radserve/assets/models

``--model all`` first makes the training slices of every phantom once (two worker
processes), then trains ``organs`` and ``lesions`` at the same time in two processes
with one thread each, so the whole run is the same on any machine with two cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from radserve.training.recipes import RECIPES, TRAIN_SEED_RANGE, VAL_SEED_RANGE, Recipe

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

    from radserve.training import bundle, export, validate
    from radserve.training.data import build_slices, load_phantom
    from radserve.training.train import train_model

    torch.set_num_threads(args.threads)
    settings = recipe.train
    n_train = args.phantoms or settings.train_phantoms
    tr_seeds = train_seeds(args.seed, n_train)
    va_seeds = val_seeds(args.val_phantoms or settings.val_phantoms)
    cache = Path(args.cache) if args.cache else None
    t_start = time.perf_counter()
    train_slices = build_slices(recipe, tr_seeds, cache_dir=cache, small=args.small)
    val_slices = build_slices(recipe, va_seeds, cache_dir=cache, small=args.small)
    t_data = time.perf_counter() - t_start
    logger.info(
        "%s: %d train / %d val slices (%.0f s)",
        recipe.name,
        len(train_slices),
        len(val_slices),
        t_data,
    )
    result = train_model(
        recipe,
        train_slices,
        val_slices,
        seed=args.seed,
        steps=args.steps or settings.steps,
        minutes=args.minutes,
    )
    spec = recipe.spec
    directory = Path(args.out) / spec.name / spec.version
    onnx_path = directory / spec.files["fp32"]
    export.export_onnx(result.model, onnx_path, in_channels=spec.input.in_channels)
    diff = export.verify_onnx(result.model, onnx_path, in_channels=spec.input.in_channels)
    timing_shape = (8, spec.input.in_channels, *settings.timing_hw)
    ms = export.time_onnx(onnx_path, shape=timing_shape, threads=2)

    t_val = time.perf_counter()
    phantoms = [load_phantom(s, small=args.small) for s in va_seeds]
    validation: dict = {}
    if spec.task == "segmentation":
        per = [validate.organ_dice(onnx_path, spec, p, threads=args.threads) for p in phantoms]
        dice = {k: round(float(np.nanmean([d[k] for d in per])), 4) for k in per[0]}
        validation = {"dice": dice, "mean_dice": round(float(np.mean(list(dice.values()))), 4)}
        logger.info("%s: whole-volume validation Dice %s", spec.name, validation)
    else:
        thresholds = [round(float(t), 2) for t in np.arange(0.35, 0.96, 0.05)] + [0.97, 0.99]
        sweep = validate.lesion_sweep(onnx_path, spec, phantoms, thresholds, args.threads)
        _ti, chosen = validate.choose_min_confidence(sweep, settings.max_fp_per_study)
        validation = {
            "chosen": chosen,
            "sweep": [sweep.row(i) for i in range(len(thresholds))],
            "max_fp_per_study_target": settings.max_fp_per_study,
        }
        post = spec.postprocess.model_copy(update={"min_confidence": chosen["min_confidence"]})
        spec = spec.model_copy(update={"postprocess": post})
        logger.info("%s: chose %s", spec.name, chosen)
    t_val = time.perf_counter() - t_val

    log = {
        "model": spec.key,
        "command": "python -m radserve.training " + " ".join(args.argv),
        "seed": args.seed,
        "threads": args.threads,
        "torch": torch.__version__,
        "data": {
            "train_seed_range": list(TRAIN_SEED_RANGE),
            "train_seeds": tr_seeds,
            "val_seeds": va_seeds,
            "small_phantoms": args.small,
            "slices_train": len(train_slices),
            "slices_val": len(val_slices),
            "data_seconds": round(t_data, 1),
        },
        "architecture": {"channels": list(settings.channels), "parameters": result.parameters},
        "steps": result.steps,
        "batch": settings.batch,
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
    p.add_argument("--threads", type=int, default=1, help="torch threads per model")
    p.add_argument("--phantoms", type=int, default=None, help="training phantoms")
    p.add_argument("--val-phantoms", type=int, default=None)
    p.add_argument("--small", action="store_true", help="small phantoms (quick trials)")
    p.add_argument("--cache", default=None, help="slice cache folder (default: /tmp/...)")
    p.add_argument("--workers", type=int, default=2, help="processes making phantoms")
    p.add_argument("--prepare-only", action="store_true", help="only make the slice cache")
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
    prepare(
        names, seeds + val_seeds(n_val), small=args.small, cache=args.cache, workers=args.workers
    )
    if args.prepare_only:
        return 0
    if len(names) == 1:
        log = run_one(RECIPES[names[0]], args)
        logger.info("done: %s", json.dumps({"model": log["model"], "val": log["validation"]}))
        return 0
    # Both models at once, one thread each, as separate processes.
    procs = []
    for name in names:
        sub = list(argv)
        i = sub.index("--model")
        sub[i + 1] = name
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
        shape = tuple(log["export"]["timing_shape"])
        ms = export.time_onnx(directory / spec.files["fp32"], shape=shape, threads=2, repeats=20)
        log["export"]["ms_per_slice"] = round(ms, 2)
        log["command"] = "python -m radserve.training " + " ".join(args.argv)
        bundle.write_training_log(log, directory)
        bundle.write_model_card(spec, log, directory)
        logger.info("%s: %.1f ms/slice at %s", spec.key, ms, shape)
