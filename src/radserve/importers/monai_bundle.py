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
  (b 0..1) or the equivalent ``clip_zscore``.
* ``CropForeground(d)(margin, k_divisible, allow_smaller)`` after both ->
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
Spacing or ScaleIntensityRange, with another ``select_fn``, ``channel_indices``, another
``source_key``, non-zero or non-constant padding or ``lazy`` (see ``_crop_foreground``),
any other transform (e.g. ``NormalizeIntensityd``,
``KeepLargestConnectedComponentd``), ``clip=False``, Spacing options that move the grid
(``diagonal``, ``scale_extent``, ``min_pixdim``/``max_pixdim``, ``align_corners``,
``padding_mode`` other than border), a missing Orientation or Spacing (the network's axes
and grid would depend on the loader), other inferers, a non-constant sliding-window
padding or non-zero ``cval``, sigmoid outputs, no ``Invertd`` (labels would stay on the
resampled grid), more than one input channel, modalities other than CT/MR.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from radserve.importers import ImportRefusedError
from radserve.importers.common import export_checked, label_entries, sha256_file
from radserve.models.manifest import ModelSpec

logger = logging.getLogger(__name__)

__all__ = ["MonaiSource", "import_monai", "manifest_from_monai", "read_bundle"]

# Transforms that change nothing radserve must state (loading, typing, channel layout).
_NEUTRAL = {
    "LoadImage",
    "LoadImaged",
    "EnsureChannelFirst",
    "EnsureChannelFirstd",
    "EnsureType",
    "EnsureTyped",
    "ToTensor",
    "ToTensord",
    "SaveImage",
    "SaveImaged",
}
_MODES = {"bilinear": 1, "nearest": 0}
_RAS_LABELS = (("L", "R"), ("P", "A"), ("I", "S"))
# Why CropForeground(d) is refused before Spacing/ScaleIntensityRange (docs/model-ops.md
# "MONAI's CropForeground")
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


def read_bundle(folder: Path) -> MonaiSource:
    """Find the inference config, metadata and weights; parse the config with MONAI."""
    folder = Path(folder)
    configs = folder / "configs"
    if not configs.is_dir():
        raise ImportRefusedError(f"{folder} is not a MONAI bundle (no configs/ folder)")
    found = [configs / f"inference.{ext}" for ext in ("json", "yaml", "yml")]
    config_path = next((p for p in found if p.is_file()), None)
    if config_path is None:
        raise ImportRefusedError(f"no configs/inference.json or .yaml in {folder}")
    meta_path = configs / "metadata.json"
    try:
        metadata = json.loads(meta_path.read_text())
    except (OSError, ValueError) as exc:
        raise ImportRefusedError(f"cannot read {meta_path}: {exc}") from exc
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
    try:
        from monai.bundle import ConfigParser
    except ImportError as exc:
        raise ImportRefusedError(
            "the MONAI importer needs the monai extra: pip install 'torch==2.13.0' 'monai==1.6.1'"
        ) from exc
    parser = ConfigParser()
    parser.read_meta(str(meta_path))
    parser.read_config(str(config_path))
    parser["bundle_root"] = str(folder)
    return MonaiSource(folder, config_path, metadata, parser, weights)


def _parsed(source: MonaiSource, key: str) -> Any:
    if key not in source.parser:
        _refuse(f"{source.config_path.name} has no {key!r}")
    try:
        return source.parser.get_parsed_content(key)
    except Exception as exc:  # MONAI raises many kinds while instantiating
        raise ImportRefusedError(f"MONAI cannot build {key!r}: {exc}") from exc


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


