"""The training loop: U-Net, Dice + cross-entropy, slice-level validation, best checkpoint.

Reproducible: ``torch.manual_seed(seed)``, a numpy generator seeded from ``seed`` for
patch sampling, a fixed thread count, and a fixed number of steps. ``minutes`` instead
sizes the run from the measured speed of its first steps (then the step count depends
on the machine, and is recorded in the training log).

On a GPU (``device="cuda"``) the patch sampler would starve the device, so
``loader_workers`` processes sample batches in parallel, each with its own generator
seeded from ``(seed, worker)``: the run is reproducible for a given worker count.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from radserve.host import bf16_slower_reason, cpu_bf16_support
from radserve.preprocess import normalised_floor
from radserve.training.data import LesionPatchSampler, PatchSampler, SliceSet
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
    best_state: dict | None = None  # CPU tensors of the best checkpoint
    # Where the weights were trained (set when loaded from a checkpoint file).
    device: str | None = None
    torch_version: str | None = None
    loader_workers: int = 0
    batch: int | None = None
    autocast: str | None = None
    command: str | None = None
    slices: tuple[int, int] | None = None  # (train, validation) slice counts


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


def sample_dice_ce_loss(
    logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None
) -> torch.Tensor:
    """Cross-entropy plus soft Dice per (patch, foreground class) present in the patch.

    Batch Dice sums pixels over the batch, so one 30 mm lesion outweighs a dozen 5 mm
    ones; per patch each lesion patch counts once. Classes absent from a patch add no
    Dice term (cross-entropy alone punishes false positives there).
    """
    ce = F.cross_entropy(logits, target, weight=weight)
    probs = logits.softmax(dim=1)[:, 1:]
    onehot = F.one_hot(target, logits.shape[1]).permute(0, 3, 1, 2)[:, 1:].to(probs.dtype)
    dims = (2, 3)
    present = onehot.sum(dims) > 0
    if not bool(present.any()):
        return ce
    inter = (probs * onehot).sum(dims)
    denom = probs.sum(dims) + onehot.sum(dims)
    dice = (2 * inter + 1.0) / (denom + 1.0)
    return ce + (1.0 - dice[present]).mean()


LOSSES = {"batch_dice": dice_ce_loss, "sample_dice": sample_dice_ce_loss}


def _pad_to(img: np.ndarray, k: int, floor: float) -> tuple[np.ndarray, tuple[int, int]]:
    c, h, w = img.shape
    ph, pw = -(-h // k) * k, -(-w // k) * k
    out = np.full((c, ph, pw), floor, np.float32)
    oy, ox = (ph - h) // 2, (pw - w) // 2
    out[:, oy : oy + h, ox : ox + w] = img
    return out, (oy, ox)


def _sampled(slices: SliceSet, recipe: Recipe, rng: np.random.Generator, batch: int):
    """Endless (images, labels) tensor batches from the recipe's patch sampler."""
    sampler_class = LesionPatchSampler if recipe.train.sampling == "lesion" else PatchSampler
    sampler = sampler_class(slices, recipe, rng)
    while True:
        x, y = sampler.batch(batch)
        yield torch.from_numpy(x), torch.from_numpy(y)


class _PatchStream(torch.utils.data.IterableDataset):
    """Endless training batches for a DataLoader worker, from its own seeded generator."""

    def __init__(self, slices: SliceSet, recipe: Recipe, seed: int, batch: int) -> None:
        self.slices, self.recipe, self.seed, self.batch = slices, recipe, seed, batch

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        rng = np.random.default_rng([self.seed, 7, worker])
        yield from _sampled(self.slices, self.recipe, rng, self.batch)


def _batches(
    slices: SliceSet, recipe: Recipe, rng: np.random.Generator, seed: int, batch: int, workers: int
):
    """Training batches: sampled in this process, or by ``workers`` loader processes."""
    if workers <= 0:
        yield from _sampled(slices, recipe, rng, batch)
        return
    loader = torch.utils.data.DataLoader(
        _PatchStream(slices, recipe, seed, batch),
        batch_size=None,
        num_workers=workers,
        pin_memory=torch.cuda.is_available(),
        prefetch_factor=4,
    )
    yield from loader


