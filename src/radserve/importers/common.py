"""What every importer shares: label entries, file hashes, the checked ONNX export and
the staged write of the bundle folder."""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from radserve import durable
from radserve.importers import ImportRefusedError
from radserve.lifecycle.graph_checks import check_onnx
from radserve.lifecycle.install import STAGING_DIR, sha256_file
from radserve.models.dicom_text import fit
from radserve.models.manifest import ModelSpec, path_segment
from radserve.validation_text import describe_problems

if TYPE_CHECKING:
    from radserve.inference.providers import RuntimeChoice

_ANATOMY = {"value": "123037004", "scheme": "SCT", "meaning": "Anatomical Structure"}
_PALETTE = [
    (221, 130, 101), (157, 108, 162), (111, 184, 210), (250, 250, 225), (216, 101, 79),
    (144, 238, 144), (255, 181, 158), (128, 174, 128), (241, 214, 145), (177, 122, 101),
]  # fmt: skip


def _code(value: int, name: str) -> str:
    """A private Code Value (at most 16 characters, DICOM's SH) for a label name: the
    name lower-cased with '-' for other characters; a longer name is cut and ends in
    ``-<value>``, so labels that share their first 16 characters (TotalSegmentator's
    ``subclavian_artery_left`` / ``_right``) still get distinct codes."""
    code = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-") or f"label-{value}"
    return code if len(code) <= 16 else _suffixed(code, value)


