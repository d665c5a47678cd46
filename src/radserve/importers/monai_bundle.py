"""``radserve models import monai-bundle BUNDLE_DIR``: a MONAI Bundle -> a radserve bundle.

``BUNDLE_DIR`` holds ``configs/inference.json`` (or ``.yaml``), ``configs/metadata.json``
and ``models/model.pt`` (a state dict for ``network_def``) or ``models/model.ts``
(TorchScript). MONAI's own ``ConfigParser`` instantiates the bundle's ``preprocessing``,
``inferer``, ``network_def`` and ``postprocessing`` (the ``monai`` extra: torch and MONAI);
the importer reads the instantiated transforms' parameters, so references (``@...``) and
expressions (``$...``) resolve exactly as MONAI resolves them.

What the bundle states, mapped onto ``model.yaml``:

* ``Orientation(d)(axcodes)`` -> ``input.axes`` (the patient directions, MONAI's sense).
* ``Spacing(d)(pixdim, mode="bilinear" or "nearest")`` -> ``input.spacing`` in the
  network's order and ``input.resampling`` with ``grid: first_voxel`` (MONAI's grid),
  ``image_order`` 1 or 0; ``normalise_first`` when the intensity transform comes first.
  Nearest picks the voxel ``grid_sample`` picks: radserve samples at MONAI's own float64
  coordinates (:mod:`radserve.preprocess.monai_grid`) and rounds half to even as ATen's
  ``nearbyint`` does, so exact half-voxel ties (2.5 -> 2 mm) fall the same way.
* ``ScaleIntensityRange(d)(a_min, a_max, b_min, b_max, clip=True)`` -> ``ct_window``
  (b 0..1) or the equivalent ``clip_zscore``; ``NormalizeIntensity(d)(nonzero)`` and
  ``ScaleIntensity(d)(minv, maxv)`` -> ``monai_intensity`` steps in the bundle's order
  (per image, on the grid they follow).
* Neutral: loading (its ``reader`` dropped: radserve reads DICOM), channel layout,
  float32 typing, ``CopyItemsd``/``DeleteItemsd`` that leave the image key.
* ``CropForeground(d)(margin, k_divisible, allow_smaller)`` after Spacing and every
  intensity transform ->
  ``input.crop_foreground`` (the box of the scaled model grid > 0; MONAI's default
  ``select_fn``, constant 0 padding); the way back repeats ``Invertd``'s float64
  coordinates bit for bit (:mod:`radserve.preprocess.monai_grid`), so the voxels landing
  exactly on a model voxel beside the box get MONAI's labels.
* ``SlidingWindowInferer(roi_size, overlap, mode, sigma_scale)`` -> ``patch_size``,
  ``overlap``, MONAI's window placement and Gaussian (``monai_gaussian``) or ``constant``
  weights, centred zero padding, logits averaged.
* Post-processing: ``Activations(d)(softmax)`` before ``Invertd`` -> the softmax on the
  model grid (``activate_on_model_grid``); ``Invertd`` -> outputs back bilinearly
  (``nearest_interp=False`` after a bilinear ``Spacing``) or nearest (``output_order`` 0:
  ``nearest_interp=True``, MONAI's default, or a nearest ``Spacing``), at MONAI's own
  coordinates; ``AsDiscrete(d)(argmax)`` -> labels, before a nearest ``Invertd`` too (the
  picked label is the argmax of the picked outputs); the label names from
  ``metadata.json``'s ``channel_def`` (channel 0 is background, as argmax 0). At run
  time an oblique series is refused where a row of MONAI's grid falls on both sides of
  a tie (see :mod:`radserve.preprocess.monai_grid`).

Refused, by name: argmax before a bilinear ``Invertd`` (MONAI would blend label
values, see ``_LABELS_BLENDED``), ``CropForeground(d)`` before
Spacing or the intensity transforms, with another ``select_fn``, ``channel_indices``,
another ``source_key``, non-zero or non-constant padding of a box that may pass the image,
or ``lazy`` (see ``_crop_foreground``), any other transform (e.g.
``KeepLargestConnectedComponentd``, ``Lambdad``), intensity transforms on both sides of
Spacing, ``clip=False``, Spacing options that move the grid
(``diagonal``, ``scale_extent``, ``min_pixdim``/``max_pixdim``, ``align_corners``,
``padding_mode`` other than border), a missing Orientation or Spacing (the network's axes
and grid would depend on the loader), other inferers, sliding-window padding other than
constant 0 or replicate, sigmoid outputs, no ``Invertd`` (labels would stay on the
resampled grid) or one of another key or transform, modalities other than CT/MR, a
network ONNX Runtime cannot run once exported.

Several input channels (``LoadImaged`` of a list of files, or several keys joined by
``ConcatItemsd``) become ``input.channels``, a series per channel
(:mod:`radserve.importers.monai_channels`, with what it refuses).
The model zoo bundles each of these was checked on: docs/bring-your-own-model.md.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from radserve.importers import ImportRefusedError
from radserve.importers.channel_series import SeriesRule, multi_series_input
from radserve.importers.common import (
    export_checked,
    label_entries,
    read_json_object,
    refused_if_malformed,
    sha256_file,
    staged_bundle,
    validated_manifest,
    write_bundle_files,
)
from radserve.importers.monai_channels import _CONCAT, channel_inputs, channel_names, stacking
from radserve.importers.monai_config_guard import CheckedConfigParser
from radserve.models.manifest import LABEL_MAPS_8_BIT, MAX_LABEL_VALUE, ModelSpec

logger = logging.getLogger(__name__)

__all__ = ["MonaiSource", "import_monai", "manifest_from_monai", "read_bundle", "read_weights"]

# Transforms that change nothing radserve must state (loading, typing, channel layout).
_NEUTRAL = {
    "LoadImage",
    "LoadImaged",
    "EnsureChannelFirst",
    "EnsureChannelFirstd",
    "EnsureType",
    "EnsureTyped",
    "CastToType",
    "CastToTyped",
    "ToTensor",
    "ToTensord",
    "Identity",
    "Identityd",
    "SaveImage",
    "SaveImaged",
}
# Transforms on other keys of the data dictionary: neutral unless they write or delete
# the image (or prediction) key itself.
_KEY_COPIES = {"CopyItemsd", "DeleteItemsd"}
# Per-image intensity transforms -> MonaiIntensityStep ops
_PER_IMAGE = {
    "NormalizeIntensity": "normalize",
    "NormalizeIntensityd": "normalize",
    "ScaleIntensity": "scale",
    "ScaleIntensityd": "scale",
}
_RANGE = ("ScaleIntensityRanged", "ScaleIntensityRange")
_ORIENTATION = ("Orientationd", "Orientation")
_SPACING = ("Spacingd", "Spacing")
_CROP = ("CropForegroundd", "CropForeground")
_ACTIVATIONS = ("Activationsd", "Activations")
_ARGMAX = ("AsDiscreted", "AsDiscrete")
# what _preprocessing and _postprocessing map (or check); any other transform on the
# image (prediction) key is refused, before MONAI is imported where the config names it
# plainly (_refuse_before_monai)
_MAPPED = {
    "preprocessing": frozenset(
        {*_NEUTRAL, *_KEY_COPIES, *_ORIENTATION, *_SPACING, *_RANGE, *_PER_IMAGE, *_CROP}
        | set(_CONCAT)
    ),
    "postprocessing": frozenset({*_NEUTRAL, *_KEY_COPIES, *_ACTIVATIONS, "Invertd", *_ARGMAX}),
}
_PADDING = {"constant": "centre_zero", "replicate": "centre_edge"}
_MODES = {"bilinear": 1, "nearest": 0}
_RAS_LABELS = (("L", "R"), ("P", "A"), ("I", "S"))
_NO_GRID = "no {} in preprocessing: the network's axes/grid would be the loader's"
_INTENSITY_NAMES = "ScaleIntensityRange, NormalizeIntensity, ScaleIntensity"
# Why CropForeground(d) is refused before Spacing or an intensity transform
# (docs/model-ops.md "MONAI's CropForeground")
_CROP_FOREGROUND = (
    "radserve states MONAI's crop only on the resampled, scaled image (input.crop_foreground: "
    "select_fn x > 0 on the model grid); a box of the native or unscaled image is not mapped"
)
# Why argmax before a bilinear Invertd is refused
_LABELS_BLENDED = (
    "MONAI would interpolate label values bilinearly (1 beside 3 gives 2); set "
    "nearest_interp=true, or put AsDiscrete after Invertd"
)


def _refuse(reason: str) -> None:
    raise ImportRefusedError(f"MONAI bundle not importable: {reason}")


@dataclass(frozen=True)
class MonaiSource:
    """A bundle folder's files and MONAI's parsed config (objects built on demand)."""

    folder: Path
    config_path: Path
    metadata: dict[str, Any]
    parser: Any  # monai.bundle.ConfigParser
    weights: Path
    readers_dropped: list[str]


def read_bundle(folder: Path) -> MonaiSource:
    """Find the inference config, metadata and weights; parse the config with MONAI."""
    return _parse(Path(folder), *_bundle_files(Path(folder)))


def _bundle_files(folder: Path) -> tuple[Path, dict[str, Any], Path]:
    """(inference config, metadata.json's object, weights) of a bundle folder."""
    configs = folder / "configs"
    if not configs.is_dir():
        raise ImportRefusedError(f"{folder} is not a MONAI bundle (no configs/ folder)")
    found = [configs / f"inference.{ext}" for ext in ("json", "yaml", "yml")]
    config_path = next((p for p in found if p.is_file()), None)
    if config_path is None:
        raise ImportRefusedError(f"no configs/inference.json or .yaml in {folder}")
    metadata = read_json_object(configs / "metadata.json")
    weights = next(
        (
            p
            for p in (folder / "models" / "model.pt", folder / "models" / "model.ts")
            if p.is_file()
        ),
        None,
    )
    if weights is None:
        raise ImportRefusedError(f"no models/model.pt or models/model.ts in {folder}")
    return config_path, metadata, weights


def _parse(folder: Path, config_path: Path, metadata: dict[str, Any], weights: Path) -> MonaiSource:
    meta_path = config_path.with_name("metadata.json")
    try:
        import monai.bundle  # noqa: F401 - the extra's presence, checked before parsing
    except ImportError as exc:
        raise ImportRefusedError(
            "the MONAI importer needs the monai extra: pip install 'torch==2.13.0' 'monai==1.6.1'"
        ) from exc
    parser = CheckedConfigParser()  # the config's code is checked before MONAI runs it
    with refused_if_malformed(f"{meta_path.name} and {config_path.name}"):
        parser.read_meta(str(meta_path))
        parser.read_config(str(config_path))
        parser["bundle_root"] = str(folder)
        readers = without_file_readers(parser)
    return MonaiSource(folder, config_path, metadata, parser, weights, readers)


@refused_if_malformed("the bundle's metadata.json and inference config")
def _refuse_before_monai(config_path: Path, metadata: dict[str, Any]) -> None:
    """What can be refused from the bundle's JSON/YAML alone, before torch and MONAI are
    imported (~6 CPU-s): metadata.json's inputs and outputs, a transform of the bundle's
    own code, and a transform on the image (prediction) key that is none of those mapped,
    where the config names it plainly (a class name, not a reference or an expression,
    with literal keys); anything else is left to the mapping after MONAI's parse."""
    _, _, image_key, _ = _labels(metadata)
    pred_key = next(iter(metadata["network_data_format"]["outputs"]))
    try:
        text = config_path.read_text()
        config = json.loads(text) if config_path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError, RecursionError):
        return  # MONAI's parse says what is wrong with it
    if not isinstance(config, dict):
        return
    for key, on in (("preprocessing", image_key), ("postprocessing", pred_key)):
        _no_bundle_code(config.get(key), key)
        named = _plain_transforms(config, key)
        for i, name, keys in named:
            acts = on in keys if keys is not None else not name.endswith("d")
            if acts and name not in _MAPPED[key]:
                _refuse(f"{key}[{i}] {name} is not expressible in a radserve bundle")
        items = config[key].get("transforms") if isinstance(config.get(key), dict) else None
        if key == "preprocessing" and isinstance(items, list) and len(named) == len(items):
            names = {name for _, name, _ in named}  # every transform named: none is one
            for group, what in ((_ORIENTATION, "Orientation(d)"), (_SPACING, "Spacing(d)")):
                if not names & set(group):
                    _refuse(_NO_GRID.format(what))


