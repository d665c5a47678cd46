"""``radserve evaluate``: accuracy of the pipeline on held-out phantoms, per precision."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from radserve.commands.config import DEFAULT_PIPELINE, check_output_file
from radserve.models.manifest import GateSpec, ModelSpec
from radserve.models.registry import PRECISIONS, ModelRegistry, bundled_model_dir

if TYPE_CHECKING:
    from radserve.evaluation.gate import GateDecision

# radserve.evaluation (scipy.ndimage and the metrics: ~0.35 s) is imported by the command
# itself, so `radserve evaluate --help` answers at once

logger = logging.getLogger(__name__)


def pipeline_specs(registry: ModelRegistry, pipeline: str) -> list[ModelSpec]:
    """The model specs of a pipeline's steps, in order."""
    from radserve.pipeline.spec import load_pipeline

    return [registry.get(s.model, s.version).spec for s in load_pipeline(pipeline).steps]


def strictest_gate(specs: Sequence[ModelSpec]) -> GateSpec:
    """The tightest thresholds among the given models' gates."""
    if not specs:
        return GateSpec()
    return GateSpec(
        max_dice_drop=min(s.gate.max_dice_drop for s in specs),
        max_recall_drop_points=min(s.gate.max_recall_drop_points for s in specs),
    )


def parse_precisions(text: str) -> list[str]:
    """``"fp32,int8"`` -> ``["fp32", "int8"]``; fp32 is always evaluated first."""
    items = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in items if p not in PRECISIONS]
    if bad:
        raise click.BadParameter(f"unknown precision {bad}; choose from {', '.join(PRECISIONS)}")
    return ["fp32", *[p for p in dict.fromkeys(items) if p != "fp32"]]


