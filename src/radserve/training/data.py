"""Training slices from synthetic phantoms, made exactly as inference makes its inputs.

Per phantom: crop on the native grid (organs: ``body_bbox``; lesions: the box of the
liver and lungs grown by ``roi_margin_mm``), stack each slice with its
``context_slices`` neighbours as channels (``gather_context``: adjacent native slices,
or every ``context_mm`` in z interpolated between native slices; clamped at the
volume's ends), ``resample_inplane`` the HU (linear) and the label crop (nearest),
``normalise``. These are the functions :mod:`radserve.inference.slices` uses, in the
same order.

Slice choice: organs take random slices of the box; lesions (``sampling="lesion"``)
take slices through every lesion (each lesion equally, small ones included) and keep
per slice the lesion instance map and a hard-negative map (lung vessels, lesion-free
liver), so :class:`LesionPatchSampler` can centre patches per lesion and on the
look-alikes that cause false positives.

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

from radserve import durable
from radserve.domain.volume import Volume
from radserve.models.manifest import ModelSpec
from radserve.preprocess import (
    bbox_of_mask,
    body_bbox,
    context_step,
    expand_bbox,
    gather_context,
    normalise,
    normalised_floor,
    resample_inplane,
)
from radserve.training.recipes import (
    LESION_KIND_CLASS,
    ORGAN_LABELS,
    TRAIN_SEED_RANGE,
    Recipe,
    TrainSettings,
)

logger = logging.getLogger(__name__)

CACHE_VERSION = 2
# Hard-negative map values (lesion recipe): patch centres that look like small lesions.
HARD_VESSEL = 1  # pulmonary vessel inside a lung
HARD_LIVER = 2  # liver parenchyma without lesion
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
    tissue: np.ndarray | None = None  # uint8 phantom tissue classes (anatomy.Tissue)


def load_phantom(
    seed: int,
    *,
    small: bool = False,
    n_lesions: int | None = None,
    lesion_max_diameter_mm: float | None = None,
) -> PhantomArrays:
    """Generate phantom ``seed`` with ``radserve.phantom`` and map its labels.

    ``n_lesions`` overrides the drawn lesion count (training phantoms carry more lesions
    than studies do, for more positive examples) and ``lesion_max_diameter_mm`` caps
    their size (more small lesions); anatomy and acquisition are unchanged.
    """
    from radserve.phantom import PhantomSpec, generate_phantom

    spec = PhantomSpec.random(seed, small=small)
    if n_lesions is not None:
        spec = dataclasses.replace(spec, n_lesions=n_lesions)
    if lesion_max_diameter_mm is not None:
        spec = dataclasses.replace(spec, lesion_max_diameter_mm=lesion_max_diameter_mm)
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
        tissue=np.asarray(phantom.tissue.array),
    )


def training_lesion_count(seed: int, bounds: tuple[int, int] = (6, 12)) -> int:
    """Lesions painted into training phantom ``seed`` (``bounds`` inclusive, from the seed)."""
    return int(np.random.default_rng([seed, 99]).integers(bounds[0], bounds[1] + 1))


def phantom_variant(seed: int, settings: TrainSettings) -> tuple[int | None, float | None]:
    """(lesion count, diameter cap) of phantom ``seed`` for a recipe: validation and
    evaluation seeds keep the generator's own draw (None, None)."""
    if seed < TRAIN_SEED_RANGE[0]:
        return None, None
    n = training_lesion_count(seed, settings.lesions_per_phantom)
    capped = np.random.default_rng([seed, 98]).random() < settings.small_lesion_phantoms
    return n, (settings.lesion_max_diameter_mm if capped else None)


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
    """Preprocessed training samples of one or more phantoms (variable in-plane size).

    ``instances`` and ``hard`` (lesion sampling only) are per-slice lesion instance ids
    and hard-negative maps on the same grid as ``labels``; ``lesion_keys[i]`` lists the
    (seed, lesion id) of the lesions on slice ``i``.
    """

    images: list[np.ndarray]  # (C, H, W) float16, normalised
    labels: list[np.ndarray]  # (H, W) uint8 class map
    seeds: list[int]
    instances: list[np.ndarray] = dataclasses.field(default_factory=list)  # (H, W) uint16
    hard: list[np.ndarray] = dataclasses.field(default_factory=list)  # (H, W) uint8

    def __len__(self) -> int:
        return len(self.images)

    def extend(self, other: SliceSet) -> None:
        self.images += other.images
        self.labels += other.labels
        self.seeds += other.seeds
        self.instances += other.instances
        self.hard += other.hard

    @property
    def has_foreground(self) -> np.ndarray:
        return np.array([bool(lab.any()) for lab in self.labels])