def _plain_transforms(config: dict[str, Any], key: str) -> list[tuple[int, str, list[str] | None]]:
    """(index, class name, keys) of each transform of ``config[key]``, a literal Compose,
    that is named by a plain class name (``Spacingd``, ``monai.transforms.Spacingd``;
    MONAI's ``SpacingD`` and ``SpacingDict`` aliases as the class's own name). ``keys``:
    the literal keys (``@name`` of a top-level string resolved), None where it has none
    or they are an expression."""
    compose = config.get(key)
    items = compose.get("transforms") if isinstance(compose, dict) else None
    named = []
    for i, item in enumerate(items if isinstance(items, list) else []):
        target = item.get("_target_") if isinstance(item, dict) else None
        if not isinstance(target, str):
            continue
        module, _, name = target.rpartition(".")
        if module not in ("", "monai.transforms") or not name.isidentifier():
            continue
        if not name[:1].isupper():  # a function (the config guard refuses those by name)
            continue
        if name.endswith("Dict"):
            name = name[:-4] + "d"
        elif name.endswith("D"):
            name = name[:-1] + "d"
        keys = item.get("keys")
        keys = [keys] if isinstance(keys, str) else keys
        if isinstance(keys, list) and all(isinstance(k, str) for k in keys):
            keys = [_literal(k, config) for k in keys]
        named.append((i, name, keys if isinstance(keys, list) and None not in keys else None))
    return named


