"""The training loop: U-Net, Dice + cross-entropy, slice-level validation, best checkpoint.

Reproducible: ``torch.manual_seed(seed)``, a numpy generator seeded from ``seed`` for
patch sampling, a fixed thread count, and a fixed number of steps. ``minutes`` instead
sizes the run from the measured speed of its first steps (then the step count depends
on the machine, and is recorded in the training log).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from radserve.preprocess import normalised_floor
from radserve.training.data import PatchSampler, SliceSet
from radserve.training.net import UNet2d, UNetConfig, count_parameters
from radserve.training.recipes import Recipe

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    model: UNet2d
    steps: int
    seconds: float
    best_step: int
    best_val: float
    history: list[dict] = field(default_factory=list)
    val_per_class: dict[str, float] = field(default_factory=dict)
    parameters: int = 0


def dice_ce_loss(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None
) -> torch.Tensor:
    """Cross-entropy plus batch soft Dice over the foreground classes."""
    ce = F.cross_entropy(logits, target, weight=weight)
    probs = logits.softmax(dim=1)
    onehot = F.one_hot(target, logits.shape[1]).permute(0, 3, 1, 2).to(probs.dtype)
    dims = (0, 2, 3)
    inter = (probs * onehot).sum(dims)[1:]
    denom = (probs.sum(dims) + onehot.sum(dims))[1:]
    dice = (2 * inter + 1.0) / (denom + 1.0)
    return ce + (1.0 - dice.mean())


def _pad_to(img: np.ndarray, k: int, floor: float) -> tuple[np.ndarray, tuple[int, int]]:
    c, h, w = img.shape
    ph, pw = -(-h // k) * k, -(-w // k) * k
    out = np.full((c, ph, pw), floor, np.float32)
    oy, ox = (ph - h) // 2, (pw - w) // 2
    out[:, oy : oy + h, ox : ox + w] = img
    return out, (oy, ox)


def slice_confusion(model: UNet2d, slices: SliceSet, recipe: Recipe) -> np.ndarray:
    """(classes, 3) true-positive / predicted / reference pixel counts over whole slices."""
    k = recipe.spec.num_classes
    counts = np.zeros((k, 3), np.int64)
    floor = normalised_floor(recipe.spec.input.normalisation)
    div = max(recipe.spec.input.divisible_by, UNetConfig(1, k, recipe.train.channels).divisible_by)
    model.eval()
    with torch.no_grad():
        for img, lab in zip(slices.images, slices.labels, strict=True):
            x, (oy, ox) = _pad_to(img.astype(np.float32), div, floor)
            out = model(torch.from_numpy(x)[None])[0].argmax(0).numpy()
            pred = out[oy : oy + lab.shape[0], ox : ox + lab.shape[1]]
            for c in range(1, k):
                p, g = pred == c, lab == c
                counts[c] += (int((p & g).sum()), int(p.sum()), int(g.sum()))
    model.train()
    return counts


def dice_from_counts(counts: np.ndarray) -> np.ndarray:
    """Per-class Dice (nan where a class is absent from prediction and reference)."""
    denom = counts[:, 1] + counts[:, 2]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, 2 * counts[:, 0] / denom, np.nan)


def train_model(
    recipe: Recipe,
    train_slices: SliceSet,
    val_slices: SliceSet,
    *,
    seed: int,
    steps: int | None = None,
    minutes: float | None = None,
) -> TrainResult:
    """Train one recipe; returns the best checkpoint by slice-level validation Dice."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    settings = recipe.train
    spec = recipe.spec
    net = UNet2d(UNetConfig(spec.input.in_channels, spec.num_classes, settings.channels))
    n_params = count_parameters(net)
    logger.info("%s: U-Net %s, %d parameters", spec.name, settings.channels, n_params)
    sampler = PatchSampler(train_slices, recipe, rng)
    opt = torch.optim.AdamW(net.parameters(), lr=settings.lr, weight_decay=1e-4)
    weight = (
        torch.tensor(settings.class_weights, dtype=torch.float32)
        if settings.class_weights
        else None
    )
    total = steps or settings.max_steps
    warmup = 50
    names = [label.name for label in sorted(spec.labels, key=lambda lab: lab.value)]

    def lr_at(step: int) -> float:
        if step < warmup:
            return settings.lr * (step + 1) / warmup
        frac = min(1.0, (step - warmup) / max(1, total - warmup))
        return settings.lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * frac)))

    history: list[dict] = []
    best = (-1.0, 0, {k: v.clone() for k, v in net.state_dict().items()}, {})
    t0 = time.perf_counter()
    running = []
    step = 0
    net.train()
    while step < total:
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x, y = sampler.batch(settings.batch)
        loss = dice_ce_loss(net(torch.from_numpy(x)), torch.from_numpy(y), weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        running.append(loss.item())
        step += 1
        if minutes is not None and step == 30:
            per_step = (time.perf_counter() - t0) / step
            # Validation costs about 5 % of the run; leave that out of the budget.
            total = max(60, min(settings.max_steps, int(0.95 * minutes * 60 / per_step)))
            logger.info(
                "%s: %.2f s/step -> %d steps in %.0f min", spec.name, per_step, total, minutes
            )
        if step % settings.val_every == 0 or step == total:
            counts = slice_confusion(net, val_slices, recipe)
            dice = dice_from_counts(counts)[1:]
            score = float(np.nanmean(dice))
            per_class = {n: round(float(d), 4) for n, d in zip(names, dice, strict=True)}
            entry = {
                "step": step,
                "seconds": round(time.perf_counter() - t0, 1),
                "lr": round(lr_at(step - 1), 6),
                "train_loss": round(float(np.mean(running)), 4),
                "val_dice_mean": round(score, 4),
                "val_dice": per_class,
            }
            history.append(entry)
            running = []
            logger.info(
                "%s step %d/%d (%.0fs): loss %.4f val Dice %.4f %s",
                spec.name,
                step,
                total,
                entry["seconds"],
                entry["train_loss"],
                score,
                per_class,
            )
            if score > best[0]:
                best = (score, step, {k: v.clone() for k, v in net.state_dict().items()}, per_class)
    net.load_state_dict(best[2])
    net.eval()
    return TrainResult(
        model=net,
        steps=step,
        seconds=time.perf_counter() - t0,
        best_step=best[1],
        best_val=best[0],
        history=history,
        val_per_class=best[3],
        parameters=n_params,
    )
