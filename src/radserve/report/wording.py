"""How radserve words an organ's or a finding's coverage, and a study's completeness,
for people (conclusion text, FHIR notes, SR text, CLI).

One place, so the DiagnosticReport conclusion, the Observation notes and the console
say the same thing: a partial organ's volume is "at least" a value, an organ not found
is "not assessed", never "0 ml"; a finding cut by the edge of the volume has diameters
and a volume that are lower bounds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from radserve.domain import CodedConcept, Finding, OrganMeasurement
from radserve.domain.input_domain import OUTSIDE_INPUT_DOMAIN

if TYPE_CHECKING:
    from radserve.report.schema import ReportWarning

_EDGE_WORDS = {
    "first_slice": "the first slice",
    "last_slice": "the last slice",
    "first_row": "the first row",
    "last_row": "the last row",
    "first_column": "the first column",
    "last_column": "the last column",
}


def edges_text(item: OrganMeasurement | Finding) -> str:
    """e.g. "reaches the first slice and the last row of the scanned volume"."""
    words = [_EDGE_WORDS[e] for e in item.edges]
    joined = words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
    return f"reaches {joined} of the scanned volume"


def coverage_note(organ: OrganMeasurement) -> str | None:
    """Why an organ's volume is a lower bound or absent; None when it is complete."""
    name = organ.concept.meaning
    if organ.coverage == "not_found":
        return (
            f"{name}: not assessed; no part of it was found in the scanned volume (outside "
            "the scanned range, absent, or not detected). No volume is reported."
        )
    if organ.coverage == "partial":
        return (
            f"{name} is not wholly in the field of view (it {edges_text(organ)}); the "
            "volume covers the scanned part only and is a lower bound."
        )
    return None


def finding_coverage_note(finding: Finding, name: str) -> str | None:
    """Why a finding's measurements are lower bounds; None when it lies wholly inside."""
    if finding.coverage != "partial":
        return None
    return (
        f"{name} is truncated by the edge of the scanned volume (it {edges_text(finding)}); "
        "its diameters and volume cover the scanned part only and are lower bounds."
    )


def site_text(finding: Finding, organs: Mapping[str, CodedConcept]) -> str:
    """Where a finding lies, e.g. " in left lung": named by its organ's concept as the SR's
    finding site, the SEG's anatomic region and the organ's own conclusion line ("Left
    lung volume") name it, never by the model's label (``lung_left``); "" when no organ
    contains it. ``organs``: organ label -> concept
    (:func:`radserve.report.dicom.common.organ_concepts`). A label without a concept
    reads with spaces for its underscores."""
    label = finding.containing_organ
    if not label:
        return ""
    concept = organs.get(label)
    name = concept.meaning if concept is not None else label.replace("_", " ")
    if len(name) > 1 and name[0].isupper() and not name[1].isupper():  # not an acronym
        name = name[0].lower() + name[1:]
    return f" in {name}"


def organ_volume_text(organ: OrganMeasurement, digits: int = 1) -> str:
    """The conclusion line of one organ."""
    name = organ.concept.meaning
    if organ.volume_ml is None:
        return f"{name}: not assessed (not found in the scanned volume)"
    value = f"{organ.volume_ml:.{digits}f} ml"
    if organ.coverage == "partial":
        return f"{name} volume: at least {value} (partly outside the scanned volume)"
    return f"{name} volume: {value}"


# --- what a reader must know (gateway completeness, lossy input, input domain) ----------------
# Report warnings a reader of the SR and the FHIR DiagnosticReport must see: the result may
# not cover the whole study, the models ran on lossy compressed images (its measurements
# may differ from those on the originals), or the study lies outside what the models were
# validated on (a volume with no body in it read as a clean "no findings"); other warnings
# stay in the JSON report.
LATE_INSTANCES = "late_instances"
STUDY_MAYBE_INCOMPLETE = "study_maybe_incomplete"
INSTANCES_REFUSED = "instances_refused"
LOSSY_INPUT = "lossy_input"
COMPLETENESS_WARNINGS = (LATE_INSTANCES, STUDY_MAYBE_INCOMPLETE, INSTANCES_REFUSED)
READER_WARNINGS = (*COMPLETENESS_WARNINGS, LOSSY_INPUT, OUTSIDE_INPUT_DOMAIN)


def late_instances_text(instances: int, series: int) -> str:
    """The ``late_instances`` warning: what arrived after the analysis started."""
    return (
        f"{instances} instance{'s' if instances != 1 else ''} in {series} "
        f"series arrived after this analysis started and {'are' if instances != 1 else 'is'} "
        "not included in this result (gateway late policy 'flag')"
    )


def maybe_incomplete_text() -> str:
    """The ``study_maybe_incomplete`` warning: the transfer was cut off and never resumed,
    or a sender's association was still open when the study went quiet (since session
    43; the text said only the first)."""
    return (
        "the transfer of this study was cut off, or its sender still held the connection "
        "open, when the study was handed over for analysis; the study may be incomplete "
        "and this result may not cover all of its images"
    )


def instances_refused_text(
    instances: int, reasons: Iterable[tuple[str, int]], *, at_most: bool = False
) -> str:
    """The ``instances_refused`` warning: instances of the study that a gateway door
    (C-STORE, STOW-RS) refused, each answered to its sender as a failure, and not stored
    since. ``reasons``: (reason, how many), a reason being radserve's error code and the
    status answered, never a value of an instance. ``at_most``: past the instances the
    gateway tells apart, a resent instance was counted at each refusal."""
    listed = ", ".join(f"{count} {reason}" for reason, count in reasons)
    if at_most:
        return (
            f"up to {instances} instances of this study were refused at the gateway (not "
            f"stored: {listed}) and may be missing from this result; the count may include "
            "instances the sender sent again"
        )
    plural = instances != 1
    return (
        f"{instances} instance{'s' if plural else ''} of this study {'were' if plural else 'was'} "
        f"refused at the gateway (not stored: {listed}) and {'are' if plural else 'is'} not "
        "included in this result"
    )


def no_findings_text(warnings: Iterable[ReportWarning]) -> str:
    """The conclusion's first line when nothing was found: not a negative result where the
    study lies outside the models' input domain (a radiologist reads "No lesions detected"
    alone as a normal study)."""
    if any(w.code == OUTSIDE_INPUT_DOMAIN for w in warnings):
        return (
            "No lesions detected, but the study lies outside the input domain of the models "
            "(see the notes): this is not a negative result."
        )
    return "No lesions detected."


def reader_notes(warnings: Iterable[ReportWarning]) -> list[str]:
    """The messages of the warnings a reader must see among ``warnings``, in order."""
    return [w.message for w in warnings if w.code in READER_WARNINGS]
