"""Training checkpoints: the best weights and the run's history in one ``.pt`` file.

A run on a leased GPU machine saves one after every validation, so weights survive a
cut-off run; ``--from-checkpoint`` then exports, validates and bundles them on any
machine (ONNX export and threshold tuning need no GPU).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from radserve import durable
from radserve.training.net import UNet2d, UNetConfig
from radserve.training.recipes import Recipe
from radserve.training.train import TrainResult


def save(
    result: TrainResult, path: Path, *, recipe: Recipe, args: argparse.Namespace, device: str
) -> None:
    """Write atomically (a partial file is never left behind a cut-off run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": recipe.spec.key,
        "channels": list(recipe.train.channels),
        "state_dict": result.best_state,
        "steps": result.steps,
        "seconds": result.seconds,
        "best_step": result.best_step,
        "best_val": result.best_val,
        "history": result.history,
        "val_per_class": result.val_per_class,
        "parameters": result.parameters,
        "device": device,
        "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "torch": str(torch.__version__),
        "loader_workers": args.loader_workers,
        "batch": recipe.train.batch,
        "autocast": result.autocast or "off",
        "slices": list(result.slices) if result.slices else None,
        "command": "python -m radserve.training " + " ".join(args.argv),
    }
    durable.write_with(Path(path), lambda handle: torch.save(payload, handle), mode=0o644)


def load(path: str | Path, recipe: Recipe) -> TrainResult:
    """The checkpoint's best weights in a CPU model of ``recipe``'s shape."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if payload["model"] != recipe.spec.key:
        raise ValueError(f"checkpoint {path} holds {payload['model']}, not {recipe.spec.key}")
    spec = recipe.spec
    net = UNet2d(UNetConfig(spec.input.in_channels, spec.num_classes, tuple(payload["channels"])))
    net.load_state_dict(payload["state_dict"])
    net.eval()
    return TrainResult(
        model=net,
        steps=payload["steps"],
        seconds=payload["seconds"],
        best_step=payload["best_step"],
        best_val=payload["best_val"],
        history=payload["history"],
        val_per_class=payload["val_per_class"],
        parameters=payload["parameters"],
        best_state=payload["state_dict"],
        device=f"{payload['device']} ({payload['device_name']})",
        torch_version=payload["torch"],
        loader_workers=payload["loader_workers"],
        batch=payload["batch"],
        autocast=payload.get("autocast", "off"),
        command=payload["command"],
        slices=tuple(payload["slices"]) if payload.get("slices") else None,
    )
