"""A bundle's ONNX graphs against its model.yaml, before it is installed or imported.

Read with ``load_external_data=False`` (nothing outside the bundle is opened): one
graph input, an output whose rank, channel count and element type match the manifest,
fixed spatial sizes the pipeline can feed, every stored tensor holding what it declares
(inside the bundle), opsets this host's ONNX Runtime loads; then one probe batch, shaped
as the pipeline feeds it, run as serving runs it
(:func:`radserve.inference.probe.probe_refusal`), so what warm-up would refuse at
deploy is refused here, naming the expected and the actual shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from radserve.lifecycle.requirements import free_memory_mb, graph_refusal
from radserve.models.manifest import ModelSpec


def _graph_tensors(graph: Any) -> Iterator[Any]:
    """Every tensor a graph stores: its initializers (sparse ones' values and indices),
    and the tensors in its nodes' attributes (a ``Constant``'s ``value``), subgraphs
    (``If``, ``Loop``, ``Scan`` bodies) included. Any of them may keep its data in an
    external file; before 2026-12-06 only the top graph's initializers were looked at,
    so a ``Constant`` reading ``/etc/passwd`` installed (ONNX Runtime refused it only
    when the version was deployed)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for sparse in (
                *([attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []),
                *attribute.sparse_tensors,
            ):
                yield from (sparse.values, sparse.indices)
            for sub in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                yield from _graph_tensors(sub)


def _external_data_refusal(tensor: Any, directory: Path) -> str | None:
    """Why ``tensor``'s external data cannot be read from inside the bundle, or None: its
    file must lie inside (a regular file, after links are followed) and hold the
    ``offset`` + ``length`` bytes it declares (ONNX Runtime refuses it at load
    otherwise: a 2 GB ``length`` on an 8-byte file installed, then failed to deploy)."""
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location", "")
    try:
        ext = (directory / location).resolve()
        ext.relative_to(directory.resolve())
        size = ext.stat().st_size if ext.is_file() else None
    except (ValueError, OSError):
        size = None
    if size is None:
        return f"external data {location!r} missing or outside"
    try:
        offset, length = int(entries.get("offset") or 0), entries.get("length")
        end = offset + (int(length) if length else 0)
    except ValueError:
        return f"external data {location!r}: offset or length is not a number"
    if offset < 0 or end > size or (length is not None and int(length) < 0):
        return (
            f"external data {location!r} of tensor {tensor.name!r}: bytes {offset}-{end} "
            f"declared, the file holds {size}"
        )
    return None


_TYPED_DATA = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")
_PACKED_TYPES = ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")  # several per byte: not counted


def _size_refusal(tensor: Any, directory: Path) -> str | None:
    """Why ``tensor`` holds other than the values its shape and type declare, or None.
    ONNX Runtime allocates the declared size when it loads a graph: a weight declared
    as 16 GiB that holds 16 bytes took all of the process's memory (or was refused,
    "bad_alloc") at the first session, which install now opens to run its probe batch
    (:func:`radserve.inference.probe.probe_refusal`). Counted, never read."""
    import onnx

    kind = onnx.TensorProto.DataType.Name(tensor.data_type)
    if kind in ("UNDEFINED", "STRING", *_PACKED_TYPES):
        return None
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    elements = math.prod(tensor.dims)
    declared = elements * itemsize
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        entries = {e.key: e.value for e in tensor.external_data}
        length = entries.get("length")
        offset = int(entries.get("offset") or 0)
        held = int(length) if length else (directory / entries["location"]).stat().st_size - offset
    elif tensor.raw_data:
        held = len(tensor.raw_data)
    else:
        values = sum(len(getattr(tensor, name)) for name in _TYPED_DATA)
        held = values * itemsize // (2 if kind.startswith("COMPLEX") else 1)
    if held == declared:
        return None
    shape = "x".join(str(d) for d in tensor.dims) or "scalar"
    return (
        f"tensor {tensor.name!r} declares {shape} {kind} ({declared:,} bytes) and holds "
        f"{held:,} bytes"
    )


def _output_as_inferred(model: Any) -> Any:
    """The graph's first output, its shape completed by ONNX's shape inference where the
    graph declares none or leaves the class axis symbolic (a careless export's
    ``["N", "c", "h", "w"]``): ONNX Runtime infers the same and refuses the session,
    so such a graph installed and failed at deploy. Inference that fails (a custom
    operator, a graph over protobuf's 2 GB) leaves the declared output as it is."""
    import onnx

    declared = model.graph.output[0]
    shape = declared.type.tensor_type.shape
    if declared.type.tensor_type.HasField("shape") and (
        len(shape.dim) < 2 or shape.dim[1].HasField("dim_value")
    ):
        return declared
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph.output
    except Exception:  # onnx raises InferenceError, ValueError, protobuf's errors ...
        return declared
    return next((o for o in inferred if o.name == declared.name), declared)


def _static_dims(value: Any) -> list[int | None]:
    """A value's declared dimensions: the size where fixed, None where symbolic."""
    return [
        d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim
    ]


def check_onnx(
    spec: ModelSpec,
    directory: Path,
    *,
    probe_timeout_s: float | None = None,
    providers: Sequence[str] = (),
) -> list[str]:
    """Reasons the ONNX files ``spec.files`` names disagree with ``spec`` (empty: none).

    Each file that passes the checks read from the graph is then loaded as serving
    loads it and run on one batch shaped as the pipeline feeds it, in a process of its
    own killed after ``probe_timeout_s`` (default
    :data:`radserve.inference.probe.PROBE_TIMEOUT_S`;
    :func:`radserve.inference.probe.isolated_probe_refusal`), so an output off the
    input's grid, or a graph ONNX Runtime does not load or run, loops or crashes on, is
    refused here, naming the expected and the actual shape, not at deploy. ``providers``:
    the execution providers the server serves with (empty: the host's choice), which the
    probe batch runs on."""
    import onnx

    from radserve.inference.probe import (
        PROBE_TIMEOUT_S,
        isolated_probe_refusal,
        static_input_refusal,
        static_output_refusal,
    )

    reasons: list[str] = [] if (why := undeclared_class_refusal(spec)) is None else [why]
    rank = 5 if spec.input.mode == "3d" else 4
    out_rank = 2 if spec.is_classifier else rank  # a classifier: one score vector each
    float_types = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    probed: set[Path] = set()
    for precision, filename in spec.files.items():
        path = directory / filename
        label = f"{spec.key} {precision} ({filename})"
        try:
            path.resolve().relative_to(directory.resolve())
        except ValueError:
            reasons.append(f"{label}: the file lies outside the bundle")
            continue
        if not path.is_file():
            reasons.append(f"{label}: file named in model.yaml is missing")
            continue
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # onnx raises DecodeError, RuntimeError, ...
            reasons.append(f"{label}: not a readable ONNX model ({type(exc).__name__})")
            continue
        found = len(reasons)
        for tensor in _graph_tensors(model.graph):
            why = None
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                why = _external_data_refusal(tensor, directory)
            why = why or _size_refusal(tensor, directory)
            if why is not None:
                reasons.append(f"{label}: {why}")
                break
        refusal = graph_refusal(
            ((o.domain, o.version) for o in model.opset_import), model.ir_version
        )
        if refusal is not None:
            reasons.append(f"{label}: this host cannot load the graph: {refusal}")
        weights = {t.name for t in model.graph.initializer}
        inputs = [i for i in model.graph.input if i.name not in weights]
        if len(inputs) != 1:
            reasons.append(f"{label}: expected 1 graph input, found {len(inputs)}")
            continue
        if not model.graph.output:
            reasons.append(f"{label}: the graph has no output")
            continue
        output = _output_as_inferred(model)
        checks = (
            ("input", inputs[0], spec.input.in_channels, rank),
            ("output", output, spec.num_classes, out_rank),
        )
        for role, value, channels, want_rank in checks:
            tensor_type = value.type.tensor_type
            if tensor_type.elem_type not in float_types:
                name = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
                reasons.append(f"{label}: {role} {value.name!r} is {name}, expected float")
            if role == "output" and not tensor_type.HasField("shape"):
                continue  # rank unknown until it runs: the probe batch checks it
            dims = tensor_type.shape.dim
            if len(dims) != want_rank:
                layout = "(N, classes)" if want_rank == 2 else "(N, C, spatial...)"
                reasons.append(
                    f"{label}: {role} {value.name!r} has rank {len(dims)}; a "
                    f"{'classification' if spec.is_classifier else spec.input.mode} model's "
                    f"{role} needs rank {want_rank} {layout}"
                )
                continue
            if dims[1].HasField("dim_value") and dims[1].dim_value != channels:
                what = "input channels" if role == "input" else "output classes"
                reasons.append(
                    f"{label}: {role} {value.name!r} has {dims[1].dim_value} channels; the "
                    f"manifest implies {channels} {what}"
                )
        if len(reasons) > found:
            continue  # the sizes below mean nothing on a graph of another rank or type
        static = (
            static_input_refusal(spec, _static_dims(inputs[0])),
            static_output_refusal(spec, _static_dims(output)),
        )
        reasons += [f"{label}: {why}" for why in static if why is not None]
        if len(reasons) == found and path.resolve() not in probed:
            probed.add(path.resolve())
            why = _probe_memory_refusal(spec) or isolated_probe_refusal(
                spec, path, timeout_s=probe_timeout_s or PROBE_TIMEOUT_S, providers=providers
            )
            if why is not None:
                reasons.append(f"{label}: {why}")
    return reasons


def undeclared_class_refusal(spec: ModelSpec) -> str | None:
    """Why ``spec``'s output has classes it does not declare (None: every class is a
    label or in ``ignored_values``). A softmax model declaring labels 1 and 3 has an
    output class 2; before 2026-12-06 it installed, and the voxels class 2 won were
    reported as nothing: liver and spleen read "not found", with no warning."""
    missing = spec.undeclared_values
    if not missing:
        return None
    if spec.is_classifier:
        what = "class scores"
    else:
        what = "voxels" if spec.activation == "softmax" else "channels over the threshold"
    layout = (
        f"{spec.num_classes} output channels, channel 0 background and channel c class c"
        if spec.activation == "softmax"
        else f"{spec.num_classes} output channels, channel c class c + 1"
    )
    declared = sorted(label.value for label in spec.labels)
    return (
        f"{spec.key}: output class values {list(missing)} are declared neither as labels nor "
        f"in ignored_values ({layout}; labels {declared}): {what} won by them would be "
        "reported as nothing, a false negative. Declare each as a label, or list it in "
        "ignored_values if the model's class is deliberately not reported"
    )


def _probe_memory_refusal(spec: ModelSpec) -> str | None:
    """Why this host cannot hold one probe batch's input and output (None: it can): a
    3D patch up to 2,048 voxels an edge is a valid model.yaml, and its batch of 32 GiB
    would take the server's memory at install, as every study's would at serving."""
    from radserve.inference.probe import expected_output_shape, probe_input_shape

    shape = probe_input_shape(spec)
    needed = 4 * (math.prod(shape) + math.prod(expected_output_shape(spec, shape)))
    available = free_memory_mb()
    if available is None or needed <= available * 2**20 // 2:
        return None
    return (
        f"one batch of shape {shape} and its output need {needed / 2**30:.1f} GiB; this host "
        f"has {available / 1024:.1f} GiB available: give input.patch_size the patch the "
        "network was trained with"
    )


__all__ = ["check_onnx", "undeclared_class_refusal"]
