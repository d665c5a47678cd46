"""nnU-Net v2 trained-model folders made here, for the benchmark and the tests.

``plans.json`` is what nnU-Net's planner writes for a 3d_fullres CT configuration:
by default shrunk (three stages, a 16x32x32 patch, 8..32 features) so a CPU runs it in
seconds; :func:`default_ct_plans` gives the size nnU-Net's default planner picks for a
CT at about 1 mm (six stages, 32..320 features, a 128x128x128 patch). The weights are
nnU-Net's own random initialisation (He) under a fixed seed, one set per fold, saved as
``checkpoint_final.pth`` the way nnUNetTrainer saves them. Nothing is downloaded;
needs the ``nnunet`` extra (torch, nnunetv2) only to write checkpoints.

Random weights make logits that are nearly tied almost everywhere (a deep random
network's classes differ by a small fraction of their size), so any rounding
anywhere flips labels: nnU-Net's own float16 logit accumulation does (see the README's
issue 18 section). ``train_on`` gives a model with decisive logits instead, still
built here, taught the intensity classes of a CT (:func:`hu_band_target`) in one of two
ways: ``train_steps`` > 0 trains the whole network briefly (:func:`train_briefly`:
Adam, cross-entropy, random crops); otherwise only its segmentation head (the last
1x1x1 convolution) is fitted by least squares on the random body's features
(:func:`fit_head`). The second is cheap but stays close to random: the random body's
features are chaotic enough that two float32 implementations (OpenVINO, torch) differ
by ~2% of their spread, which no linear head rises above (issue 18, session 10).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CONFIG = "3d_fullres"
FOLDER = f"nnUNetTrainer__nnUNetPlans__{CONFIG}"


def tiny_plans(
    *,
    patch: tuple[int, int, int] = (16, 32, 32),
    spacing: tuple[float, float, float] = (2.0, 1.5, 1.5),
    channels: int = 1,
    data_order: int = 3,
    separate_z: bool | None = None,
    features: tuple[int, ...] = (8, 16, 32),
    kernels: tuple[tuple[int, int, int], ...] = ((1, 3, 3), (3, 3, 3), (3, 3, 3)),
    strides: tuple[tuple[int, int, int], ...] = ((1, 1, 1), (1, 2, 2), (2, 2, 2)),
    schemes: tuple[str, ...] | None = None,
    use_mask: tuple[bool, ...] | None = None,
) -> dict:
    """``schemes``: each channel's nnU-Net normalization (default CTNormalization);
    ``use_mask``: its use_mask_for_norm (default False); ``channels`` is then their count."""
    if schemes is not None:
        channels = len(schemes)
    intensity = {
        str(c): {
            "max": 1500.0, "mean": 40.0 + 10 * c, "median": 45.0, "min": -1024.0,
            "percentile_00_5": -900.0, "percentile_99_5": 600.0, "std": 180.0,
        }
        for c in range(channels)
    }  # fmt: skip
    return {
        "dataset_name": "Dataset901_Tiny",
        "plans_name": "nnUNetPlans",
        "original_median_spacing_after_transp": list(spacing),
        "original_median_shape_after_transp": [40, 64, 64],
        "image_reader_writer": "SimpleITKIO",
        "transpose_forward": [0, 1, 2],
        "transpose_backward": [0, 1, 2],
        "experiment_planner_used": "ExperimentPlanner",
        "label_manager": "LabelManager",
        "foreground_intensity_properties_per_channel": intensity,
        "configurations": {
            CONFIG: {
                "data_identifier": "nnUNetPlans_3d_fullres",
                "preprocessor_name": "DefaultPreprocessor",
                "batch_size": 2,
                "patch_size": list(patch),
                "median_image_size_in_voxels": [40, 64, 64],
                "spacing": list(spacing),
                "normalization_schemes": list(schemes or ["CTNormalization"] * channels),
                "use_mask_for_norm": list(use_mask or [False] * channels),
                "resampling_fn_data": "resample_data_or_seg_to_shape",
                "resampling_fn_seg": "resample_data_or_seg_to_shape",
                "resampling_fn_data_kwargs": {
                    "is_seg": False, "order": data_order, "order_z": 0,
                    "force_separate_z": separate_z,
                },
                "resampling_fn_seg_kwargs": {
                    "is_seg": True, "order": 1, "order_z": 0, "force_separate_z": separate_z,
                },
                "resampling_fn_probabilities": "resample_data_or_seg_to_shape",
                "resampling_fn_probabilities_kwargs": {
                    "is_seg": False, "order": 1, "order_z": 0, "force_separate_z": separate_z,
                },
                "architecture": {
                    "network_class_name": (
                        "dynamic_network_architectures.architectures.unet.PlainConvUNet"
                    ),
                    "arch_kwargs": {
                        "n_stages": len(features),
                        "features_per_stage": list(features),
                        "conv_op": "torch.nn.modules.conv.Conv3d",
                        "kernel_sizes": [list(k) for k in kernels],
                        "strides": [list(s) for s in strides],
                        "n_conv_per_stage": [2] * len(features),
                        "n_conv_per_stage_decoder": [2] * (len(features) - 1),
                        "conv_bias": True,
                        "norm_op": "torch.nn.modules.instancenorm.InstanceNorm3d",
                        "norm_op_kwargs": {"eps": 1e-05, "affine": True},
                        "dropout_op": None,
                        "dropout_op_kwargs": None,
                        "nonlin": "torch.nn.LeakyReLU",
                        "nonlin_kwargs": {"inplace": True},
                    },
                    "_kw_requires_import": ["conv_op", "norm_op", "dropout_op", "nonlin"],
                },
                "batch_dice": False,
            }
        },
    }  # fmt: skip


def default_ct_plans(spacing: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> dict:
    """nnU-Net's default 3d_fullres plan shape for an isotropic-ish CT (as its planner
    writes for e.g. abdominal CT at ~1 mm): patch 128^3, six stages of 32..320 features,
    3x3x3 kernels, stride 2 per stage."""
    return tiny_plans(
        patch=(128, 128, 128),
        spacing=spacing,
        features=(32, 64, 128, 256, 320, 320),
        kernels=((3, 3, 3),) * 6,
        strides=((1, 1, 1),) + ((2, 2, 2),) * 5,
    )


HU_BANDS = {"background": 0, "fat": 1, "soft_tissue": 2, "bone": 3}


def hu_band_target(hu: np.ndarray) -> np.ndarray:
    """Intensity classes of a CT (HU): fat -200..-30, soft tissue -30..200, bone above
    200, background elsewhere (air, lung). What a linear head on a random network's
    features can learn, so the fitted model's logits are decisive except at edges."""
    target = np.zeros(hu.shape, np.int64)
    target[(hu > -200) & (hu <= -30)] = 1
    target[(hu > -30) & (hu <= 200)] = 2
    target[hu > 200] = 3
    return target


