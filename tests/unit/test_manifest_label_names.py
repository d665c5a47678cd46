"""A model.yaml label name becomes a DICOM value (SEG SegmentLabel, SR text) and console
text: one with a backslash (a DICOM value delimiter: highdicom wrote ``a\\b`` as a
SegmentLabel of two values), a NUL, a newline or a bidi override is refused when the
manifest is read; printable text, markup included, is kept as written. The same rule
(radserve.models.dicom_text) holds the label's concept and category (CodeMeaning: LO, 64
bytes as UTF-8, as dciodvfy counts; scheme: SH, 16) and the model's name and version
(AlgorithmName/Version)."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from radserve.models.manifest import LabelSpec, ModelSpec

CODE = {"value": "10200004", "meaning": "Liver"}
MODEL_YAML = """
name: m
version: "1.0"
task: segmentation
modality: CT
input:
  mode: 2d
  spacing: [null, 1.0, 1.0]
  normalisation: {kind: ct_window, center: 40, width: 400}
labels:
  - {value: 1, name: liver, concept: {value: "10200004", meaning: Liver},
     category: {value: "123037004", meaning: Anatomical Structure}}
"""


def _label(name: str) -> LabelSpec:
    return LabelSpec.model_validate({"value": 1, "name": name, "concept": CODE, "category": CODE})


@pytest.mark.parametrize("name", ["a\\b", "nul\x00x", "two\nlines", "rtl\u202eevil", ""])
def test_label_names_that_would_break_a_dicom_value_are_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="must be printable text without a backslash"):
        _label(name)


@pytest.mark.parametrize("name", ["liver", "<script>x</script>", 'O\'Brien "quoted"', "Leber ä"])
def test_printable_names_are_kept_as_written(name: str) -> None:
    assert _label(name).name == name


@pytest.mark.parametrize(
    ("field", "code", "message"),
    [
        ("concept", {"value": "1", "meaning": "L" * 65}, "concept meaning .* is 65 bytes as UTF-8"),
        ("category", {"value": "1", "meaning": "a\\b"}, "category meaning .* without a backslash"),
        ("concept", {"value": "1", "meaning": "rtl\u202eevil"}, "concept meaning .* printable"),
        ("concept", {"value": "1", "meaning": "two\nlines"}, "concept meaning .* printable"),
        ("concept", {"value": "1", "meaning": ""}, "concept meaning .* printable"),
        ("concept", {"value": "1", "scheme": "S" * 17, "meaning": "x"}, "scheme .* is 17 bytes"),
        ("category", {"value": "a\\b", "meaning": "x"}, "category value .* backslash"),
    ],
)
def test_codes_that_would_break_a_seg_or_sr_are_refused(
    field: str, code: dict[str, str], message: str
) -> None:
    """A CodeMeaning is LO (64 characters; highdicom refused a longer one when every SEG
    and SR was built, at the end of each run), a scheme SH (16)."""
    entry = {"value": 1, "name": "liver", "concept": CODE, "category": CODE, field: code}
    with pytest.raises(ValidationError, match=message):
        LabelSpec.model_validate(entry)


def test_a_meaning_of_64_utf8_bytes_in_any_script_is_kept_and_one_more_is_refused() -> None:
    """dciodvfy counts an LO's bytes: 64 characters holding "ä αβγ 肝臓" are 72 and an error."""
    meaning = 'Läsion <b>"q"</b> αβγ 肝臓 ' + "x" * 31
    assert len(meaning.encode()) == 64 and len(meaning) < 64
    code = {"value": "1", "meaning": meaning}
    label = LabelSpec.model_validate({"value": 1, "name": "l", "concept": code, "category": CODE})
    assert label.concept.meaning == meaning
    with pytest.raises(ValidationError, match="is 65 bytes as UTF-8"):
        LabelSpec.model_validate(
            {
                "value": 1,
                "name": "l",
                "concept": {**code, "meaning": meaning + "x"},
                "category": CODE,
            }
        )


@pytest.mark.parametrize(
    ("name", "version", "message"),
    [
        ("m" * 65, "1.0.0", "model name .* is 65 bytes"),
        ("a\\b", "1.0.0", "model name .* without a backslash"),
        ("organs", "1.0\u202e", "model version .* printable"),
    ],
)
def test_model_names_and_versions_are_dicom_algorithm_identification(
    name: str, version: str, message: str
) -> None:
    """They are the SEG's and SR's AlgorithmName and AlgorithmVersion (LO)."""
    manifest = yaml.safe_load(MODEL_YAML)
    manifest.update(name=name, version=version)
    with pytest.raises(ValidationError, match=message):
        ModelSpec.model_validate(manifest)


@pytest.mark.parametrize("second", ["liver", "Liver", "LIVER"])
def test_two_labels_of_one_name_are_refused(second: str) -> None:
    """Measurements and upstream references look labels up by name: until session 36 a
    bundle with two labels named alike installed and one of them was read as the other."""
    manifest = yaml.safe_load(MODEL_YAML)
    manifest["labels"].append({**manifest["labels"][0], "value": 2, "name": second})
    with pytest.raises(ValidationError, match=f"'liver' and '{second}' name two labels"):
        ModelSpec.model_validate(manifest)
    manifest["labels"][1]["name"] = "liver_left"
    assert [label.name for label in ModelSpec.model_validate(manifest).labels] == [
        "liver",
        "liver_left",
    ]


def test_two_labels_of_one_value_are_refused() -> None:
    """One label map value, one label: a second label on value 1 would never be written."""
    manifest = yaml.safe_load(MODEL_YAML)
    manifest["labels"].append({**manifest["labels"][0], "name": "spleen"})
    with pytest.raises(ValidationError, match="label values must be unique"):
        ModelSpec.model_validate(manifest)
