"""``radserve models import nnunet DIR``: an nnU-Net v2 trained-model folder -> a bundle.

``DIR`` is a trainer folder (``<Trainer>__<Plans>__<configuration>``) holding
``dataset.json``, ``plans.json`` and ``fold_<k>/checkpoint_final.pth``. Reading the
JSON and writing ``model.yaml`` needs no torch (:func:`manifest_from_nnunet`); the
export (:func:`export_onnx`) rebuilds the network with nnU-Net's own predictor
(``nnUNetPredictor.initialize_from_trained_model_folder``: the trainer's
``build_network_architecture`` from the plans) and needs the ``nnunet`` extra.

What the bundle states, as nnU-Net's inference does it (nnunetv2 2.x, default
preprocessor): the array axes are SimpleITK's (= radserve's (slice, row, column)),
transposed by ``transpose_forward``; crop to the bounding box of voxels non-zero in any
channel; each channel's normalisation before resampling (CTNormalization: clip to the
dataset fingerprint's 0.5/99.5 percentiles of that channel, z-score with its foreground
mean and std; per-image ZScoreNormalization, with ``use_mask_for_norm`` over the filled
non-zero mask; RescaleTo01Normalization; NoNormalization); resampling to the
configuration's spacing with its spline orders and the separate-z rule; sliding window
with its patch, step 0.5, nnU-Net's filtered Gaussian, centred zero padding and logit
averaging; logits resampled back with its order, then softmax (labels) or sigmoid
regions in ``regions_class_order``. Folds are ensembled inside the ONNX graph (their
logits averaged, as nnU-Net does); mirroring test-time augmentation is in the graph only
with ``tta=True`` (2^axes network passes per patch).

A ``transpose_forward`` becomes ``input.axes`` (index axes in nnU-Net's transposed order;
with the NibabelIOWithReorient reader, the patient directions S, A, R so transposed).
A model of several input channels (PET/CT, multi-sequence MR) becomes ``input.channels``:
each channel's series from its dataset.json name or ``--channel``, the first CT/MR
channel the grid, else the first PET (:mod:`radserve.importers.nnunet_channels`); a
PET-only model declares its one channel, so that it is read in SUVbw.

A ``2d`` configuration runs as depth-1 patches ``[1, H, W]`` of the 3D sliding window on
``spacing: [null, sy, sx]`` (the first axis keeps its native spacing, as nnU-Net's 2d
preprocessing does), the 2D network exported behind a (B, C, 1, H, W) wrapper.
Any trainer nnU-Net can load is fine: nnUNetPredictor uses it only to build the network.

Refused, with the reason: a transpose that is not a permutation, cascades
(``previous_stage``), SimpleITKIOWithReorient or a 2D-image reader, a trainer nnunetv2
cannot find,
another preprocessor or resampling function, a forced separate
z, other normalisations (e.g. RGBTo01Normalization), a channel whose name says no series
and no ``--channel`` names one, two channels read from the same series.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

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
from radserve.importers.nnunet_channels import channel_declarations
from radserve.models.axes import INDEX_AXES
from radserve.models.manifest import LABEL_MAPS_8_BIT, MAX_LABEL_VALUE, ModelSpec

logger = logging.getLogger(__name__)

__all__ = [
    "NnunetSource",
    "check_architecture",
    "default_folds",
    "export_onnx",
    "import_nnunet",
    "manifest_from_nnunet",
    "read_results_folder",
]

CHECKPOINT = "checkpoint_final.pth"
_RESAMPLE_FN = "resample_data_or_seg_to_shape"


@dataclass(frozen=True)
class NnunetSource:
    """What the JSON files of a trainer folder say (no checkpoint read yet)."""

    folder: Path
    dataset: dict[str, Any]
    plans: dict[str, Any]
    configuration_name: str
    configuration: dict[str, Any]  # inheritance resolved
    trainer_name: str
    folds: tuple[str, ...]
    # every fold folder holding the checkpoint, chosen or not (import.json records both)
    folds_found: tuple[str, ...] = ()


def default_folds(found: Sequence[str]) -> tuple[str, ...]:
    """The folds nnU-Net's own prediction ensembles when none are named
    (``nnUNetPredictor.auto_detect_available_folds``): every ``fold_K`` with the
    checkpoint, never ``fold_all`` -- a model trained on all cases, not one of the
    cross-validation folds -- unless it is the only one (nnU-Net then finds none and
    needs ``-f all``). Before 2026-12-07 the import took ``fold_all`` beside
    ``fold_0..k``: an ensemble nnU-Net never runs, its labels not nnU-Net's."""
    folds = tuple(f for f in found if f != "all")
    return folds or tuple(found)


