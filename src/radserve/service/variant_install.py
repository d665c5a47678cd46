"""``models install --build-variants``: the install's prepare step that builds and gates
the bundle's precision variants before it is hashed and moved into the model store.

The variants are made exactly as the shipped ones are (``radserve models
build-variants``, :func:`radserve.variants.build_and_gate_on_phantoms`): through the
pipeline that runs the model (the other steps at the versions they serve now), on
phantoms, with the settings of ``lifecycle.variants``. Each variant's gate decision is
recorded in the bundle's ``gate.json``; a rejected variant stays declared but the
registry refuses to serve or deploy it, giving the gate's reasons. A variant build that
cannot run at all (no pipeline runs the model, bad seeds, a graph the quantiser cannot
handle) refuses the install: nothing half-built is installed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radserve.config import Settings
from radserve.errors import BundleRejectedError, ModelError, RadserveError
from radserve.lifecycle.install import InstalledBundle
from radserve.models.manifest import ModelSpec
from radserve.models.registry import ModelRegistry
from radserve.service.catalog import Catalog, ResolvedPipeline

logger = logging.getLogger(__name__)

__all__ = ["VariantRequest", "install_summary", "variant_builder", "variant_gates"]


@dataclass(frozen=True)
class VariantRequest:
    """What one install asks for; ``None`` fields take ``lifecycle.variants``."""

    precisions: tuple[str, ...] | None = None
    seeds: str | None = None
    calibration_seeds: str | None = None
    small: bool | None = None


def _pipeline_for(settings: Settings, catalog: Catalog, model: str) -> ResolvedPipeline:
    """The configured variants pipeline, else the default one, else the first pipeline
    with a step running ``model``."""
    chosen = settings.lifecycle.variants.pipeline
    names = [chosen] if chosen else [settings.pipelines.default, *catalog.available()]
    for name in dict.fromkeys(names):
        try:
            resolved = catalog.resolve(name)
        except RadserveError as exc:
            logger.info("pipeline %s not usable to gate %s variants: %s", name, model, exc)
            continue
        if model in resolved.model_versions:
            return resolved
    raise BundleRejectedError(
        f"variants of {model!r} are evaluated through a pipeline that runs it, and none "
        f"does ({', '.join(dict.fromkeys(names))}); install without --build-variants, or set "
        "lifecycle.variants.pipeline"
    )


def _seeds(text: str, what: str) -> list[int]:
    from radserve.evaluation.runner import parse_seeds

    try:
        return parse_seeds(text)
    except ValueError as exc:
        raise BundleRejectedError(f"variant {what} {text!r}: {exc}") from exc


def variant_builder(
    settings: Settings, catalog: Catalog, request: VariantRequest
) -> Callable[[Path, ModelSpec], None]:
    """The ``prepare`` step for :func:`radserve.lifecycle.install.install_bundle`."""
    from radserve.variants import build_and_gate_on_phantoms, default_precisions

    config = settings.lifecycle.variants
    providers = catalog.serving_providers  # built, evaluated and timed as they will serve

    def prepare(root: Path, spec: ModelSpec) -> None:
        precisions: Sequence[str] = (
            request.precisions or config.precisions or tuple(default_precisions(providers))
        )
        precisions = [p for p in dict.fromkeys(precisions) if p != "fp32"]
        eval_seeds = _seeds(request.seeds or config.seeds, "evaluation seeds")
        calibration_seeds = _seeds(
            request.calibration_seeds or config.calibration_seeds, "calibration seeds"
        )
        resolved = _pipeline_for(settings, catalog, spec.name)
        pipeline = resolved.pinned({spec.name: spec.version}, {}).spec
        registry = ModelRegistry(
            [root, *catalog.registry.roots], missing_ok=catalog.registry.missing_ok
        )
        small = config.small if request.small is None else request.small
        logger.info(
            "building %s variants of %s through pipeline %s on %d phantoms%s",
            ", ".join(precisions),
            spec.key,
            pipeline.name,
            len(eval_seeds),
            " (small)" if small else "",
        )
        try:
            report = build_and_gate_on_phantoms(
                registry,
                pipeline,
                spec.name,
                eval_seeds=eval_seeds,
                calibration_seeds=calibration_seeds,
                precisions=precisions,
                small=small,
                threads=config.threads,
                providers=providers,
            )
        except (ModelError, ValueError) as exc:
            why = exc.message if isinstance(exc, ModelError) else str(exc)
            raise BundleRejectedError(
                f"{spec.key}: precision variants could not be built: {why}"
            ) from exc
        for precision, record in report.variants.items():
            logger.info(
                "%s %s: %s%s",
                spec.key,
                precision,
                "accepted" if record.accepted else "rejected (kept off)",
                "".join(f"; {r}" for r in record.reasons),
            )

    return prepare


def variant_gates(directory: Path) -> dict[str, dict[str, object]]:
    """Per variant in the bundle's ``gate.json``: accepted, and the gate's reasons (what
    an install answers and audits; empty without a gate report)."""
    from radserve.models.gate import read_gate_report

    report = read_gate_report(directory)
    if report is None:
        return {}
    return {
        precision: {"accepted": record.accepted, "reasons": list(record.reasons)}
        for precision, record in report.variants.items()
    }


def install_summary(installed: InstalledBundle) -> dict[str, Any]:
    """What an install answers (the API's 201, an install record's ``result``): name,
    version, every file's SHA-256, each variant's gate decision, and what became of a
    ``gate.json`` that came in the bundle (``shipped_gate``: ``set_aside``, no variant
    serves on it; ``trusted``; None: there was none). Before 2026-12-07 only ``GET
    /v1/models`` said a shipped gate was set aside, so a vendor reading its 201 took
    its variants for served."""
    return {
        "name": installed.name,
        "version": installed.version,
        "files": dict(installed.files),
        "variants": variant_gates(installed.directory),
        "shipped_gate": installed.shipped_gate,
    }
