"""Evaluation results as JSON, Markdown and rich tables (one source, three renderings).

JSON layout: the FP32 summary's fields at the top level, each other precision under
``variants[<precision>]`` with the same fields plus ``gate`` (the gate decision against
FP32) and, when measured, ``speed``.
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.table import Table

from radserve.evaluation.gate import GateDecision
from radserve.evaluation.lesions import SIZE_STRATA
from radserve.evaluation.summary import EvalSummary
from radserve.models.gate import SpeedResult

__all__ = ["lesion_table", "organ_table", "to_json", "to_markdown"]


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def to_json(
    summaries: Mapping[str, EvalSummary],
    *,
    gates: Mapping[str, GateDecision] | None = None,
    speeds: Mapping[str, SpeedResult] | None = None,
    reference: str = "fp32",
) -> dict[str, object]:
    """Machine-readable results; ``reference`` (FP32) at the top level."""
    gates = gates or {}
    speeds = speeds or {}
    if reference not in summaries:
        raise ValueError(f"the {reference} summary is needed as the reference")
    out: dict[str, object] = summaries[reference].model_dump(mode="json")
    if reference in speeds:
        out["speed"] = speeds[reference].model_dump(mode="json")
    variants: dict[str, object] = {}
    for name, summary in summaries.items():
        if name == reference:
            continue
        entry: dict[str, object] = summary.model_dump(mode="json")
        if name in gates:
            entry["gate"] = gates[name].model_dump(mode="json")
        if name in speeds:
            entry["speed"] = speeds[name].model_dump(mode="json")
        variants[name] = entry
    out["variants"] = variants
    return out


def organ_table(summaries: Mapping[str, EvalSummary]) -> Table:
    """Organs as rows, Dice and HD95 for each precision as columns."""
    table = Table(title="Organs: Dice / HD95 (mm)")
    table.add_column("organ")
    for name in summaries:
        table.add_column(f"Dice {name}", justify="right")
        table.add_column(f"HD95 {name}", justify="right")
    organs = list(dict.fromkeys(o for s in summaries.values() for o in s.dice))
    for organ in organs:
        row = [organ]
        for s in summaries.values():
            row += [_fmt(s.dice.get(organ)), _fmt(s.hd95.get(organ), 1)]
        table.add_row(*row)
    row = ["mean"]
    for s in summaries.values():
        row += [_fmt(s.dice_mean), ""]
    table.add_row(*row, style="bold")
    return table


def _lesion_rows(
    summaries: Mapping[str, EvalSummary], gates: Mapping[str, GateDecision]
) -> tuple[list[str], list[list[str]]]:
    header = ["precision"] + [f"recall {k} mm" for k in SIZE_STRATA]
    header += ["precision (lesions)", "FP/study", "gate"]
    rows = []
    for name, s in summaries.items():
        row = [name]
        row += [
            f"{_pct(s.recall_by_size[k])} ({s.n_detected_by_size[k]}/{s.n_lesions_by_size[k]})"
            for k in SIZE_STRATA
        ]
        gate = gates.get(name)
        verdict = "reference" if gate is None else ("accepted" if gate.accepted else "REJECTED")
        row += [_pct(s.precision), f"{s.fp_per_study:.2f}", verdict]
        rows.append(row)
    return header, rows


def lesion_table(
    summaries: Mapping[str, EvalSummary], gates: Mapping[str, GateDecision] | None = None
) -> Table:
    """Lesion recall per size stratum, precision, FP per study, gate verdict."""
    header, rows = _lesion_rows(summaries, gates or {})
    table = Table(title="Lesions")
    for i, col in enumerate(header):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def to_markdown(
    summaries: Mapping[str, EvalSummary], gates: Mapping[str, GateDecision] | None = None
) -> str:
    """The two tables plus recall by lesion type and every gate reason, as Markdown."""
    gates = gates or {}
    names = list(summaries)
    first = next(iter(summaries.values()))
    lines = [
        "# Evaluation on held-out phantoms",
        "",
        f"{first.n_studies} studies, seeds {first.seeds[0]}..{first.seeds[-1]}.",
        "",
        "## Organs",
        "",
        "| organ | " + " | ".join(f"Dice {n} | HD95 {n} (mm)" for n in names) + " |",
        "|---|" + "---:|---:|" * len(names),
    ]
    organs = list(dict.fromkeys(o for s in summaries.values() for o in s.dice))
    for organ in organs:
        cells = [
            f"{_fmt(s.dice.get(organ))} | {_fmt(s.hd95.get(organ), 1)}" for s in summaries.values()
        ]
        lines.append(f"| {organ} | " + " | ".join(cells) + " |")
    lines.append(
        "| **mean** | "
        + " | ".join(f"**{_fmt(s.dice_mean)}** | " for s in summaries.values())
        + " |"
    )
    header, rows = _lesion_rows(summaries, gates)
    lines += ["", "## Lesions", "", "| " + " | ".join(header) + " |"]
    lines.append("|---|" + "---:|" * (len(header) - 1))
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    kinds = list(dict.fromkeys(k for s in summaries.values() for k in s.recall_by_type))
    lines += ["", "Recall by lesion type:", "", "| precision | " + " | ".join(kinds) + " |"]
    lines.append("|---|" + "---:|" * len(kinds))
    for name, s in summaries.items():
        cells = [
            f"{_pct(s.recall_by_type.get(k))} (n={s.n_lesions_by_type.get(k, 0)})" for k in kinds
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, gate in gates.items():
        lines += ["", f"Gate {name}: {'accepted' if gate.accepted else 'rejected'}."]
        lines += [f"- {r}" for r in gate.reasons]
        lines += [f"- note: {n}" for n in gate.notes]
    notes = list(dict.fromkeys(n for s in summaries.values() for n in s.notes))
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"