def _seeds(_ctx: click.Context, _param: click.Parameter, value: str) -> list[int]:
    from radserve.evaluation.runner import HELD_OUT_SEED_LIMIT, parse_seeds

    try:
        seeds = parse_seeds(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    training = [seed for seed in seeds if seed >= HELD_OUT_SEED_LIMIT]
    if training:  # refused by the evaluation as a ValueError traceback (exit 1) before
        raise click.BadParameter(
            f"seeds {training[:5]} are training seeds (>= {HELD_OUT_SEED_LIMIT}); "
            f"evaluate on held-out seeds below {HELD_OUT_SEED_LIMIT}"
        )
    return seeds


@click.command("evaluate")
@click.option(
    "--seeds",
    default="0-19",
    show_default=True,
    callback=_seeds,
    help="Held-out phantom seeds (below 1000), e.g. 0-19 or 0,3,5-7.",
)
@click.option(
    "--small",
    is_flag=True,
    help=(
        "Small phantoms (128x128, 2.6-3 mm pixels): a quick check that the pipeline runs; "
        "outside the reference models' input domain, so not their accuracy."
    ),
)
@click.option(
    "--precision",
    "precision_text",
    default="fp32",
    show_default=True,
    help="Comma-separated precisions, e.g. fp32,fp16,int8.",
)
@click.option("--pipeline", default=DEFAULT_PIPELINE, show_default=True)
@click.option(
    "--models-dir",
    "models_dirs",
    multiple=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Extra model root searched before the bundled models (repeatable).",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the machine-readable summary here.",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write a Markdown report here.",
)
@click.option(
    "--grid",
    "grid_text",
    help=(
        "Evaluate across acquisitions instead: 'default' (each declared input_domain edge "
        "and just outside it, plus noise, HU offset and contrast enhancement) or axes such "
        "as 'slice_thickness=1.25,5;pixel_spacing=0.6;matrix=448;coverage=250;noise=2.5;"
        "hu_offset=40;enhancement=0.5;fov=300;suv_scale=0.8' (one factor at a time around "
        "each phantom's "
        "baseline); prints metric per cell, whether it meets the project floors and whether "
        "it lies in the models' declared input_domain."
    ),
)
def command(
    seeds: list[int],
    small: bool,
    precision_text: str,
    pipeline: str,
    models_dirs: tuple[Path, ...],
    json_path: Path | None,
    markdown_path: Path | None,
    grid_text: str | None,
) -> None:
    """Evaluate the pipeline on held-out phantoms: organ Dice/HD95, lesion recall per
    size stratum, precision and false positives per study, for each precision."""
    from radserve.evaluation.gate import gate_decision
    from radserve.evaluation.publish import lesion_table, organ_table, to_json, to_markdown
    from radserve.evaluation.runner import evaluate

    precisions = parse_precisions(precision_text)
    # before the evaluation, not after it (a traceback once every phantom had run)
    if json_path is not None:
        check_output_file(json_path, "--json")
    if markdown_path is not None:
        check_output_file(markdown_path, "--markdown")
    registry = ModelRegistry([*models_dirs, bundled_model_dir()])
    if grid_text is not None:
        _grid(registry, pipeline, grid_text, seeds, small, json_path, markdown_path)
        return
    specs = pipeline_specs(registry, pipeline)
    from radserve.evaluation.grid import phantom_domain_violations
    from radserve.evaluation.pipeline_runs import organ_label_values, pipeline_predictor

    organ_labels = organ_label_values(specs)
    predict = pipeline_predictor(registry, pipeline)
    summaries = evaluate(
        predict,
        seeds=seeds,
        organ_labels=organ_labels,
        precisions=precisions,
        small=small,
        outside_domain=lambda ct: phantom_domain_violations(specs, ct),
    )
    gate = strictest_gate(specs)
    gates: dict[str, GateDecision] = {
        p: gate_decision(summaries["fp32"], s, gate) for p, s in summaries.items() if p != "fp32"
    }
    console = Console()
    console.print(organ_table(summaries))
    console.print(lesion_table(summaries, gates))
    for name, decision in gates.items():
        for reason in decision.reasons:
            console.print(f"[red]{name} gate:[/red] {reason}")
    for note in dict.fromkeys(n for s in summaries.values() for n in s.notes):
        console.print(f"[yellow]note:[/yellow] {note}", markup=True, highlight=False)
    if json_path is not None:
        json_path.write_text(json.dumps(to_json(summaries, gates=gates), indent=2) + "\n")
        console.print(f"wrote {json_path}")
    if markdown_path is not None:
        markdown_path.write_text(to_markdown(summaries, gates))
        console.print(f"wrote {markdown_path}")


def _grid(
    registry: ModelRegistry,
    pipeline: str,
    grid_text: str,
    seeds: list[int],
    small: bool,
    json_path: Path | None,
    markdown_path: Path | None,
) -> None:
    """``--grid``: one row per acquisition cell (radserve.evaluation.grid)."""
    from rich.table import Table

    from radserve.evaluation.grid import (
        GRID_HEADER,
        CellResult,
        evaluate_grid,
        grid_markdown,
        grid_rows,
        parse_grid,
        tightest_domain,
    )
    from radserve.pipeline.spec import load_pipeline

    spec = load_pipeline(pipeline)
    specs = [registry.get(s.model, s.version).spec for s in spec.steps]
    try:
        cells = parse_grid(
            grid_text,
            pet=any(s.input.channels for s in specs),
            domain=tightest_domain([s.input_domain for s in specs]),
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--grid") from exc
    console = Console()
    if not console.is_terminal:  # a log file or a pipe: the nine columns unabridged
        console = Console(width=240)

    def write(rows: list[CellResult]) -> None:
        """The files so far: a long run that is stopped keeps the cells it finished."""
        if json_path is not None:
            payload = {"pipeline": spec.name, "seeds": seeds, "small": small}
            payload["cells"] = [r.to_dict() for r in rows]  # type: ignore[assignment]
            json_path.write_text(json.dumps(payload, indent=2) + "\n")
        if markdown_path is not None:
            markdown_path.write_text(grid_markdown(rows))

    rows = evaluate_grid(
        registry,
        spec,
        cells=cells,
        seeds=seeds,
        small=small,
        progress=lambda line: console.print(line, highlight=False),
        on_row=write,
    )
    table = Table(title=f"{spec.name}: accuracy per acquisition ({len(seeds)} phantoms a cell)")
    for name in GRID_HEADER:
        table.add_column(name)
    for row in grid_rows(rows):
        table.add_row(*row)
    console.print(table)
    write(rows)
    for path in (json_path, markdown_path):
        if path is not None:
            console.print(f"wrote {path}")
