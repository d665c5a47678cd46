"""``radserve run`` and ``radserve outbox list`` as users met them (session 35).

``run --out`` at a file ran the whole inference, then ended in a FileExistsError
traceback; ``run`` never showed the report's warnings; ``outbox list --kind critical``
was refused and ``--destination <receiver>`` silently matched nothing (critical rows are
stored, listed and matched by ``GET /v1/ops/outbox`` as ``critical:<receiver>``)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.factories.bundles import write_test_bundles, write_test_pipeline
from tests.factories.dicom_series import make_ct_series
from tests.factories.results import lesions_hu
from tests.factories.server_process import run_radserve

from radserve.cli import cli
from radserve.config import load_settings
from radserve.ingest.policy import IngestPolicy
from radserve.store.audited import open_audited
from radserve.store.outbox import NewDelivery, OutboxKind, OutboxStore, Settlement


def radserve(*args: str) -> subprocess.CompletedProcess[str]:
    """``radserve ARGS`` in a fresh interpreter, with none of this environment's
    ``RADSERVE_*`` settings and a wide terminal (rich wraps at 80 columns)."""
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("RADSERVE_")}
    return run_radserve(*args, env={**clean, "COLUMNS": "400"}, timeout=600)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("run-s35")
    models, pipeline = write_test_bundles(root / "models"), write_test_pipeline(root)
    gap = root / "gap"  # one slice missing: resampled with --ingest, and a warning says so
    make_ct_series(
        gap, n_slices=24, rows=48, cols=48, spacing=(2.0, 1.0, 1.0),
        origin=(-20.0, -20.0, 0.0), hu=lesions_hu, drop=(11,),
    )  # fmt: skip
    return {"root": root, "models": models, "pipeline": pipeline, "gap": gap}


def run_args(setup: dict[str, Path], study: Path, out: Path) -> list[str]:
    return [
        "run", str(study), "--out", str(out), "--no-dicom",
        "--pipeline", str(setup["pipeline"]), "--models-dir", str(setup["models"]),
        "--ingest", "missing_slices=resample",
    ]  # fmt: skip


@pytest.mark.parametrize("where", ["a-file", "under-a-file"])
def test_run_refuses_an_out_it_cannot_write_before_any_work(
    setup: dict[str, Path], tmp_path: Path, where: str
) -> None:
    """Checked first: an empty folder as the study (an ingest error once read) gets the
    --out error, so nothing of the study was read or run."""
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder")
    out = blocker if where == "a-file" else blocker / "results"
    empty = tmp_path / "no-study"
    empty.mkdir()
    done = radserve(*run_args(setup, empty, out))
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"Error: --out {out}") and "not a folder" in line, line
    assert blocker.read_text() == "not a folder"


def test_run_prints_the_reports_warnings(setup: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = radserve(*run_args(setup, setup["gap"], out))
    assert done.returncode == 0, done.stderr
    warnings = json.loads((out / "report.json").read_text())["warnings"]
    assert any(w["stage"] == "ingest" for w in warnings), warnings
    printed = done.stdout
    assert f"Warnings ({len(warnings)})" in printed
    # after the findings, before the organ volumes
    assert printed.index("Findings") < printed.index("Warnings") < printed.index("Organ volumes")
    for w in warnings:
        row = next(line for line in printed.splitlines() if f" {w['code']} " in line)
        assert w["message"] in row, (w, printed)


def test_run_takes_one_nifti_volume_as_the_server_does(
    setup: dict[str, Path], tmp_path: Path
) -> None:
    """The server analyses a NIfTI upload; `radserve run ct.nii.gz` said "not DICOM"."""
    from radserve.ingest import discover_series, load_series, save_nifti

    volume = load_series(discover_series(setup["gap"])[0], IngestPolicy(missing_slices="resample"))
    save_nifti(volume.volume, tmp_path / "ct.nii.gz")
    out = tmp_path / "out"
    args = run_args(setup, tmp_path / "ct.nii.gz", out)
    done = radserve(*[a for a in args if a != "--no-dicom"])
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["geometry"]["shape"] == list(volume.volume.shape)
    assert "no DICOM SEG/SR: a NIfTI volume" in done.stdout
    assert not list(out.glob("*.dcm"))


def test_outbox_list_takes_the_critical_kind_and_a_receivers_name(tmp_path: Path) -> None:
    settings = load_settings(None, data_dir=str(tmp_path / "data"))
    store, _trail = open_audited(settings)
    rows = OutboxStore(store.engine)
    now = dt.datetime.now(dt.UTC)

    def delivery(destination: str, kind: OutboxKind, uid: str) -> NewDelivery:
        return NewDelivery(
            destination=destination, path=str(tmp_path / f"{uid}.json"), sop_class_uid="-",
            sop_instance_uid=uid, study_instance_uid="1.2.3", transfer_syntax_uid="-", kind=kind,
        )  # fmt: skip

    critical, _dicom = rows.add(
        [
            delivery("critical:ward", OutboxKind.CRITICAL, "1.2.3.1"),
            delivery("PACS", OutboxKind.DICOM, "1.2.3.2"),
        ],
        now=now,
    )
    [claimed] = rows.claim_due(now, kind=OutboxKind.CRITICAL)
    rows.settle_all([Settlement.failed(claimed.id, now=now, error="HTTP 400 from ward")])
    store.close()
    base = ["--data-dir", str(settings.data_dir)]

    def listed(*args: str) -> list[int]:
        result = CliRunner().invoke(cli, ["outbox", "list", "--json", *args, *base])
        assert result.exit_code == 0, result.output
        return [json.loads(line)["id"] for line in result.output.splitlines() if line[:1] == "{"]

    assert listed("--kind", "critical") == [critical.id]
    # as the list shows it, and by the receiver's name in critical.receivers
    assert listed("--destination", "critical:ward") == [critical.id]
    assert listed("--destination", "ward") == [critical.id]
    text = CliRunner().invoke(cli, ["outbox", "list", "--kind", "critical", *base])
    assert text.exit_code == 0, text.output
    assert f"{critical.id:>6}  critical  critical:ward" in text.output
    # the summary above the rows is filtered as they are (it listed the PACS too)
    assert "critical critical:ward: " in text.output
    assert "dicom PACS: " not in text.output
    by_name = CliRunner().invoke(cli, ["outbox", "list", "--destination", "PACS", *base])
    assert by_name.exit_code == 0, by_name.output
    assert "dicom PACS: " in by_name.output
    assert "critical:ward" not in by_name.output
    # --all-failed --destination names the rows the same way
    again = CliRunner().invoke(
        cli, ["outbox", "retry", "--all-failed", "--destination", "ward", *base]
    )
    assert again.exit_code == 0, again.output
    assert f"row {critical.id} (critical to critical:ward): pending, due now" in again.output