def _resolve(plans: dict[str, Any], name: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """A configuration with ``inherits_from`` applied (as nnU-Net's PlansManager does)."""
    configs = plans.get("configurations") or {}
    if name not in configs:
        raise ImportRefusedError(
            f"configuration {name!r} is not in plans.json (has {sorted(configs)})"
        )
    if name in seen:
        chain = " -> ".join((*seen, name))
        raise ImportRefusedError(f"plans.json: configurations inherit in a circle ({chain})")
    config = copy.deepcopy(configs[name])
    parent = config.get("inherits_from")
    if parent:
        base = _resolve(plans, parent, (*seen, name))
        base.update(config)
        config = base
    return config


def read_results_folder(
    folder: Path, *, folds: tuple[str, ...] | None = None, checkpoint: str = CHECKPOINT
) -> NnunetSource:
    """Read ``dataset.json``, ``plans.json`` and find the folds with a checkpoint."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ImportRefusedError(f"{folder} is not a folder")
    parts = folder.name.split("__")
    if len(parts) != 3:
        raise ImportRefusedError(
            f"{folder.name!r} is not an nnU-Net trainer folder "
            "(<Trainer>__<Plans>__<configuration>, e.g. nnUNetTrainer__nnUNetPlans__3d_fullres)"
        )
    trainer, _plans_name, configuration = parts
    dataset = read_json_object(folder / "dataset.json")
    plans = read_json_object(folder / "plans.json")
    found = sorted(p.parent.name.removeprefix("fold_") for p in folder.glob(f"fold_*/{checkpoint}"))
    chosen = tuple(folds) if folds else default_folds(found)
    if not folds and "all" in found and "all" not in chosen:
        logger.warning(
            "fold_all left out: folds %s ensembled, as nnU-Net's own prediction does when "
            "no fold is named; --fold all imports fold_all alone",
            ", ".join(chosen),
        )
    missing = [f for f in chosen if f not in found]
    if missing or not chosen:
        others = sorted({p.name for p in folder.glob("fold_*/checkpoint_*.pth")} - {checkpoint})
        hint = f"; the folds hold {others} (--checkpoint NAME)" if others else ""
        raise ImportRefusedError(
            f"no {checkpoint} for fold(s) {missing or 'any'} in {folder} (found {found}){hint}"
        )
    with refused_if_malformed("plans.json"):
        config = _resolve(plans, configuration)
    return NnunetSource(
        folder, dataset, plans, configuration, config, trainer, chosen, tuple(found)
    )


def _refuse(reason: str) -> NoReturn:
    raise ImportRefusedError(f"nnU-Net model not importable: {reason}")


def _numbers(values: object, what: str) -> list[float]:
    """The plans' list ``what`` of numbers, each a JSON number: a string, a boolean or
    another object is refused by name. (Before 2026-12-08 ``"2"`` was read as 2 and
    ``true`` as a 1 mm spacing, silently, and a non-list ended the import in a
    traceback.)"""
    if not isinstance(values, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values
    ):
        _refuse(f"{what} is {values!r}: give a list of numbers")
    return [float(v) for v in values]


def _whole_numbers(values: object, what: str) -> list[int]:
    """The plans' list ``what`` of whole numbers (a patch size, an axis order): 16.5 is
    refused, not cut to 16."""
    numbers = _numbers(values, what)
    if not all(v.is_integer() for v in numbers):
        _refuse(f"{what} is {values!r}: give whole numbers")
    return [int(v) for v in numbers]


def _resampling(config: dict[str, Any]) -> dict[str, Any]:
    """Map the configuration's resampling functions onto ``input.resampling``."""
    for key in ("resampling_fn_data", "resampling_fn_probabilities"):
        if config.get(key) != _RESAMPLE_FN:
            _refuse(f"{key} is {config.get(key)!r}; radserve reproduces only {_RESAMPLE_FN}")
    data = config.get("resampling_fn_data_kwargs") or {}
    probs = config.get("resampling_fn_probabilities_kwargs") or {}
    if data.get("is_seg") or probs.get("is_seg"):
        _refuse("image or probability resampling declared as segmentation resampling")
    forced = {data.get("force_separate_z"), probs.get("force_separate_z")}
    if True in forced:
        _refuse("force_separate_z=True (always resample z apart) is not expressible")
    separate = "never" if forced == {False} else "auto"
    if None in forced and False in forced:
        _refuse("force_separate_z differs between image and probability resampling")
    checks = {
        "image order": (data.get("order", 3), (0, 1, 3)),
        "image order_z": (data.get("order_z", 0), (0, 1)),
        "probability order": (probs.get("order", 1), (0, 1)),
        "probability order_z": (probs.get("order_z", 0), (0, 1)),
    }
    for what, (value, allowed) in checks.items():
        if value not in allowed:
            _refuse(f"{what} {value} (radserve supports {list(allowed)})")
    return {
        "image_order": data.get("order", 3),
        "image_order_z": data.get("order_z", 0),
        "output_order": probs.get("order", 1),
        "output_order_z": probs.get("order_z", 0),
        "separate_z": separate,
        "anisotropy_threshold": 3.0,  # nnunetv2.configuration.ANISO_THRESHOLD
        "normalise_first": True,
    }


def _inputs(source: NnunetSource, overrides: dict[int, SeriesRule] | None) -> dict[str, Any]:
    """``modality`` and the ``input`` fields of the image channels (one, or ``channels``)."""
    channels = channel_declarations(source.dataset, source.plans, source.configuration, overrides)
    if len(channels) == 1 and channels[0]["modality"] != "PT":
        (only,) = channels
        return {"modality": only["modality"], "input": {"normalisation": only["normalisation"]}}
    # several series, or a PET-only model: its one channel declared, to be read in SUVbw
    # (what nnU-Net PET models are trained on), not in the series' Bq/ml
    order = int((source.configuration.get("resampling_fn_data_kwargs") or {}).get("order", 3))
    return multi_series_input(channels, "nnU-Net model not importable", order)


def _labels(dataset: dict[str, Any]) -> tuple[list[dict[str, Any]], str, list[int]]:
    """(labels, activation, regions) from dataset.json's ``labels``."""
    raw = dataset.get("labels")
    if not isinstance(raw, dict) or not raw:
        _refuse("dataset.json has no 'labels' object")
    entries = [(n, v) for n, v in raw.items() if n != "ignore"]  # the ignore label has no head
    # nnU-Net's LabelManager refuses these when it loads the model (RuntimeError,
    # AssertionError): before 2026-12-07 its traceback ended the import
    background = raw.get("background")
    if (
        "background" not in raw
        or isinstance(background, list | tuple)
        or _whole_number("background", background, refuse=False) != 0
    ):
        names = [n for n, v in entries if _whole_number(n, v, refuse=False) == 0]
        named = f" (value 0 is named {names[0]!r})" if names and names[0] != "background" else ""
        _refuse(
            'dataset.json\'s labels need the background as "background": 0, the name '
            f"nnU-Net requires{named}; nnU-Net itself refuses the model otherwise"
        )
    has_regions = any(isinstance(v, list | tuple) and len(v) > 1 for _, v in entries)
    if not has_regions:
        values = {n: _whole_number(n, v) for n, v in entries}
        ordered = sorted(values.values())
        shared = {
            v: [n for n, w in values.items() if w == v] for v in ordered if ordered.count(v) > 1
        }
        if shared:
            said = "; ".join(
                f"{v} is {' and '.join(map(repr, names))}" for v, names in shared.items()
            )
            _refuse(f"label values are duplicated ({said}): each label needs a value of its own")
        if ordered != list(range(len(ordered))) or ordered[0] != 0:
            _refuse(f"label values {ordered} are not consecutive from 0 (background)")
        if ordered[-1] > MAX_LABEL_VALUE:
            _refuse(f"{ordered[-1]} labels; {LABEL_MAPS_8_BIT}")
        labels = label_entries([(v, n) for n, v in values.items() if v != 0])
        return labels, "softmax", []
    order = dataset.get("regions_class_order")
    foreground = [(n, v) for n, v in entries if v not in (0, [0], (0,))]
    if not isinstance(order, list) or len(order) != len(foreground):
        _refuse("region labels without a regions_class_order of one value per region")
    if len(set(order)) != len(order) or min(order) < 1 or max(order) > MAX_LABEL_VALUE:
        _refuse(
            f"regions_class_order {order} must be distinct values 1..{MAX_LABEL_VALUE} "
            f"({LABEL_MAPS_8_BIT})"
        )
    labels = label_entries([(int(v), n) for (n, _), v in zip(foreground, order, strict=True)])
    return labels, "sigmoid", [int(v) for v in order]


def _whole_number(name: str, value: Any, *, refuse: bool = True) -> int | None:
    """A dataset.json label's value as nnU-Net reads it (``int(value)``; ``[v]`` is v):
    a whole number, given as one (``3``, ``3.0``) or as its digits (``"3"``). Anything
    else raises ValueError naming the label, which :func:`refused_if_malformed` makes
    the import's one-line refusal (``refuse=False``: None instead); ``int(2.5)`` quietly
    made 2 before."""
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    else:
        number = None
    if number is None and refuse:  # refused_if_malformed names the files around it
        raise ValueError(
            f"dataset.json's label {name!r} has the value {value!r}; a label value is a "
            "whole number (a region label a list of them)"
        )
    return number


_READERS = {"SimpleITKIO", "NibabelIO"}
# NibabelIOWithReorient: the image turned to NiBabel's closest canonical (RAS+) voxel
# order (io_orientation), then read as (k, j, i): the array axes run to S, A, R.
_REORIENTED_AXES = ("S", "A", "R")


def _reader_axes(source: NnunetSource) -> tuple[str, str, str]:
    """The array axes nnU-Net's image reader gives (before ``transpose_forward``), from
    the plans' ``image_reader_writer`` (what inference uses; the dataset.json's
    ``overwrite_image_reader_writer`` where the plans lack it). SimpleITKIO and NibabelIO
    give the voxel order reversed (slice, row, column: radserve's index axes);
    NibabelIOWithReorient the patient directions S, A, R (TotalSegmentator's reader).
    Other readers are refused."""
    name = str(
        source.plans.get("image_reader_writer")
        or source.dataset.get("overwrite_image_reader_writer")
        or "SimpleITKIO"
    )
    if name in _READERS or name == "None":
        return INDEX_AXES
    if name == "NibabelIOWithReorient":
        return _REORIENTED_AXES
    if name == "SimpleITKIOWithReorient":
        _refuse(
            f"image reader {name} reorients every image with SimpleITK's DICOMOrient "
            "before the network sees it; radserve reproduces NibabelIOWithReorient's "
            "reorientation, not this one (not tested against it)"
        )
    _refuse(
        f"image reader {name!r}: radserve reproduces nnU-Net's SimpleITKIO and NibabelIO "
        "(volumes such as NIfTI or DICOM series), not 2D images, TIFF stacks or custom readers"
    )


@refused_if_malformed("dataset.json and plans.json")
def manifest_from_nnunet(
    source: NnunetSource,
    *,
    name: str,
    version: str,
    mirror_axes: tuple[int, ...] = (),
    tta: bool = False,
    batch_size: int = 2,
    channels: dict[int, SeriesRule] | None = None,
) -> ModelSpec:
    """The ``model.yaml`` stating nnU-Net's inference for ``source``, validated.

    ``channels``: series rules by channel index (``--channel``), for channels whose
    dataset.json name does not say their series (:mod:`radserve.importers.nnunet_channels`).
    """
    plans, config = source.plans, source.configuration
    forward = _whole_numbers(plans.get("transpose_forward", [0, 1, 2]), "transpose_forward")
    backward = _whole_numbers(plans.get("transpose_backward", [0, 1, 2]), "transpose_backward")
    if sorted(forward) != [0, 1, 2] or [forward[b] for b in backward] != [0, 1, 2]:
        _refuse(
            f"transpose_forward {forward} / transpose_backward {backward} are not a "
            "permutation of the three axes and its inverse"
        )
    # nnU-Net transposes SimpleITK's (z, y, x) arrays by transpose_forward; the plans'
    # spacing and patch size are in that order, as input.axes declares it.
    reader_axes = _reader_axes(source)
    axes = [reader_axes[a] for a in forward]
    patch = _whole_numbers(config.get("patch_size") or [], "patch_size")
    spacing: list[float | None] = [*_numbers(config.get("spacing") or [], "spacing")]
    if len(patch) == 2 and len(spacing) == 2:
        # A 2d configuration: each slice along the (transposed) first axis through the 2D
        # network is a depth-1 patch of the 3D sliding window; that axis keeps its native
        # spacing (nnU-Net resamples in-plane only) and mirroring is over the 2D axes.
        patch, spacing = [1, *patch], [None, *spacing]
        mirror_axes = tuple(a + 1 for a in mirror_axes)
    elif len(patch) != 3 or len(spacing) != 3:
        _refuse(
            f"configuration {source.configuration_name!r}: patch {patch} and spacing "
            f"{spacing} are neither 2d nor 3d"
        )
    if config.get("previous_stage") or "cascade" in source.configuration_name:
        _refuse("cascade configurations (a previous stage's segmentation as input)")
    if config.get("preprocessor_name", "DefaultPreprocessor") != "DefaultPreprocessor":
        _refuse(f"preprocessor {config.get('preprocessor_name')!r} (only DefaultPreprocessor)")
    labels, activation, regions = _labels(source.dataset)
    if tta and not mirror_axes:
        _refuse("test-time augmentation asked for, but the model allows no mirroring axes")
    folds = ", ".join(source.folds)
    images = _inputs(source, channels)
    raw = {
        "name": name,
        "version": version,
        "task": "segmentation",
        "modality": images["modality"],
        "description": (
            f"Imported from nnU-Net v2: {plans.get('dataset_name', '?')}, "
            f"{source.folder.name}, fold(s) {folds} ensembled"
            + (f", mirroring TTA over axes {list(mirror_axes)}" if tta else "")
        ),
        "input": {
            "mode": "3d",
            "axes": axes,
            "spacing": spacing,
            **images["input"],
            "patch_size": patch,
            "batch_size": batch_size,
            "overlap": 0.5,  # nnUNetPredictor's default tile_step_size 0.5
            "crop": "nonzero",
            "resampling": _resampling(config),
            "sliding_window": {
                "importance": "gaussian_filter",
                "sigma_scale": 0.125,
                "accumulate": "logits",
                "pad": "centre_zero",
            },
            "test_time_augmentation": {"mirror_axes": list(mirror_axes), "enabled": tta},
        },
        "activation": activation,
        "channel_values": regions,
        "labels": labels,
        "postprocess": {"threshold": 0.5},
        "files": {"fp32": "model.onnx"},
    }
    return validated_manifest(raw)


def load_predictor(
    source: NnunetSource, checkpoint: str = CHECKPOINT, device: str = "cpu"
):  # -> nnUNetPredictor
    """nnU-Net's own predictor for ``source`` (network built from the plans) on ``device``;
    on a GPU as ``nnUNetv2_predict`` runs there (everything on the device, its autocast).

    The checkpoints are read by :func:`read_checkpoint` (tensors and plain values only,
    never a pickle's code). radserve serves the ONNX file, never the pickle.
    """
    try:
        import torch
        from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor
    except ImportError as exc:
        raise ImportRefusedError(
            "importing an nnU-Net model needs torch and nnunetv2: install the `nnunet` extra "
            f"(tools/install_nnunet.sh) ({exc})"
        ) from exc
    predictor = nnUNetPredictor(
        tile_step_size=0.5,
        use_gaussian=True,
        use_mirroring=False,
        perform_everything_on_device=device != "cpu",
        device=torch.device(device),
        verbose=False,
        allow_tqdm=False,
    )
    _initialise(predictor, source, checkpoint)
    return predictor


def _initialise(predictor, source: NnunetSource, checkpoint: str) -> None:
    """``nnUNetPredictor.initialize_from_trained_model_folder``, step by step, with one
    difference: the trainer class is looked up without failing on modules of nnunetv2
    that cannot be imported here. nnU-Net's lookup imports every trainer module until
    it finds the name, and its Primus trainers import timm, which the ``nnunet`` extra
    leaves out (tools/install_nnunet.sh); every trainer but nnUNetTrainer itself
    (nnUNetTrainerNoMirroring, nnUNetTrainer_250epochs, ...) would fail on that."""
    import inspect

    from nnunetv2.utilities.label_handling.label_handling import determine_num_input_channels
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    plans_manager = PlansManager(source.plans)
    parameters = []
    for i, fold in enumerate(source.folds):
        path = source.folder / f"fold_{fold}" / checkpoint
        saved = read_checkpoint(path)
        if i == 0:
            init_args = saved.get("init_args")
            configuration_name = (
                init_args.get("configuration") if isinstance(init_args, dict) else None
            )
            if not isinstance(saved.get("trainer_name"), str) or configuration_name is None:
                _refuse(
                    f"fold_{fold}/{checkpoint} has no trainer_name or init_args.configuration "
                    "(nnUNetTrainer.save_checkpoint writes both): not an nnU-Net v2 checkpoint"
                )
            trainer_name = str(saved["trainer_name"])
            mirror_axes = saved.get("inference_allowed_mirroring_axes")
        parameters.append(saved["network_weights"])
    if configuration_name != source.configuration_name:
        _refuse(
            f"the checkpoints were trained as {configuration_name!r}, the folder says "
            f"{source.configuration_name!r}"
        )
    config = plans_manager.get_configuration(configuration_name)
    try:  # nnU-Net's own checks of the labels and plans: RuntimeError, AssertionError ...
        channels = determine_num_input_channels(plans_manager, config, source.dataset)
        heads = plans_manager.get_label_manager(source.dataset).num_segmentation_heads
    except (RuntimeError, AssertionError, LookupError, TypeError, ValueError) as exc:
        _refuse(
            f"nnU-Net refuses dataset.json and plans.json as they are "
            f"({type(exc).__name__}: {_first_line(exc)[:200]})"
        )
    trainer = _trainer_class(trainer_name)
    check_architecture(config)  # before anything the plans name is built (called)
    try:
        if "plans_manager" in inspect.signature(trainer.build_network_architecture).parameters:
            network = trainer.build_network_architecture(
                plans_manager, config, channels, heads, enable_deep_supervision=False
            )
        else:  # the pre-2.6 signature nnU-Net still accepts
            network = trainer.build_network_architecture(
                config.network_arch_class_name,
                config.network_arch_init_kwargs,
                config.network_arch_init_kwargs_req_import,
                channels,
                heads,
                enable_deep_supervision=False,
            )
    except (ImportError, TypeError, ValueError, KeyError, AttributeError) as exc:
        _refuse(
            f"plans.json's architecture for {configuration_name!r} does not build with "
            f"{trainer_name} ({type(exc).__name__}: {_first_line(exc)[:200]})"
        )
    # every fold's weights must fit the network the plans describe; parameters[0] last,
    # so the network holds fold 0's weights as nnU-Net's own initialisation leaves it
    order = [*range(1, len(parameters)), 0]
    for fold, params in ((source.folds[i], parameters[i]) for i in order):
        try:
            network.load_state_dict(params)
        except (RuntimeError, TypeError, ValueError) as exc:
            detail = "; ".join(line.strip() for line in str(exc).splitlines()[1:3])
            _refuse(
                f"fold_{fold}/{checkpoint}: its weights do not fit the network plans.json "
                f"describes for {configuration_name!r} ({detail[:300] or type(exc).__name__})"
            )
    predictor.manual_initialization(
        network, plans_manager, config, parameters, source.dataset, trainer_name, mirror_axes
    )


def check_architecture(config: Any) -> None:
    """Refuse plans whose architecture names anything but network classes.

    nnU-Net builds the network from strings in plans.json: ``network_class_name`` is
    located and called with the plans' ``arch_kwargs``, and each name in
    ``_kw_requires_import`` (conv_op, norm_op, dropout_op, nonlin) is located and called
    by the network with its own kwargs. A plans file is data an AI team is handed, but
    located names are code: ``nonlin: subprocess.Popen`` with ``nonlin_kwargs: {args:
    [...]}`` ran a command, and ``network_class_name: torch.hub.load`` imported a
    ``hubconf.py`` shipped beside the plans, during an import. Each must be a class
    deriving from ``torch.nn.Module`` (every planner's and dynamic_network_architectures'
    are); the network class may also be a bare name nnU-Net then looks up among
    dynamic_network_architectures' own architectures."""
    import pydoc

    import torch

    kwargs = config.network_arch_init_kwargs or {}
    named = [("network_class_name", config.network_arch_class_name)]
    named += [
        (f"arch_kwargs.{key}", kwargs.get(key))
        for key in config.network_arch_init_kwargs_req_import or ()
        if kwargs.get(key) is not None
    ]
    for field, name in named:
        if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
            _refuse(f"plans.json architecture {field} {name!r} is not a dotted class name")
        try:
            found = pydoc.locate(name)
        except Exception as exc:  # pydoc.ErrorDuringImport: the module's own import failed
            _refuse(f"plans.json architecture {field} {name!r} cannot be imported ({exc})")
        if found is None and field == "network_class_name":
            continue  # nnU-Net looks it up among dynamic_network_architectures' classes
        if not (isinstance(found, type) and issubclass(found, torch.nn.Module)):
            if found is None:
                what = "not found"
            elif isinstance(found, type):
                what = "a class that is not a torch.nn.Module"
            else:
                what = f"a {type(found).__name__}, not a class"
            _refuse(
                f"plans.json architecture {field} {name!r} is {what}; nnU-Net would call it "
                "with the plans' arguments while building the network, so radserve does not "
                "(a network and its layers are torch.nn.Module classes)"
            )


def _checkpoint_globals() -> list[Any]:
    """The globals beyond torch's own that ``nnUNetTrainer.save_checkpoint`` pickles:
    numpy scalars (the logger's float32 losses, float64 dice, ``_best_ema``) and their
    dtypes (``numpy.dtypes.Float32DType`` / ``Float64DType`` under numpy 2). The scalar's
    module is ``numpy.core`` in checkpoints written under numpy 1, ``numpy._core`` under
    numpy 2."""
    import numpy as np

    dtypes = [type(np.dtype(code)) for code in ("f4", "f8")]
    scalar = np.float64(0).__reduce__()[0]  # numpy.(_)core.multiarray.scalar
    return [np.dtype, *dtypes, scalar, (scalar, "numpy.core.multiarray.scalar")]


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A trainer checkpoint read with ``torch.load(weights_only=True)``: tensors, plain
    values and :func:`_checkpoint_globals`. Unpickling anything else can run code the
    file names, so a checkpoint that needs it is refused instead."""
    import pickle

    import torch

    try:
        with torch.serialization.safe_globals(_checkpoint_globals()):
            saved = torch.load(path, map_location=torch.device("cpu"), weights_only=True)
    except pickle.UnpicklingError as exc:
        allowed = {
            g[1] if isinstance(g, tuple) else f"{g.__module__}.{g.__qualname__}"
            for g in _checkpoint_globals()
        }
        try:
            found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except ValueError:  # not a file torch.save wrote
            _refuse(f"{path.parent.name}/{path.name} is not a torch checkpoint")
        unsafe = [name for name in found if name not in allowed]
        _refuse(
            f"{path.parent.name}/{path.name} holds objects other than tensors, numbers and "
            f"the trainer's settings ({', '.join(unsafe) or _first_line(exc)}); unpickling "
            "them could run code, so radserve does not"
        )
    except (OSError, RuntimeError, EOFError) as exc:
        _refuse(f"cannot read {path.parent.name}/{path.name}: {exc}")
    if not isinstance(saved, dict) or not isinstance(saved.get("network_weights"), dict):
        _refuse(f"{path.parent.name}/{path.name} is not an nnU-Net trainer checkpoint")
    return saved


def _first_line(exc: Exception) -> str:
    """What torch's unpickler names as refused, without its advice to load unsafely."""
    text = str(exc).split("WeightsUnpickler error:")[-1].strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _trainer_class(name: str):  # -> type[nnUNetTrainer]
    """The trainer class ``name`` as nnU-Net finds it (nnunetv2's trainers, then
    ``nnUNet_extTrainer``), skipping trainer modules whose own imports fail here."""
    import importlib
    import pkgutil

    import nnunetv2.training.nnUNetTrainer as package
    from nnunetv2.utilities.find_class_by_name import recursive_find_python_class
    from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name

    try:
        return recursive_find_trainer_class_by_name(name)
    except ImportError:
        pass  # a module beside the one we want needs a package not installed here
    except RuntimeError:
        _refuse(_unknown_trainer(name))
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".", lambda _: None):
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            continue
        if isinstance(found := getattr(module, name, None), type):
            return found
    # nnU-Net searches nnUNet_extTrainer's folders after its own trainers, as here.
    for folder in os.environ.get("nnUNet_extTrainer", "").split(os.pathsep):  # noqa: SIM112
        if folder.strip() and os.path.isdir(folder):
            found = recursive_find_python_class(
                folder, name, None, base_folder=folder, cleanup_imports_from_base_folder=True
            )
            if found is not None:
                return found
    _refuse(_unknown_trainer(name))