def tiny_dataset(
    *,
    regions: bool = False,
    channels: int = 1,
    bands: bool = False,
    channel_names: tuple[str, ...] | None = None,
) -> dict:
    names = {str(c): n for c, n in enumerate(channel_names or ("CT", "PET"))}
    if bands:
        labels, extra = dict(HU_BANDS), {}
    elif regions:
        labels: dict = {"background": 0, "kidney": [1, 2], "tumour": 2}
        extra = {"regions_class_order": [1, 2]}
    else:
        labels, extra = {"background": 0, "liver": 1, "spleen": 2, "lesion": 3}, {}
    return {
        "channel_names": {str(c): names[str(c)] for c in range(channels)},
        "labels": labels,
        "numTraining": 10,
        "file_ending": ".nii.gz",
        **extra,
    }


def make_results_folder(
    root: Path,
    *,
    folds: tuple[int | str, ...] = (0, 1),
    regions: bool = False,
    mirror_axes: tuple[int, ...] | None = (0, 1, 2),
    seed: int = 0,
    plans: dict | None = None,
    train_on: np.ndarray | None = None,
    train_steps: int = 0,
    train_lr: float = 1e-3,
    channel_names: tuple[str, ...] | None = None,
    configuration: str = CONFIG,
    trainer: str = "nnUNetTrainer",
    checkpoint: str = "checkpoint_final.pth",
    dataset_extra: dict | None = None,
    **plan_options,
) -> Path:
    """Write ``root/<trainer folder>`` with dataset.json, plans.json and checkpoints
    (``plans``: a whole plans dict, else :func:`tiny_plans` with ``plan_options``).

    ``train_on``: a CT in HU (D, H, W, about the model's spacing, at least one patch in
    size); the labels are then :data:`HU_BANDS`, and each fold is trained for
    ``train_steps`` steps at ``train_lr`` on it (:func:`train_briefly`) or, with none, has its head
    fitted to it (:func:`fit_head`).

    ``configuration``, ``trainer`` and the plans' ``plans_name`` name the folder
    (``<trainer>__<plans>__<configuration>``); ``folds`` may hold ``"all"``; each fold's
    weights are saved as ``checkpoint``; ``dataset_extra`` is merged into dataset.json."""
    import torch
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    plans = plans or tiny_plans(**plan_options)
    folder = root / f"{trainer}__{plans.get('plans_name', 'nnUNetPlans')}__{configuration}"
    folder.mkdir(parents=True)
    manager = PlansManager(plans)
    config = manager.get_configuration(configuration)
    channels = len(config.normalization_schemes)
    dataset = tiny_dataset(
        regions=regions, channels=channels, bands=train_on is not None, channel_names=channel_names
    )
    dataset.update(dataset_extra or {})
    (folder / "plans.json").write_text(json.dumps(plans, indent=2))
    (folder / "dataset.json").write_text(json.dumps(dataset, indent=2))
    heads = manager.get_label_manager(dataset).num_segmentation_heads
    for i, fold in enumerate(folds):
        k = fold if isinstance(fold, int) else i
        torch.manual_seed(seed + k)
        net = nnUNetTrainer.build_network_architecture(
            manager, config, len(dataset["channel_names"]), heads, enable_deep_supervision=False
        )
        if train_on is not None and train_steps > 0:
            train_briefly(net, train_on, plans, steps=train_steps, seed=seed + k, lr=train_lr)
        elif train_on is not None:
            fit_head(net, train_on, plans, config.patch_size)
        (folder / f"fold_{fold}").mkdir()
        torch.save(
            trainer_checkpoint(net, trainer, plans, configuration, fold, dataset, mirror_axes),
            folder / f"fold_{fold}" / checkpoint,
        )
    return folder


