"""`radserve bench --scenario floor` on a small study: the memory of every import step
and model, and the CPU-seconds of every stage beside its lower bound. The stage-by-stage
run must give the served pipeline's labels, or its figures would describe other work.
No timing or memory figure is asserted beyond its sign: those are what the scenario
measures, not what a test can promise on a shared machine."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from radserve.bench.floor import IMPORT_STEPS, labels_digest
from radserve.bench.study import ensure_study
from radserve.cli import cli
from radserve.pipeline.spec import load_pipeline
from radserve.pipeline.study import run_study

pytestmark = pytest.mark.slow

SLICES = 80  # 5 mm apart over the whole coverage (fewer cover less: radserve.bench.study)


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("floor")
    out = tmp / "floor.json"
    args = ["bench", "--scenario", "floor", "--slices", str(SLICES), "--precision", "fp32"]
    result = CliRunner().invoke(
        cli, [*args, "--cache-dir", str(tmp / "studies"), "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "floor CPU-s" in result.output
    data = json.loads(out.read_text())
    data["_cache"] = str(tmp / "studies")
    return data


def test_every_import_step_and_model_has_its_memory(summary: dict) -> None:
    steps = summary["imports"]
    assert [s["step"] for s in steps] == [label for label, _ in IMPORT_STEPS]
    assert all(s["VmRSS"] > 0 and s["RssAnon"] > 0 for s in steps)
    assert steps[0]["delta_mb"] is None and all(s["delta_mb"] is not None for s in steps[1:])
    warm = summary["runs"]["fp32"]["memory_warm"]
    assert [w["step"] for w in warm[1:5]] == [
        "organs: compiled",
        "organs: one batch run",
        "lesions: compiled",
        "lesions: one batch run",
    ]


def test_every_stage_has_cpu_seconds_and_the_networks_a_floor(summary: dict) -> None:
    run = summary["runs"]["fp32"]
    rows = {r["stage"]: r for r in run["floor"]}
    for model in ("organs", "lesions"):
        for kind in ("prepare", "infer", "merge", "postprocess"):
            assert rows[f"{model}: {kind}"]["cpu_s"] >= 0.0
        infer = rows[f"{model}: infer"]
        assert infer["floor_cpu_s"] > 0.0 and infer["basis"].startswith("network alone")
        assert run["networks"][model]["batches"] > 0
    assert rows["ingest"]["floor_cpu_s"] > 0.0 and summary["copy_gib_per_cpu_s"] > 0.0
    assert run["total_cpu_s"] >= sum(r["cpu_s"] for r in run["floor"]) * 0.99
    assert run["peak_rss_mb"] >= run["memory_warm"][-1]["VmRSS"]
    assert summary["peak_rss_over_int16_volume"]["fp32"] == pytest.approx(
        run["peak_rss_mb"] / summary["study"]["int16_volume_mb"]
    )


def test_reduced_resolution_decode_is_measured_and_finds_the_body(summary: dict) -> None:
    rows = summary["jpeg2000_reduced_decode"]["rows"]
    assert [r["level"] for r in rows] == [0, 1, 2, 3]
    assert all(r["cpu_ms"] > 0 for r in rows)
    full = rows[0]["box"]
    for row in rows[1:]:  # within one reduced pixel's span of the full-resolution box
        margin = 2 ** row["level"]
        assert all(abs(a - b) <= margin for a, b in zip(row["box"], full, strict=True))


def test_the_stage_by_stage_run_gives_the_pipelines_labels(summary: dict) -> None:
    study = ensure_study(Path(summary["_cache"]), "explicit", SLICES)
    with tempfile.TemporaryDirectory() as out:
        served = run_study(study, pipeline=load_pipeline("ct-chest-abdomen"), out_dir=Path(out))
    assert labels_digest(served.volume_result) == summary["runs"]["fp32"]["labels_sha256"]


def test_the_networks_replayed_give_the_recorded_labels_and_refuse_other_inputs(
    summary: dict, tmp_path: Path
) -> None:
    """The stage child with the networks' outputs recorded, then replayed in their
    place: the same labels as the scenario's own run; a batch whose input is not the
    recorded one stops the replay (prepare changed what the networks would see)."""
    study = ensure_study(Path(summary["_cache"]), "explicit", SLICES)
    child = [sys.executable, "-m", "radserve.bench.floor", str(study), "fp32", "auto"]
    runs = {}
    for mode in ("record", "replay"):
        done = subprocess.run(
            [*child, f"--{mode}", str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
        )
        runs[mode] = json.loads(done.stdout.splitlines()[-1])
    expected = summary["runs"]["fp32"]["labels_sha256"]
    assert runs["record"]["labels_sha256"] == runs["replay"]["labels_sha256"] == expected
    assert runs["replay"]["replayed"] == "replay" and runs["replay"]["networks"] == {}
    assert runs["replay"]["stage_cpu_s"].keys() == runs["record"]["stage_cpu_s"].keys()
    index = tmp_path / "inputs.json"
    digests = json.loads(index.read_text())
    digests["lesions"][3] = "0" * 64
    index.write_text(json.dumps(digests))
    done = subprocess.run(
        [*child, "--replay", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "lesions, batch 3: the network input differs from the recording" in done.stderr
