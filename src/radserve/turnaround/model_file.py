"""A service-time model from a file a person hands ``radserve plan --service-times``.

The planner's own model (:meth:`ServiceTimeModel.to_json`) or a whole ``radserve bench
--scenario eta --json`` summary, which holds one under ``service_times`` (the help has
said "radserve bench writes one" since the planner landed; before session 31 such a
summary planned with the prior, silently). Either may be gzipped, as the kept traces
are. Everything is checked before the model is built: a file that is no model, a model
that holds no measured job, or times that are not finite seconds (JSON allows NaN) is
refused with what is wrong, not planned with garbage or a traceback. So is one out of
range (since 2026-12-07: a prior above the settings' bounds for turnaround.prior_*, a
study of more slices than ingest.max_frames, a time over what the largest prior allows
for its slices, every time of a group 0 s) or inconsistent (``steps`` naming a step
with no samples, ``sizes`` empty beside measured jobs, a lane's list holding no lane):
those ended in a traceback, a MemoryError or a plan of 0.0 s TATs.
"""

from __future__ import annotations

import gzip
import json
import math
import reprlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from radserve.config import PRIOR_MAX, IngestSettings
from radserve.turnaround.service_time import NOT_WORK, RUN, SHARE, Prior, ServiceTimeModel

MAX_BYTES = 256 * 1024 * 1024  # a bench summary is a few MiB; a model well under one
_KEYS = ("pipeline", "step", "device", "precision")
_GROUP = ("pipeline", "device", "precision")
# the most slices a study may have, unless the caller says (the command: the settings'
# ingest.max_frames): a study the server would not ingest is not planned, and 1e15
# slices ended in a MemoryError (its batches)
MAX_SLICES = IngestSettings.model_fields["max_frames"].default
# the longest a study's step (or its whole run) may take: what the largest prior allows
# for its slices (turnaround.prior_fixed_s + prior_per_slice_s x slices at their bounds)
_LONGEST_FIXED_S, _LONGEST_PER_SLICE_S = PRIOR_MAX["fixed_s"], PRIOR_MAX["per_slice_s"]
_REPR = reprlib.Repr()  # values quoted in a refusal: short, whatever the file holds
_REPR.maxstring = _REPR.maxother = 40
_show = _REPR.repr


class ModelFileError(ValueError):
    """A ``--service-times`` file the planner cannot use, and why."""


def read_model_file(path: Path, *, max_slices: int = MAX_SLICES) -> ServiceTimeModel:
    """The service-time model in ``path`` (:mod:`this module's <radserve.turnaround.
    model_file>` rules), or :class:`ModelFileError`. ``max_slices``: the most slices a
    study may have (the command passes ``ingest.max_frames``)."""
    data = _model_data(_read_json(path), path, max_slices)
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
    except RecursionError:  # [[[[... nested deeper than Python's stack
        raise ModelFileError(
            f"{path}: not a service-time model: its JSON is nested too deeply to read"
        ) from None


def _model_data(data: Any, path: Path, max_slices: int = MAX_SLICES) -> Mapping[str, Any]:
    """The model's part of ``data`` (itself, or a bench summary's ``service_times``),
    checked: every field the model is built from, each in range, and ``steps`` and
    ``sizes`` consistent with ``samples``."""
    if isinstance(data, Mapping) and isinstance(data.get("service_times"), Mapping):
        data = data["service_times"]  # a radserve bench --scenario eta summary
    if not isinstance(data, Mapping) or not isinstance(data.get("samples"), list):
        raise ModelFileError(
            f"{path}: not a service-time model: expected a JSON object with 'samples' "
            "(or a `radserve bench --scenario eta --json` summary)"
        )
    lanes = _list(data.get("lane_samples", []), "lane_samples", path)
    if not data["samples"] and not lanes:
        raise ModelFileError(f"{path}: the model holds no measured job")
    # (pipeline, device, precision) -> step -> its samples' seconds
    measured: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for field, rows in (("samples", data["samples"]), ("lane_samples", lanes)):
        for i, row in enumerate(rows):
            _check_row(row, f"{path}: {field}[{i}]", field == "lane_samples", max_slices)
            group = (row["pipeline"], row["device"], row["precision"])
            measured.setdefault(group, {}).setdefault(row["step"], []).extend(row["seconds"])
    _check_prior(data.get("prior", {}), path)
    _check_sizes(data, path, max_slices)
    _check_steps(_list(data.get("steps", []), "steps", path), measured, path)
    for group, steps in measured.items():
        if not any(any(times) for times in steps.values()):
            raise ModelFileError(
                f"{path}: samples: every time of {_group_name(group)} is 0 s: its jobs "
                "took no time, which no study does (a plan with them answers TATs of 0 s)"
            )
    return data


