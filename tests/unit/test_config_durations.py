"""Every duration setting is bounded above by a year: Python's waits, socket timeouts and
datetimes overflow long before the largest finite float, so a duration of 1e300 s killed
the thread that waited on it (``threading.Event.wait`` raises OverflowError) or ended
in a traceback (``radserve gateway echo --timeout 1e300``: tests/unit/test_cli_numbers.py)."""

from __future__ import annotations

import threading
import types
import typing
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from radserve.config import MAX_DURATION_S, ConfigError, Settings, load_settings

_UNITS = {"_s": 1.0, "_ms": 1e-3, "_days": 86_400.0}


def _model_of(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    return None


def _durations(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, float]]:
    """(dotted path, seconds per unit) of every number setting named as a duration (a
    ``_s``, ``_ms`` or ``_days`` suffix; ``_bytes_s`` is a rate), and of the TATs."""
    for name, field in model.model_fields.items():
        nested = _model_of(field.annotation)
        if nested is not None:
            yield from _durations(nested, f"{prefix}{name}.")
            continue
        unit = next((u for suffix, u in _UNITS.items() if name.endswith(suffix)), None)
        if prefix == "scheduler.tat_s.":
            unit = 1.0
        if unit is not None and not name.endswith("_bytes_s") and field.annotation is float:
            yield prefix + name, unit


DURATIONS = sorted(_durations(Settings))


def test_the_walk_finds_the_durations() -> None:
    paths = {path for path, _ in DURATIONS}
    named = {"fhir.timeout_s", "scheduler.tat_s.urgent", "lifecycle.drift.stale_window_days"}
    assert named <= paths
    assert "scheduler.max_queue_delay_ms" in paths and "server.min_body_rate_bytes_s" not in paths
    assert len(paths) > 40


@pytest.mark.parametrize(("path", "unit_s"), DURATIONS)
def test_every_duration_is_refused_over_a_year_with_its_name(path: str, unit_s: float) -> None:
    key = path.replace(".", "__")
    with pytest.raises(ConfigError, match=rf"'{path}'.*over a year|'{path}'.*less than"):
        load_settings(None, **{key: 1e300})
    over = (MAX_DURATION_S + 86_400) / unit_s
    with pytest.raises(ConfigError, match=rf"'{path}'"):
        load_settings(None, **{key: over})


def test_a_year_itself_is_taken_and_waits_on_it() -> None:
    settings = load_settings(None, jobs__lease_poll_s=MAX_DURATION_S, fhir__timeout_s=1e6)
    assert settings.jobs.lease_poll_s == MAX_DURATION_S
    assert MAX_DURATION_S < threading.TIMEOUT_MAX  # a thread can wait that long
    with pytest.raises(OverflowError):  # what 1e300 did to the waiting thread
        threading.Event().wait(1e300)
