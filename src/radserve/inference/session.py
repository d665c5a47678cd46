"""One ONNX file loaded on one device: checked against its model.yaml, then run.

The graph must have one input (N, C, H, W) or (N, C, D, H, W) and one output, or
model.yaml's ``output`` names the one served, read as logits (N, classes, ...); a graph
that applies its activation itself (``activation_in_graph``) gives probabilities, turned
into logits here so every task reads one kind. The batch axis should be dynamic; a graph exported
with a fixed batch size still works (batches are split and padded to it). A float16
graph is fed float16 and its output returned as float32, so callers see one dtype.
"""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort

from radserve.errors import DeviceMemoryError, InferenceError, ModelError
from radserve.host import process_rss_bytes
from radserve.inference.providers import RuntimeChoice, choose_runtime, precision_options
from radserve.models.manifest import ModelSpec

logger = logging.getLogger(__name__)

_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
# What ONNX Runtime's allocators say when a device (CUDA's BFC arena, the CPU's) or the
# host has no memory left for a run; and OpenVINO's, the default CPU provider here: its
# CPU plugin's "Failed to allocate 5242880000 bytes of memory" (cpu_memory.cpp), its
# core's "Failed to allocate memory" and "Cannot allocate memory for type", std::bad_alloc,
# strerror(ENOMEM)'s "Cannot allocate memory", and its GPU plugin's OpenCL failures.
# Before 2026-12-07 OpenVINO's "N bytes of memory" was not recognised: the batch was not
# halved and the study failed. Not "Failed to allocate aux GPR" / "... registers": a JIT
# kernel's registers, not memory.
_OUT_OF_MEMORY = re.compile(
    r"Failed to allocate (?:memory|\d+ bytes)|Cannot allocate memory|out of memory"
    r"|bad_alloc|ALLOC_FAILED|cudaErrorMemoryAllocation|CL_OUT_OF_RESOURCES"
    r"|CL_MEM_OBJECT_ALLOCATION_FAILURE|out of GPU resources",
    re.IGNORECASE,
)
_STARTED_PROVIDERS: set[str] = set()
_STARTED_LOCK = threading.Lock()


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error``'s text is an allocation failure of ONNX Runtime, OpenVINO or a
    GPU driver (:data:`_OUT_OF_MEMORY`), or it is a :class:`DeviceMemoryError`."""
    return isinstance(error, DeviceMemoryError) or bool(_OUT_OF_MEMORY.search(str(error)))


def as_logits(probabilities: np.ndarray, activation: str) -> np.ndarray:
    """The logits whose ``activation`` gives ``probabilities`` back (float32): log p for
    softmax (softmax(log p) = p / sum p = p), log p -
    log(1 - p) for sigmoid; 0 and 1 become -inf and +inf, which both activations turn
    back into 0 and 1 (a class no voxel may take stays impossible; no NaN is made)."""
    p = np.clip(np.asarray(probabilities, dtype=np.float32), 0.0, 1.0)
    with np.errstate(divide="ignore"):
        if activation == "softmax":
            return np.log(p, out=p)
        logits = np.log(p)
        logits -= np.log1p(-p)
        return logits


def probabilities_range_refusal(spec: ModelSpec, output: np.ndarray) -> str | None:
    """Why ``output`` cannot be the probabilities ``spec`` says its graph gives
    (``activation_in_graph``; None: it can): values outside [0, 1] are logits (the graph
    has no final activation), which would be clipped into nonsense."""
    if output.size == 0:
        return None
    lo, hi = float(np.nanmin(output)), float(np.nanmax(output))
    if lo >= -1e-3 and hi <= 1.0 + 1e-3:
        return None
    return (
        f"model {spec.key} declares activation_in_graph: true (its graph outputs "
        f"probabilities), but its output ranges over [{lo:.3g}, {hi:.3g}], outside [0, 1]: "
        f"logits; set activation_in_graph: false so that radserve applies "
        f"{spec.activation!r} to them"
    )


def _static(dim: object) -> int | None:
    return dim if isinstance(dim, int) and dim > 0 else None


def _file_bytes(path: Path) -> int:
    """The ONNX file plus any external-data files beside it that name it as a prefix
    (``model.onnx.data``): the weights a session holds, as stored."""
    total = path.stat().st_size
    for extra in path.parent.glob(f"{path.name}.*"):
        if extra.is_file():
            total += extra.stat().st_size
    return total


class _ModelFile:
    """What every handle on a model file knows without running it: file, contract,
    precision, runtime (shared by the local session and the remote reference)."""

    def __init__(
        self,
        path: Path,
        spec: ModelSpec,
        *,
        runtime: RuntimeChoice | None = None,
        precision: str = "fp32",
    ) -> None:
        self.path = Path(path)
        self.spec = spec
        self.precision = precision
        self.runtime = runtime or choose_runtime()
        self._open()

    def _open(self) -> None:
        """Load what running needs; a reference to a remote session loads nothing."""


class ModelSession(_ModelFile):
    """An ``ort.InferenceSession`` that knows the model's contract."""

    def _open(self) -> None:
        spec, precision = self.spec, self.precision
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = self.runtime.intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Input shapes change with every study: memory patterns would be rebuilt each
        # time; the arena is kept (it is what makes repeated batches cheap).
        options.enable_mem_pattern = False
        options.enable_cpu_mem_arena = True
        # ... within a task; release_memory() shrinks it when the task is done.
        self._shrink = ort.RunOptions()
        self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        options.log_severity_level = 3
        provider_options = precision_options(self.runtime, precision)
        rss_before = process_rss_bytes()
        try:
            self._session = ort.InferenceSession(
                str(self.path),
                sess_options=options,
                providers=list(self.runtime.providers),
                provider_options=provider_options,
            )
        except Exception as exc:  # onnxruntime raises its own, untyped, exception family
            raise ModelError(
                f"cannot load ONNX model {self.path.name} for {spec.key}: {exc}"
            ) from exc
        rss_after = process_rss_bytes()
        # Host memory the session took while loading (weights, the provider's compiled
        # graph); approximate: other threads allocate meanwhile, and a GPU provider's
        # device memory is not in it. The first batch's activations come on top.
        self.load_rss_bytes = (
            max(0, rss_after - rss_before) if rss_before is not None and rss_after else None
        )
        self.weights_bytes = _file_bytes(self.path)
        self.providers_in_use = tuple(self._session.get_providers())
        with _STARTED_LOCK:  # the first session of a provider also loads its libraries
            self.first_of_provider = self.providers_in_use[0] not in _STARTED_PROVIDERS
            _STARTED_PROVIDERS.add(self.providers_in_use[0])
        if self.providers_in_use[0] != self.runtime.primary:
            logger.warning(
                "%s: asked for %s, onnxruntime is using %s",
                spec.key,
                self.runtime.primary,
                self.providers_in_use[0],
            )
        # After a run that ran out of memory, the arenas of every device it used are
        # shrunk: on a CUDA session the device's too (the batch-size fallback exists for
        # GPUs shared with other models). Not yet run on a GPU: should ONNX Runtime refuse
        # the device name, the shrink run fails, is logged, and the halves run anyway.
        self._shrink_after_oom = self._shrink
        cuda = self.runtime.device.startswith("cuda:")
        if cuda and "CUDAExecutionProvider" in self.providers_in_use:
            devices = f"cpu:0;gpu:{self.runtime.device.split(':', 1)[1]}"
            self._shrink_after_oom = ort.RunOptions()
            self._shrink_after_oom.add_run_config_entry(
                "memory.enable_memory_arena_shrinkage", devices
            )
        self._check_contract()

    def _check_contract(self) -> None:
        inputs = self._session.get_inputs()
        if len(inputs) != 1:
            raise ModelError(
                f"model {self.spec.key} ({self.path.name}) has {len(inputs)} inputs "
                f"{[i.name for i in inputs]}; radserve feeds exactly one (N, C, spatial...)"
            )
        outputs = self._session.get_outputs()
        why = self.spec.served_output_refusal([o.name for o in outputs])
        if why is not None:
            raise ModelError(f"model {self.spec.key} ({self.path.name}): {why}")
        out = next(o for o in outputs if self.spec.output in (None, o.name))
        inp = inputs[0]
        self.input_name, self.output_name = inp.name, out.name
        rank = 5 if self.spec.input.mode == "3d" else 4
        if len(inp.shape) != rank:
            raise ModelError(
                f"model {self.spec.key} input {inp.name!r} has shape {inp.shape}; "
                f"input.mode {self.spec.input.mode!r} needs rank {rank} (N, C, spatial...)"
            )
        if inp.type not in _ORT_TYPES:
            raise ModelError(
                f"model {self.spec.key} input {inp.name!r} is {inp.type}; "
                "expected tensor(float) or tensor(float16)"
            )
        self.input_dtype = _ORT_TYPES[inp.type]
        want = self.spec.input.in_channels
        got = _static(inp.shape[1])
        if got is not None and got != want:
            raise ModelError(
                f"model {self.spec.key} ({self.path.name}) takes {got} input channels but "
                f"model.yaml declares {want} (2 x context_slices "
                f"{self.spec.input.context_slices} + 1 + extra_channels "
                f"{list(self.spec.input.extra_channels)}); fix model.yaml or re-export"
            )
        out_rank = 2 if self.spec.is_classifier else rank  # (N, classes): one vector each
        if self.spec.is_classifier and len(out.shape) not in (0, out_rank):
            raise ModelError(
                f"model {self.spec.key} output {out.name!r} has shape {out.shape}; a "
                "classification model answers each input with one score vector (N, classes)"
            )
        classes = _static(out.shape[1]) if len(out.shape) == out_rank else None
        if classes is not None and classes != self.spec.num_classes:
            raise ModelError(
                f"model {self.spec.key} outputs {classes} channels but model.yaml labels "
                f"with activation {self.spec.activation!r} need {self.spec.num_classes}"
            )
        self.fixed_batch = _static(inp.shape[0])
        # A 3D model's batches are patches (seconds each through nnU-Net's network): the
        # arena is shrunk at the end of every run, which costs the page faults of one
        # output, instead of by release_memory's probe, which is itself a patch when the
        # graph's spatial size is fixed (issue 18: one extra 128^3 patch per task, a
        # quarter of the network time of a four-patch study).
        self._shrink_every_run = rank == 5
        # OpenVINO's CPU plugin builds its kernels anew for every input shape (its shape
        # caches are off: openvino_cpu_config): measured on an AMX host at 60 ms of CPU
        # for an INT8 reference model, 30 bf16, 10 fp32, where one more slice costs 6-12
        # ms. So a 2D/2.5D batch smaller than the one before it, of the same slices'
        # shape (a task's last, partial batch), is padded up to it when that at most
        # doubles it; each slice's output is the same, bit for bit (session 16, AMX).
        self._pad_partial = rank == 4 and self.providers_in_use[0] == "OpenVINOExecutionProvider"
        self._last_shape: tuple[int, ...] | None = None
        # On a GPU every call has the model's batch size: larger batches (several
        # studies' slices merged by the scheduler) are split, smaller ones padded. cuDNN
        # picks its convolution kernels per input shape, so a slice computed in a batch
        # of another size gets other roundings, and near-tied voxels other labels: on
        # session 23's H200 the priority scenario's studies, batched with others, did not
        # all match the same studies run alone. With one shape, a slice's result does
        # not depend on the studies batched beside it (expected; not yet re-run on a GPU).
        gpu = self.runtime.device.startswith("cuda")
        self.uniform_batch = self.spec.input.batch_size if gpu and not self.fixed_batch else None
        # the largest batch known to fit in the device's memory, once one did not (run)
        self.batch_limit: int | None = None
        self._limit_lock = threading.Lock()
        if self.fixed_batch is not None:
            logger.info("%s has a fixed batch size %d", self.spec.key, self.fixed_batch)

    def run(self, batch: np.ndarray) -> np.ndarray:
        """Run one batch; returns float32 (N, classes, spatial...).

        A batch the device has no memory for is run again in halves, and batches are
        kept at the size that fitted from then on (:attr:`batch_limit`): on a GPU shared
        with other models, or with several studies' batches merged into one call, the
        model's batch size can be more than the free memory holds, and failing the call
        would fail every study in it and count against the model's circuit breaker. A
        batch that fails for memory even so raises :class:`DeviceMemoryError`.

        A graph that applies its activation itself (``activation_in_graph``) has its
        probabilities returned as the logits they come from (:func:`as_logits`), and
        values outside [0, 1] refused (:func:`probabilities_range_refusal`).
        """
        if batch.ndim != (5 if self.spec.input.mode == "3d" else 4):
            raise InferenceError(f"batch of shape {batch.shape} for {self.spec.input.mode} model")
        x = np.ascontiguousarray(batch, dtype=self.input_dtype)
        try:
            out = self._run_within_memory(x)
        except Exception as exc:
            # memory: the device's state, not the model's fault (DeviceMemoryError)
            kind = DeviceMemoryError if _OUT_OF_MEMORY.search(str(exc)) else InferenceError
            raise kind(
                f"{self.spec.key} failed on a batch of shape {batch.shape} with "
                f"{self.providers_in_use[0]}: {exc}"
            ) from exc
        out = np.asarray(out, dtype=np.float32)
        if not self.spec.activation_in_graph:
            return out
        why = probabilities_range_refusal(self.spec, out)
        if why is not None:
            raise ModelError(why)
        return as_logits(out, self.spec.activation)

    def _run_within_memory(self, x: np.ndarray, *, tight: bool = False) -> np.ndarray:
        """``x`` in one run, or in parts of at most :attr:`batch_limit` (``tight``: memory
        has run out before; each run then hands the CPU arena's free memory back)."""
        limit = self.batch_limit
        if limit is not None and len(x) > limit:
            return self._run_in_parts(x, limit)
        try:
            return self._run_once(x, shrink=tight or limit is not None)
        except Exception as exc:
            if not _OUT_OF_MEMORY.search(str(exc)) or len(x) == 1 or self.fixed_batch:
                raise
            half = (len(x) + 1) // 2
            # the failed run grew the arena by all it got before it failed; without this
            # those chunks stay held beside the halves and the joined output
            self._shrink_arena(self._shrink_after_oom)
            with self._limit_lock:
                if self.batch_limit is None or half < self.batch_limit:
                    self.batch_limit = half
            logger.warning(
                "%s: out of memory on %s at a batch of %d; running batches of at most %d "
                "from now on",
                self.spec.key,
                self.providers_in_use[0],
                len(x),
                half,
            )
            return self._run_in_parts(x, half)

    def _run_in_parts(self, x: np.ndarray, size: int) -> np.ndarray:
        """``x`` run ``size`` samples at a time, each part written into one output (no
        second copy of the whole output while the parts are joined)."""
        out: np.ndarray | None = None
        for i in range(0, len(x), size):
            part = self._run_within_memory(x[i : i + size], tight=True)
            if out is None:
                out = np.empty((len(x), *part.shape[1:]), dtype=part.dtype)
            out[i : i + len(part)] = part
            del part
        assert out is not None
        return out

    def _run_once(self, x: np.ndarray, *, shrink: bool = False) -> np.ndarray:
        options = self._shrink if shrink else self._options
        b = self.fixed_batch or self._uniform_size() or self._padded_size(x.shape)
        if b is None or len(x) == b:
            out = self._session.run([self.output_name], {self.input_name: x}, options)[0]
            self._last_shape = x.shape
            return out
        return self._run_fixed(x, b, options)

    def _uniform_size(self) -> int | None:
        """:attr:`uniform_batch`, within :attr:`batch_limit` once memory ran out."""
        if self.uniform_batch is None:
            return None
        return min(self.uniform_batch, self.batch_limit or self.uniform_batch)

    def _padded_size(self, shape: tuple[int, ...]) -> int | None:
        """The batch size to pad a batch of ``shape`` to (the last run's), or None."""
        last = self._last_shape
        if not self._pad_partial or last is None or last[1:] != shape[1:]:
            return None
        return last[0] if shape[0] < last[0] <= 2 * shape[0] else None

    def _run_fixed(self, x: np.ndarray, b: int, options: ort.RunOptions | None) -> np.ndarray:
        parts = []
        for start in range(0, len(x), b):
            chunk = x[start : start + b]
            n = len(chunk)
            if n < b:
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], b - n, axis=0)])
            feed = {self.input_name: chunk}
            parts.append(self._session.run([self.output_name], feed, options)[0][:n])
        return np.concatenate(parts)

    @property
    def _options(self) -> ort.RunOptions | None:
        """Run options of a batch: the arena shrink for 3D models (see _check_contract)."""
        return self._shrink if self._shrink_every_run else None

    def release_memory(self) -> None:
        """Hand the CPU arena's free chunks back to the system.

        Without this a loaded model keeps its largest batch's activations (~60 MB for
        each reference model) for good: beside the next model's during its step, and
        through post-processing and the report. ONNX Runtime shrinks an arena only at
        the end of a run asked to, so this runs the smallest valid input once that way
        (a millisecond). Runners call it when a task's last batch is done; shrinking
        after every batch instead costs a fresh set of page faults per batch (+0.5 s
        over the 300-slice lesion step here). A 3D model's arena is shrunk by every
        run instead, so this returns at once.
        """
        if not self._shrink_every_run:
            self._shrink_arena()

    def _shrink_arena(self, options: ort.RunOptions | None = None) -> None:
        """Run the smallest valid input once with the arena shrink (see release_memory;
        ``options``: other run options that shrink, e.g. a GPU's arena too)."""
        x = np.zeros(self._smallest_input_shape(), dtype=self.input_dtype)
        try:
            self._session.run([self.output_name], {self.input_name: x}, options or self._shrink)
        except Exception as exc:  # a graph that refuses the probe: keep the memory
            logger.debug("%s: arena not shrunk (%s)", self.spec.key, exc)

    def _smallest_input_shape(self) -> tuple[int, ...]:
        k = self.spec.input.divisible_by
        dims = self._session.get_inputs()[0].shape
        batch = self.fixed_batch or 1
        spatial = [_static(d) or k for d in dims[2:]]
        return (batch, self.spec.input.in_channels, *spatial)

    def describe(self) -> dict[str, object]:
        """What ran: file, precision, providers actually used; for reports and logs."""
        return {
            "model": self.spec.key,
            "file": self.path.name,
            "precision": self.precision,
            "input_dtype": np.dtype(self.input_dtype).name,
            "providers": list(self.providers_in_use),
            "intra_op_threads": self.runtime.intra_op_threads,
        }


class SessionRef(_ModelFile):
    """A model file whose session runs in another process (a Ray worker actor): what
    the serving process needs of it -- file, contract, precision, runtime -- without
    loading it. The scheduler hands it to the executor, which runs its batches remotely;
    running it here is a bug, not a fallback."""

    @property
    def providers_in_use(self) -> tuple[str, ...]:
        return tuple(self.runtime.providers)

    def run(self, batch: np.ndarray) -> np.ndarray:
        raise InferenceError(
            f"{self.spec.key} runs on the executor's workers (executor: ray), not in the "
            "serving process"
        )


__all__ = [
    "DeviceMemoryError",
    "ModelSession",
    "SessionRef",
    "as_logits",
    "is_out_of_memory",
    "probabilities_range_refusal",
]