def _check_row(row: Any, where: str, lane: bool, max_slices: int) -> None:
    if not isinstance(row, Mapping):
        raise ModelFileError(f"{where} is not an object")
    for key in _KEYS:
        if not isinstance(row.get(key), str):
            raise ModelFileError(f"{where}: '{key}' must be text")
    step = row["step"]
    if step in NOT_WORK - {RUN}:
        raise ModelFileError(
            f"{where}: step {_show(step)} is not a step of the work (a wait or a total)"
        )
    if lane != _is_lane(step):
        raise ModelFileError(
            f"{where}: step {_show(step)}: "
            + (
                "lane_samples hold a lane's whole-job times ('run <lane>', 'share <lane>')"
                if lane
                else "a lane's time belongs in 'lane_samples'"
            )
        )
    slices, seconds = row.get("slices"), row.get("seconds")
    if not isinstance(slices, list) or not isinstance(seconds, list):
        raise ModelFileError(f"{where}: 'slices' and 'seconds' must be lists")
    if len(slices) != len(seconds):
        raise ModelFileError(f"{where}: {len(slices)} slice counts for {len(seconds)} times")
    if not slices:
        raise ModelFileError(f"{where} ({_show(step)}): no samples in 'slices' and 'seconds'")
    for n, s in zip(slices, seconds, strict=True):
        if not _slices(n) or not _seconds(s):
            raise ModelFileError(
                f"{where} ({_show(step)}): {_show(n)} slices in {_show(s)} s; expected a "
                "slice count and finite seconds >= 0"
            )
        if n > max_slices:
            raise ModelFileError(
                f"{where} ({_show(step)}): 'slices' holds {n:.4g}: a study has at most "
                f"{max_slices:,} (ingest.max_frames)"
            )
        longest = _LONGEST_FIXED_S + _LONGEST_PER_SLICE_S * n
        if s > longest:
            raise ModelFileError(
                f"{where} ({_show(step)}): 'seconds' holds {s:.4g} s for {n:g} slices: over "
                f"the {longest:,.0f} s the largest prior allows (turnaround.prior_fixed_s "
                f"{_LONGEST_FIXED_S:g} + prior_per_slice_s {_LONGEST_PER_SLICE_S:g} x slices)"
            )


def _check_prior(prior: Any, path: Path) -> None:
    """The prior's fields, each within the bounds the settings hold turnaround.prior_*
    to (config.PRIOR_MAX): 1e308 s planned every TAT as 0.0 s, a device share of 5
    changed the answer."""
    if not isinstance(prior, Mapping) or not set(prior) <= set(Prior.__dataclass_fields__):
        raise ModelFileError(
            f"{path}: 'prior' must be an object of {', '.join(Prior.__dataclass_fields__)}"
        )
    for name, value in prior.items():
        most = PRIOR_MAX[name]
        if not _seconds(value) or value > most:
            raise ModelFileError(
                f"{path}: prior {name} {_show(value)}: must be a number from 0 to {most:g} "
                f"(as turnaround.prior_{name})"
            )


def _check_sizes(data: Mapping[str, Any], path: Path, max_slices: int) -> None:
    """``sizes``, when given: the jobs' study sizes, oldest first. Empty beside measured
    jobs it made every simulated study the typical 300 slices, whatever was measured."""
    if "sizes" not in data:
        return
    sizes = _list(data["sizes"], "sizes", path)
    if not sizes and data["samples"]:
        raise ModelFileError(
            f"{path}: 'sizes' is empty while 'samples' hold measured jobs: give their "
            "study sizes (slices), or leave 'sizes' out to take them from the samples"
        )
    for value in sizes:
        if not _slices(value):
            raise ModelFileError(f"{path}: sizes holds {_show(value)}, not a slice count")
        if value > max_slices:
            raise ModelFileError(
                f"{path}: sizes holds {value:.4g}: a study has at most {max_slices:,} "
                "slices (ingest.max_frames)"
            )


def _check_steps(
    steps: list[Any], measured: Mapping[tuple[str, str, str], Mapping[str, Any]], path: Path
) -> None:
    """Each of ``steps``: a measured group's steps in order, each named once and each
    with samples (one without made the planner's estimate end in an AttributeError)."""
    seen: set[tuple[str, str, str]] = set()
    for i, entry in enumerate(steps):
        where = f"{path}: steps[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("steps"), list):
            raise ModelFileError(f"{where} must be an object with 'steps' (a list)")
        for key in _GROUP:
            if not isinstance(entry.get(key), str):
                raise ModelFileError(f"{where}: '{key}' must be text")
        group = (entry["pipeline"], entry["device"], entry["precision"])
        if group in seen:
            raise ModelFileError(f"{where}: {_group_name(group)} is listed twice")
        seen.add(group)
        names = entry["steps"]
        for name in names:
            if not isinstance(name, str):
                raise ModelFileError(f"{where}: 'steps' holds {_show(name)}, not a step name")
            if name in NOT_WORK or name == SHARE or _is_lane(name):
                raise ModelFileError(f"{where}: {_show(name)} is a total or a wait, not a step")
            if name not in measured.get(group, {}):
                raise ModelFileError(
                    f"{where}: step {_show(name)} of {_group_name(group)} has no samples"
                )
        if len(set(names)) != len(names):
            raise ModelFileError(f"{where}: 'steps' names a step twice")


def _group_name(group: tuple[str, str, str]) -> str:
    return f"pipeline {_show(group[0])} on {_show(group[1])} at {_show(group[2])}"


def _is_lane(step: str) -> bool:
    """``run <lane>``, ``share <lane>``: one lane's whole-job times (as service_time
    tells them)."""
    return step.startswith((RUN + " ", SHARE + " "))


def _list(value: Any, name: str, path: Path) -> list[Any]:
    if not isinstance(value, list):
        raise ModelFileError(f"{path}: '{name}' must be a list")
    return value


def _seconds(value: Any) -> bool:
    """A finite number >= 0 (an integer too large for a float is none)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and value >= 0
    except OverflowError:  # JSON allows 1 followed by 400 zeros
        return False


def _slices(value: Any) -> bool:
    return _seconds(value) and float(value).is_integer() and value >= 1


__all__ = ["MAX_SLICES", "ModelFileError", "read_model_file"]