def _literal(value: str, config: dict[str, Any]) -> str | None:
    """``value``, or the top-level string an ``@name`` reference names; None for an
    expression, a macro or a reference to anything else."""
    if value.startswith("@"):
        value = config.get(value[1:])
        if not isinstance(value, str):
            return None
    return None if value[:1] in ("@", "$", "%") else value


def without_file_readers(parser: Any) -> list[str]:
    """Drop the ``reader`` option of the preprocessing's ``LoadImage(d)``: radserve reads
    the DICOM series itself, so the bundle's file reader (e.g. ``ITKReader``, which needs
    ``itk`` installed just to build the transform) takes no part; the grid is stated by
    Orientation and Spacing in patient coordinates. Returns the readers dropped."""
    pre = parser.get("preprocessing")
    items = pre.get("transforms") if isinstance(pre, dict) else None
    dropped = []
    for item in items if isinstance(items, list) else []:
        target = str(item.get("_target_", "")) if isinstance(item, dict) else ""
        if target.split(".")[-1] in ("LoadImage", "LoadImaged") and "reader" in item:
            dropped.append(str(item.pop("reader")))
    if dropped:
        parser["preprocessing"] = pre
    return dropped


@contextmanager
def _bundle_code(folder: Path) -> Iterator[None]:
    """The bundle's own ``scripts`` package importable while MONAI builds its objects,
    as ``python -m monai.bundle run`` from the bundle folder has it (e.g. the model
    zoo's UNesT networks, ``scripts.networks.unest.UNesT``); another bundle's ``scripts``
    modules are not reused."""

    def drop() -> dict[str, Any]:
        return {n: sys.modules.pop(n) for n in list(sys.modules) if n.split(".")[0] == "scripts"}

    saved = drop()
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        drop()
        sys.modules.update(saved)


class _NetworkReached(OSError):
    """A connection or name lookup while MONAI built a bundle's objects."""


@contextmanager
def _no_network() -> Iterator[list[str]]:
    """No name lookup or connection while MONAI builds a bundle's objects: a network
    built with ``pretrained`` weights (MONAI's ``EfficientNetBN``, whose default it is,
    ``DenseNet121``, ``SENet``, ``HoVerNet``...) downloads them as it is built, and wrote
    them under the current folder; radserve loads the bundle's own ``models/model.pt``
    over them and reaches no network. Yields the hosts asked for (the import is one
    process: the socket functions are replaced for its duration)."""
    asked: list[str] = []
    lookup, connect = socket.getaddrinfo, socket.socket.connect

    def refused_lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(str(host))
        raise _NetworkReached(f"radserve reaches no network while importing (asked for {host})")

    def refused_connect(self: socket.socket, address: Any) -> None:
        asked.append(str(address[0] if isinstance(address, tuple) else address))
        raise _NetworkReached(f"radserve reaches no network while importing ({address})")

    socket.getaddrinfo = refused_lookup  # type: ignore[assignment]
    socket.socket.connect = refused_connect  # type: ignore[method-assign]
    try:
        yield asked
    finally:
        socket.getaddrinfo = lookup
        socket.socket.connect = connect  # type: ignore[method-assign]


