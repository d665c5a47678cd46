"""Build reduced-precision variants of an FP32 ONNX model and time them against it.

* FP16: every float tensor and weight converted to float16 by
  ``onnxruntime.transformers.float16`` with ``keep_io_types=True``, so the model still
  takes and returns float32 and the runtime needs no change.
* BF16: no new file. The fp32 graph run by OpenVINO's CPU plugin in bfloat16 (AMX or
  AVX-512 BF16 hosts): declared as ``bf16: model.onnx`` and gated like the others.
* INT8: static quantisation (``onnxruntime.quantization.quantize_static``) in QDQ format,
  unsigned 8-bit activations and signed 8-bit per-channel weights (U8S8, ONNX Runtime's
  default recommendation for CPUs), calibrated (min/max) on preprocessed slices.
  Softmax/Sigmoid/ArgMax and, by default, the node that produces each graph output (the
  logits head) stay in float: there, rounding error turns straight into flipped labels,
  and the head is a small share of the compute.

Calibration data comes from a callable returning input batches, so tests pass tiny
arrays and the command passes phantom slices. Neither builder decides whether a variant
may serve: :func:`build_and_gate` asks :mod:`radserve.evaluation.gate` and records the
answer in ``gate.json`` (:mod:`radserve.models.gate`), which the registry reads.

Besides :mod:`radserve.inference`, this is the only module that imports onnxruntime
(its quantiser and float16 converter are model-building tools, not the runtime); speed is
measured through :class:`radserve.inference.ModelSession`, exactly as serving runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from pydantic import ValidationError

from radserve import durable
from radserve.domain.accuracy import EvalSummary
from radserve.errors import ModelError, RadserveError
from radserve.evaluation.gate import gate_decision
from radserve.host import cpu_kernel
from radserve.lifecycle.install import read_install, verify_install
from radserve.lifecycle.version_commit import stage_version
from radserve.models.gate import (
    CPU_PROVIDERS,
    GateReport,
    SpeedResult,
    VariantGate,
    file_sha256,
    write_gate_report,
)
from radserve.models.manifest import ModelSpec
from radserve.validation_text import describe_problems
from radserve.yaml_text import load_yaml

if TYPE_CHECKING:
    from radserve.domain.volume import Volume
    from radserve.inference.providers import RuntimeChoice
    from radserve.models.registry import ModelBundle, ModelRegistry
    from radserve.pipeline.channels import ChannelInputs
    from radserve.pipeline.spec import PipelineSpec

logger = logging.getLogger(__name__)

__all__ = [
    "CalibrationSource",
    "build_and_gate",
    "build_and_gate_on_phantoms",
    "build_and_gate_on_studies",
    "build_fp16",
    "build_int8",
    "declare_files",
    "default_precisions",
    "gate_runtime",
    "measure_speed",
    "variant_filename",
]

CalibrationSource = Callable[[], Iterable[np.ndarray]]
"""Returns float32 input batches shaped like the model's (first) input, e.g. (N, C, H, W)."""

_FLOAT_ONLY_OPS = ("Softmax", "Sigmoid", "ArgMax", "LogSoftmax")
_BUNDLE_FILE_MODE = 0o644  # readable by all, like the rest of a bundle (gate.json too)


def variant_filename(fp32_name: str, precision: str) -> str:
    """``model.onnx`` -> ``model.fp16.onnx`` / ``model.int8.onnx``."""
    stem = fp32_name[: -len(".onnx")] if fp32_name.endswith(".onnx") else fp32_name
    return f"{stem}.{precision}.onnx"


def _load(path: Path) -> onnx.ModelProto:
    try:
        return onnx.load(str(path))
    except Exception as exc:  # onnx raises several unrelated types for a bad file
        raise ModelError(f"cannot read ONNX model {path}: {exc}") from exc


def _topologically_sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """Reorder the main graph's nodes so each follows its inputs' producers (the float16
    converter appends its input Casts at the end, which the ONNX checker refuses)."""
    graph = model.graph
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    while pending:
        still = [n for n in pending if not set(n.input) <= ready]
        done = [n for n in pending if set(n.input) <= ready]
        if not done:
            missing = sorted({i for n in still for i in n.input} - ready)
            raise ModelError(f"graph {graph.name!r} has a cycle or unknown inputs {missing[:5]}")
        for node in done:
            ordered.append(node)
            ready.update(node.output)
        pending = still
    del graph.node[:]
    graph.node.extend(ordered)
    return model