def _preprocessing(transforms: list[Any], image_key: str) -> dict[str, Any]:
    """Orientation, Spacing and intensity from the instantiated preprocessing."""
    out: dict[str, Any] = {}
    for i, t in enumerate(transforms):
        name = type(t).__name__
        if name in _NEUTRAL:
            dtype = _one(getattr(t, "dtype", None), f"{name} dtype")
            if name.startswith("EnsureType") and dtype is not None and "float32" not in str(dtype):
                _refuse(f"preprocessing[{i}] {name} casts to {dtype}")
            continue
        if not _on_image(t, image_key):
            continue  # e.g. a label key's transforms in a shared config
        if name in ("Orientationd", "Orientation"):
            o = getattr(t, "ornt_transform", t)
            # labels None: the image's space, RAS as MONAI's loaders give it by default
            labels = None if o.labels is None else tuple(map(tuple, o.labels))
            if o.as_closest_canonical or labels not in (None, _RAS_LABELS):
                _refuse(f"preprocessing[{i}] {name}: as_closest_canonical or custom labels")
            out["axes"] = list(str(o.axcodes).upper())
            out["orientation_at"] = i
        elif name in ("Spacingd", "Spacing"):
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
        elif name in ("ScaleIntensityRanged", "ScaleIntensityRange"):
            s = getattr(t, "scaler", t)
            if not s.clip:
                _refuse(f"preprocessing[{i}] {name} with clip=False (unbounded intensities)")
            if s.b_min is None or s.b_max is None or s.b_max <= s.b_min or s.a_max <= s.a_min:
                _refuse(f"preprocessing[{i}] {name}: a/b ranges must be increasing")
            out["intensity"] = (float(s.a_min), float(s.a_max), float(s.b_min), float(s.b_max))
            out["intensity_at"] = i
        elif name in ("CropForegroundd", "CropForeground"):
            if "crop_foreground" in out:
                _refuse(f"preprocessing[{i}] a second {name}")
            out["crop_foreground"] = _crop_foreground(t, i, name, image_key)
            out["crop_at"] = i
        else:
            _refuse(f"preprocessing[{i}] {name} is not expressible in a radserve bundle")
    for key, what in (("axes", "Orientation(d)"), ("spacing", "Spacing(d)")):
        if key not in out:
            _refuse(f"no {what} in preprocessing: the network's axes/grid would be the loader's")
    if "intensity" not in out:
        _refuse("no ScaleIntensityRange(d) in preprocessing")
    if out["orientation_at"] > out["spacing_at"]:
        _refuse("Spacing before Orientation (pixdim would follow the file's axes)")
    crop_at = out.get("crop_at", -1)
    if crop_at >= 0 and crop_at < max(out["spacing_at"], out["intensity_at"]):
        _refuse(
            f"preprocessing[{crop_at}] CropForeground before Spacing or ScaleIntensityRange: "
            f"{_CROP_FOREGROUND}"
        )
    return out


def _crop_foreground(t: Any, i: int, name: str, image_key: str) -> dict[str, Any]:
    """``CropForeground(d)`` after Spacing and ScaleIntensityRange -> ``crop_foreground``
    (MONAI's defaults and the model zoo's settings; anything else refused by name)."""
    from monai.transforms.utils import is_positive

    cropper = getattr(t, "cropper", t)
    source = getattr(t, "source_key", image_key)
    mode = _value(_one(getattr(t, "mode", cropper.padder.mode), f"{name} mode"))
    pad_value = cropper.padder.kwargs.get("value", 0)
    if cropper.select_fn is not is_positive:
        _refuse(
            f"preprocessing[{i}] {name}: select_fn {getattr(cropper.select_fn, '__name__', '?')} "
            "(only MONAI's default is_positive, x > 0: radserve cannot read a function's "
            "threshold)"
        )
    if cropper.channel_indices is not None:
        _refuse(f"preprocessing[{i}] {name}: channel_indices (one image channel here)")
    if source != image_key:
        _refuse(f"preprocessing[{i}] {name}: source_key {source!r} (the box of the image only)")
    if mode != "constant" or pad_value != 0:
        _refuse(
            f"preprocessing[{i}] {name}: padding mode {mode!r} value {pad_value} (constant 0 "
            "only: Invertd's zero padding is what radserve reproduces)"
        )
    if cropper.lazy:
        _refuse(f"preprocessing[{i}] {name}: lazy=True (MONAI then fuses the crop into Spacing)")

    def per_axis(v: Any, what: str) -> list[int]:
        vals = [int(x) for x in v] if isinstance(v, list | tuple) else [int(v)] * 3
        if len(vals) != 3:
            _refuse(f"preprocessing[{i}] {name} {what} {v} (one value or three)")
        return vals

    return {
        "threshold": 0.0,
        "margin": per_axis(cropper.margin, "margin"),
        "k_divisible": per_axis(cropper.k_divisible, "k_divisible"),
        "allow_smaller": bool(cropper.allow_smaller),
    }