def trainer_checkpoint(
    net, trainer: str, plans: dict, configuration: str, fold, dataset: dict, mirror_axes
) -> dict:
    """What ``nnUNetTrainer.save_checkpoint`` writes, field for field: the optimizer's
    state (nnU-Net's SGD, Nesterov momentum), the logger's per-epoch numpy float64
    values, ``_best_ema`` and the trainer's init arguments with its ``torch.device``.
    The importer loads it with ``weights_only=True``, so these are the globals a real
    checkpoint needs allowed (radserve.importers.nnunet)."""
    import torch

    optimizer = torch.optim.SGD(
        net.parameters(), 1e-2, weight_decay=3e-5, momentum=0.99, nesterov=True
    )
    for parameter in net.parameters():  # one step: the momentum buffers a real run has
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    dice = np.float64(0.5)
    logging = {
        "mean_fg_dice": [dice],
        "ema_fg_dice": [dice],
        "dice_per_class_or_region": [[dice]],
        "train_losses": [np.mean(np.ones(2, np.float32))],
        "val_losses": [np.float64(-0.1)],
        "lrs": [1e-2],
        "epoch_start_timestamps": [0.0],
        "epoch_end_timestamps": [1.0],
    }
    init_args = {"plans": plans, "configuration": configuration, "fold": fold,
                 "dataset_json": dataset, "device": torch.device("cpu")}  # fmt: skip
    return {
        "network_weights": net.state_dict(),
        "optimizer_state": optimizer.state_dict(),
        "grad_scaler_state": None,
        "logging": logging,
        "_best_ema": dice,
        "current_epoch": 1,
        "init_args": init_args,
        "trainer_name": trainer,
        "inference_allowed_mirroring_axes": mirror_axes,
    }


def _normalised(hu: np.ndarray, plans: dict) -> np.ndarray:
    """``hu`` as the plans' CT normalisation makes it (clip to the percentiles, z-score)."""
    props = plans["foreground_intensity_properties_per_channel"]["0"]
    x = np.clip(hu, props["percentile_00_5"], props["percentile_99_5"])
    return ((x - props["mean"]) / max(props["std"], 1e-8)).astype(np.float32)