def build_fp16(src: Path, dst: Path) -> Path:
    """Write an FP16 copy of ``src`` to ``dst`` keeping float32 inputs and outputs."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(_load(src), keep_io_types=True)
    model = _topologically_sorted(model)
    onnx.checker.check_model(model)
    # replaced whole (a crash leaves the file before or after, never half of it)
    durable.write_bytes(dst, model.SerializeToString(), mode=_BUNDLE_FILE_MODE)
    logger.info("fp16 variant %s (%.1f kB)", dst, dst.stat().st_size / 1024)
    return dst


def _output_nodes(model: onnx.ModelProto) -> list[str]:
    outputs = {o.name for o in model.graph.output}
    return [n.name for n in model.graph.node if outputs.intersection(n.output)]


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give every node a unique name (exporters may leave them empty): exclusion lists
    and quantisation reports refer to nodes by name."""
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    return model


class _Reader:
    """``onnxruntime.quantization.CalibrationDataReader`` over a batch source."""

    def __init__(self, input_name: str, source: CalibrationSource) -> None:
        self._input_name = input_name
        self._source = source
        self._it: Iterator[np.ndarray] | None = None
        self.batches = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._it is None:
            self._it = iter(self._source())
        batch = next(self._it, None)
        if batch is None:
            return None
        self.batches += 1
        return {self._input_name: np.ascontiguousarray(batch, dtype=np.float32)}

    def __iter__(self) -> _Reader:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        item = self.get_next()
        if item is None:
            raise StopIteration
        return item


def build_int8(
    src: Path,
    dst: Path,
    calibration: CalibrationSource,
    *,
    per_channel: bool = True,
    keep_output_nodes_float: bool = True,
    exclude_nodes: Sequence[str] = (),
) -> Path:
    """Write a statically quantised (QDQ, U8S8, per-channel) copy of ``src`` to ``dst``.

    ``calibration`` is called once and must yield at least one batch.
    """
    model = _named(_load(src))
    excluded = [n.name for n in model.graph.node if n.op_type in _FLOAT_ONLY_OPS]
    if keep_output_nodes_float:
        excluded += _output_nodes(model)
    excluded += list(exclude_nodes)
    input_name = model.graph.input[0].name

    reader = _Reader(input_name, calibration)
    dst.parent.mkdir(parents=True, exist_ok=True)
    # quantised beside its name and renamed into it once checked: a crash or a failed
    # calibration leaves the file before, never half of it
    built = durable.temporary_path(dst)
    try:
        _quantize(model, built, reader, per_channel, excluded)
        if reader.batches == 0:
            raise ModelError(
                f"int8 calibration of {src} received no batches; check the data source"
            )
        onnx.checker.check_model(onnx.load(str(built)))
        os.chmod(built, _BUNDLE_FILE_MODE)
        durable.fsync_file(built)
        os.replace(built, dst)
    finally:
        built.unlink(missing_ok=True)
    durable.fsync_dir(dst.parent)
    logger.info(
        "int8 variant %s (%.1f kB) calibrated on %d batches; float nodes: %s",
        dst,
        dst.stat().st_size / 1024,
        reader.batches,
        ", ".join(sorted(set(excluded))) or "none",
    )
    return dst


def _quantize(
    model: onnx.ModelProto, dst: Path, reader: _Reader, per_channel: bool, excluded: list[str]
) -> None:
    """ONNX Runtime's static QDQ quantisation of ``model`` into ``dst`` (U8S8, MinMax)."""
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    quantize_static(
        model,
        str(dst),
        reader,  # type: ignore[arg-type]  # a CalibrationDataReader by its __subclasshook__
        quant_format=QuantFormat.QDQ,
        per_channel=per_channel,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_exclude=sorted(set(excluded)),
        calibrate_method=CalibrationMethod.MinMax,
        extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
    )


