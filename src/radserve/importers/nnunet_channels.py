"""nnU-Net's input channels as radserve's: each channel's series and normalisation.

nnU-Net names a channel by free text (``dataset.json: channel_names``) and normalises it
by the plans' ``normalization_schemes``. The series a channel is read from comes from
its name where the name says it (:data:`NAMED_SERIES`: CT; PET/PT/SUV as a PT series in
SUVbw, radserve's PET path; MR sequences T1, T1c, T2, FLAIR, ADC, DWI by their Series
Description), or from the importer's ``--channel INDEX=MODALITY[:SERIES_DESCRIPTION]``;
a name that says no series (``noNorm``, ``image``, ...) and two channels reading the
same series are refused, naming the option. Normalisations: ``CTNormalization`` (the
fingerprint's per-channel percentiles, mean and std), ``ZScoreNormalization`` (per image,
with ``use_mask_for_norm``), ``RescaleTo01Normalization``, ``NoNormalization``; any
other is refused by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from radserve.importers import ImportRefusedError

__all__ = ["SeriesRule", "channel_declarations", "parse_channel_option"]

_NOT_CONTRAST = r"(?!.*(t1c|t1\s*ce|gd|gad|\+c|c\+|post|contrast|flair))"


@dataclass(frozen=True)
class SeriesRule:
    """Which of a study's series a channel is read from (``ChannelSpec``'s fields)."""

    modality: str
    series_description: str | None = None

    @property
    def units(self) -> str:
        """nnU-Net PET models are trained on SUV (autoPET): radserve converts PT to SUVbw."""
        return "SUVbw" if self.modality == "PT" else "native"

    def describe(self) -> str:
        where = f" whose Series Description matches {self.series_description!r}"
        return f"{self.modality} series" + (where if self.series_description else "")


_MR_SEQUENCES = {
    "T1": rf"(?i)^{_NOT_CONTRAST}.*t1",
    "T1C": r"(?i)(?=.*t1)(?=.*(t1c|t1\s*ce|gd|gad|\+c|c\+|post|contrast))",
    "T2": r"(?i)^(?!.*(flair|t2\s*\*|star|swi)).*t2",
    "FLAIR": r"(?i)flair",
    "ADC": r"(?i)adc|apparent",
    "DWI": r"(?i)^(?!.*(adc|apparent)).*(dwi|diff|trace|hbv)",
}
_ALIASES = {
    "CT": "CT", "CTRES": "CT",
    "PET": "PT", "PT": "PT", "SUV": "PT", "FDG": "PT", "PETCT": "PT",
    "MR": "MR", "MRI": "MR",
    "T1": "T1", "T1W": "T1",
    "T1C": "T1C", "T1CE": "T1C", "T1GD": "T1C", "T1WCE": "T1C", "T1POST": "T1C",
    "T2": "T2", "T2W": "T2",
    "FLAIR": "FLAIR", "T2FLAIR": "FLAIR",
    "ADC": "ADC",
    "DWI": "DWI", "HBV": "DWI",
}  # fmt: skip
NAMED_SERIES: dict[str, SeriesRule] = {
    alias: SeriesRule("MR", _MR_SEQUENCES[key]) if key in _MR_SEQUENCES else SeriesRule(key)
    for alias, key in _ALIASES.items()
}
"""dataset.json channel names (upper case, letters and digits only) that say their series."""

_OPTION = "--channel INDEX=MODALITY[:SERIES_DESCRIPTION_REGEX]"


def parse_channel_option(text: str) -> tuple[int, SeriesRule]:
    """``1=PT`` or ``2=MR:(?i)flair`` -> (channel index, rule); ImportRefusedError if bad."""
    index, sep, rule = text.partition("=")
    modality, _, description = rule.partition(":")
    if not sep or not index.strip().isdigit() or not re.fullmatch(r"[A-Z]{2,4}", modality):
        raise ImportRefusedError(
            f"--channel {text!r}: expected {_OPTION.removeprefix('--channel ')}, e.g. "
            "1=PT (a PET in SUVbw) or 2=MR:(?i)flair"
        )
    if description:
        try:
            re.compile(description)
        except re.error as exc:
            raise ImportRefusedError(
                f"--channel {text!r}: not a regular expression: {exc}"
            ) from exc
    return int(index), SeriesRule(modality, description or None)


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


def _name(raw: str, taken: set[str], channel: int) -> str:
    name = re.sub(r"[^a-z0-9_-]+", "-", raw.lower()).strip("-_")[:28] or f"channel{channel}"
    if not name[0].isalnum():
        name = f"c{name}"[:28]
    while name in taken:
        name = f"{name}-{channel}"
    taken.add(name)
    return name


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
    overrides = dict(overrides or {})
    if unknown := sorted(set(overrides) - set(range(len(schemes)))):
        raise ImportRefusedError(
            f"--channel names channel(s) {unknown}; the model has channels 0..{len(schemes) - 1}"
        )
    props_all = plans.get("foreground_intensity_properties_per_channel") or {}
    out: list[dict[str, Any]] = []
    taken: set[str] = set()
    seen: dict[SeriesRule, int] = {}
    for c, scheme in enumerate(schemes):
        raw = str(names.get(str(c), ""))
        rule = overrides.get(c) or NAMED_SERIES.get(re.sub(r"[^A-Z0-9]", "", raw.upper()))
        if rule is None:
            raise ImportRefusedError(
                f"nnU-Net model not importable: channel {c} is named {raw!r}, which does not "
                f"say which series it is read from; name it with {_OPTION} "
                f"(e.g. --channel {c}=PT for a PET in SUVbw, --channel {c}=MR:(?i)flair)"
            )
        if rule in seen:
            raise ImportRefusedError(
                f"nnU-Net model not importable: channels {seen[rule]} and {c} would both be "
                f"read from the {rule.describe()}; tell them apart with {_OPTION}"
            )
        seen[rule] = c
        described = rule.series_description
        out.append(
            {
                "name": _name(raw, taken, c),
                "modality": rule.modality,
                **({"series_description": described} if described else {}),
                "units": rule.units,
                "normalisation": _normalisation(
                    str(scheme), c, bool(masks[c]), props_all.get(str(c)) or {}
                ),
            }
        )
    return out
