"""Imported nnU-Net models beyond one CT channel and the arrays they are run on: a
CT + PET model (CTNormalization + per-image ZScoreNormalization, channels named CT and
PET) and a one-channel MR ZScore model with use_mask_for_norm, each a tiny folder
(random weights, one fold) imported with the importer's function, with nnU-Net's own
labels (``nnUNetPredictor.predict_single_npy_array``, TTA off). Shared by
tests/integration/test_nnunet_multichannel.py and tools/nnunet_multichannel_agreement.py;
needs the ``nnunet`` extra when run."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from radserve.importers.nnunet import import_nnunet, load_predictor, read_results_folder
from tests.factories.agreement import synthetic_ct
from tests.factories.nnunet_folder import make_results_folder, tiny_plans


def synthetic_pet(ct: np.ndarray, seed: int = 2) -> np.ndarray:
    """SUV-like: 1 in the body, a hot sphere of 8, 0.3 in air, and non-zero where the
    CT's zero frame is (slices 0-1), so the crop is the union of both channels'."""
    rng = np.random.default_rng(seed)
    pet = np.where(ct > -500, 1.0, 0.3).astype(np.float32)
    z, y, x = np.ogrid[: ct.shape[0], : ct.shape[1], : ct.shape[2]]
    hot = ((z - ct.shape[0] / 2) / 4) ** 2 + ((y - ct.shape[1] / 2 + 8) / 6) ** 2 + (
        (x - ct.shape[2] / 2 - 9) / 6
    ) ** 2 < 1
    pet[hot] = 8.0
    pet += rng.gamma(2.0, 0.05, ct.shape).astype(np.float32)
    pet[:, :, :3] = 0.0  # outside the PET's field of view too
    return pet


def synthetic_mr(shape, seed: int = 6) -> np.ndarray:
    """A head-like MR: zero outside an ellipsoid (as skull-stripped MR is), two tissues,
    a zero-valued hole inside (in nnU-Net's filled mask) and noise."""
    rng = np.random.default_rng(seed)
    z, y, x = np.ogrid[: shape[0], : shape[1], : shape[2]]
    c = [s / 2 for s in shape]
    r = ((z - c[0]) / (0.45 * shape[0])) ** 2 + ((y - c[1]) / (0.4 * shape[1])) ** 2
    r = r + ((x - c[2]) / (0.4 * shape[2])) ** 2
    mr = np.zeros(shape, np.float32)
    mr[r < 1] = 400.0
    mr[r < 0.35] = 700.0
    mr += np.where(r < 1, rng.normal(0, 30, shape), 0).astype(np.float32)
    mr[int(c[0]) : int(c[0]) + 2, int(c[1]) : int(c[1]) + 3, int(c[2]) : int(c[2]) + 3] = 0.0
    return mr


def nnunet_labels(folder, stacked: np.ndarray, spacing) -> np.ndarray:
    predictor = load_predictor(read_results_folder(folder))
    return predictor.predict_single_npy_array(stacked.astype(np.float32), {"spacing": spacing})


def ct_pet_case(root: Path) -> tuple[Path, np.ndarray, np.ndarray, np.ndarray, tuple]:
    """The CT + PET model imported under ``root``; (bundle, ct, pet, nnU-Net's labels, spacing)."""
    folder = make_results_folder(
        root / "results",
        folds=(0,),
        schemes=("CTNormalization", "ZScoreNormalization"),
        channel_names=("CT", "PET"),
    )
    bundle = import_nnunet(folder, root / "models", name="tiny-petct")
    ct = synthetic_ct((20, 56, 52), seed=7)
    pet, spacing = synthetic_pet(ct), (2.5, 1.3, 1.4)
    return bundle, ct, pet, nnunet_labels(folder, np.stack([ct, pet]), spacing), spacing


def pet_case(root: Path) -> tuple[Path, np.ndarray, np.ndarray, tuple]:
    """A PET-only model (one channel named PET, ZScoreNormalization) under ``root``;
    (bundle, SUV array, nnU-Net's labels, spacing)."""
    plans = tiny_plans(schemes=("ZScoreNormalization",))
    folder = make_results_folder(root / "results", folds=(0,), plans=plans, channel_names=("PET",))
    bundle = import_nnunet(folder, root / "models", name="tiny-pet")
    pet, spacing = synthetic_pet(synthetic_ct((20, 56, 52), seed=8)), (3.0, 2.0, 2.0)
    return bundle, pet, nnunet_labels(folder, pet[None], spacing), spacing


def mr_case(root: Path) -> tuple[Path, np.ndarray, np.ndarray, tuple]:
    """The MR ZScore (use_mask_for_norm) model under ``root``; (bundle, mr, nnU-Net's labels,
    spacing)."""
    plans = tiny_plans(schemes=("ZScoreNormalization",), use_mask=(True,))
    folder = make_results_folder(root / "results", folds=(0,), plans=plans, channel_names=("T2",))
    bundle = import_nnunet(folder, root / "models", name="tiny-mr")
    mr, spacing = synthetic_mr((22, 60, 54)), (2.4, 1.2, 1.3)
    return bundle, mr, nnunet_labels(folder, mr[None], spacing), spacing