def measure_speed(
    path: Path,
    spec: ModelSpec,
    batch: np.ndarray,
    *,
    threads: int,
    repeats: int = 10,
    warmup: int = 2,
    precision: str = "fp32",
    runtime: RuntimeChoice | None = None,
) -> SpeedResult:
    """Median wall time of one ``batch`` through ``path`` in a
    :class:`~radserve.inference.ModelSession` configured as serving configures it (the
    host's preferred provider unless ``runtime`` says otherwise).

    Compare variants only with numbers measured in the same run, with the same batch
    and ``threads``; the absolute value depends on the host.
    """
    from radserve.inference import ModelSession, choose_runtime

    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    runtime = runtime or choose_runtime(threads=threads)
    session = ModelSession(path, spec, runtime=runtime, precision=precision)
    for _ in range(warmup):
        session.run(batch)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(batch)
        times.append(time.perf_counter() - start)
    ms = 1000.0 * statistics.median(times)
    n = int(batch.shape[0])
    return SpeedResult(
        ms_per_batch=ms,
        ms_per_slice=ms / n,
        batch_size=n,
        threads=threads,
        repeats=repeats,
        provider=session.providers_in_use[0],
    )


def declare_files(manifest: Path, files: Mapping[str, str]) -> None:
    """Rewrite only the top-level ``files:`` block of a ``model.yaml`` (comments and
    the rest of the file are kept), then check the result still parses."""
    lines = manifest.read_text().splitlines()
    block = ["files:"] + [f"  {k}: {v}" for k, v in files.items()]
    start = next((i for i, line in enumerate(lines) if re.match(r"files\s*:", line)), None)
    if start is None:
        lines += block
    else:
        end = start + 1
        while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t#"):
            end += 1
        while end > start + 1 and not lines[end - 1].strip():
            end -= 1  # keep blank lines that separate the next section
        lines[start:end] = block
    text = "\n".join(lines) + "\n"
    try:  # checked before it replaces the file
        ModelSpec.model_validate(load_yaml(text))
    except ValidationError as exc:
        raise ModelError(
            f"invalid model manifest {manifest} once its files are declared: "
            f"{describe_problems(exc)}"
        ) from exc
    # replaced whole, keeping its permissions: a crash mid-write left a cut-off
    # model.yaml, and a bundle whose every precision (fp32 too) no longer loaded
    durable.write_text(manifest, text, mode=stat.S_IMODE(manifest.stat().st_mode))