def _suffixed(code: str, value: int) -> str:
    """``code`` cut to end in ``-<value>`` within 16 characters."""
    suffix = f"-{value}"
    return code[: 16 - len(suffix)].rstrip("-") + suffix


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (NaN and Infinity are JavaScript's)")


def read_json_object(path: Path) -> dict[str, Any]:
    """``path``'s JSON object (an AI team's plans, dataset.json, metadata.json), refused
    (:class:`ImportRefusedError`) when unreadable, not an object, nested too deeply for
    the parser, or holding NaN/Infinity, which Python's json accepts and would carry into
    model.yaml as a spacing or intensity of NaN."""
    try:
        data = json.loads(path.read_text(), parse_constant=_no_constant)
    except (OSError, ValueError) as exc:
        raise ImportRefusedError(f"cannot read {path.name}: {exc}") from exc
    except RecursionError as exc:
        raise ImportRefusedError(f"{path.name} is nested too deeply to read") from exc
    if not isinstance(data, dict):
        raise ImportRefusedError(f"{path.name} is not a JSON object")
    return data


@contextlib.contextmanager
def refused_if_malformed(files: str) -> Iterator[None]:
    """An AI team's files (``files`` names them) read as their tool writes them:
    ``plans["configurations"][name]``, ``int(value)``, ``metadata["network_data_format"]``.
    A file that parses but has another shape (a list where an object belongs, a name
    where a number does, an ``inherits_from`` cycle) raised KeyError, TypeError,
    RecursionError ... from deep inside the mapping, past the import's refusal (found by
    fuzzing the importers); here it becomes :class:`ImportRefusedError`, naming the
    files and what was wrong. Usable as a decorator."""
    try:
        yield
    except ImportRefusedError:
        raise
    except (LookupError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise ImportRefusedError(
            f"{files}: not the structure the import reads "
            f"({type(exc).__name__}{': ' + detail if detail else ''})"
        ) from exc


def validated_manifest(raw: dict[str, Any]) -> ModelSpec:
    """The mapped ``model.yaml`` ``raw``, validated; refused (:class:`ImportRefusedError`)
    in one line, one ``field: reason (got value)`` per problem
    (:func:`radserve.validation_text.describe_problems`), as ``radserve models install``
    says it. Before 2026-12-07 the importers printed pydantic's own text: a header line,
    then two lines per problem with a link to pydantic's site."""
    try:
        return ModelSpec.model_validate(raw)
    except ValidationError as exc:
        raise ImportRefusedError(
            f"the mapped model.yaml is invalid: {describe_problems(exc)}"
        ) from exc


def label_entries(pairs: list[tuple[int, str]]) -> list[dict[str, Any]]:
    """:func:`label_entry` for each (value, name), by value; codes made distinct (a code
    another label already has gets ``-<value>`` in place of its tail)."""
    out, seen = [], set()
    for value, name in sorted(pairs):
        entry = label_entry(value, name)
        code = entry["concept"]["value"]
        if code in seen:
            code = entry["concept"]["value"] = _suffixed(code, value)
        seen.add(code)
        out.append(entry)
    return out


def label_entry(value: int, name: str) -> dict[str, Any]:
    """A model.yaml label for a framework's label name (organ kind, private code)."""
    return {
        "value": value,
        "name": name,
        # framework label names carry no code: a private scheme until the site maps them.
        # the meaning is a CodeMeaning (LO: 64 bytes here); the name stays whole
        "concept": {
            "value": _code(value, name),
            "scheme": "99RADSRV",
            "meaning": fit(name),
        },
        "category": dict(_ANATOMY),
        "kind": "organ",
        "color": list(_PALETTE[(value - 1) % len(_PALETTE)]),
    }


def export_checked(
    model: Any,
    path: Path,
    channels: int,
    patch: tuple[int, ...],
    *,
    providers: Sequence[str] = (),
) -> float:
    """Export a torch module to ``path`` (opset 17, dynamic patch batch, input ``image``,
    output ``logits``); return the max |torch - ONNX Runtime| output difference on two
    random patch batches, run on the providers radserve serves with (raises if large):
    ``providers``, the server's (``runtime.providers``, as
    :attr:`radserve.service.catalog.Catalog.serving_providers` gives them; empty: the
    host's choice). Before 2026-12-07 it always ran on the host's choice (OpenVINO
    here), so a network that OpenVINO cannot compile was refused for a server serving on
    the CPU provider, where it runs.

    "Large" is 1% of the largest logit: an export bug (a dropped or wrong operator,
    wrong weights) moves outputs by their own size, while two correct float32
    implementations of a deep network differ by their kernels' rounding -- measured
    1.06e-3 of the largest logit for nnU-Net's default six-stage network with a fitted
    head on OpenVINO (issue 18), which the former 0.1% bound refused."""
    import warnings

    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch

    dummy = torch.zeros(1, channels, *patch)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Checked on the providers radserve will serve with: ONNX Runtime's plain CPU
    # provider runs 3D convolutions through im2col buffers (29 GB for one batch of two
    # 128^3 patches of nnU-Net's default network), OpenVINO does not.
    runtime = import_runtime(providers)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (dummy,),
                str(path),
                dynamo=False,
                opset_version=17,
                input_names=["image"],
                output_names=["logits"],
                dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
                do_constant_folding=True,
            )
        onnx.checker.check_model(onnx.load(str(path)))

        def new_session() -> ort.InferenceSession:
            return ort.InferenceSession(
                str(path),
                providers=list(runtime.providers),
                provider_options=list(runtime.provider_options),
            )

        session: ort.InferenceSession | None = new_session()
    except ImportRefusedError:
        raise
    except Exception as exc:  # torch's exporter, the checker and ORT raise many kinds
        name = type(getattr(model, "net", model)).__name__
        raise ImportRefusedError(
            f"the network ({name}) does not export to an ONNX graph radserve can run on "
            f"{', '.join(runtime.providers)}, the providers the server serves with "
            f"(torch {torch.__version__}, opset 17): {_what_failed(str(exc))}"
        ) from exc
    rng = np.random.default_rng(0)
    worst, scale = 0.0, 1.0
    # Memory: a batch of logits is classes x patch voxels (two 96^3 patches of a 105-class
    # network: 0.7 GB), and OpenVINO keeps each input shape's buffers for its session's
    # life. So one session per batch size, dropped before torch runs; torch runs the
    # batch's patches one at a time (a network in eval mode treats each alone); the
    # difference is taken in place. Batched torch beside both sessions' buffers and new
    # arrays for the difference took such an import to 5.6 GB.
    for n in (1, 2):
        x = rng.normal(size=(n, channels, *patch)).astype(np.float32)
        out = (session or new_session()).run(None, {"image": x})[0]
        session = None
        for patch_in, got in zip(x, out, strict=True):
            with torch.no_grad():
                ref = _first_tensor(model(torch.from_numpy(patch_in[None]))).numpy()[0]
            # a NaN compares false with everything: max(worst, nan) kept worst, and a
            # network of NaN weights was imported to label every study empty
            for what, values in (("torch", ref), ("ONNX Runtime", got)):
                if not np.isfinite(values).all():
                    raise ImportRefusedError(
                        f"the network's outputs in {what} hold NaN or infinite values on a "
                        "random input patch: its weights or graph are broken (a NaN weight, "
                        "an overflow); nothing labelled from it could be trusted"
                    )
            scale = max(scale, float(ref.max()), -float(ref.min()))
            np.abs(np.subtract(got, ref, out=got), out=got)
            worst = max(worst, float(got.max()))
            del ref
        del out
    if worst > 1e-2 * scale:
        raise ImportRefusedError(f"ONNX export differs from torch by {worst:.2e} (scale {scale})")
    return worst


def _first_tensor(out: Any) -> Any:
    """A network's output as the export's first graph output (``logits``) holds it: the
    tensor itself, or the first of a tuple or list (a TorchScript network returning
    several, exported as they are; :func:`write_bundle_files` then names ``logits`` as
    the output served)."""
    while isinstance(out, list | tuple) and out:
        out = out[0]
    return out


@contextlib.contextmanager
def staged_bundle(models_dir: Path, name: str, version: str) -> Iterator[Path]:
    """A folder to write the bundle ``models_dir/<name>/<version>/`` into, renamed to
    that name, whole, when the block ends (:func:`radserve.durable.rename_tree`). An
    import that is refused or fails on the way (an ONNX export that does not run, a
    network that does not load) leaves nothing behind: no half-written version for
    ``radserve models`` or the registry to find, and no folder made for it.

    The folder lies in ``models_dir/.staging/`` (the file system of the target, three
    levels deep: the registry's ``*/*/model.yaml`` does not see it), owner-named, so a
    killed import's is swept by the next import into the same folder (and, under a data
    dir, by ``radserve models install`` and the server's start)."""
    root = Path(models_dir)
    try:  # before anything is written: a name from a folder's plans may be '../../x'
        target = root / path_segment(name, "model name") / path_segment(version, "version")
    except ValueError as exc:
        raise ImportRefusedError(str(exc)) from None
    if target.exists():
        raise ImportRefusedError(f"{target} already holds a bundle; pick another --version")
    made = [folder for folder in (root / STAGING_DIR, root) if not folder.exists()]
    if not made:
        durable.sweep(root / STAGING_DIR)  # what killed imports left
    staging = durable.temporary_dir(root / STAGING_DIR, "import")
    try:
        bundle = staging / "bundle"
        bundle.mkdir()
        yield bundle
        durable.make_dirs(target.parent)
        try:
            durable.rename_tree(bundle, target)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise ImportRefusedError(f"{target} already holds a bundle") from exc
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in made:  # the staging folder, then the models folder, if now empty
            with contextlib.suppress(OSError):
                folder.rmdir()


def _what_failed(text: str) -> str:
    """An exporter's or ONNX Runtime's message in one line: its first 300 characters, and
    for one of several lines its last, which says what failed (OpenVINO's first line is
    a C++ signature of 1,000 characters; "CPU plug-in doesn't support If operation with
    dynamic rank" comes last)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2:
        return (lines or ["no reason given"])[0][:300]
    return f"{lines[0][:150]} ... {lines[-1][:250]}"


def import_runtime(providers: Sequence[str]) -> RuntimeChoice:
    """The runtime an import checks its export on: ``providers`` (the server's; empty:
    the host's choice) as :func:`~radserve.inference.providers.choose_runtime` picks
    them for the server, refused as a server start refuses a list this host cannot run.
    Asked before torch exports anything."""
    from radserve.errors import ModelError
    from radserve.inference.providers import choose_runtime

    try:
        return choose_runtime(prefer=list(providers) or None)
    except ModelError as exc:
        raise ImportRefusedError(
            f"cannot check the export on the providers the server serves with "
            f"({', '.join(providers)}, runtime.providers): {exc.message}"
        ) from exc


def write_bundle_files(
    folder: Path,
    spec: ModelSpec,
    header: str,
    record: dict[str, Any],
    *,
    providers: Sequence[str] = (),
) -> None:
    """``model.yaml`` (``header``, comment lines, then ``spec``) and ``import.json``
    (``record``: where the bundle came from) beside the exported ``model.onnx``.

    The exported graph is then checked against the mapped model.yaml as ``radserve
    models install`` checks a bundle (:func:`radserve.lifecycle.graph_checks.check_onnx`):
    the labels come from the framework's label list (MONAI's metadata.json
    ``channel_def``, nnU-Net's dataset.json) and the graph from the network, and a
    network of 5 output channels beside a ``channel_def`` of 3 was imported, to be
    refused by install and by every run. Its probe batch runs on ``providers`` (the
    server's, as :func:`export_checked`).

    A graph of several outputs (a TorchScript network returning a tuple) gets
    ``output:`` naming its first, the one :func:`export_checked` compared with torch:
    install refuses a graph of several outputs without it."""
    spec = _name_served_output(spec, folder / spec.files["fp32"])
    (folder / "model.yaml").write_text(
        header + yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
    )
    (folder / "import.json").write_text(json.dumps(record, indent=2) + "\n")
    reasons = check_onnx(spec, folder, providers=providers)
    if reasons:
        raise ImportRefusedError(
            "the exported network does not fit the labels the model declares: "
            + "; ".join(reasons)
            + " (the labels come from metadata.json's channel_def for a MONAI bundle, from "
            "dataset.json's labels for nnU-Net)"
        )


def _name_served_output(spec: ModelSpec, path: Path) -> ModelSpec:
    """``spec`` with ``output`` naming the graph's first output where it has several
    (unchanged where ``output`` is set, the graph has one, or it cannot be read: the
    check after it says why)."""
    import onnx

    if spec.output is not None:
        return spec
    try:
        outputs = [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]
    except Exception:  # onnx raises DecodeError, OSError ...: check_onnx names the file
        return spec
    if len(outputs) < 2:
        return spec
    return spec.model_copy(update={"output": outputs[0]})


__all__ = [
    "export_checked",
    "import_runtime",
    "label_entries",
    "label_entry",
    "read_json_object",
    "sha256_file",
    "staged_bundle",
    "validated_manifest",
    "write_bundle_files",
]
