"""A model.yaml label name becomes a DICOM value (SEG SegmentLabel, SR text) and console
text: one with a backslash (a DICOM value delimiter: highdicom wrote ``a\\b`` as a
SegmentLabel of two values), a NUL, a newline or a bidi override is refused when the
manifest is read; printable text, markup included, is kept as written."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from radserve.models.manifest import LabelSpec

CODE = {"value": "10200004", "meaning": "Liver"}


def _label(name: str) -> LabelSpec:
    return LabelSpec.model_validate({"value": 1, "name": name, "concept": CODE, "category": CODE})


@pytest.mark.parametrize("name", ["a\\b", "nul\x00x", "two\nlines", "rtl\u202eevil", ""])
def test_label_names_that_would_break_a_dicom_value_are_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="must be printable text without a backslash"):
        _label(name)


@pytest.mark.parametrize("name", ["liver", "<script>x</script>", 'O\'Brien "quoted"', "Leber ä"])
def test_printable_names_are_kept_as_written(name: str) -> None:
    assert _label(name).name == name