def build_and_gate(
    bundle: ModelBundle,
    *,
    evaluate_precisions: Callable[[Sequence[str]], Mapping[str, EvalSummary]],
    calibration: CalibrationSource,
    speed_batch: np.ndarray,
    threads: int,
    precisions: Sequence[str] = ("fp16", "int8"),
    calibration_seeds: Sequence[int] = (),
    repeats: int = 10,
    studies: Sequence[str] = (),
    calibration_studies: Sequence[str] = (),
    providers: Sequence[str] = (),
) -> GateReport:
    """Build ``precisions`` beside the bundle's FP32 file, declare them in model.yaml,
    evaluate them against FP32, time them, gate them and write ``gate.json``
    (``studies``/``calibration_studies``: the names of a site's studies it was evaluated
    and calibrated on, recorded instead of phantom seeds). The speed is timed on
    ``providers`` (the server's, :func:`gate_runtime`; empty: the host's choice),
    which the gate records as the providers it covers.

    ``evaluate_precisions(["fp32", ...])`` must run the pipeline with this bundle at each
    precision on held-out studies (the candidates are not gated yet, so it must use a
    registry with ``allow_ungated=True``) and return one summary per precision.

    The files are written into ``bundle``'s folder: never an installed version's (refused),
    whose variants :func:`build_and_gate_on_phantoms` and :func:`build_and_gate_on_studies`
    build in a staged copy and move in with their record (:func:`_building`).
    """
    bad = [p for p in precisions if p not in ("fp16", "int8", "bf16")]
    if bad:
        raise ModelError(f"can build fp16, int8 and bf16 variants, not {bad}")
    if read_install(bundle.directory) is not None:
        raise ModelError(
            f"{bundle.key} is an installed version: its variants are built in a staged copy "
            "and moved in with their record in install.json (build_and_gate_on_phantoms, "
            "build_and_gate_on_studies), never written into it in place"
        )
    runtime = gate_runtime(providers, precisions, threads=threads)
    spec = bundle.spec
    fp32_name = spec.files["fp32"]
    fp32_path = bundle.candidate_path("fp32")
    files: dict[str, str] = {"fp32": fp32_name}
    for precision in precisions:
        if precision == "bf16":
            files[precision] = fp32_name  # a runtime precision: the same graph
            continue
        dst = bundle.directory / variant_filename(fp32_name, precision)
        if precision == "fp16":
            build_fp16(fp32_path, dst)
        else:
            build_int8(fp32_path, dst, calibration)
        files[precision] = dst.name
    declare_files(bundle.directory / "model.yaml", {**spec.files, **files})

    summaries = evaluate_precisions(["fp32", *precisions])
    missing = [p for p in ("fp32", *precisions) if p not in summaries]
    if missing:
        raise ModelError(f"evaluation of {spec.key} returned no summary for {missing}")
    uncompared = [p for p in precisions if summaries[p].agreement_vs_fp32 is None]
    if uncompared:  # the one check that measures something for every model: never skipped
        raise ModelError(
            f"evaluation of {spec.key} did not compare {uncompared} with fp32's own output; "
            "a variant is not gated without it"
        )
    fp32_speed = measure_speed(
        fp32_path, spec, speed_batch, threads=threads, repeats=repeats, runtime=runtime
    )
    variants = _kept_records(bundle, summaries["fp32"], precisions)
    for precision in precisions:
        path = bundle.directory / files[precision]
        speed = measure_speed(
            path,
            spec,
            speed_batch,
            threads=threads,
            repeats=repeats,
            precision=precision,
            runtime=runtime,
        )
        speed = speed.model_copy(
            update={"ratio_vs_fp32": speed.ms_per_batch / fp32_speed.ms_per_batch}
        )
        decision = gate_decision(summaries["fp32"], summaries[precision], spec.gate)
        variants[precision] = VariantGate(
            file=path.name,
            sha256=file_sha256(path),
            accepted=decision.accepted,
            reasons=decision.reasons,
            notes=decision.notes,
            dice_drop=decision.dice_drop,
            recall_drop_points=decision.recall_drop_points,
            metrics=summaries[precision],
            speed=speed,
            providers=[speed.provider] if speed.provider else [],
            cpu_kernel=cpu_kernel(precision) if speed.provider in CPU_PROVIDERS else None,
        )
        logger.info(
            "%s %s: %s (%.2fx fp32 time)%s",
            spec.key,
            precision,
            "accepted" if decision.accepted else "REJECTED",
            speed.ratio_vs_fp32,
            "".join(f"; {r}" for r in decision.reasons),
        )
    report = GateReport(
        model=spec.name,
        version=spec.version,
        gate=spec.gate,
        seeds=summaries["fp32"].seeds,
        calibration_seeds=list(calibration_seeds),
        studies=list(studies),
        calibration_studies=list(calibration_studies),
        fp32_file=fp32_name,
        fp32_sha256=file_sha256(fp32_path),
        fp32_metrics=summaries["fp32"],
        fp32_speed=fp32_speed,
        variants=variants,
    )
    write_gate_report(bundle.directory, report)
    return report


@dataclass(frozen=True)
class _Work:
    """Where a build writes: ``bundle`` (the one to build, or its staged copy) and the
    model roots to search before the registry's (the copy's, which shadows the version)."""

    bundle: ModelBundle
    roots: tuple[Path, ...] = ()


@contextlib.contextmanager
def _building(bundle: ModelBundle, precisions: Sequence[str]) -> Iterator[_Work]:
    """Where to build ``bundle``'s variants. An installed version is built in a staged
    copy and, once the block ends, moved in with the record of what the build wrote in
    its ``install.json`` (:mod:`radserve.lifecycle.version_commit`): a kill at any point
    leaves it as it was or whole with the new variants. Before 2026-12-07 they were
    written into the version and recorded last, so a kill in between left it "changed
    since install" for good (deploy refused it; the only way out was a new version).
    Any other bundle (the bundled models, a site's folder, an install's staged copy) is
    built in place."""
    if read_install(bundle.directory) is None:
        yield _Work(bundle)
        return
    from radserve.models.registry import ModelBundle

    staged = stage_version(bundle.directory)
    try:
        yield _Work(ModelBundle(bundle.spec, staged.copy), (staged.root,))
    except BaseException:
        staged.discard()
        raise
    staged.commit(what=f"radserve models build-variants: {', '.join(precisions)} built and gated")