def _parsed(source: MonaiSource, key: str) -> Any:
    if key not in source.parser:
        _refuse(f"{source.config_path.name} has no {key!r}")
    asked: list[str] = []
    try:
        with _bundle_code(source.folder), _no_network() as asked:
            return source.parser.get_parsed_content(key)
    except ImportRefusedError:
        raise
    except Exception as exc:  # MONAI raises many kinds while instantiating
        if asked:
            raise ImportRefusedError(
                f"MONAI's {key!r} reaches the network while it is built ({asked[0]}): "
                "pretrained weights? radserve loads the bundle's own weights and reaches no "
                "network; give the network pretrained: false (or its own option to that end)"
            ) from None
        raise ImportRefusedError(f"MONAI cannot build {key!r}: {exc}") from exc


def _no_bundle_code(raw: Any, key: str) -> None:
    """Refuse a transform of the bundle's own ``scripts`` package by its name, before
    MONAI builds it (radserve states MONAI's transforms; the code may not even be
    shipped, e.g. renalStructures_CECT_segmentation's ``ConcatImages``). ``raw``: the
    config's ``key`` as written."""
    items = raw.get("transforms") if isinstance(raw, dict) else None
    for i, item in enumerate(items if isinstance(items, list) else []):
        target = str(item.get("_target_", "")) if isinstance(item, dict) else ""
        if target.startswith("scripts."):
            _refuse(f"{key}[{i}] {target} is the bundle's own code, not expressible here")


def _transforms(compose: Any, key: str) -> list[Any]:
    from monai.transforms import Compose

    if not isinstance(compose, Compose):
        _refuse(f"{key!r} is a {type(compose).__name__}, not a Compose of transforms")
    return list(compose.transforms)


def _on_image(t: Any, image_key: str) -> bool:
    keys = getattr(t, "keys", None)
    return keys is None or image_key in tuple(keys)


def _one(values: Any, what: str) -> Any:
    """A per-key (or per-axis) setting that must be a single value."""
    vals = list(values) if isinstance(values, list | tuple) else [values]
    if len({str(v) for v in vals}) != 1:
        _refuse(f"{what} differs between keys/axes ({vals})")
    return vals[0]


def _value(v: Any) -> Any:
    return getattr(v, "value", v)  # enum members -> their string


def _neutral(t: Any, i: int, where: str, key: str) -> bool:
    """Whether ``t`` leaves the image (``key``) as radserve has it (refused if it would
    change its values or remove it)."""
    name = type(t).__name__
    if name in _KEY_COPIES:
        written = getattr(t, "names", None) or ()
        removed = t.keys if name == "DeleteItemsd" else ()
        if key in tuple(written) or key in tuple(removed):
            _refuse(f"{where}[{i}] {name} overwrites or deletes {key!r}")
        return True
    if name not in _NEUTRAL:
        return False
    converter = getattr(t, "converter", t)  # CastToTyped keeps its dtype on both
    dtype = getattr(t, "dtype", None)
    if dtype is None:
        dtype = getattr(converter, "dtype", None)
    dtype = _one(dtype, f"{name} dtype")
    casts = name.startswith(("EnsureType", "CastToType")) and dtype is not None
    if casts and "float32" not in str(dtype) and _on_image(t, key):
        _refuse(f"{where}[{i}] {name} casts to {dtype} (float32 only)")
    return True


def _per_image_step(t: Any, i: int, name: str) -> dict[str, Any]:
    """``NormalizeIntensity(d)`` / ``ScaleIntensity(d)`` -> a ``monai_intensity`` step."""
    op = _PER_IMAGE[name]
    inner = getattr(t, "normalizer" if op == "normalize" else "scaler", t)
    if "float32" not in str(inner.dtype):
        _refuse(f"preprocessing[{i}] {name} dtype {inner.dtype} (float32 only)")
    if op == "normalize":
        if inner.subtrahend is not None or inner.divisor is not None:
            _refuse(
                f"preprocessing[{i}] {name}: subtrahend/divisor (only the image's own mean "
                "and std are mapped)"
            )
        return {"op": "normalize", "nonzero": bool(inner.nonzero)}
    if inner.minv is None or inner.maxv is None:
        if inner.factor is not None:
            _refuse(f"preprocessing[{i}] {name}: factor {inner.factor} (minv/maxv only)")
        return {"op": "scale", "minv": 0.0, "maxv": 1.0}  # MONAI returns (x-min)/(max-min)
    return {"op": "scale", "minv": float(inner.minv), "maxv": float(inner.maxv)}


def _pools_channels(t: Any, name: str) -> bool:
    """Whether a per-image intensity transform takes its statistics over every channel
    together (MONAI's default ``channel_wise=False``)."""
    inner = getattr(t, "normalizer" if _PER_IMAGE[name] == "normalize" else "scaler", t)
    return not bool(getattr(inner, "channel_wise", False))


