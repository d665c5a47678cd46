"""Training slices from synthetic phantoms, made exactly as inference makes its inputs.

Per phantom: crop on the native grid (organs: ``body_bbox``; lesions: the box of the
liver and lungs grown by ``roi_margin_mm``), ``resample_inplane`` the HU crop
(linear) and the label crop (nearest), ``normalise``, then stack each slice with its
``context_slices`` neighbours (clamped at the volume's ends) as channels. These are the
functions :mod:`radserve.inference.slices` uses, in the same order.

Slices are cached as ``.npz`` per phantom seed under a cache folder (never the repo),
keyed by everything that changes the arrays, so a rerun reuses them. No torch here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radserve.domain.volume import Volume
from radserve.models.manifest import ModelSpec
from radserve.preprocess import (
    bbox_of_mask,
    body_bbox,
    expand_bbox,
    normalise,
    normalised_floor,
    resample_inplane,
)
from radserve.training.recipes import LESION_KIND_CLASS, ORGAN_LABELS, TRAIN_SEED_RANGE, Recipe

logger = logging.getLogger(__name__)

CACHE_VERSION = 1
NUM_ORGANS = len(ORGAN_LABELS)  # phantom organ values 1..9 are the model's; 10 (ribs) -> 0


def default_cache_dir() -> Path:
    """``$RADSERVE_TRAIN_CACHE`` or ``/tmp/radserve-train-cache``."""
    return Path(os.environ.get("RADSERVE_TRAIN_CACHE", "/tmp/radserve-train-cache"))


@dataclass
class PhantomArrays:
    """What training needs from one phantom: HU, organ labels, lesion classes, lesions."""

    ct: Volume
    organs: np.ndarray  # uint8, model organ values (ribs removed)
    lesion_classes: np.ndarray  # uint8, 0 / 1 liver lesion / 2 lung nodule
    lesion_instances: np.ndarray  # uint16 instance ids
    lesions: list[dict]  # id, kind, class, diameter_mm, organ


def load_phantom(seed: int, *, small: bool = False, n_lesions: int | None = None) -> PhantomArrays:
    """Generate phantom ``seed`` with ``radserve.phantom`` and map its labels.

    ``n_lesions`` overrides the drawn lesion count (training phantoms carry more lesions
    than studies do, for more positive examples); anatomy and acquisition are unchanged.
    """
    from radserve.phantom import PhantomSpec, generate_phantom

    spec = PhantomSpec.random(seed, small=small)
    if n_lesions is not None:
        spec = dataclasses.replace(spec, n_lesions=n_lesions)
    phantom = generate_phantom(spec)
    organs = phantom.organs.array
    organs = np.where(organs <= NUM_ORGANS, organs, 0).astype(np.uint8)
    instances = np.asarray(phantom.lesions.array)
    ids = [int(lesion.lesion_id) for lesion in phantom.lesion_list]
    lut = np.zeros(max([int(instances.max()), *ids]) + 1, np.uint8)
    lesions = []
    for lesion in phantom.lesion_list:
        cls = LESION_KIND_CLASS[str(lesion.kind)]
        lut[int(lesion.lesion_id)] = cls
        lesions.append(
            {
                "id": int(lesion.lesion_id),
                "kind": str(lesion.kind),
                "class": cls,
                "diameter_mm": float(lesion.diameter_mm),
                "centre_mm": [float(c) for c in lesion.centre_mm],
                "organ": str(lesion.organ),
            }
        )
    return PhantomArrays(
        ct=phantom.ct,
        organs=organs,
        lesion_classes=lut[instances],
        lesion_instances=instances,
        lesions=lesions,
    )


def training_lesion_count(seed: int) -> int:
    """Lesions painted into training phantom ``seed`` (6-12, drawn from the seed)."""
    return int(np.random.default_rng([seed, 99]).integers(6, 13))


def roi_box(organs: np.ndarray, spec: ModelSpec, spacing: tuple[float, float, float]):
    """Box of the ``roi_labels`` organs grown by ``roi_margin_mm`` (native indices)."""
    organ_values = {name: i + 1 for i, (name, *_rest) in enumerate(ORGAN_LABELS)}
    values = [organ_values[name] for name in spec.input.roi_labels]
    box = bbox_of_mask(np.isin(organs, values))
    if box is None:
        return None
    margin = tuple(int(np.ceil(spec.input.roi_margin_mm / s)) for s in spacing)
    return expand_bbox(box, margin, organs.shape)


@dataclass
class SliceSet:
    """Preprocessed training samples of one or more phantoms (variable in-plane size)."""

    images: list[np.ndarray]  # (C, H, W) float16, normalised
    labels: list[np.ndarray]  # (H, W) uint8 class map
    seeds: list[int]

    def __len__(self) -> int:
        return len(self.images)

    def extend(self, other: SliceSet) -> None:
        self.images += other.images
        self.labels += other.labels
        self.seeds += other.seeds

    @property
    def has_foreground(self) -> np.ndarray:
        return np.array([bool(lab.any()) for lab in self.labels])


def _source_digest() -> str:
    """Digest of the phantom generator's and this module's source: a change to either
    invalidates cached slices."""
    import radserve.phantom

    digest = hashlib.sha256(Path(__file__).read_bytes())
    for path in sorted(Path(radserve.phantom.__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cache_key(recipe: Recipe, n_slices: int) -> str:
    spec = recipe.spec
    blob = json.dumps(
        {
            "v": CACHE_VERSION,
            "source": _source_digest(),
            "name": spec.name,
            "input": spec.input.model_dump(mode="json"),
            "n_slices": n_slices,
            "lesion_fraction": recipe.train.lesion_fraction,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def phantom_slices(
    recipe: Recipe, arrays: PhantomArrays, n_slices: int, rng: np.random.Generator
) -> SliceSet:
    """Up to ``n_slices`` preprocessed slices of one phantom (lesion slices favoured)."""
    spec = recipe.spec
    ct = arrays.ct
    if spec.name == "organs":
        box = body_bbox(ct)
        target = arrays.organs
    else:
        box = roi_box(arrays.organs, spec, ct.spacing)
        target = arrays.lesion_classes
        if box is None:
            return SliceSet([], [], [])
    zs, ys, xs = box
    candidates = np.arange(zs.start, zs.stop)
    if recipe.train.lesion_fraction > 0:
        positive = candidates[target[zs, ys, xs].any(axis=(1, 2))]
        negative = np.setdiff1d(candidates, positive)
        n_pos = min(len(positive), round(n_slices * 0.6))
        chosen = np.concatenate(
            [
                rng.choice(positive, n_pos, replace=False),
                rng.choice(negative, min(len(negative), n_slices - n_pos), replace=False),
            ]
        )
    else:
        chosen = rng.choice(candidates, min(len(candidates), n_slices), replace=False)
    chosen = np.sort(chosen).astype(int)
    ctx = spec.input.context_slices
    nz = ct.shape[0]
    needed = np.unique(np.clip(chosen[:, None] + np.arange(-ctx, ctx + 1)[None, :], 0, nz - 1))
    where = {int(z): i for i, z in enumerate(needed)}
    yx = tuple(spec.input.spacing[1:])
    hu = Volume(np.ascontiguousarray(ct.array[needed][:, ys, xs]), ct.affine)
    image = normalise(resample_inplane(hu, yx, order=1).array, spec.input.normalisation)
    lab = Volume(np.ascontiguousarray(target[chosen][:, ys, xs]), ct.affine)
    labels = resample_inplane(lab, yx, order=0).array
    images = []
    for z in chosen:
        idx = [where[int(c)] for c in np.clip(np.arange(z - ctx, z + ctx + 1), 0, nz - 1)]
        images.append(image[idx].astype(np.float16))
    return SliceSet(images, [lab_ for lab_ in labels], [0] * len(images))


def _cache_path(recipe: Recipe, seed: int, small: bool, cache_dir: Path | None) -> Path:
    n = recipe.train.slices_per_phantom
    folder = (cache_dir or default_cache_dir()) / recipe.name / _cache_key(recipe, n)
    return folder / f"{seed}{'s' if small else ''}.npz"


def _save(part: SliceSet, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {f"img{i}": a for i, a in enumerate(part.images)}
    payload.update({f"lab{i}": a for i, a in enumerate(part.labels)})
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, n=len(part.images), **payload)
    tmp.replace(path)


def _load(path: Path, seed: int) -> SliceSet:
    with np.load(path) as z:
        n = int(z["n"])
        return SliceSet(
            [z[f"img{i}"] for i in range(n)], [z[f"lab{i}"] for i in range(n)], [seed] * n
        )


def build_slices_multi(
    recipes: list[Recipe], seed: int, *, small: bool = False, cache_dir: Path | None = None
) -> int:
    """Cache the slices of phantom ``seed`` for every recipe, generating it at most once.

    Returns the number of recipes whose slices had to be made.
    """
    missing = [r for r in recipes if not _cache_path(r, seed, small, cache_dir).exists()]
    if not missing:
        return 0
    n_lesions = training_lesion_count(seed) if seed >= TRAIN_SEED_RANGE[0] else None
    arrays = load_phantom(seed, small=small, n_lesions=n_lesions)
    for recipe in missing:
        rng = np.random.default_rng([seed, len(recipe.name)])
        part = phantom_slices(recipe, arrays, recipe.train.slices_per_phantom, rng)
        _save(part, _cache_path(recipe, seed, small, cache_dir))
        logger.info("%s: phantom %d -> %d slices", recipe.name, seed, len(part.images))
    return len(missing)


def build_slices(
    recipe: Recipe,
    seeds: list[int],
    *,
    cache_dir: Path | None = None,
    small: bool = False,
) -> SliceSet:
    """Preprocessed slices of the given phantom seeds, generated once and cached."""
    out = SliceSet([], [], [])
    for seed in seeds:
        path = _cache_path(recipe, seed, small, cache_dir)
        if not path.exists():
            build_slices_multi([recipe], seed, small=small, cache_dir=cache_dir)
        out.extend(_load(path, seed))
    return out


class PatchSampler:
    """Random fixed-size training patches from a :class:`SliceSet`, reproducibly.

    With ``lesion_fraction`` > 0, that share of patches is centred (with jitter) on a
    random foreground pixel; the rest are uniform random crops. Images smaller than the
    patch are padded with the normalised floor (air), labels with background. No
    mirroring: left/right labels must keep their side.
    """

    def __init__(self, slices: SliceSet, recipe: Recipe, rng: np.random.Generator) -> None:
        self.slices = slices
        self.patch = recipe.train.patch
        self.fraction = recipe.train.lesion_fraction
        self.floor = normalised_floor(recipe.spec.input.normalisation)
        self.rng = rng
        self.positive = np.flatnonzero(slices.has_foreground)
        self.ch = recipe.spec.input.in_channels

    def _crop(self, i: int, centre: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray]:
        img, lab = self.slices.images[i], self.slices.labels[i]
        p = self.patch
        h, w = lab.shape
        ph, pw = max(h, p), max(w, p)
        out_img = np.full((img.shape[0], ph, pw), self.floor, np.float32)
        out_lab = np.zeros((ph, pw), np.uint8)
        oy, ox = self.rng.integers(0, ph - h + 1), self.rng.integers(0, pw - w + 1)
        out_img[:, oy : oy + h, ox : ox + w] = img
        out_lab[oy : oy + h, ox : ox + w] = lab
        if centre is None:
            y0 = int(self.rng.integers(0, ph - p + 1))
            x0 = int(self.rng.integers(0, pw - p + 1))
        else:
            jitter = self.rng.integers(-p // 3, p // 3 + 1, size=2)
            y0 = int(np.clip(centre[0] + oy + jitter[0] - p // 2, 0, ph - p))
            x0 = int(np.clip(centre[1] + ox + jitter[1] - p // 2, 0, pw - p))
        return out_img[:, y0 : y0 + p, x0 : x0 + p], out_lab[y0 : y0 + p, x0 : x0 + p]

    def batch(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(N, C, P, P) float32 images and (N, P, P) int64 labels."""
        imgs, labs = [], []
        for _ in range(n):
            if self.fraction > 0 and self.positive.size and self.rng.random() < self.fraction:
                i = int(self.rng.choice(self.positive))
                fg = np.argwhere(self.slices.labels[i] > 0)
                centre = tuple(int(v) for v in fg[self.rng.integers(len(fg))])
            else:
                i = int(self.rng.integers(len(self.slices)))
                centre = None
            img, lab = self._crop(i, centre)
            # Mild intensity augmentation in normalised units (scanner calibration drift).
            img = img * np.float32(1.0 + self.rng.normal(0, 0.03)) + np.float32(
                self.rng.normal(0, 0.02)
            )
            imgs.append(img)
            labs.append(lab)
        return np.stack(imgs).astype(np.float32), np.stack(labs).astype(np.int64)
