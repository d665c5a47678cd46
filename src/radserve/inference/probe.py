"""The shape contract between the pipeline and a graph, and one probe batch to check it.

What the pipeline feeds a model: 2D / 2.5D slices at each study's crop size (resampled
to ``input.spacing``, padded to a multiple of ``input.divisible_by``), so their height
and width change from study to study; 3D patches of exactly ``input.patch_size``. What
it needs back: one channel per class on the input's grid (N, classes, spatial...), or
one score vector per slice for a classifier (N, classes).

The same probe batch is run at install and import (:func:`isolated_probe_refusal`, from
:func:`radserve.lifecycle.graph_checks.check_onnx`: in a process of its own, killed
after :data:`PROBE_TIMEOUT_S`) and at warm-up before a version serves
(:func:`probe_input_shape`, :func:`output_shape_refusal`): before 2026-12-06 only the
warm-up ran it, so a graph whose output is half its input's size, or whose fixed
spatial input no study can match, installed and was refused only at deploy.

What is judged of each answer (:func:`output_refusal`): its shape, naming the axes that
differ, and NaN class probabilities, by the rule every study is judged by
(:func:`radserve.inference.tasks.nan_refusal`). A 2D / 2.5D graph gets a second, wider
slice (:func:`probe_input_shapes`). Before 2026-12-07 only the shape of one 32x32 answer
was checked: a graph with a NaN weight or a +inf bias under softmax, or one cropping its
output to 32x32, installed, deployed and failed every study.

Every probe runs on the execution providers the server serves with (``providers``: the
serving session pool's, :attr:`radserve.service.catalog.Catalog.serving_providers`):
before 2026-12-07 the separate process took the host's default (OpenVINO here) whatever
``runtime.providers`` said, so a graph OpenVINO cannot compile was refused at install
on a server that serves on the CPU provider, where it runs, and a graph that fails only
on the configured provider would have passed.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from radserve.errors import ModelError, RadserveError
from radserve.inference.providers import RuntimeChoice, choose_runtime
from radserve.inference.tasks import activate, nan_refusal, shape_mismatch
from radserve.models.manifest import ModelSpec

PROBE_EDGE = 32  # 2D probe: the smallest multiple of divisible_by at least this
# What one probe batch may take, session load included, before its process is killed: a
# 128^3 patch through nnU-Net's default network runs in seconds on a CPU; a graph that
# loops for ever (a Loop of 10^15 iterations) would hold the install for ever.
PROBE_TIMEOUT_S = 300.0


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def probe_input_shape(spec: ModelSpec) -> tuple[int, ...]:
    """One sample as the pipeline feeds ``spec``'s graph: a patch of ``patch_size``
    (3D), or a small slice whose sides are a multiple of ``divisible_by`` (2D / 2.5D)."""
    if spec.input.mode == "3d":
        spatial: tuple[int, ...] = tuple(spec.input.patch_size or (PROBE_EDGE,) * 3)
    else:
        side = _round_up(PROBE_EDGE, spec.input.divisible_by)
        spatial = (side, side)
    return (1, spec.input.in_channels, *spatial)


def probe_input_shapes(spec: ModelSpec) -> tuple[tuple[int, ...], ...]:
    """The probe batches, in order: :func:`probe_input_shape`, and for 2D / 2.5D a second
    slice wider by ``divisible_by`` (32x48 by default: not square, not a power of two).
    Slices reach the network at each study's size: a graph that crops or resizes its
    output to a constant 32x32 answered the one 32-pixel probe right, installed and
    deployed, and failed every wider study (before 2026-12-07). 3D patches are always
    ``patch_size``: one batch."""
    first = probe_input_shape(spec)
    if spec.input.mode == "3d":
        return (first,)
    return (first, (*first[:-1], first[-1] + spec.input.divisible_by))


def expected_output_shape(spec: ModelSpec, input_shape: Sequence[int]) -> tuple[int, ...]:
    """What inference requires of the output of ``input_shape``
    (:func:`radserve.inference.tasks.check_batch`)."""
    spatial = () if spec.is_classifier else tuple(input_shape[2:])
    return (int(input_shape[0]), spec.num_classes, *spatial)


def output_shape_refusal(
    spec: ModelSpec, input_shape: Sequence[int], output_shape: Sequence[int]
) -> str | None:
    """Why an output of ``output_shape`` for a batch of ``input_shape`` cannot serve
    (None: it can), naming the expected and the actual shape."""
    expected = expected_output_shape(spec, input_shape)
    if tuple(output_shape) == expected:
        return None
    if spec.is_classifier:
        need = "one score vector per class (N, classes)"
    else:
        need = "one channel per class on the input's grid (N, classes, spatial...)"
    return (
        f"a batch of shape {tuple(input_shape)} returned {tuple(output_shape)}, expected "
        f"{expected}: the graph must give {need}; " + shape_mismatch(tuple(output_shape), expected)
    )


def output_refusal(spec: ModelSpec, input_shape: Sequence[int], output: np.ndarray) -> str | None:
    """Why ``output``, the graph's answer to a probe batch of ``input_shape``, cannot
    serve (None: it can): its shape (:func:`output_shape_refusal`), or NaN class
    probabilities where labels would be decided
    (:func:`~radserve.inference.tasks.nan_refusal`, the rule every study is judged by:
    NaN logits, or an infinite logit under softmax). Before 2026-12-07 only the shape
    was checked, so a graph with one NaN weight or an infinite bias installed, deployed,
    passed warm-up and failed every study."""
    why = output_shape_refusal(spec, input_shape, output.shape)
    if why is not None:
        return why
    with np.errstate(invalid="ignore"):  # inf - inf: the NaN reported below
        probabilities = activate(output, spec.activation, axis=1)
    # what decides the labels, as inference checks it: each voxel's winning probability
    # (NaN wherever any class's is); a classifier's scores as they are
    decided = probabilities if spec.is_classifier else probabilities.max(axis=1)
    why = nan_refusal(decided)
    if why is None:
        return None
    # the callers name the model and version (the install's refusal, warm-up's error)
    return f"on a batch of shape {tuple(input_shape)} (zeros), as the pipeline feeds it, {why}"


def static_input_refusal(spec: ModelSpec, dims: Sequence[int | None]) -> str | None:
    """Why the spatial sizes a graph's input declares (``dims``: N, C, spatial...; None
    where symbolic) cannot take what the pipeline feeds (None: they can)."""
    spatial = list(dims[2:])
    if spec.input.mode == "3d":
        patch = list(spec.input.patch_size or ())
        fixed = [(d, p) for d, p in zip(spatial, patch, strict=False) if d is not None]
        if all(d == p for d, p in fixed):
            return None
        return (
            f"it declares a fixed spatial input {_dims(spatial)}; the pipeline feeds patches "
            f"of input.patch_size {tuple(patch)}: export it at the patch size it was "
            "trained with, or set patch_size to the graph's"
        )
    if not any(d is not None for d in spatial):
        return None
    return (
        f"it declares a fixed spatial input {_dims(spatial)}; {spec.input.mode} slices "
        "reach the network at each study's crop size (resampled to input.spacing, padded "
        f"to a multiple of divisible_by {spec.input.divisible_by}), which differs from "
        "study to study: export it with dynamic height and width"
    )


def static_output_refusal(spec: ModelSpec, output_dims: Sequence[int | None]) -> str | None:
    """Why a 3D graph's declared output spatial sizes differ from its patch (None: they
    do not, or the output is not declared fixed). 2D sizes follow each study, so only
    the probe (:func:`probe_refusal`) can judge them."""
    if spec.input.mode != "3d" or spec.is_classifier:
        return None
    patch = tuple(spec.input.patch_size or ())
    spatial = list(output_dims[2:])
    if len(spatial) != len(patch):
        return None
    if all(d is None or d == p for d, p in zip(spatial, patch, strict=True)):
        return None
    return (
        f"its output declares the spatial size {_dims(spatial)} for patches of "
        f"{patch}; radserve needs the output on the input's grid (N, classes, {patch})"
    )


def _dims(dims: Sequence[int | None]) -> str:
    return "x".join("?" if d is None else str(d) for d in dims)


def isolated_probe_refusal(
    spec: ModelSpec,
    path: Path,
    *,
    timeout_s: float = PROBE_TIMEOUT_S,
    providers: Sequence[str] = (),
) -> str | None:
    """:func:`probe_refusal` in a process of its own, killed after ``timeout_s``: a graph
    brought from elsewhere may loop for ever (ONNX Runtime's terminate flag does not
    reach into OpenVINO's compiled graph), crash ONNX Runtime, or take all memory, and
    the install must end with a reason whatever it does, and the server stay up.

    ``providers``: the execution providers serving runs on, in order, chosen there as
    :func:`~radserve.inference.providers.choose_runtime` chooses them for the server
    (empty: the host's own choice, as a server without ``runtime.providers`` makes it);
    a list this host cannot run is refused with the message a server start gives."""
    command = [sys.executable, "-m", "radserve.inference.probe", str(path), *providers]
    try:
        done = subprocess.run(
            command,
            input=spec.model_dump_json(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return (
            f"it did not answer a batch of shape {probe_input_shape(spec)}, as the pipeline "
            f"feeds it, within {timeout_s:g} s (session load included): a graph that loops "
            "or is far too slow for serving"
        )
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        try:
            answer = json.loads(lines[-1])
        except ValueError:
            answer = None
        if isinstance(answer, dict) and "refusal" in answer:
            return answer["refusal"]
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        return (
            f"ONNX Runtime's process ended by {name} while it loaded or ran a batch of shape "
            f"{probe_input_shape(spec)} (a crash, or the memory it took)"
        )
    return "the probe batch failed: " + _one_line(done.stderr or done.stdout or "no output")


def probe_refusal(
    spec: ModelSpec, path: Path, *, runtime: RuntimeChoice | None = None
) -> str | None:
    """Load ``path`` as serving loads it (``runtime``: the host's choice by default) and
    run the probe batches (:func:`probe_input_shapes`, zeros); why a result cannot serve
    ``spec`` (:func:`output_refusal`: its shape, NaN class probabilities), or None.
    Install and import run it through :func:`isolated_probe_refusal`; warm-up runs the
    first batch before a version serves."""
    from radserve.inference.session import ModelSession

    try:
        session = ModelSession(path, spec, runtime=runtime)
    except RadserveError as exc:  # ONNX Runtime names the file by its (staging) path
        return _one_line(exc.message.replace(str(path), path.name))
    try:
        for shape in probe_input_shapes(spec):
            try:
                out = session.run(np.zeros(shape, np.float32))
            except RadserveError as exc:
                return (
                    f"it does not run on a batch of shape {shape}, as the pipeline feeds it: "
                    + _one_line(exc.message)
                )
            why = output_refusal(spec, shape, out)
            if why is not None:
                return why
    finally:
        del session
    return None


def _one_line(text: str) -> str:
    """ONNX Runtime's message in one line, less the C++ source location it puts first:
    the start of its first line and the whole of its last, which says what failed
    (OpenVINO's first line is a C++ signature of 1,000 characters: cut at 400 characters,
    it left "CPU plug-in doesn't support If operation with dynamic rank" out)."""
    lines = [
        re.sub(r"\[ONNXRuntimeError\][^:]*: \w+ : ", "", line).strip()
        for line in text.strip().splitlines()
        if line.strip()
    ]
    if len(lines) < 2:
        return (lines or ["no reason given"])[0][:400]
    return f"{lines[0][:150]} ... {lines[-1][:250]}"


def _main() -> None:
    """``python -m radserve.inference.probe MODEL.onnx [PROVIDER ...]`` with the model's
    spec (JSON) on stdin: one line of JSON on stdout, ``{"refusal": null | "why"}``. The
    PROVIDERs are serving's, in order (none: the host's choice)."""
    import logging

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    spec = ModelSpec.model_validate_json(sys.stdin.read())
    try:  # the providers as the server picks them, refused as a server start refuses them
        runtime = choose_runtime(prefer=sys.argv[2:] or None)
    except ModelError as exc:
        refusal: str | None = exc.message
    else:
        refusal = probe_refusal(spec, Path(sys.argv[1]), runtime=runtime)
    print(json.dumps({"refusal": refusal}), flush=True)


__all__ = [
    "PROBE_TIMEOUT_S",
    "expected_output_shape",
    "isolated_probe_refusal",
    "output_refusal",
    "output_shape_refusal",
    "probe_input_shape",
    "probe_input_shapes",
    "probe_refusal",
    "static_input_refusal",
    "static_output_refusal",
]


if __name__ == "__main__":
    _main()