def _preprocessing(transforms: list[Any], image_key: str) -> dict[str, Any]:
    """Orientation, Spacing and intensity from the instantiated preprocessing (and how
    its channels are stacked)."""
    stacked = stacking(transforms, image_key)
    out: dict[str, Any] = {"steps": [], "intensity_at": [], "stacked": stacked, "pooled": []}
    for i, t in enumerate(transforms):
        name = type(t).__name__
        if i == stacked.at or _neutral(t, i, "preprocessing", image_key):
            continue
        if not _on_image(t, image_key):
            if touched := stacked.touches(t):
                _refuse(
                    f"preprocessing[{i}] {name} on the stacked keys {touched}: radserve maps "
                    f"the transforms of the stacked image {image_key!r} (after ConcatItemsd)"
                )
            continue  # e.g. a label key's transforms in a shared config
        if name in _ORIENTATION:
            o = getattr(t, "ornt_transform", t)
            # labels None: the image's space, RAS as MONAI's loaders give it by default
            labels = None if o.labels is None else tuple(map(tuple, o.labels))
            if o.as_closest_canonical or labels not in (None, _RAS_LABELS):
                _refuse(f"preprocessing[{i}] {name}: as_closest_canonical or custom labels")
            out["axes"] = list(str(o.axcodes).upper())
            out["orientation_at"] = i
        elif name in _SPACING:
            s = getattr(t, "spacing_transform", t)
            mode = _value(_one(getattr(t, "mode", s.sp_resample.mode), "Spacing mode"))
            pad = _value(_one(getattr(t, "padding_mode", s.sp_resample.padding_mode), "padding"))
            align = _one(getattr(t, "align_corners", s.sp_resample.align_corners), "align")
            extent = _one(getattr(t, "scale_extent", s.scale_extent), "scale_extent")
            pixdim = [float(p) for p in s.pixdim]
            if mode not in _MODES:
                _refuse(f"preprocessing[{i}] {name} mode {mode!r} (bilinear or nearest only)")
            if pad != "border" or align or extent or s.diagonal or s.recompute_affine:
                _refuse(
                    f"preprocessing[{i}] {name}: padding_mode {pad!r}, align_corners {align}, "
                    f"scale_extent {extent}, diagonal {s.diagonal}, recompute_affine "
                    f"{s.recompute_affine} (only border, False, False, False, False)"
                )
            if not all(str(v) == "nan" for v in (*s.min_pixdim, *s.max_pixdim)):
                _refuse(f"preprocessing[{i}] {name}: min_pixdim/max_pixdim (data-dependent)")
            if len(pixdim) != 3 or min(pixdim) <= 0:
                _refuse(f"preprocessing[{i}] {name} pixdim {pixdim} (three positive values)")
            out.update(spacing=pixdim, image_order=_MODES[mode], spacing_at=i)
        elif name in _RANGE:
            s = getattr(t, "scaler", t)
            if not s.clip:
                _refuse(f"preprocessing[{i}] {name} with clip=False (unbounded intensities)")
            if s.b_min is None or s.b_max is None or s.b_max <= s.b_min or s.a_max <= s.a_min:
                _refuse(f"preprocessing[{i}] {name}: a/b ranges must be increasing")
            out["intensity"] = (float(s.a_min), float(s.a_max), float(s.b_min), float(s.b_max))
            out["intensity_at"].append(i)
        elif name in _PER_IMAGE:
            out["steps"].append(_per_image_step(t, i, name))
            out["intensity_at"].append(i)
            if _pools_channels(t, name):
                out["pooled"].append(f"preprocessing[{i}] {name}")
        elif name in _CROP:
            if "crop_foreground" in out:
                _refuse(f"preprocessing[{i}] a second {name}")
            out["crop_foreground"] = _crop_foreground(t, i, name, image_key)
            out["crop_at"] = i
        else:
            _refuse(f"preprocessing[{i}] {name} is not expressible in a radserve bundle")
    for key, what in (("axes", "Orientation(d)"), ("spacing", "Spacing(d)")):
        if key not in out:
            _refuse(_NO_GRID.format(what))
    at = out["intensity_at"]
    if not at:
        _refuse(
            "no intensity transform in preprocessing (ScaleIntensityRange, NormalizeIntensity "
            "or ScaleIntensity): the network's input scale would be the scanner's"
        )
    if "intensity" in out and (out["steps"] or len(at) > 1):
        _refuse(
            f"preprocessing[{at[0]}..{at[-1]}]: ScaleIntensityRange together with another "
            "intensity transform (one ScaleIntensityRange, or NormalizeIntensity/"
            "ScaleIntensity steps, are mapped)"
        )
    before = [i < out["spacing_at"] for i in at]
    if any(before) and not all(before):
        _refuse(
            f"preprocessing{at}: intensity transforms on both sides of Spacing (radserve "
            "normalises on the native or on the model grid, not both)"
        )
    out["normalise_first"] = before[0]
    if out["orientation_at"] > out["spacing_at"]:
        _refuse("Spacing before Orientation (pixdim would follow the file's axes)")
    crop_at = out.get("crop_at", -1)
    later = [j for j in sorted((out["spacing_at"], *at)) if j > crop_at]
    if crop_at >= 0 and later:
        _refuse(
            f"preprocessing[{crop_at}] {type(transforms[crop_at]).__name__} before "
            f"preprocessing[{later[0]}] {type(transforms[later[0]]).__name__}: "
            f"CropForeground(d) is mapped after Spacing(d) and every intensity transform "
            f"({_INTENSITY_NAMES}) only; {_CROP_FOREGROUND}"
        )
    return out