def _normalisation(a_min: float, a_max: float, b_min: float, b_max: float) -> dict[str, Any]:
    """ScaleIntensityRange(clip=True) as radserve's normalisation (the same affine map)."""
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
    if _value(inferer.padding_mode) != "constant" or float(inferer.cval) != 0.0:
        _refuse(
            f"SlidingWindowInferer padding_mode {_value(inferer.padding_mode)!r} / cval "
            f"{inferer.cval} (constant 0 only)"
        )
    if getattr(inferer, "with_coord", False):
        _refuse("SlidingWindowInferer with_coord (the network takes patch coordinates)")
    return {
        "patch_size": roi,
        "overlap": overlap,
        "batch_size": max(1, int(inferer.sw_batch_size)),
        "importance": "monai_gaussian" if mode == "gaussian" else "constant",
        "sigma_scale": sigma,
    }


def _postprocessing(transforms: list[Any], pred_key: str, image_order: int) -> dict[str, Any]:
    """(activation on the model grid, output order) from Activations/Invertd/AsDiscrete."""
    act_at = invert_at = argmax_at = None
    nearest = False
    for i, t in enumerate(transforms):
        name = type(t).__name__
        if name in _NEUTRAL or not _on_image(t, pred_key):
            continue
        if name in ("Activationsd", "Activations"):
            a = t  # dict transforms keep their per-key settings on themselves
            if _one(a.sigmoid, "sigmoid") or _one(a.other, "other") is not None:
                _refuse(f"postprocessing[{i}] {name}: sigmoid/other (softmax only)")
            if _one(a.softmax, "softmax"):
                act_at = i
        elif name == "Invertd":
            nearest = bool(_one(t.nearest_interp, "Invertd nearest_interp"))
            invert_at = i
        elif name in ("AsDiscreted", "AsDiscrete"):
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


def _labels(metadata: dict[str, Any]) -> tuple[list[dict[str, Any]], str, str]:
    """(labels, modality, image key) from metadata.json's network_data_format."""
    fmt = metadata.get("network_data_format") or {}
    inputs, outputs = fmt.get("inputs") or {}, fmt.get("outputs") or {}
    if len(inputs) != 1 or len(outputs) != 1:
        _refuse(f"network_data_format needs one input and one output (has {list(inputs)})")
    (image_key, image), (_, pred) = next(iter(inputs.items())), next(iter(outputs.items()))
    if int(image.get("num_channels", 1)) != 1:
        _refuse(f"{image.get('num_channels')} input channels (one series per model here)")
    modality = str(image.get("modality", "")).upper().replace("MRI", "MR")
    if modality not in ("CT", "MR"):
        _refuse(f"input modality {image.get('modality')!r} (CT or MR)")
    channels = pred.get("channel_def") or {}
    try:
        values = sorted((int(k), str(v)) for k, v in channels.items())
    except ValueError:
        values = []
    if not values or [v for v, _ in values] != list(range(len(values))) or len(values) < 2:
        _refuse(f"outputs channel_def {channels} must name channels 0..n (0: background)")
    if len(values) > 256:
        _refuse(f"{len(values)} output channels; radserve label maps are 8-bit")
    return label_entries([(v, n) for v, n in values if v != 0]), modality, image_key