def train_crop(plans: dict, edge: int = 64) -> tuple[int, ...]:
    """The training crop: ``edge`` voxels per axis (at most the patch), a multiple of
    the network's total stride so every stage sees whole voxels."""
    config = plans["configurations"][CONFIG]
    strides = config["architecture"]["arch_kwargs"]["strides"]
    total = [int(np.prod([s[a] for s in strides])) for a in range(3)]
    return tuple(
        max(t, min(p, edge) // t * t) for p, t in zip(config["patch_size"], total, strict=True)
    )


def train_briefly(
    net, hu: np.ndarray, plans: dict, *, steps: int, seed: int = 0, lr: float = 1e-3
) -> list[float]:
    """Train ``net`` for ``steps`` Adam steps of cross-entropy against
    :func:`hu_band_target` of ``hu``, one random :func:`train_crop` per step (the
    plans' CT normalisation; torch's CPU threads). What a short training run gives a
    network: features that separate the classes, so logits decide well away from the
    class edges. Deterministic for a seed (on one torch build and thread count).
    Returns the loss per step."""
    import torch

    x, target = _normalised(hu, plans), hu_band_target(hu)
    crop = train_crop(plans)
    if any(n < c for n, c in zip(x.shape, crop, strict=True)):
        raise ValueError(f"train_on {x.shape} is smaller than the training crop {crop}")
    rng = np.random.default_rng(seed)
    optimiser = torch.optim.Adam(net.parameters(), lr=lr)
    losses = []
    net.train()
    for _ in range(steps):
        starts = [int(rng.integers(0, n - c + 1)) for n, c in zip(x.shape, crop, strict=True)]
        box = tuple(slice(s, s + c) for s, c in zip(starts, crop, strict=True))
        image = torch.from_numpy(np.ascontiguousarray(x[box]))[None, None]
        loss = torch.nn.functional.cross_entropy(net(image), torch.from_numpy(target[box])[None])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(float(loss.detach()))
    net.eval()
    return losses


def fit_head(net, hu: np.ndarray, plans: dict, patch: list[int], per_class: int = 20000) -> None:
    """Fit ``net``'s last 1x1x1 convolution to :func:`hu_band_target` of ``hu``.

    One forward pass over the patch of ``hu`` where the classes are most even
    (normalised as the plans' CT normalisation does) records the head's input
    features; ridge regression from them (plus a bias) to one-hot targets scaled to
    +-4, on up to ``per_class`` voxels of each class, gives the head's weights.
    Deterministic (fixed sampling seed)."""
    import torch

    block = _most_mixed_block(hu, patch)
    x = _normalised(block, plans)
    head = net.decoder.seg_layers[-1]
    seen: list = []
    hook = head.register_forward_hook(lambda _m, args, _out: seen.append(args[0]))
    with torch.no_grad():
        net.eval()
        net(torch.from_numpy(x)[None, None])
    hook.remove()
    feats = seen[0][0].reshape(seen[0].shape[1], -1).numpy()
    target = hu_band_target(block).ravel()
    classes = head.weight.shape[0]
    rng = np.random.default_rng(0)
    picks = [
        rng.choice(idx, min(per_class, len(idx)), replace=False)
        for c in range(classes)
        if len(idx := np.flatnonzero(target == c))
    ]
    pick = np.concatenate(picks)
    a = np.vstack([feats[:, pick].astype(np.float64), np.ones(len(pick))]).T
    y = np.full((len(pick), classes), -4.0)
    y[np.arange(len(pick)), target[pick]] = 4.0
    w = np.linalg.solve(a.T @ a + 1e-3 * np.eye(a.shape[1]), a.T @ y)
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(w[:-1].T.astype(np.float32)).reshape(head.weight.shape))
        head.bias.copy_(torch.from_numpy(w[-1].astype(np.float32)))


def _most_mixed_block(hu: np.ndarray, patch: list[int]) -> np.ndarray:
    """The patch-sized block of ``hu`` (starts on a 5-point grid per axis) whose rarest
    intensity class is the most frequent, among those with the most classes: the head
    must see every class to learn it."""
    if any(n < p for n, p in zip(hu.shape, patch, strict=True)):
        raise ValueError(f"train_on {hu.shape} is smaller than the patch {patch}")
    target = hu_band_target(hu[::2, ::2, ::2])  # counting at half resolution
    half = [max(1, p // 2) for p in patch]
    grids = [
        sorted({int(s) for s in np.linspace(0, max(0, n - h), 5)})
        for n, h in zip(target.shape, half, strict=True)
    ]
    best, start = (0, 0), (0, 0, 0)
    for z in grids[0]:
        for y in grids[1]:
            for x in grids[2]:
                counts = np.bincount(
                    target[z : z + half[0], y : y + half[1], x : x + half[2]].ravel(),
                    minlength=len(HU_BANDS),
                )
                score = (int((counts > 0).sum()), int(counts[counts > 0].min()))
                if score > best:
                    best, start = score, (2 * z, 2 * y, 2 * x)
    starts = [min(s, n - p) for s, n, p in zip(start, hu.shape, patch, strict=True)]
    return hu[tuple(slice(s, s + p) for s, p in zip(starts, patch, strict=True))]