def _crop_foreground(t: Any, i: int, name: str, image_key: str) -> dict[str, Any]:
    """``CropForeground(d)`` after Spacing and the intensity transforms -> ``crop_foreground``
    (MONAI's defaults and the model zoo's settings; anything else refused by name)."""
    from monai.transforms.utils import is_positive

    cropper = getattr(t, "cropper", t)

    def per_axis(v: Any, what: str) -> list[int]:
        vals = [int(x) for x in v] if isinstance(v, list | tuple) else [int(v)] * 3
        if len(vals) != 3:
            _refuse(f"preprocessing[{i}] {name} {what} {v} (one value or three)")
        return vals

    source = getattr(t, "source_key", image_key)
    mode = _value(_one(getattr(t, "mode", cropper.padder.mode), f"{name} mode"))
    pad_value = cropper.padder.kwargs.get("value", 0)
    margin = per_axis(cropper.margin, "margin")
    k_divisible = per_axis(cropper.k_divisible, "k_divisible")
    # MONAI pads the box only where it passes the image: a margin kept whole
    # (allow_smaller False) or k_divisible; Invertd pads back with zeros whatever the mode
    pads = (max(margin) > 0 and not cropper.allow_smaller) or max(k_divisible) > 1
    if cropper.select_fn is not is_positive:
        _refuse(
            f"preprocessing[{i}] {name}: select_fn {getattr(cropper.select_fn, '__name__', '?')} "
            "(only MONAI's default is_positive, x > 0: radserve cannot read a function's "
            "threshold)"
        )
    if cropper.channel_indices is not None:
        _refuse(
            f"preprocessing[{i}] {name}: channel_indices (radserve's box is over every "
            "channel, as MONAI's is without them)"
        )
    if source != image_key:
        _refuse(f"preprocessing[{i}] {name}: source_key {source!r} (the box of the image only)")
    if pads and (mode != "constant" or pad_value != 0):
        _refuse(
            f"preprocessing[{i}] {name}: padding mode {mode!r} value {pad_value} with a box "
            "that may pass the image (margin without allow_smaller, or k_divisible): constant "
            "0 only, Invertd's zero padding is what radserve reproduces"
        )
    if cropper.lazy:
        _refuse(f"preprocessing[{i}] {name}: lazy=True (MONAI then fuses the crop into Spacing)")
    return {
        "threshold": 0.0,
        "margin": margin,
        "k_divisible": k_divisible,
        "allow_smaller": bool(cropper.allow_smaller),
    }


def _normalisation(pre: dict[str, Any]) -> dict[str, Any]:
    """ScaleIntensityRange(clip=True) as radserve's normalisation (the same affine map), or
    the per-image steps as ``monai_intensity``."""
    if pre["steps"]:
        return {"kind": "monai_intensity", "steps": pre["steps"]}
    a_min, a_max, b_min, b_max = pre["intensity"]
    if (b_min, b_max) == (0.0, 1.0):
        return {"kind": "ct_window", "center": (a_min + a_max) / 2, "width": a_max - a_min}
    std = (a_max - a_min) / (b_max - b_min)
    return {
        "kind": "clip_zscore",
        "lower": a_min,
        "upper": a_max,
        "mean": a_min - b_min * std,
        "std": std,
    }


def _inferer(inferer: Any) -> dict[str, Any]:
    from monai.inferers import SlidingWindowInferer

    if type(inferer) is not SlidingWindowInferer:
        _refuse(f"inferer {type(inferer).__name__} (SlidingWindowInferer only)")
    roi = [int(r) for r in inferer.roi_size] if isinstance(inferer.roi_size, list | tuple) else []
    if len(roi) != 3 or min(roi) < 1:
        _refuse(f"roi_size {inferer.roi_size} (three positive sizes)")
    overlap = float(_one(inferer.overlap, "SlidingWindowInferer overlap"))
    sigma = float(_one(inferer.sigma_scale, "SlidingWindowInferer sigma_scale"))
    mode = _value(inferer.mode)
    if mode not in ("gaussian", "constant"):
        _refuse(f"SlidingWindowInferer mode {mode!r}")
    padding = _value(inferer.padding_mode)
    if padding not in _PADDING or (padding == "constant" and float(inferer.cval) != 0.0):
        _refuse(
            f"SlidingWindowInferer padding_mode {padding!r} / cval {inferer.cval} (constant 0 "
            "or replicate only)"
        )
    if getattr(inferer, "with_coord", False):
        _refuse("SlidingWindowInferer with_coord (the network takes patch coordinates)")
    return {
        "patch_size": roi,
        "overlap": overlap,
        "batch_size": max(1, int(inferer.sw_batch_size)),
        "importance": "monai_gaussian" if mode == "gaussian" else "constant",
        "sigma_scale": sigma,
        "pad": _PADDING[padding],
    }


def _postprocessing(
    transforms: list[Any], pred_key: str, image_order: int, image_key: str, pre: Any
) -> dict[str, Any]:
    """(activation on the model grid, output order) from Activations/Invertd/AsDiscrete."""
    act_at = invert_at = argmax_at = None
    nearest = False
    for i, t in enumerate(transforms):
        name = type(t).__name__
        if _neutral(t, i, "postprocessing", pred_key) or not _on_image(t, pred_key):
            continue
        if name in _ACTIVATIONS:
            a = t  # dict transforms keep their per-key settings on themselves
            if _one(a.sigmoid, "sigmoid") or _one(a.other, "other") is not None:
                _refuse(f"postprocessing[{i}] {name}: sigmoid/other (softmax only)")
            if _one(a.softmax, "softmax"):
                act_at = i
        elif name == "Invertd":
            _invertd(t, i, pred_key, image_key, pre)
            nearest = bool(_one(t.nearest_interp, "Invertd nearest_interp"))
            invert_at = i
        elif name in _ARGMAX:
            a = t  # dict transforms keep their per-key settings on themselves
            if not _one(a.argmax, "argmax") or _one(a.threshold, "threshold") is not None:
                _refuse(f"postprocessing[{i}] {name}: argmax only (no threshold)")
            if _one(a.to_onehot, "to_onehot") is not None:
                _refuse(f"postprocessing[{i}] {name}: to_onehot (labels are a map)")
            argmax_at = i
        else:
            _refuse(f"postprocessing[{i}] {name} is not expressible in a radserve bundle")
    if invert_at is None:
        _refuse("no Invertd in postprocessing: labels would stay on the resampled grid")
    if argmax_at is None:
        _refuse("no AsDiscrete(d)(argmax=True) in postprocessing")
    assert invert_at is not None and argmax_at is not None
    # Invertd resamples with the forward Spacing's mode unless nearest_interp says nearest
    output_order = 0 if nearest else image_order
    if argmax_at < invert_at:
        if output_order != 0:
            _refuse(f"AsDiscrete(argmax) before a bilinear Invertd: {_LABELS_BLENDED}")
        if act_at is not None and act_at > argmax_at:
            _refuse("Activations after AsDiscrete(argmax) (a softmax of labels)")
    on_grid = act_at is not None and act_at < invert_at
    return {"activate_on_model_grid": on_grid, "output_order": output_order}