def _installed_as_it_was(bundle: ModelBundle) -> bool:
    """Whether ``bundle`` is an installed version (``install.json``), which a build
    records its files in (:func:`_building`).

    Raises:
        ModelError: an installed version whose files changed since install: the build
            would record ``model.yaml`` as installed, with whatever was changed in it.
    """
    if read_install(bundle.directory) is None:
        return False
    changed = verify_install(bundle.directory)  # finishes a commit a kill cut short
    if changed:
        raise ModelError(
            f"{bundle.key} changed since it was installed ({'; '.join(changed[:5])}); "
            "variants are built into an installed version only as it was installed, "
            "since the build records model.yaml and the files it writes as installed: "
            "install the changed bundle as a new version, and build its variants there"
        )
    return True


def _kept_records(
    bundle: ModelBundle, fp32: EvalSummary, rebuilt: Sequence[str]
) -> dict[str, VariantGate]:
    """Records of variants not rebuilt now, kept from the bundle's gate.json while they
    still describe the same fp32 file, variant file and fp32 evaluation (same seeds, same
    metrics: the rest of the pipeline has not changed), so building bf16 alone does not
    throw away an int8 gate that still holds."""
    try:
        old = bundle.gate_report()
    except ModelError:
        return {}
    if old is None or old.fp32_sha256 != bundle.sha256("fp32"):
        return {}
    if _comparable(old.fp32_metrics) != _comparable(fp32):
        logger.info(
            "%s: fp32 evaluation changed since gate.json; its records are dropped", bundle.key
        )
        return {}
    kept: dict[str, VariantGate] = {}
    for precision, record in old.variants.items():
        if precision in rebuilt or precision not in bundle.spec.files:
            continue
        path = bundle.directory / bundle.spec.files[precision]  # type: ignore[index]
        if path.is_file() and file_sha256(path) == record.sha256:
            kept[precision] = record
    return kept


def _comparable(summary: EvalSummary) -> dict[str, object]:
    """The metrics a gate compares against, rounded (timings and notes left out)."""
    keys = ("seeds", "dice", "recall_by_size", "fp_per_study", "n_lesions_by_size")
    data = summary.model_dump(include=set(keys))
    return json.loads(
        json.dumps(data, sort_keys=True, default=str), parse_float=lambda v: round(float(v), 6)
    )


def default_precisions(providers: Sequence[str] = ()) -> list[str]:
    """fp16 and int8 everywhere; bf16 where it can serve: OpenVINO first among
    ``providers`` (the server's; empty: the host's choice) on a CPU with native bfloat16.
    Before 2026-12-07 an install on a server serving on the CPU provider built and gated
    bf16 on OpenVINO, the host's default, and said it was "servable here"."""
    from radserve.inference import choose_runtime

    runs_bf16 = choose_runtime(prefer=list(providers) or None).runs_bf16
    return ["fp16", "int8", "bf16"] if runs_bf16 else ["fp16", "int8"]


def gate_runtime(
    providers: Sequence[str], precisions: Sequence[str] = (), *, threads: int | None = None
) -> RuntimeChoice:
    """The runtime variants are evaluated and timed on: the server's ``providers``
    (:attr:`radserve.service.catalog.Catalog.serving_providers`, chosen as
    :func:`~radserve.inference.providers.choose_runtime` chooses them for the server;
    empty: the host's choice), so that a gate measures the kernels that will serve the
    variant. Before 2026-12-07 every gate ran on the host's default (OpenVINO here), also
    for a server set to ``runtime.providers: [CPUExecutionProvider]``, whose int8 then
    served through kernels its gate never measured.

    Raises:
        ModelError: ``bf16`` asked for where the server does not serve on OpenVINO (its
            variant could never serve there), or providers this host cannot run.
    """
    from radserve.inference import choose_runtime

    runtime = choose_runtime(prefer=list(providers) or None, threads=threads)
    if "bf16" in precisions and providers and runtime.primary != "OpenVINOExecutionProvider":
        raise ModelError(
            f"bf16 runs on OpenVINO's CPU plugin only, and this server serves with "
            f"{', '.join(providers)} (runtime.providers): a bf16 variant could not serve "
            "here; leave bf16 out of the precisions (lifecycle.variants.precisions, "
            "--precision), or put OpenVINOExecutionProvider first in runtime.providers"
        )
    return runtime


