"""A bundle's ONNX graphs against its model.yaml, before it is installed or imported.

Read with ``load_external_data=False`` (nothing outside the bundle is opened): one
graph input; one output, or the one model.yaml's ``output`` names; their rank, channel
count and element type as the manifest implies, channels first; an output that is not
probabilities already unless ``activation_in_graph`` says so; fixed spatial sizes the
pipeline can feed; every stored tensor holding what it declares (inside the bundle);
opsets this host's ONNX Runtime loads; then one probe batch, shaped as the pipeline
feeds it, run as serving runs it (:func:`radserve.inference.probe.probe_refusal`), so
what warm-up would refuse at deploy is refused here, naming the expected and the actual
shape.
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


def _output_as_inferred(model: Any, declared: Any) -> Any:
    """The graph output ``declared`` (the one served), its shape completed by ONNX's
    shape inference where the graph declares none or leaves the class axis symbolic (a
    careless export's ``["N", "c", "h", "w"]``): ONNX Runtime infers the same and
    refuses the session, so such a graph installed and failed at deploy. Inference that
    fails (a custom operator, a graph over protobuf's 2 GB) leaves the declared output
    as it is."""
    import onnx

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


# Operators that move or re-type values without changing them: a Sigmoid's output read
# through them is still probabilities (an export's final Transpose, Reshape, Cast ...).
_VALUE_KEEPING = frozenset(
    {"Identity", "Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice",
     "Expand", "Resize"}
)  # fmt: skip
_PROBABILITY_OPS = frozenset({"Sigmoid", "HardSigmoid", "Softmax"})


def final_activation(model: Any, output: str) -> tuple[str, list[str]] | None:
    """The Sigmoid/Softmax node that makes graph output ``output``, directly or through
    value-keeping ops: its op type and those ops, output side first; None when no such
    node makes it. Every value of such a node lies in [0, 1] whatever the input, so this
    is the strong evidence that the graph outputs probabilities: a probe batch's values
    in [0, 1] alone could be logits that happen to lie there on zeros."""
    producers = {name: node for node in model.graph.node for name in node.output}
    between: list[str] = []
    name = output
    for _ in range(64):  # a chain of reshapes is short; a cycle is not a valid graph
        node = producers.get(name)
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type in _PROBABILITY_OPS:
            return node.op_type, between
        if node.op_type not in _VALUE_KEEPING or not node.input:
            return None
        between.append(node.op_type)
        name = node.input[0]
    return None


def probabilities_refusal(spec: ModelSpec, model: Any, output: str) -> str | None:
    """Why ``spec``'s ``activation`` would be applied to what is already probabilities
    (None: it would not): the graph output ``output`` comes from a Sigmoid/Softmax node
    and model.yaml does not say ``activation_in_graph: true``. Before 2026-12-07 such a
    graph installed: a sigmoid model's probabilities went through sigmoid again, which
    is at least 0.5 everywhere, so every voxel of every study was labelled; a softmax
    model kept its labels but its confidences were squashed toward 1/classes (the
    finding confidences, min_confidence rules and calibration read them). Only the log
    said "looks like probabilities"."""
    if spec.activation_in_graph:
        return None
    found = final_activation(model, output)
    if found is None:
        return None
    op, between = found
    through = f" (through {', '.join(reversed(between))})" if between else ""
    if spec.activation == "sigmoid":
        effect = (
            "sigmoid of a probability is at least 0.5, so every voxel would reach the 0.5 "
            "threshold: the whole volume labelled"
        )
    else:
        effect = (
            "softmax of probabilities keeps the winning class but squashes its probability "
            "toward 1/classes: confidences and min_confidence rules would be wrong"
        )
    return (
        f"its output {output!r} comes from a {op} node{through}, so it is probabilities "
        f"(in [0, 1] for any input), and radserve applies model.yaml's activation "
        f"{spec.activation!r} to the graph's output: {effect}. Set `activation_in_graph: "
        f"true` in model.yaml (radserve then reads the graph's probabilities as they are), "
        f"or export the graph without its final {op} so that it outputs logits"
    )


def _channels_last_refusal(role: str, value: Any, channels: int, rank: int) -> str | None:
    """Why ``value`` (the graph's input or served output) looks channels-last (None: it
    does not): its second axis symbolic and its last fixed at the channel count, as a
    TensorFlow or Keras export's (N, H, W, C). Before 2026-12-07 it was refused as "a
    fixed spatial input ?x1", which says nothing of the layout."""
    dims = value.type.tensor_type.shape.dim
    if len(dims) != rank or dims[1].HasField("dim_value") or not dims[-1].HasField("dim_value"):
        return None
    if dims[-1].dim_value != channels:
        return None
    shown = ", ".join(
        str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims
    )
    layout = "N, C, H, W" if rank == 4 else "N, C, D, H, W"
    return (
        f"{role} {value.name!r} is [{shown}]: channels last (its last axis, "
        f"{channels}, is the {'channel' if role == 'input' else 'class'} axis); radserve "
        f"feeds and reads channels first ({layout}): export the graph with the channel "
        "axis second (PyTorch exports are; from TensorFlow/Keras, tf2onnx's "
        "--inputs-as-nchw and --outputs-as-nchw)"
    )


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
        why = spec.served_output_refusal([o.name for o in model.graph.output])
        if why is not None:
            reasons.append(f"{label}: {why}")
            continue
        served = next(o for o in model.graph.output if spec.output in (None, o.name))
        output = _output_as_inferred(model, served)
        if (why := probabilities_refusal(spec, model, output.name)) is not None:
            reasons.append(f"{label}: {why}")
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
            if (why := _channels_last_refusal(role, value, channels, want_rank)) is not None:
                reasons.append(f"{label}: {why}")
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
