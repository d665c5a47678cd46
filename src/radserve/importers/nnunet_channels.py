"""nnU-Net's input channels as radserve's: each channel's series and normalisation.

nnU-Net names a channel by free text (``dataset.json: channel_names``) and normalises it
by the plans' ``normalization_schemes``. The series a channel is read from comes from
its name or the importer's ``--channel`` (:mod:`radserve.importers.channel_series`).
Normalisations: ``CTNormalization`` (the fingerprint's per-channel percentiles, mean and
std), ``ZScoreNormalization`` (per image, with ``use_mask_for_norm``),
``RescaleTo01Normalization``, ``NoNormalization``; any other is refused by name.
"""

from __future__ import annotations

from typing import Any

from radserve.importers import ImportRefusedError
from radserve.importers.channel_series import SeriesRule, channel_name, series_rules

__all__ = ["channel_declarations"]

_REFUSED = "nnU-Net model not importable"


def _normalisation(scheme: str, channel: int, use_mask: bool, props: dict) -> dict[str, Any]:
    """model.yaml's ``normalisation`` for one channel's nnU-Net scheme."""
    if scheme == "CTNormalization":
        needed = ("percentile_00_5", "percentile_99_5", "mean", "std")
        if any(k not in props for k in needed):
            raise ImportRefusedError(
                f"nnU-Net model not importable: plans.json lacks foreground intensity "
                f"properties {list(needed)} of channel {channel} (CTNormalization)"
            )
        return {
            "kind": "clip_zscore",
            "lower": float(props["percentile_00_5"]),
            "upper": float(props["percentile_99_5"]),
            "mean": float(props["mean"]),
            "std": max(float(props["std"]), 1e-8),  # CTNormalization divides by max(std, 1e-8)
        }
    if scheme == "ZScoreNormalization":
        return {"kind": "zscore", "use_mask": bool(use_mask)}
    if scheme == "RescaleTo01Normalization":
        return {"kind": "rescale_01"}  # use_mask_for_norm is ignored by nnU-Net here too
    if scheme == "NoNormalization":
        return {"kind": "none"}
    raise ImportRefusedError(
        f"nnU-Net model not importable: channel {channel} normalization {scheme!r}; radserve "
        "expresses CTNormalization, ZScoreNormalization, RescaleTo01Normalization and "
        "NoNormalization"
    )


def channel_declarations(
    dataset: dict[str, Any],
    plans: dict[str, Any],
    config: dict[str, Any],
    overrides: dict[int, SeriesRule] | None = None,
) -> list[dict[str, Any]]:
    """One ``ChannelSpec`` dict per nnU-Net input channel, in network order.

    ``overrides``: series rules given on the command line, by channel index; they take
    the place of the rule the channel's name gives.
    """
    names = dataset.get("channel_names") or dataset.get("modality") or {}
    schemes = list(config.get("normalization_schemes") or [])
    masks = list(config.get("use_mask_for_norm") or [False] * len(schemes))
    if not schemes or len(names) != len(schemes) or len(masks) != len(schemes):
        raise ImportRefusedError(
            f"nnU-Net model not importable: dataset.json names {len(names)} channel(s), the "
            f"plans normalise {len(schemes)} and give use_mask_for_norm for {len(masks)}"
        )
    raw_names = [str(names.get(str(c), "")) for c in range(len(schemes))]
    rules = series_rules(raw_names, overrides, _REFUSED)
    props_all = plans.get("foreground_intensity_properties_per_channel") or {}
    taken: set[str] = set()
    return [
        {
            "name": channel_name(raw_names[c], taken, c),
            **rule.declaration(),
            "normalisation": _normalisation(
                str(scheme), c, bool(masks[c]), props_all.get(str(c)) or {}
            ),
        }
        for c, (scheme, rule) in enumerate(zip(schemes, rules, strict=True))
    ]
