"""Every setting is read by something, and every knob a subsystem has is a setting.

A setting nothing reads is a setting that silently does not apply (``jobs.retry_backoff_s``
was one); a subsystem knob with no setting cannot be tuned on site (five scheduler knobs
were). The first test looks for each field name, recursively through the sections, as
an attribute read (``x.name``), a keyword argument or a string anywhere in ``src``.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, RootModel, ValidationError

import radserve
from radserve.config import IngestSettings, Settings
from radserve.ingest.policy import IngestPolicy

SRC = Path(radserve.__file__).parent


def _used_names() -> set[str]:
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
    return names


def _sections(annotation: object) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            if issubclass(arg, RootModel):
                found += _sections(arg.model_fields["root"].annotation)
            else:
                found.append(arg)
        elif typing.get_args(arg):
            found += _sections(arg)
    return found


def _settings_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for name, field in model.model_fields.items():
        out.append((f"{prefix}{name}", name))
        for section in _sections(field.annotation):
            out += _settings_fields(section, f"{prefix}{name}.")
    return out


def test_every_setting_is_read_somewhere() -> None:
    used = _used_names()
    fields = _settings_fields(Settings)
    assert ("jobs.retry_backoff_s", "retry_backoff_s") in fields
    assert ("priority_rules.matches", "matches") in fields  # looks through root models
    unread = [dotted for dotted, name in fields if name not in used]
    assert not unread, f"settings nothing reads: {unread}"


def test_ingest_settings_are_every_ingest_policy_knob_with_its_default() -> None:
    policy = {f.name: f.default for f in dataclasses.fields(IngestPolicy)}
    settings = {name: f.default for name, f in IngestSettings.model_fields.items()}
    assert settings == policy
    assert IngestPolicy.from_settings(IngestSettings()) == IngestPolicy()


_INGEST_NUMBERS = {
    name: field.annotation
    for name, field in IngestSettings.model_fields.items()
    if field.annotation in (int, float)
}


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(sorted(_INGEST_NUMBERS)),
        st.one_of(st.floats(-1e300, 1e300, allow_nan=False), st.integers(-(2**70), 2**70)),
        max_size=4,
    )
)
def test_ingest_settings_that_load_always_build_the_policy(values: dict[str, float]) -> None:
    """A cross-field rule only IngestPolicy checked (min_spacing_mm below the largest
    spacings) let the settings load and the server's start end in a traceback."""
    try:
        loaded = IngestSettings(**values)
    except ValidationError:
        return
    IngestPolicy.from_settings(loaded)