def slice_confusion(
    model: UNet2d, slices: SliceSet, recipe: Recipe, device: str = "cpu"
) -> np.ndarray:
    """(classes, 3) true-positive / predicted / reference pixel counts over whole slices."""
    k = recipe.spec.num_classes
    counts = np.zeros((k, 3), np.int64)
    floor = normalised_floor(recipe.spec.input.normalisation)
    div = max(recipe.spec.input.divisible_by, UNetConfig(1, k, recipe.train.channels).divisible_by)
    model.eval()
    with torch.no_grad():
        for img, lab in zip(slices.images, slices.labels, strict=True):
            x, (oy, ox) = _pad_to(img.astype(np.float32), div, floor)
            out = model(torch.from_numpy(x)[None].to(device))[0].argmax(0).cpu().numpy()
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
    device: str = "cpu",
    loader_workers: int = 0,
    on_validation=None,
) -> TrainResult:
    """Train one recipe; returns the best checkpoint by slice-level validation Dice.

    ``on_validation(result)`` is called after each validation with the best state so
    far (a caller on a leased machine saves it, so a cut-off run still leaves weights).
    """
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    settings = recipe.train
    spec = recipe.spec
    net = UNet2d(UNetConfig(spec.input.in_channels, spec.num_classes, settings.channels))
    net.to(device)
    n_params = count_parameters(net)
    logger.info(
        "%s: U-Net %s, %d parameters, on %s", spec.name, settings.channels, n_params, device
    )
    batches = _batches(train_slices, recipe, rng, seed, settings.batch, loader_workers)
    loss_fn = LOSSES[settings.loss]
    opt = torch.optim.AdamW(net.parameters(), lr=settings.lr, weight_decay=1e-4)
    weight = (
        torch.tensor(settings.class_weights, dtype=torch.float32, device=device)
        if settings.class_weights
        else None
    )
    total = steps or settings.max_steps
    warmup = 50
    use_bf16 = settings.autocast == "bf16"
    if use_bf16 and torch.device(device).type == "cpu":
        slower = bf16_slower_reason(cpu_bf16_support())
        if slower:  # the run would only lose time
            logger.warning("%s: %s; training in float32", spec.name, slower)
            use_bf16 = False
    amp = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=use_bf16)
    autocast = "bf16" if use_bf16 else "off"  # what this run did, for its log
    names = [label.name for label in sorted(spec.labels, key=lambda lab: lab.value)]

    def lr_at(step: int) -> float:
        if step < warmup:
            return settings.lr * (step + 1) / warmup
        frac = min(1.0, (step - warmup) / max(1, total - warmup))
        return settings.lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * frac)))

    history: list[dict] = []
    best = (-1.0, 0, {k: v.detach().to("cpu", copy=True) for k, v in net.state_dict().items()}, {})
    t0 = time.perf_counter()
    running = []
    step = 0
    net.train()
    while step < total:
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with amp:
            logits = net(x)
        loss = loss_fn(logits.float(), y, weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        running.append(loss.item())
        step += 1
        if minutes is not None and step == 50:
            t50 = time.perf_counter()
        if minutes is not None and step == 150:
            # Timed after start-up (loader processes, first kernels); validation costs
            # about 5 % of the run, so it is left out of the budget.
            now = time.perf_counter()
            per_step = (now - t50) / 100
            left = 0.95 * minutes * 60 - (now - t0)
            total = max(step + 10, min(settings.max_steps, step + int(left / per_step)))
            logger.info(
                "%s: %.4f s/step -> %d steps in %.1f min", spec.name, per_step, total, minutes
            )
        if step % settings.val_every == 0 or step == total:
            counts = slice_confusion(net, val_slices, recipe, device)
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
                state = {k: v.detach().to("cpu", copy=True) for k, v in net.state_dict().items()}
                best = (score, step, state, per_class)
            if on_validation is not None:
                on_validation(_result(net, best, step, t0, history, n_params, autocast, load=False))
    return _result(net, best, step, t0, history, n_params, autocast, load=True)


def _result(net, best, step, t0, history, n_params, autocast, *, load: bool) -> TrainResult:
    """The run so far; ``load`` puts the best state into ``net`` (on the CPU, eval mode)."""
    if load:
        net.to("cpu")
        net.load_state_dict(best[2])
        net.eval()
    return TrainResult(
        model=net,
        steps=step,
        seconds=time.perf_counter() - t0,
        best_step=best[1],
        best_val=best[0],
        history=list(history),
        val_per_class=best[3],
        parameters=n_params,
        best_state=best[2],
        autocast=autocast,
    )