def _source_digest() -> str:
    """Digest of the phantom generator's, the preprocessing's and this module's source:
    a change to any invalidates cached slices."""
    import radserve.phantom
    import radserve.preprocess

    digest = hashlib.sha256(Path(__file__).read_bytes())
    for package in (radserve.phantom, radserve.preprocess):
        for path in sorted(Path(package.__file__).parent.glob("*.py")):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cache_key(recipe: Recipe, n_slices: int) -> str:
    spec = recipe.spec
    settings = recipe.train
    blob = json.dumps(
        {
            "v": CACHE_VERSION,
            "source": _source_digest(),
            "name": spec.name,
            "input": spec.input.model_dump(mode="json"),
            "n_slices": n_slices,
            "lesion_fraction": settings.lesion_fraction,
            "sampling": settings.sampling,
            "lesions_per_phantom": list(settings.lesions_per_phantom),
            "small_lesion_phantoms": settings.small_lesion_phantoms,
            "lesion_max_diameter_mm": settings.lesion_max_diameter_mm,
            "slices_per_lesion": settings.slices_per_lesion,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _model_grid(
    recipe: Recipe, arrays: PhantomArrays, box, chosen: np.ndarray
) -> tuple[np.ndarray, tuple[float, float]]:
    """(N, C, H, W) normalised images of slices ``chosen``: gather the 2.5D context on
    the native crop, resample in-plane, normalise, exactly as ``SliceTask`` does."""
    spec = recipe.spec
    ct = arrays.ct
    _zs, ys, xs = box
    step = context_step(spec.input.context_mm, ct.spacing[0])
    stack = gather_context(ct.array, chosen, spec.input.context_slices, step, (ys, xs))
    n, c, h, w = stack.shape
    yx = tuple(spec.input.spacing[1:])
    flat = resample_inplane(Volume(stack.reshape(n * c, h, w), ct.affine), yx, order=1).array
    image = normalise(flat, spec.input.normalisation)
    return image.reshape(n, c, *image.shape[1:]), yx


def _labels_on_grid(array: np.ndarray, arrays: PhantomArrays, box, chosen, yx) -> np.ndarray:
    _zs, ys, xs = box
    lab = Volume(np.ascontiguousarray(array[chosen][:, ys, xs]), arrays.ct.affine)
    return resample_inplane(lab, yx, order=0).array


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
    if recipe.train.sampling == "lesion":
        return _lesion_slices(recipe, arrays, box, n_slices, rng)
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
    image, yx = _model_grid(recipe, arrays, box, chosen)
    labels = _labels_on_grid(target, arrays, box, chosen, yx)
    images = [img.astype(np.float16) for img in image]
    return SliceSet(images, [lab_ for lab_ in labels], [0] * len(images))


def _hard_map(arrays: PhantomArrays) -> np.ndarray:
    """uint8: lung vessels (HARD_VESSEL) and lesion-free liver (HARD_LIVER)."""
    from radserve.phantom.anatomy import Tissue

    names = {name: i + 1 for i, (name, *_rest) in enumerate(ORGAN_LABELS)}
    hard = np.zeros(arrays.organs.shape, np.uint8)
    lungs = np.isin(arrays.organs, [names["lung_left"], names["lung_right"]])
    if arrays.tissue is not None:
        hard[lungs & (arrays.tissue == Tissue.VESSEL)] = HARD_VESSEL
    hard[(arrays.organs == names["liver"]) & (arrays.lesion_instances == 0)] = HARD_LIVER
    return hard


def _lesion_slices(
    recipe: Recipe, arrays: PhantomArrays, box, n_slices: int, rng: np.random.Generator
) -> SliceSet:
    """Slices through every lesion (its largest section and ``slices_per_lesion - 1``
    more across its extent, edges included) plus random slices of the box."""
    zs, ys, xs = box
    inst = arrays.lesion_instances[zs, ys, xs]
    per_lesion = recipe.train.slices_per_lesion
    chosen_set: set[int] = set()
    for lesion in arrays.lesions:
        area = (inst == lesion["id"]).sum(axis=(1, 2))
        rows = np.flatnonzero(area)
        if rows.size == 0:
            continue
        picks = [int(rows[np.argmax(area[rows])])]
        others = np.setdiff1d(rows, picks)
        if others.size:
            picks += [int(v) for v in rng.choice(others, min(per_lesion - 1, others.size), False)]
        chosen_set.update(zs.start + p for p in picks)
    positive = sorted(chosen_set)
    candidates = np.setdiff1d(np.arange(zs.start, zs.stop), positive)
    n_neg = min(candidates.size, max(n_slices - len(positive), n_slices // 3))
    negative = rng.choice(candidates, n_neg, replace=False) if n_neg else np.array([], int)
    chosen = np.sort(np.concatenate([np.asarray(positive, int), negative])).astype(int)
    image, yx = _model_grid(recipe, arrays, box, chosen)
    labels = _labels_on_grid(arrays.lesion_classes, arrays, box, chosen, yx)
    instances = _labels_on_grid(arrays.lesion_instances, arrays, box, chosen, yx)
    hard = _labels_on_grid(_hard_map(arrays), arrays, box, chosen, yx)
    return SliceSet(
        [img.astype(np.float16) for img in image],
        list(labels),
        [0] * len(chosen),
        list(instances.astype(np.uint16)),
        list(hard),
    )


def _cache_path(recipe: Recipe, seed: int, small: bool, cache_dir: Path | None) -> Path:
    n = recipe.train.slices_per_phantom
    folder = (cache_dir or default_cache_dir()) / recipe.name / _cache_key(recipe, n)
    return folder / f"{seed}{'s' if small else ''}.npz"


def _save(part: SliceSet, path: Path) -> None:
    payload = {f"img{i}": a for i, a in enumerate(part.images)}
    payload.update({f"lab{i}": a for i, a in enumerate(part.labels)})
    payload.update({f"ins{i}": a for i, a in enumerate(part.instances)})
    payload.update({f"hrd{i}": a for i, a in enumerate(part.hard)})
    durable.write_with(
        path, lambda handle: np.savez(handle, n=len(part.images), **payload), mode=0o644
    )


def _load(path: Path, seed: int) -> SliceSet:
    with np.load(path) as z:
        n = int(z["n"])
        extra = n > 0 and "ins0" in z.files
        return SliceSet(
            [z[f"img{i}"] for i in range(n)],
            [z[f"lab{i}"] for i in range(n)],
            [seed] * n,
            [z[f"ins{i}"] for i in range(n)] if extra else [],
            [z[f"hrd{i}"] for i in range(n)] if extra else [],
        )


def build_slices_multi(
    recipes: list[Recipe], seed: int, *, small: bool = False, cache_dir: Path | None = None
) -> int:
    """Cache the slices of phantom ``seed`` for every recipe, generating each phantom
    variant (lesion count and size cap, see :func:`phantom_variant`) at most once.

    Returns the number of recipes whose slices had to be made.
    """
    missing = [r for r in recipes if not _cache_path(r, seed, small, cache_dir).exists()]
    variants: dict[tuple[int | None, float | None], list[Recipe]] = {}
    for recipe in missing:
        variants.setdefault(phantom_variant(seed, recipe.train), []).append(recipe)
    for (n_lesions, cap), group in variants.items():
        arrays = load_phantom(seed, small=small, n_lesions=n_lesions, lesion_max_diameter_mm=cap)
        for recipe in group:
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

    def _crop(
        self, i: int, centre: tuple[int, int] | None, jitter: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
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
            reach = p // 3 if jitter is None else jitter
            shift = self.rng.integers(-reach, reach + 1, size=2)
            y0 = int(np.clip(centre[0] + oy + shift[0] - p // 2, 0, ph - p))
            x0 = int(np.clip(centre[1] + ox + shift[1] - p // 2, 0, pw - p))
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
            imgs.append(self._augment(img))
            labs.append(lab)
        return np.stack(imgs).astype(np.float32), np.stack(labs).astype(np.int64)

    def _augment(self, img: np.ndarray) -> np.ndarray:
        """Mild intensity augmentation in normalised units (scanner calibration drift)."""
        return img * np.float32(1.0 + self.rng.normal(0, 0.03)) + np.float32(
            self.rng.normal(0, 0.02)
        )


class LesionPatchSampler(PatchSampler):
    """Patches centred per lesion, on lesion look-alikes, or at random (lesion recipe).

    A ``lesion_fraction`` share goes to lesions: one drawn uniformly over all lesions
    of the set, so a 5 mm nodule is as likely as a 40 mm liver mass (per-pixel or
    per-slice sampling lets the large ones dominate), then one of its slices, centred
    on its section there with up to a quarter patch of jitter. A
    ``hard_negative_fraction`` share is centred on a pulmonary vessel (two in three) or
    on lesion-free liver, the look-alikes behind most false positives. The rest are
    random crops, as for organs.
    """

    def __init__(self, slices: SliceSet, recipe: Recipe, rng: np.random.Generator) -> None:
        super().__init__(slices, recipe, rng)
        if len(slices.instances) != len(slices):
            raise ValueError("lesion sampling needs instance maps (sampling='lesion' slices)")
        self.hard_fraction = recipe.train.hard_negative_fraction
        where: dict[tuple[int, int], list[int]] = {}
        for i, (seed, ins) in enumerate(zip(slices.seeds, slices.instances, strict=True)):
            for lesion_id in np.unique(ins):
                if lesion_id:
                    where.setdefault((seed, int(lesion_id)), []).append(i)
        self.lesion_keys = list(where)
        self.lesion_slices = [np.asarray(v) for v in where.values()]
        self.hard_slices = {
            value: np.flatnonzero([bool((h == value).any()) for h in slices.hard])
            for value in (HARD_VESSEL, HARD_LIVER)
        }
        logger.info(
            "lesion sampler: %d lesions on %d slices; hard negatives on %d / %d slices",
            len(self.lesion_keys),
            len(slices),
            self.hard_slices[HARD_VESSEL].size,
            self.hard_slices[HARD_LIVER].size,
        )

    def _lesion_centre(self) -> tuple[int, tuple[int, int]]:
        k = int(self.rng.integers(len(self.lesion_keys)))
        i = int(self.rng.choice(self.lesion_slices[k]))
        pts = np.argwhere(self.slices.instances[i] == self.lesion_keys[k][1])
        centre = np.rint(pts.mean(axis=0)).astype(int)
        return i, (int(centre[0]), int(centre[1]))

    def _hard_centre(self) -> tuple[int, tuple[int, int]] | None:
        value = HARD_VESSEL if self.rng.random() < 2 / 3 else HARD_LIVER
        if not self.hard_slices[value].size:
            return None
        i = int(self.rng.choice(self.hard_slices[value]))
        pts = np.argwhere(self.slices.hard[i] == value)
        y, x = pts[int(self.rng.integers(len(pts)))]
        return i, (int(y), int(x))

    def batch(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(N, C, P, P) float32 images and (N, P, P) int64 labels."""
        imgs, labs = [], []
        p = self.patch
        for _ in range(n):
            r = self.rng.random()
            pick = None
            jitter = None
            if r < self.fraction and self.lesion_keys:
                pick, jitter = self._lesion_centre(), p // 4
            elif r < self.fraction + self.hard_fraction:
                pick, jitter = self._hard_centre(), p // 8
            if pick is None:
                i, centre = int(self.rng.integers(len(self.slices))), None
            else:
                i, centre = pick
            img, lab = self._crop(i, centre, jitter)
            imgs.append(self._augment(img))
            labs.append(lab)
        return np.stack(imgs).astype(np.float32), np.stack(labs).astype(np.int64)