def _invertd(t: Any, i: int, pred_key: str, image_key: str, pre: Any) -> None:
    """``Invertd`` must undo the bundle's own preprocessing as applied to the image."""
    at = tuple(t.keys).index(pred_key)
    orig = t.orig_keys[at]
    if orig != image_key:
        _refuse(
            f"postprocessing[{i}] Invertd orig_keys {orig!r}: the inverse of another key's "
            f"transforms than the image {image_key!r} (radserve maps back onto the image's grid)"
        )
    if t.transform is not pre:
        _refuse(
            f"postprocessing[{i}] Invertd transform is a {type(t.transform).__name__}, not the "
            "bundle's 'preprocessing' (@preprocessing)"
        )
    if t.post_func[at] is not None:
        _refuse(f"postprocessing[{i}] Invertd post_func (code radserve cannot state)")


def _labels(metadata: dict[str, Any]) -> tuple[list[dict[str, Any]], str, str, dict[str, Any]]:
    """(labels, modality, image key, the input's entry) from metadata.json's
    network_data_format."""
    fmt = metadata.get("network_data_format") or {}
    inputs, outputs = fmt.get("inputs") or {}, fmt.get("outputs") or {}
    if len(inputs) != 1 or len(outputs) != 1:
        _refuse(f"network_data_format needs one input and one output (has {list(inputs)})")
    (image_key, image), (_, pred) = next(iter(inputs.items())), next(iter(outputs.items()))
    modality = str(image.get("modality", "")).upper().replace("MRI", "MR").replace("PET", "PT")
    if modality not in ("CT", "MR", "PT"):
        _refuse(f"input modality {image.get('modality')!r} (CT, MR or PET)")
    # label_def: what some bundles (e.g. pediatric_abdominal_ct_segmentation) call it
    channels = pred.get("channel_def") or pred.get("label_def") or {}
    try:
        values = sorted((int(k), str(v)) for k, v in channels.items())
    except ValueError:
        values = []
    if not values or [v for v, _ in values] != list(range(len(values))) or len(values) < 2:
        _refuse(f"outputs channel_def {channels} must name channels 0..n (0: background)")
    if len(values) > MAX_LABEL_VALUE + 1:  # channel 0 is background
        _refuse(f"{len(values)} output channels; {LABEL_MAPS_8_BIT}")
    return label_entries([(v, n) for v, n in values if v != 0]), modality, image_key, image


@refused_if_malformed("the bundle's metadata.json and inference config")
def manifest_from_monai(
    source: MonaiSource,
    *,
    name: str,
    version: str,
    channels: dict[int, SeriesRule] | None = None,
) -> ModelSpec:
    """The ``model.yaml`` stating the bundle's inference, validated (needs MONAI).
    ``channels``: series rules by channel index (``--channel``) where a channel's name
    does not say its series."""
    labels, modality, image_key, image = _labels(source.metadata)
    for key in ("preprocessing", "postprocessing"):
        _no_bundle_code(source.parser.get(key), key)
    compose = _parsed(source, "preprocessing")
    pre = _preprocessing(_transforms(compose, "preprocessing"), image_key)
    inputs = channel_inputs(
        channel_names(image, pre["stacked"]),
        _normalisation(pre),
        channels,
        pooled=pre["pooled"],
        image_order=pre["image_order"],
    )
    if modality == "PT" and not inputs:
        # a PET-only bundle: its one channel declared, so that the PET is read in SUVbw
        # (what PET models are trained on, as autoPET's data is), not in Bq/ml
        pet = {
            "name": "pet",
            **SeriesRule("PT").declaration(),
            "normalisation": _normalisation(pre),
        }
        inputs = multi_series_input([pet], "MONAI bundle not importable", pre["image_order"])
    window = _inferer(_parsed(source, "inferer"))
    if window["pad"] != "centre_zero" and pre.get("crop_foreground") is not None:
        _refuse(
            "SlidingWindowInferer padding_mode replicate after CropForeground (radserve pads "
            "MONAI's box with zeros)"
        )
    pred_key = next(iter(source.metadata["network_data_format"]["outputs"]))
    post = _postprocessing(
        _transforms(_parsed(source, "postprocessing"), "postprocessing"),
        pred_key,
        pre["image_order"],
        image_key,
        compose,
    )
    meta = source.metadata
    raw = {
        "name": name,
        "version": version,
        "task": "segmentation",
        "modality": inputs.get("modality", modality),
        "description": (
            f"Imported from MONAI Bundle {meta.get('name') or source.folder.name} "
            f"{meta.get('version', '')}".strip()
        ),
        "input": {
            "mode": "3d",
            "axes": pre["axes"],
            "spacing": pre["spacing"],
            "normalisation": _normalisation(pre),
            "patch_size": window["patch_size"],
            "batch_size": window["batch_size"],
            "overlap": window["overlap"],
            "crop": "none",
            "crop_foreground": pre.get("crop_foreground"),
            "resampling": {
                "grid": "first_voxel",
                "image_order": pre["image_order"],
                "output_order": post["output_order"],
                "normalise_first": pre["normalise_first"],
            },
            "sliding_window": {
                "importance": window["importance"],
                "sigma_scale": window["sigma_scale"],
                "accumulate": "logits",
                "pad": window["pad"],
                "placement": "monai",
                "activate_on_model_grid": post["activate_on_model_grid"],
            },
            **inputs.get("input", {}),
        },
        "activation": "softmax",
        "labels": labels,
        "files": {"fp32": "model.onnx"},
    }
    return validated_manifest(raw)


