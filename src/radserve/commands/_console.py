"""Terminal presentation shared by the commands: a rich progress bar and summary tables."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:  # annotations only: `radserve run --help` loads none of the pipeline
    from radserve.ingest.policy import IngestPolicy
    from radserve.pipeline.study import StudyResult
    from radserve.report.schema import Report


# columns of a table written to a pipe or a file (rich's default there: 80)
PIPED_WIDTH = 200


class RichProgress:
    """A :class:`radserve.progress.ProgressSink` drawing one bar per stage."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description:<28}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, int] = {}

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def start(self, stage: str, total: int | None) -> None:
        self._tasks[stage] = self._progress.add_task(stage, total=total or 1)

    def advance(self, stage: str, amount: int = 1) -> None:
        if stage in self._tasks:
            self._progress.advance(self._tasks[stage], amount)

    def finish(self, stage: str, seconds: float) -> None:
        task = self._tasks.get(stage)
        if task is not None:
            total = self._progress.tasks[task].total or 1
            self._progress.update(task, completed=total)


def summary_tables(report: Report) -> list[Table]:
    """Findings, the report's warnings, organ volumes and stage timings, for the terminal.

    The warnings follow the findings because they qualify them (a study outside the
    model's input domain, slices resampled at ingest): before, only report.json had them.
    """
    findings = Table(title=f"Findings ({len(report.findings)})")
    for column in ("#", "finding", "organ", "long axis mm", "short axis mm", "ml", "HU", "conf"):
        findings.add_column(
            column, justify="right" if column not in ("finding", "organ") else "left"
        )
    for f in report.findings:
        least = ">= " if f.coverage == "partial" else ""  # cut by the edge: lower bounds
        findings.add_row(
            str(f.finding_id),
            f.label,
            f.containing_organ or "-",
            f"{least}{f.longest_diameter_mm:.1f}",
            f"{least}{f.short_axis_mm:.1f}",
            f"{least}{f.volume_ml:.2f}",
            "-" if f.mean_hu is None else f"{f.mean_hu:.0f}",
            f"{f.confidence:.2f}",
        )
    tables = [findings]
    if report.warnings:
        warnings = Table(title=f"Warnings ({len(report.warnings)})")
        for column in ("stage", "code", "message"):
            warnings.add_column(column, overflow="fold")
        for w in report.warnings:
            warnings.add_row(w.stage or "-", w.code, w.message)
        tables.append(warnings)
    organs = Table(title="Organ volumes")
    for column in ("organ", "ml", "mean HU"):
        organs.add_column(column, justify="left" if column == "organ" else "right")
    for m in report.organ_measurements:
        if m.volume_ml is None:
            ml = "not found"
        else:
            ml = f"{'>= ' if m.coverage == 'partial' else ''}{m.volume_ml:.0f}"
        organs.add_row(m.label, ml, "-" if m.mean_hu is None else f"{m.mean_hu:.0f}")
    timings = Table(title="Timings (s)")
    timings.add_column("stage")
    timings.add_column("seconds", justify="right")
    for stage, seconds in report.timings.items():
        paused = report.paused.get(stage)
        note = f" ({paused:.2f} paused for URGENT)" if paused else ""
        timings.add_row(stage, f"{seconds:.2f}{note}")
    return [*tables, organs, timings]


def table_console() -> Console:
    """A console for a command's table: the terminal's width on a terminal; piped or
    redirected (`radserve models list > models.txt`, a script's log), where rich assumes
    80 columns and cut every cell to a word a line, :data:`PIPED_WIDTH` columns, unless
    ``COLUMNS`` says how wide."""
    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    return Console(width=PIPED_WIDTH)


def write_dicom_objects(
    result: StudyResult,
    console: Console,
    *,
    key_images: bool = False,
    policy: IngestPolicy | None = None,
) -> list[Path]:
    """DICOM SEG + SR (and Secondary Capture key images) next to the report. Slices read
    inside a zip archive are copied out first, to a temporary folder removed after: the
    writers read their headers from files (until 2026-12-07 a zip got no SEG or SR)."""
    import tempfile

    from radserve.ingest.policy import IngestPolicy
    from radserve.ingest.sources import copy_members
    from radserve.report.dicom import write_dicom_results

    if not result.sources:
        console.print("DICOM SEG/SR skipped: the study has no DICOM source slices")
        return []
    with console.status("writing DICOM SEG and SR"), tempfile.TemporaryDirectory() as tmp:
        bound = policy.max_file_bytes if policy is not None else IngestPolicy().max_file_bytes
        files = copy_members(result.sources, Path(tmp), bound)
        return write_dicom_results(
            result.report, result.out_dir, files, key_images=key_images, policy=policy
        )
