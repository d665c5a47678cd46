"""A MONAI Bundle's several input channels (T1/T2/FLAIR, ...) as radserve's ``input.channels``.

MONAI stacks a multi-channel input in its loader, in one of two ways: ``LoadImaged`` of
one key given a list of files (BraTS's layout: ``{"image": [t1c, t1, t2, flair]}``), or
``LoadImaged`` of several keys joined by ``ConcatItemsd(keys, name=<image key>)``. Either
way the files are stacked voxel by voxel, one grid for all. radserve reads each channel
from its own DICOM series (:class:`~radserve.models.manifest.ChannelSpec`) and resamples
every one onto the reference series' grid, which must share its Frame of Reference
(refused at run time otherwise): on one grid that is MONAI's stack, voxel for voxel.

The channels' names are ``metadata.json``'s input ``channel_def`` (else the keys
``ConcatItemsd`` stacks), and each name's series is the shared rule
(:mod:`radserve.importers.channel_series`: T1, T1c, T2, FLAIR, ... or ``--channel``).
Every channel gets the bundle's intensity transforms, channel by channel; refused by
name: statistics over all channels together (``NormalizeIntensityd`` /
``ScaleIntensityd`` without ``channel_wise=True``), non-neutral transforms on the
loader's keys before they are stacked, and ``ConcatItemsd`` along another axis than the
channels. ``CropForegroundd`` of the stacked image (``source_key`` the image key, no
``channel_indices``: the importer refuses the others) maps as for one channel: MONAI's
box is the voxels above 0 in *any* channel, which is what
:func:`radserve.preprocess.foreground.foreground_box` takes over the stacked channels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radserve.importers import ImportRefusedError
from radserve.importers.channel_series import (
    SeriesRule,
    channel_name,
    multi_series_input,
    series_rules,
)

__all__ = ["REFUSED", "Stacking", "channel_inputs", "channel_names", "stacking"]

REFUSED = "MONAI bundle not importable"
_CONCAT = ("ConcatItemsd",)


@dataclass(frozen=True)
class Stacking:
    """How the bundle's preprocessing stacks its channels: ``keys`` the loader keys
    ``ConcatItemsd`` joins into the image key (at ``at``), or none (one key, a list of
    files)."""

    keys: tuple[str, ...] = ()
    at: int = -1

    def touches(self, transform: Any) -> list[str]:
        """The stacked keys ``transform`` works on."""
        keys = getattr(transform, "keys", None) or ()
        return [k for k in self.keys if k in tuple(keys)]


def stacking(transforms: Sequence[Any], image_key: str) -> Stacking:
    """The ``ConcatItemsd`` that writes ``image_key`` (none: a single loader key)."""
    found = [
        (i, t)
        for i, t in enumerate(transforms)
        if type(t).__name__ in _CONCAT and getattr(t, "name", None) == image_key
    ]
    if not found:
        return Stacking()
    if len(found) > 1:
        _refuse(f"preprocessing{[i for i, _ in found]} ConcatItemsd writes {image_key!r} twice")
    ((at, concat),) = found
    if int(concat.dim) != 0:
        _refuse(
            f"preprocessing[{at}] ConcatItemsd dim {concat.dim} (channels are stacked along "
            "dim 0; another axis joins images in space)"
        )
    return Stacking(tuple(str(k) for k in concat.keys), at)


def channel_names(image: Mapping[str, Any], stacked: Stacking) -> list[str]:
    """The input channels' names: ``channel_def`` (one per channel), else the stacked keys."""
    count = int(image.get("num_channels", 1))
    if stacked.keys and len(stacked.keys) != count:
        _refuse(
            f"metadata.json gives the input {count} channel(s), ConcatItemsd stacks "
            f"{len(stacked.keys)} keys {list(stacked.keys)}"
        )
    defined = image.get("channel_def") or {}
    try:
        named = {int(k): str(v) for k, v in defined.items()}
    except ValueError:
        named = {}
    if sorted(named) == list(range(count)):
        return [named[c] for c in range(count)]
    return list(stacked.keys) or [f"channel{c}" for c in range(count)]


def channel_inputs(
    names: Sequence[str],
    normalisation: dict[str, Any],
    overrides: Mapping[int, SeriesRule] | None,
    *,
    pooled: Sequence[str],
    image_order: int,
) -> dict[str, Any]:
    """``modality`` and ``input.channels``/``reference`` for a bundle of several input
    channels (nothing for one): each channel's series from its name or ``--channel``,
    each normalised as the bundle normalises every channel (``pooled``: the per-image
    intensity transforms without ``channel_wise``; ``image_order``: ``Spacingd``'s, which
    resamples the other channels onto the reference too)."""
    if len(names) == 1:
        if overrides:
            _refuse("--channel names a series per input channel; this bundle has one channel")
        return {}
    if pooled:
        _refuse(
            f"{pooled[0]} without channel_wise=True on {len(names)} channels: its statistics "
            "pool every channel; radserve normalises each channel on its own"
        )
    rules = series_rules(names, overrides, REFUSED)
    taken: set[str] = set()
    channels = [
        {"name": channel_name(raw, taken, c), **rule.declaration(), "normalisation": normalisation}
        for c, (raw, rule) in enumerate(zip(names, rules, strict=True))
    ]
    return multi_series_input(channels, REFUSED, image_order)


def _refuse(reason: str) -> None:
    raise ImportRefusedError(f"{REFUSED}: {reason}")
