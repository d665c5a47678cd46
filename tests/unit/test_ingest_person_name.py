"""Person names decoded with the dataset's character set: no ISO 2022 escape sequence
or control character survives (issue 11, 5), for pydicom's own character-set test
files and for values built here with the escape sequences of ISO 2022 IR 58/87/149."""

from __future__ import annotations

import pydicom
import pytest
from pydicom.data import get_charset_files
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset
from pydicom.tag import Tag

from radserve.ingest.person_name import person_name_groups, person_name_text

PYDICOM_FILES = {
    "chrH31.dcm": ("Yamada^Tarou", "山田^太郎", "やまだ^たろう"),
    "chrH32.dcm": ("ﾔﾏﾀﾞ^ﾀﾛｳ", "山田^太郎", "やまだ^たろう"),
    "chrI2.dcm": ("Hong^Gildong", "洪^吉洞", "홍^길동"),
    "chrJapMulti.dcm": ("やまだ^たろう",),
    "chrJapMultiExplicitIR6.dcm": ("やまだ^たろう",),
    "chrKoreanMulti.dcm": ("김희중",),
    "chrX1.dcm": ("Wang^XiaoDong", "王^小東"),
    "chrX2.dcm": ("Wang^XiaoDong", "王^小东"),
    "chrFren.dcm": ("Buc^Jérôme",),
    "chrGreek.dcm": ("Διονυσιος",),
    "chrRuss.dcm": ("Люкceмбypг",),
}


def _no_controls(groups: tuple[str, ...]) -> bool:
    return all(ord(c) >= 0x20 and c != "\x7f" for g in groups for c in g)


@pytest.mark.parametrize("name", sorted(PYDICOM_FILES))
def test_pydicom_charset_files(name: str) -> None:
    files = get_charset_files(name)
    if not files:
        pytest.skip(f"pydicom does not ship {name}")
    ds = pydicom.dcmread(files[0])
    groups = person_name_groups(ds)
    assert groups == PYDICOM_FILES[name]
    assert _no_controls(groups)
    assert person_name_text(ds) == "=".join(PYDICOM_FILES[name])


def _raw_name(value: bytes, charset: object) -> Dataset:
    """A dataset as read from a file: the name still raw bytes."""
    ds = Dataset()
    if charset is not None:
        ds.SpecificCharacterSet = charset
    ds[0x00100010] = RawDataElement(Tag(0x00100010), "PN", len(value), value, 0, False, True)
    return ds


# PS3.5 H.3.2 style: Chinese (GB 2312 in G1 via ESC $ ) A), each component re-designated.
IR58 = b"Zhang^XiaoDong=\x1b$)A\xd5\xc5^\x1b$)A\xd0\xa1\xb6\xab=zhang^xiaodong"
ZHANG = ("Zhang^XiaoDong", "张^小东", "zhang^xiaodong")
# PS3.5 H.3.1: Japanese, JIS X 0208 in G0 (ESC $ B), back to ASCII (ESC ( B) before each
# delimiter; 'ma' is 0x24 0x5E, a '^' byte inside a character.
IR87 = b"Yamada^Tarou=\x1b$B;3ED\x1b(B^\x1b$BB@O:\x1b(B=\x1b$B$d$^$@\x1b(B^\x1b$B$?$m$&\x1b(B"
# PS3.5 I.2: Korean, KS X 1001 in G1 (ESC $ ) C).
IR149 = (
    b"Hong^Gildong=\x1b$)C\xfb\xf3^\x1b$)C\xd1\xce\xd4\xd7=\x1b$)C\xc8\xab^\x1b$)C\xb1\xe6\xb5\xbf"
)


@pytest.mark.parametrize(
    ("value", "charset", "expected"),
    [
        (IR58, ["", "ISO 2022 IR 58"], ZHANG),
        (IR58, ["ISO 2022 IR 6", "ISO 2022 IR 58"], ZHANG),
        (IR87, ["", "ISO 2022 IR 87"], ("Yamada^Tarou", "山田^太郎", "やまだ^たろう")),
        (IR149, ["", "ISO 2022 IR 149"], ("Hong^Gildong", "洪^吉洞", "홍^길동")),
        # The escape sequence names its character set even where the header forgot to.
        (IR58, None, ZHANG),
        (IR87, "ISO_IR 100", ("Yamada^Tarou", "山田^太郎", "やまだ^たろう")),
        (IR149, None, ("Hong^Gildong", "洪^吉洞", "홍^길동")),
    ],
)  # fmt: skip
@pytest.mark.filterwarnings("ignore:Found unknown escape sequence:UserWarning")
def test_iso_2022_escapes_are_decoded_not_kept(value: bytes, charset, expected) -> None:
    groups = person_name_groups(_raw_name(value, charset))
    assert groups == expected
    assert _no_controls(groups)


def test_a_name_pydicom_already_converted_loses_its_escapes_too() -> None:
    ds = _raw_name(IR58, ["", "ISO 2022 IR 58"])
    str(ds.PatientName)  # converted (and decoded) by pydicom first
    assert person_name_groups(ds) == ("Zhang^XiaoDong", "张^小东", "zhang^xiaodong")


def test_pydicom_alone_keeps_the_ir_58_escape() -> None:
    """Why this module exists: pydicom 3.0's own PN decoding leaves ESC $ ) A in."""
    ds = _raw_name(IR58, ["", "ISO 2022 IR 58"])
    assert "\x1b" in str(ds.PatientName) or pydicom.__version__ >= "4"
    assert "\x1b" not in person_name_text(_raw_name(IR58, ["", "ISO 2022 IR 58"]))


@pytest.mark.filterwarnings("ignore:Found unknown escape sequence:UserWarning")
def test_unknown_escape_and_controls_are_dropped() -> None:
    groups = person_name_groups(_raw_name(b"Doe\x1b(Z^Jo\x07hn", None))
    assert groups == ("Doe^John",)
    ds = Dataset()
    ds.PatientName = "Doe\x1b$B^Jane"  # already text (not read from bytes)
    assert person_name_groups(ds) == ("Doe^Jane",)


def test_absent_or_empty_name() -> None:
    assert person_name_groups(Dataset()) == ()
    ds = Dataset()
    ds.PatientName = ""
    assert person_name_groups(ds) == ()
    ds.PatientName = "Doe^John=="
    assert person_name_groups(ds) == ("Doe^John",)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Müller^Jürgen=ミュラー^ユルゲン".encode(), ("Müller^Jürgen", "ミュラー^ユルゲン")),
        ("Müller^Jürgen".encode("latin-1"), ("Müller^Jürgen",)),
    ],
)
def test_a_name_no_character_set_declares_is_read_as_its_bytes_are(
    value: bytes, expected: tuple[str, ...]
) -> None:
    """Found by tools/edge_probe.py (charset_utf8_undeclared): without Specific Character
    Set a UTF-8 name was read as Latin-1 ("MÃ¼ller") into the FHIR Patient."""
    assert person_name_groups(_raw_name(value, None)) == expected