def manifest_from_monai(source: MonaiSource, *, name: str, version: str) -> ModelSpec:
    """The ``model.yaml`` stating the bundle's inference, validated (needs MONAI)."""
    labels, modality, image_key = _labels(source.metadata)
    pre = _preprocessing(_transforms(_parsed(source, "preprocessing"), "preprocessing"), image_key)
    window = _inferer(_parsed(source, "inferer"))
    pred_key = next(iter(source.metadata["network_data_format"]["outputs"]))
    post = _postprocessing(
        _transforms(_parsed(source, "postprocessing"), "postprocessing"),
        pred_key,
        pre["image_order"],
    )
    meta = source.metadata
    raw = {
        "name": name,
        "version": version,
        "task": "segmentation",
        "modality": modality,
        "description": (
            f"Imported from MONAI Bundle {meta.get('name') or source.folder.name} "
            f"{meta.get('version', '')}".strip()
        ),
        "input": {
            "mode": "3d",
            "axes": pre["axes"],
            "spacing": pre["spacing"],
            "normalisation": _normalisation(*pre["intensity"]),
            "patch_size": window["patch_size"],
            "batch_size": window["batch_size"],
            "overlap": window["overlap"],
            "crop": "none",
            "crop_foreground": pre.get("crop_foreground"),
            "resampling": {
                "grid": "first_voxel",
                "image_order": pre["image_order"],
                "output_order": post["output_order"],
                "normalise_first": pre["intensity_at"] < pre["spacing_at"],
            },
            "sliding_window": {
                "importance": window["importance"],
                "sigma_scale": window["sigma_scale"],
                "accumulate": "logits",
                "pad": "centre_zero",
                "placement": "monai",
                "activate_on_model_grid": post["activate_on_model_grid"],
            },
        },
        "activation": "softmax",
        "labels": labels,
        "files": {"fp32": "model.onnx"},
    }
    try:
        return ModelSpec.model_validate(raw)
    except ValueError as exc:
        raise ImportRefusedError(f"the mapped model.yaml is invalid: {exc}") from exc


def load_network(source: MonaiSource) -> Any:
    """The bundle's network with its weights, in eval mode (torch.nn.Module)."""
    import torch

    if source.weights.suffix == ".ts":
        net = torch.jit.load(str(source.weights), map_location="cpu")
    else:
        net = _parsed(source, "network_def")
        state = torch.load(str(source.weights), map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
            state = state["model"]  # a checkpoint saved by a MONAI trainer's handler
        try:
            net.load_state_dict(state)
        except (RuntimeError, TypeError) as exc:
            raise ImportRefusedError(f"{source.weights} does not fit network_def: {exc}") from exc
    return net.eval()


def import_monai(
    folder: Path, models_dir: Path, *, name: str | None = None, version: str = "1.0.0"
) -> Path:
    """Write ``models_dir/<name>/<version>/`` (model.yaml, model.onnx, import.json)."""
    source = read_bundle(folder)
    default = str(source.metadata.get("name") or Path(folder).name)
    name = name or "".join(c if c.isalnum() else "-" for c in default.lower()).strip("-")
    spec = manifest_from_monai(source, name=name, version=version)
    out = Path(models_dir) / name / version
    if (out / "model.yaml").exists():
        raise ImportRefusedError(f"{out} already holds a bundle; pick another --version")
    net = load_network(source)
    out.mkdir(parents=True, exist_ok=True)
    patch = tuple(spec.input.patch_size or ())
    diff = export_checked(_single_output(net), out / "model.onnx", 1, patch)
    header = (
        f"# {spec.key}: imported by `radserve models import monai-bundle` from "
        f"{source.folder.name}.\n"
        "# The preprocessing below states the bundle's; see import.json for the source files.\n"
    )
    (out / "model.yaml").write_text(
        header + yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
    )
    record = {
        "framework": "monai",
        "source": str(source.folder),
        "bundle": {k: source.metadata.get(k) for k in ("name", "version", "monai_version")},
        "config": source.config_path.name,
        "weights": {source.weights.name: sha256_file(source.weights)},
        "onnx_max_abs_diff_vs_torch": diff,
    }
    (out / "import.json").write_text(json.dumps(record, indent=2) + "\n")
    logger.info("imported %s -> %s (ONNX vs torch max |diff| %.2e)", source.folder, out, diff)
    return out


def _single_output(net: Any) -> Any:
    """The network with one tensor output (deep-supervision lists are refused)."""
    import torch

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