def _unknown_trainer(name: str) -> str:
    return (
        f"trainer {name!r} (the checkpoint's trainer_name) is not in the installed nnunetv2 "
        f"{_nnunet_version()}, so its build_network_architecture (the network) is unknown. "
        "Put the file defining it where nnU-Net's own prediction would need it "
        "(nnunetv2/training/nnUNetTrainer, or a folder named by nnUNet_extTrainer) and "
        "import again"
    )


def _nnunet_version() -> str:
    from importlib.metadata import version

    return version("nnunetv2")


def _ensemble(predictor, mirror_axes: tuple[int, ...]):  # -> torch.nn.Module
    """The folds' networks averaged (and each mirrored over ``mirror_axes``), as
    ``predict_logits_from_preprocessed_data`` and ``_internal_maybe_mirror_and_predict``
    average them: per fold, the mean over flips; then the mean over folds."""
    import itertools

    import torch

    nets = []
    for params in predictor.list_of_parameters:
        net = copy.deepcopy(predictor.network)
        net.load_state_dict(params)
        nets.append(net.eval())
    flips = [
        tuple(a + 2 for a in c)
        for i in range(len(mirror_axes))
        for c in itertools.combinations(mirror_axes, i + 1)
    ]

    class Ensemble(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.nets = torch.nn.ModuleList(nets)

        def forward(self, x):
            total = None
            for net in self.nets:
                out = net(x)
                for axes in flips:
                    out = out + torch.flip(net(torch.flip(x, axes)), axes)
                out = out / (len(flips) + 1)
                total = out if total is None else total + out
            return total / len(self.nets)

    return Ensemble().eval()


def _as_depth_one_3d(model):  # -> torch.nn.Module
    """A 2D network as a 3D one on depth-1 patches: (B, C, 1, H, W) in and out."""
    import torch

    class DepthOne(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x):
            return self.net(x[:, :, 0])[:, :, None]

    return DepthOne().eval()


def export_onnx(
    predictor, path: Path, *, mirror_axes: tuple[int, ...] = (), providers: Sequence[str] = ()
) -> float:
    """Export the fold ensemble to ``path`` (opset 17, dynamic batch); return the max
    |torch - ONNX Runtime| logit difference on two random patch batches (raises if large),
    run on ``providers`` (the server's; empty: the host's choice).
    ``mirror_axes``: the network's own (nnU-Net's ``inference_allowed_mirroring_axes``);
    a 2D network is exported taking depth-1 3D patches."""
    model = _ensemble(predictor, mirror_axes)
    patch = tuple(predictor.configuration_manager.patch_size)
    if len(patch) == 2:
        model, patch = _as_depth_one_3d(model), (1, *patch)
    channels = len(predictor.configuration_manager.normalization_schemes)
    return export_checked(model, path, channels, patch, providers=providers)


def import_nnunet(
    folder: Path,
    models_dir: Path,
    *,
    name: str | None = None,
    version: str = "1.0.0",
    folds: tuple[str, ...] | None = None,
    tta: bool = False,
    checkpoint: str = CHECKPOINT,
    channels: dict[int, SeriesRule] | None = None,
    providers: Sequence[str] = (),
) -> Path:
    """Write ``models_dir/<name>/<version>/`` (model.yaml, model.onnx, import.json),
    whole or not at all (:func:`~radserve.importers.common.staged_bundle`); ``channels``:
    series rules by channel index, as :func:`manifest_from_nnunet`; ``providers``: the
    execution providers the server serves with (``runtime.providers``; empty: the
    host's choice), which the export is checked and probed on."""
    source = read_results_folder(folder, folds=folds, checkpoint=checkpoint)
    default = str(source.plans.get("dataset_name") or "nnunet").lower().replace("_", "-")
    name = name or default
    # Refuse what is inexpressible before spending time on torch.
    manifest_from_nnunet(source, name=name, version=version, channels=channels)
    predictor = load_predictor(source, checkpoint)
    if predictor.configuration_manager.previous_stage_name:
        _refuse("cascade configurations (a previous stage's segmentation as input)")
    allowed = tuple(int(a) for a in (predictor.allowed_mirroring_axes or ()))
    spec = manifest_from_nnunet(
        source, name=name, version=version, mirror_axes=allowed, tta=tta, channels=channels
    )
    with staged_bundle(models_dir, name, version) as staged:
        diff = export_onnx(
            predictor,
            staged / "model.onnx",
            mirror_axes=allowed if tta else (),
            providers=providers,
        )
        header = (
            f"# {spec.key}: imported by `radserve models import nnunet` from "
            f"{source.folder.name}.\n"
            "# The preprocessing below states nnU-Net's; see import.json for the source files.\n"
        )
        record = {
            "framework": "nnunetv2",
            "source": str(source.folder),
            "configuration": source.configuration_name,
            "trainer": source.trainer_name,
            "plans": source.plans.get("plans_name"),
            "checkpoint": checkpoint,
            "folds": list(source.folds),
            "folds_found": list(source.folds_found),
            "checkpoints": {
                f: sha256_file(source.folder / f"fold_{f}" / checkpoint) for f in source.folds
            },
            "onnx_max_abs_diff_vs_torch": diff,
            "test_time_augmentation": {
                "mirror_axes": list(allowed),
                "enabled": tta,
                "network_passes_per_patch": (2 ** len(allowed) if tta else 1) * len(source.folds),
            },
        }
        write_bundle_files(staged, spec, header, record, providers=providers)
    out = Path(models_dir) / name / version
    logger.info("imported %s -> %s (ONNX vs torch max |diff| %.2e)", source.folder, out, diff)
    return out