def build_and_gate_on_phantoms(
    registry: ModelRegistry,
    pipeline: PipelineSpec,
    model: str,
    *,
    eval_seeds: Sequence[int],
    calibration_seeds: Sequence[int],
    precisions: Sequence[str],
    small: bool = False,
    threads: int | None = None,
    repeats: int = 10,
    providers: Sequence[str] = (),
) -> GateReport:
    """:func:`build_and_gate` for the version of ``model`` that ``pipeline`` runs, the way
    the shipped variants are made (``radserve models build-variants``): INT8 calibrated on
    the batches the FP32 pipeline feeds the model on the ``calibration_seeds`` phantoms,
    every precision evaluated through the whole pipeline (the other models at FP32) on
    the held-out ``eval_seeds`` phantoms, against their ground truth and, label by label,
    against the model's own FP32 output, timed, gated; every session on ``providers``
    (the server's, :func:`gate_runtime`; empty: the host's choice)."""
    from radserve.evaluation.pipeline_runs import (
        organ_label_values,
        pipeline_predictor,
        record_model_inputs,
    )
    from radserve.evaluation.runner import evaluate, phantom_truth
    from radserve.models.registry import ModelRegistry

    overlap = sorted(set(eval_seeds) & set(calibration_seeds))
    if overlap:
        raise ModelError(f"calibration and evaluation share phantom seeds {overlap[:5]}")
    runtime = gate_runtime(providers, precisions)
    bundle = _step_bundle(registry, pipeline, model)
    specs = [registry.get(s.model, s.version).spec for s in pipeline.steps]
    several = next((s for s in specs if s.input.channels), None)
    if several is not None:
        raise ModelError(
            f"{several.key} reads {len(several.input.channels)} series and a phantom is one "
            "CT: gate it on studies that have them (radserve models build-variants --studies, "
            "on the bundle before it is installed)"
        )
    calibration_cts = [phantom_truth(s, small=small).ct for s in calibration_seeds]
    batches = record_model_inputs(registry, pipeline, model, calibration_cts, runtime=runtime)
    if not batches:
        raise ModelError(f"the pipeline fed {bundle.key} no batches on the calibration phantoms")

    with _building(bundle, precisions) as work:

        def run_eval(wanted: Sequence[str]) -> Mapping[str, EvalSummary]:
            ungated = ModelRegistry(
                [*work.roots, *registry.roots], allow_ungated=True, missing_ok=registry.missing_ok
            )
            return evaluate(
                pipeline_predictor(ungated, pipeline, vary=model, runtime=runtime),
                seeds=eval_seeds,
                organ_labels=organ_label_values(specs),
                precisions=wanted,
                small=small,
                step_labels=_label_names(bundle),
            )

        return _gate_on_batches(
            work.bundle, run_eval, batches, threads, precisions, repeats,
            calibration_seeds=calibration_seeds, providers=providers,
        )  # fmt: skip


