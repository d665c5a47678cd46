"""Target (b): a 4-slice phantom CT series, one slice replaced by the fuzzer's bytes,
through what ``radserve run`` (and a server job) does before inference:
:func:`~radserve.pipeline.inputs.ingest_study` -- discovery (header reads, grouping,
the series checks), series selection, stack geometry, pixel decode, CT value checks.

The server decodes JPEG 2000 and the other isolated syntaxes in worker processes, where
a native abort fails only the job. Here every syntax is decoded in this process (the
guard below), so a native abort is a deadly signal libFuzzer reports with its input,
instead of a worker that dies unseen."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from radserve.ingest import decode
from radserve.ingest.policy import IngestPolicy
from radserve.pipeline.inputs import ingest_study
from radserve.pipeline.spec import PipelineSpec
from tests.fuzz.invariant import refusals_only
from tests.fuzz.targets import _phantom

COVERED = (
    "radserve.ingest",
    "radserve.pipeline.inputs",
    "radserve.pipeline.selection",
    "radserve.domain.volume",
    "pydicom.pixels",
    *_phantom.PARSER,
)
# bounds small enough that a fuzzed Rows x Columns x frames is refused, not allocated
POLICY = IngestPolicy(max_file_bytes=8 << 20, max_header_bytes=1 << 20, max_frames=64)
PIPELINE = PipelineSpec.model_validate(
    {
        "name": "fuzz",
        "version": "1.0.0",
        "series_selection": {"modalities": ["CT", "MR"], "min_slices": 2},
        "steps": [{"model": "organs"}],
    }
)
_FOLDER = Path(tempfile.mkdtemp(prefix="radserve-fuzz-series-"))
_MUTATED = _FOLDER / f"slice{_phantom.MUTATED}.dcm"


def _in_process(frames: object, workers: int | None = None) -> bool:
    return False


decode.use_processes = _in_process  # the guard: decode here, where a crash is seen


def _fixed_slices() -> None:
    for k, data in enumerate(_phantom.series_slices()):
        if k != _phantom.MUTATED:
            (_FOLDER / f"slice{k}.dcm").write_bytes(data)


_fixed_slices()


def seeds() -> list[bytes]:
    """The mutated slice as stored, and in each compressed syntax with an encoder here
    (:func:`~tests.fuzz.targets._phantom.compressed_slices`): every decoder is reached."""
    return [_phantom.series_slices()[_phantom.MUTATED], *_phantom.compressed_slices()]


def one_input(data: bytes) -> None:
    _MUTATED.write_bytes(data)
    with refusals_only():
        study = ingest_study(_FOLDER, pipeline=PIPELINE, policy=POLICY)
        volume = study.loaded.volume
        if not np.isfinite(volume.array).all():
            raise AssertionError("the loaded volume holds NaN or infinite values")
        if not np.isfinite(volume.affine).all():
            raise AssertionError("the loaded volume's affine is not finite")