TORCHSCRIPT_RUNS_CODE = (
    "models/model.ts is TorchScript: loading and exporting it runs the code it holds "
    "(a state dict, models/model.pt, holds none). Import TorchScript only from a source "
    "you trust, and say so with --trust-torchscript"
)


def load_network(source: MonaiSource) -> Any:
    """The bundle's network with its weights, in eval mode (torch.nn.Module)."""
    import torch

    if source.weights.suffix == ".ts":
        with _bundle_code(source.folder):
            net = torch.jit.load(str(source.weights), map_location="cpu")
    else:
        net = _parsed(source, "network_def")
        if not isinstance(net, torch.nn.Module):
            raise ImportRefusedError(
                f"the bundle's network_def builds {type(net).__name__}, not a torch.nn.Module"
            )
        state = read_weights(source.weights)
        if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
            state = state["model"]  # a checkpoint saved by a MONAI trainer's handler
        try:
            net.load_state_dict(state)
        except (RuntimeError, TypeError) as exc:
            raise ImportRefusedError(f"{source.weights} does not fit network_def: {exc}") from exc
    return net.eval()


def read_weights(path: Path) -> Any:
    """``models/model.pt`` read with ``torch.load(weights_only=True)``: tensors and plain
    values. A file whose pickle names any other global (code unpickling would run) is
    refused naming it; torch's own message advises loading it with
    ``weights_only=False``, which is exactly what must not be done with a bundle one was
    handed, so it is not passed on."""
    import pickle

    import torch

    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        try:
            found = ", ".join(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        except (ValueError, OSError, RuntimeError):  # not a file torch.save wrote
            found = ""
        raise ImportRefusedError(
            f"{path.parent.name}/{path.name} holds objects other than tensors and plain values"
            f"{f' ({found})' if found else ''}; unpickling them could run code, so radserve "
            "does not (save the network's state_dict with torch.save)"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise ImportRefusedError(
            f"cannot read {path.parent.name}/{path.name}: {str(exc).splitlines()[0][:200]}"
        ) from None


def import_monai(
    folder: Path,
    models_dir: Path,
    *,
    name: str | None = None,
    version: str = "1.0.0",
    channels: dict[int, SeriesRule] | None = None,
    trust_torchscript: bool = False,
    providers: Sequence[str] = (),
) -> Path:
    """Write ``models_dir/<name>/<version>/`` (model.yaml, model.onnx, import.json),
    whole or not at all (:func:`~radserve.importers.common.staged_bundle`); the export
    is checked and probed on ``providers``, the execution providers the server serves
    with (``runtime.providers``; empty: the host's choice).

    A ``models/model.ts`` is refused unless ``trust_torchscript``: loading TorchScript
    runs the code it holds (:data:`TORCHSCRIPT_RUNS_CODE`)."""
    config_path, metadata, weights = _bundle_files(Path(folder))
    if weights.suffix == ".ts" and not trust_torchscript:
        raise ImportRefusedError(TORCHSCRIPT_RUNS_CODE)
    _refuse_before_monai(config_path, metadata)
    source = _parse(Path(folder), config_path, metadata, weights)
    default = str(source.metadata.get("name") or Path(folder).name)
    name = name or "".join(c if c.isalnum() else "-" for c in default.lower()).strip("-")
    spec = manifest_from_monai(source, name=name, version=version, channels=channels)
    with staged_bundle(models_dir, name, version) as staged:
        net = load_network(source)
        patch = tuple(spec.input.patch_size or ())
        channels_in = spec.input.in_channels
        diff = export_checked(
            _single_output(net), staged / "model.onnx", channels_in, patch, providers=providers
        )
        header = (
            f"# {spec.key}: imported by `radserve models import monai-bundle` from "
            f"{source.folder.name}.\n"
            "# The preprocessing below states the bundle's; see import.json for the source "
            "files.\n"
        )
        record = {
            "framework": "monai",
            "source": str(source.folder),
            "bundle": {k: source.metadata.get(k) for k in ("name", "version", "monai_version")},
            "config": source.config_path.name,
            "loader_readers_not_used": source.readers_dropped,
            "weights": {source.weights.name: sha256_file(source.weights)},
            "onnx_max_abs_diff_vs_torch": diff,
        }
        write_bundle_files(staged, spec, header, record, providers=providers)
    out = Path(models_dir) / name / version
    logger.info("imported %s -> %s (ONNX vs torch max |diff| %.2e)", source.folder, out, diff)
    return out


def _single_output(net: Any) -> Any:
    """The network with one tensor output (deep-supervision lists are refused). A
    TorchScript module (model.ts) is exported as it is: torch's exporter cannot trace one
    called inside another module."""
    import torch

    if isinstance(net, torch.jit.ScriptModule):
        return net

    class Single(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x):
            out = self.net(x)
            if not isinstance(out, torch.Tensor):
                raise ImportRefusedError(
                    f"the network returns {type(out).__name__}, not one logits tensor"
                )
            return out

    return Single().eval()