def build_and_gate_on_studies(
    registry: ModelRegistry,
    pipeline: PipelineSpec,
    model: str,
    *,
    studies: Sequence[Path],
    calibration_studies: Sequence[Path],
    precisions: Sequence[str],
    threads: int | None = None,
    repeats: int = 10,
    providers: Sequence[str] = (),
) -> GateReport:
    """:func:`build_and_gate` on a site's own studies (folders of DICOM files, read as
    ``radserve run`` reads them, other series for multi-channel models included): INT8
    calibrated on ``calibration_studies``, every precision judged by its agreement with
    the model's FP32 output on ``studies`` (there is no ground truth to score). The way
    to gate a model on inputs like those it serves: an MR or PET/CT model, or any model
    whose anatomy the CT phantoms do not show. Sessions run on ``providers`` (the
    server's, :func:`gate_runtime`; empty: the host's choice)."""
    from radserve.evaluation.pipeline_runs import agreement_on_studies, record_model_inputs
    from radserve.models.registry import ModelRegistry
    from radserve.pipeline.study import load_study

    studies = [Path(s) for s in studies]
    calibration_studies = [Path(s) for s in calibration_studies]
    if not studies:
        raise ModelError("a gate on studies needs at least one study to judge the variants on")
    shared = sorted({s.resolve() for s in studies} & {s.resolve() for s in calibration_studies})
    if shared:
        raise ModelError(
            f"calibration and evaluation share studies: {[str(s) for s in shared[:5]]}"
        )
    if "int8" in precisions and not calibration_studies:
        raise ModelError(
            "INT8 is calibrated on studies other than those it is judged on: give "
            "calibration studies, or leave int8 out"
        )
    runtime = gate_runtime(providers, precisions)
    bundle = _step_bundle(registry, pipeline, model)

    def load(study: Path, registry: ModelRegistry) -> tuple[Volume, ChannelInputs]:
        try:
            return load_study(study, pipeline, registry)
        except RadserveError as exc:  # which of a site's studies, not only what
            raise ModelError(f"study {study}: {exc.message}") from exc

    # INT8's calibration set; without INT8, the batches the speed comparison times
    recorded = calibration_studies or studies[:1]
    batches = record_model_inputs(
        registry, pipeline, model, (load(s, registry) for s in recorded), runtime=runtime
    )
    if not batches:
        raise ModelError(f"the pipeline fed {bundle.key} no batches on {recorded[0]}")

    with _building(bundle, precisions) as work:

        def run_eval(wanted: Sequence[str]) -> Mapping[str, EvalSummary]:
            ungated = ModelRegistry(
                [*work.roots, *registry.roots], allow_ungated=True, missing_ok=registry.missing_ok
            )
            return agreement_on_studies(
                ungated,
                pipeline,
                model,
                (load(s, ungated) for s in studies),
                precisions=wanted,
                step_labels=_label_names(bundle),
                runtime=runtime,
            )

        return _gate_on_batches(
            work.bundle, run_eval, batches, threads, precisions, repeats,
            studies=[s.name for s in studies],
            calibration_studies=[s.name for s in calibration_studies],
            providers=providers,
        )  # fmt: skip


def _step_bundle(registry: ModelRegistry, pipeline: PipelineSpec, model: str) -> ModelBundle:
    """The version of ``model`` that ``pipeline`` runs (one changed since its install is
    refused here, before the long part: :func:`_installed_as_it_was`)."""
    step = next((s for s in pipeline.steps if s.model == model), None)
    if step is None:
        raise ModelError(f"pipeline {pipeline.name!r} has no step running {model!r}")
    bundle = registry.get(model, step.version)
    if _installed_as_it_was(bundle):  # re-read: a commit it finished changed model.yaml
        bundle = registry.get(model, step.version)
    return bundle


def _label_names(bundle: ModelBundle) -> dict[int, str]:
    return {label.value: label.name for label in bundle.spec.labels}


def _gate_on_batches(
    bundle: ModelBundle,
    evaluate_precisions: Callable[[Sequence[str]], Mapping[str, EvalSummary]],
    batches: Sequence[np.ndarray],
    threads: int | None,
    precisions: Sequence[str],
    repeats: int,
    *,
    calibration_seeds: Sequence[int] = (),
    studies: Sequence[str] = (),
    calibration_studies: Sequence[str] = (),
    providers: Sequence[str] = (),
) -> GateReport:
    """:func:`build_and_gate` with INT8 calibrated on the recorded ``batches`` and the
    speed timed on the largest of them (on ``providers``)."""
    from radserve.inference import probe_host

    return build_and_gate(
        bundle,
        evaluate_precisions=evaluate_precisions,
        calibration=lambda: iter(batches),
        speed_batch=max(batches, key=len),
        threads=threads or probe_host().usable_cores,
        precisions=precisions,
        repeats=repeats,
        calibration_seeds=calibration_seeds,
        studies=studies,
        calibration_studies=calibration_studies,
        providers=providers,
    )
