"""A service-time model from a file a person hands ``radserve plan --service-times``.

The planner's own model (:meth:`ServiceTimeModel.to_json`) or a whole ``radserve bench
--scenario eta --json`` summary, which holds one under ``service_times`` (the help has
said "radserve bench writes one" since the planner landed; before session 31 such a
summary planned with the prior, silently). Either may be gzipped, as the kept traces
are. Everything is checked before the model is built: a file that is no model, a model
that holds no measured job, or times that are not finite seconds (JSON allows NaN) is
refused with what is wrong, not planned with garbage or a traceback.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from radserve.turnaround.service_time import Prior, ServiceTimeModel

MAX_BYTES = 256 * 1024 * 1024  # a bench summary is a few MiB; a model well under one
_KEYS = ("pipeline", "step", "device", "precision")


class ModelFileError(ValueError):
    """A ``--service-times`` file the planner cannot use, and why."""


def read_model_file(path: Path) -> ServiceTimeModel:
    """The service-time model in ``path`` (:mod:`this module's <radserve.turnaround.
    model_file>` rules), or :class:`ModelFileError`."""
    data = _model_data(_read_json(path), path)
    try:
        return ServiceTimeModel.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # checked above
        raise ModelFileError(f"{path}: not a service-time model ({exc})") from None


def _read_json(path: Path) -> Any:
    try:
        with path.open("rb") as raw:
            head = raw.read(2)
        opener: Any = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            blob = f.read(MAX_BYTES + 1)
    except (OSError, EOFError) as exc:
        raise ModelFileError(f"{path}: cannot be read ({exc})") from None
    if len(blob) > MAX_BYTES:
        raise ModelFileError(f"{path}: over {MAX_BYTES // 2**20} MiB; not a service-time model")
    try:
        return json.loads(blob)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ModelFileError(f"{path}: not JSON ({exc})") from None


def _model_data(data: Any, path: Path) -> Mapping[str, Any]:
    """The model's part of ``data`` (itself, or a bench summary's ``service_times``),
    checked."""
    if isinstance(data, Mapping) and isinstance(data.get("service_times"), Mapping):
        data = data["service_times"]  # a radserve bench --scenario eta summary
    if not isinstance(data, Mapping) or not isinstance(data.get("samples"), list):
        raise ModelFileError(
            f"{path}: not a service-time model: expected a JSON object with 'samples' "
            "(or a `radserve bench --scenario eta --json` summary)"
        )
    rows = [*data["samples"], *_list(data.get("lane_samples", []), "lane_samples", path)]
    if not rows:
        raise ModelFileError(f"{path}: the model holds no measured job")
    for i, row in enumerate(rows):
        _check_row(row, i, path)
    prior = data.get("prior", {})
    if not isinstance(prior, Mapping) or not set(prior) <= set(Prior.__dataclass_fields__):
        raise ModelFileError(f"{path}: 'prior' must be an object of {Prior.__dataclass_fields__}")
    for name, value in prior.items():
        if not _seconds(value):
            raise ModelFileError(f"{path}: prior {name} {value!r} is not a number >= 0")
    for value in _list(data.get("sizes", []), "sizes", path):
        if not _slices(value):
            raise ModelFileError(f"{path}: sizes holds {value!r}, not a slice count")
    steps = _list(data.get("steps", []), "steps", path)
    for group in steps:
        if not isinstance(group, Mapping) or not isinstance(group.get("steps"), list):
            raise ModelFileError(f"{path}: each of 'steps' must be an object with 'steps'")
    return data


def _check_row(row: Any, i: int, path: Path) -> None:
    where = f"{path}: sample {i}"
    if not isinstance(row, Mapping):
        raise ModelFileError(f"{where} is not an object")
    for key in _KEYS:
        if not isinstance(row.get(key), str):
            raise ModelFileError(f"{where}: '{key}' must be text")
    slices, seconds = row.get("slices"), row.get("seconds")
    if not isinstance(slices, list) or not isinstance(seconds, list):
        raise ModelFileError(f"{where}: 'slices' and 'seconds' must be lists")
    if len(slices) != len(seconds):
        raise ModelFileError(f"{where}: {len(slices)} slice counts for {len(seconds)} times")
    for n, s in zip(slices, seconds, strict=True):
        if not _slices(n) or not _seconds(s):
            raise ModelFileError(
                f"{where} ({row['step']}): {n!r} slices in {s!r} s; expected a slice count "
                "and finite seconds >= 0"
            )


def _list(value: Any, name: str, path: Path) -> list[Any]:
    if not isinstance(value, list):
        raise ModelFileError(f"{path}: '{name}' must be a list")
    return value


def _seconds(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _slices(value: Any) -> bool:
    return _seconds(value) and float(value).is_integer() and value >= 1


__all__ = ["ModelFileError", "read_model_file"]
