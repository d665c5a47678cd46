"""Source values the DICOM results carry shortened: the rule, and the report warning that
says which attribute was cut and how long it was, never the value.

A source may hold a Patient's Name far longer than PN allows (64 characters per
component group; a 65,534-byte name arrived through every door). The SEG, SR and
Secondary Captures copy it cut (:func:`radserve.report.dicom.common.restore_patient_name`),
so a reader comparing them with the PACS's images must be told: the report carries a
``value_shortened`` warning (JSON, and a Quality Issue in the SR). The FHIR Bundle keeps
the name whole (FHIR has no length limit).
"""

from __future__ import annotations

PN_GROUP_MAX_CHARS = 64  # PS3.5 Table 6.2-1: a PN component group holds at most 64 characters
VALUE_SHORTENED = "value_shortened"  # the report warning's code


def longest_pn_group_over(name: object) -> int:
    """The length of the longest component group of the Person Name ``name`` that is over
    PN's 64 characters; 0 when none is."""
    if name is None:
        return 0
    groups = str(name).split("=")
    return max((len(g) for g in groups if len(g) > PN_GROUP_MAX_CHARS), default=0)


def cut_person_name(name: object) -> str:
    """``name`` with each component group cut to PN's 64 characters."""
    return "=".join(group[:PN_GROUP_MAX_CHARS] for group in str(name).split("="))


def shortened_values(patient_name: object) -> list[tuple[str, str]]:
    """(code, message) of each source value the DICOM results will carry shortened."""
    longest = longest_pn_group_over(patient_name)
    if not longest:
        return []
    return [
        (
            VALUE_SHORTENED,
            f"Patient's Name (0010,0010) has a component group of {longest} characters: the "
            f"DICOM results carry each group cut to the {PN_GROUP_MAX_CHARS} characters PN "
            "allows (the FHIR Bundle carries it whole)",
        )
    ]


__all__ = [
    "PN_GROUP_MAX_CHARS",
    "VALUE_SHORTENED",
    "cut_person_name",
    "longest_pn_group_over",
    "shortened_values",
]
