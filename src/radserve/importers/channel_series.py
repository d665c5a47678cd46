"""Which of a study's series each input channel of an imported model is read from.

nnU-Net names a channel by free text (``dataset.json: channel_names``), a MONAI Bundle by
its ``channel_def`` or its loader's keys; neither says which DICOM series to read. The
series comes from the channel's name where the name says it (:data:`NAMED_SERIES`: CT;
PET/PT/SUV as a PT series in SUVbw, radserve's PET path; the MR sequences T1, T1c, T2,
FLAIR, ADC, DWI by their Series Description), or from the importer's ``--channel
INDEX=MODALITY[:SERIES_DESCRIPTION]``. A name that says no series and two channels
reading the same series are refused, naming the option. The grid is the first CT or MR
channel, else the first PET (a PET-only model). Shared by
:mod:`radserve.importers.nnunet_channels` and :mod:`radserve.importers.monai_channels`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radserve.importers import ImportRefusedError

__all__ = [
    "CHANNEL_OPTION",
    "NAMED_SERIES",
    "SeriesRule",
    "channel_name",
    "multi_series_input",
    "parse_channel_option",
    "reference_channel",
    "series_rules",
]

_NOT_CONTRAST = r"(?!.*(t1c|t1\s*ce|gd|gad|\+c|c\+|post|contrast|flair))"


@dataclass(frozen=True)
class SeriesRule:
    """Which of a study's series a channel is read from (``ChannelSpec``'s fields)."""

    modality: str
    series_description: str | None = None

    @property
    def units(self) -> str:
        """PET models are trained on SUV (autoPET): radserve converts PT to SUVbw."""
        return "SUVbw" if self.modality == "PT" else "native"

    def describe(self) -> str:
        where = f" whose Series Description matches {self.series_description!r}"
        return f"{self.modality} series" + (where if self.series_description else "")

    def declaration(self) -> dict[str, Any]:
        """The ``ChannelSpec`` fields this rule sets."""
        described = self.series_description
        return {
            "modality": self.modality,
            **({"series_description": described} if described else {}),
            "units": self.units,
        }


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
"""Channel names (upper case, letters and digits only) that say their series."""

CHANNEL_OPTION = "--channel INDEX=MODALITY[:SERIES_DESCRIPTION_REGEX]"


def parse_channel_option(text: str) -> tuple[int, SeriesRule]:
    """``1=PT`` or ``2=MR:(?i)flair`` -> (channel index, rule); ImportRefusedError if bad."""
    index, sep, rule = text.partition("=")
    modality, _, description = rule.partition(":")
    if not sep or not index.strip().isdigit() or not re.fullmatch(r"[A-Z]{2,4}", modality):
        raise ImportRefusedError(
            f"--channel {text!r}: expected {CHANNEL_OPTION.removeprefix('--channel ')}, e.g. "
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


def series_rules(
    names: Sequence[str], overrides: Mapping[int, SeriesRule] | None, refused: str
) -> list[SeriesRule]:
    """Each channel's series rule, in channel order: ``overrides`` (from ``--channel``, by
    index) before the rule a channel's name gives. ``refused`` opens each refusal
    (e.g. "nnU-Net model not importable")."""
    overrides = dict(overrides or {})
    if unknown := sorted(set(overrides) - set(range(len(names)))):
        raise ImportRefusedError(
            f"--channel names channel(s) {unknown}; the model has channels 0..{len(names) - 1}"
        )
    rules: list[SeriesRule] = []
    seen: dict[SeriesRule, int] = {}
    for c, raw in enumerate(names):
        rule = overrides.get(c) or NAMED_SERIES.get(re.sub(r"[^A-Z0-9]", "", raw.upper()))
        if rule is None:
            raise ImportRefusedError(
                f"{refused}: channel {c} is named {raw!r}, which does not say which series "
                f"it is read from; name it with {CHANNEL_OPTION} "
                f"(e.g. --channel {c}=PT for a PET in SUVbw, --channel {c}=MR:(?i)flair)"
            )
        if rule in seen:
            raise ImportRefusedError(
                f"{refused}: channels {seen[rule]} and {c} would both be read from the "
                f"{rule.describe()}; tell them apart with {CHANNEL_OPTION}"
            )
        seen[rule] = c
        rules.append(rule)
    return rules


def channel_name(raw: str, taken: set[str], channel: int) -> str:
    """A ``ChannelSpec`` name for channel ``channel`` named ``raw``, unique in ``taken``."""
    name = re.sub(r"[^a-z0-9_-]+", "-", raw.lower()).strip("-_")[:28] or f"channel{channel}"
    if not name[0].isalnum():
        name = f"c{name}"[:28]
    while name in taken:
        name = f"{name}-{channel}"
    taken.add(name)
    return name


def reference_channel(channels: Sequence[Mapping[str, Any]], refused: str) -> Mapping[str, Any]:
    """The channel whose series is the grid: the first CT/MR one (a PET is coarser and
    shows less anatomy), else the first PET (a PET-only model, converted to SUVbw too)."""
    if not channels:
        raise ImportRefusedError(f"{refused}: no input channels")
    return next((c for c in channels if c["modality"] != "PT"), channels[0])


def multi_series_input(
    channels: Sequence[Mapping[str, Any]], refused: str, image_order: int
) -> dict[str, Any]:
    """``modality`` and the ``input`` fields of a model of several series: its channels,
    the reference (:func:`reference_channel`), and the other channels resampled onto it
    with the spline order the framework resamples images with (``image_order``: nnU-Net's
    data order, 3; MONAI's ``Spacingd`` mode), since neither framework moves one series
    onto another itself (both stack channels that already share a grid)."""
    # here, not at the top: onto_grid loads SciPy's ndimage (~0.5 CPU-s), which a
    # refusal from the bundle's configs alone does not need
    from radserve.preprocess.onto_grid import INTERPOLATION_ORDERS

    reference = reference_channel(channels, refused)
    names = {order: name for name, order in INTERPOLATION_ORDERS.items()}
    return {
        "modality": reference["modality"],
        "input": {
            "channels": list(channels),
            "reference": reference["name"],
            "channel_interpolation": names[image_order],
        },
    }
