"""`radserve bench` end to end on a small study: every contestant in its own process,
the same answer from each (Dice), and the summary keys the issue names. No timing is
asserted: speed is what the benchmark reports, not what a test can promise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from radserve.bench.child import PIPELINE
from radserve.cli import cli
from radserve.pipeline.spec import load_pipeline

pytestmark = pytest.mark.slow

LESIONS_VERSION = next(s.version for s in load_pipeline(PIPELINE).steps if s.model == "lesions")

ISSUE_KEYS = (
    "radserve_s",
    "naive_s",
    "monai_s",
    "speedup_vs_naive",
    "speedup_vs_monai",
    "dice_vs_naive",
    "dice_vs_monai",
    "peak_rss_mb",
    "stages",
)


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "bench.json"
    args = ["bench", "--slices", "80", "--syntax", "explicit", "--baseline", "naive-ort"]
    result = CliRunner().invoke(
        cli, [*args, "--cache-dir", str(tmp / "studies"), "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "radserve faster by" in result.output
    return json.loads(out.read_text())


def test_summary_has_the_issue_keys_and_the_baseline_gives_radserve_s_answer(summary):
    assert all(key in summary for key in ISSUE_KEYS)
    assert summary["radserve_s"] > 0 and summary["naive_ort_s"] > 0
    assert summary["speedup_vs_naive_ort"] == pytest.approx(
        summary["naive_ort_s"] / summary["radserve_s"]
    )
    assert summary["dice_vs_naive_ort"] >= 0.99
    entry = summary["by_transfer_syntax"]["explicit"]
    assert entry["naive_ort_engine"] == "onnxruntime-cpu-batch1"
    assert set(entry["dice_vs_naive_ort_detail"]) == {"organs", "findings"}
    assert summary["stages"] and all(v >= 0 for v in summary["stages"].values())
    assert summary["precision"] == "fp32"


def test_every_precision_radserve_serves_here_is_compared_with_the_fp32_baseline(summary):
    """bf16 (where this host runs it and its gates passed) must still give the fp32
    answer: it is benchmarked against the same float32 baseline."""
    by_precision = summary["by_precision"]
    assert next(iter(by_precision)) == "fp32"
    for precision, entry in by_precision.items():
        assert entry["dice_vs_naive_ort"] >= 0.99, precision
        assert entry["naive_ort_s"] == summary["naive_ort_s"]
    if "bf16" in by_precision:
        assert by_precision["bf16"]["providers"][0] == "OpenVINOExecutionProvider"


def test_memory_is_reported_against_the_int16_volume(summary):
    assert summary["study"]["shape"] == [80, 512, 512]
    volume_mb = summary["study"]["int16_volume_mb"]
    assert summary["peak_rss_over_int16_volume"] == pytest.approx(
        summary["peak_rss_mb"] / volume_mb
    )


def test_providers_scenario_compares_each_model_with_the_cpu_provider() -> None:
    from radserve.bench.providers import run_providers_bench
    from radserve.inference import choose_runtime

    summary = run_providers_bench(n_slices=40, repeats=1, log=lambda _msg: None)
    assert set(summary["models"]) == {"organs/1.0.0", f"lesions/{LESIONS_VERSION}"}
    best = choose_runtime().primary
    for entry in summary["models"].values():
        rows = entry["rows"]
        assert (rows[0]["provider"], rows[0]["precision"]) == ("CPUExecutionProvider", "fp32")
        assert rows[0]["label_agreement"] == 1.0
        fp32 = [r for r in rows if r["precision"] == "fp32"]
        assert {r["provider"] for r in fp32} == {"CPUExecutionProvider", best}
        for row in fp32:
            assert row["label_agreement"] >= 0.999, row
        assert all(r["ms_per_batch"] > 0 and r["speedup_vs_cpu_fp32"] > 0 for r in rows)


def test_scale_scenario_drains_one_queue_in_process_and_on_one_and_two_ray_workers(
    tmp_path: Path,
) -> None:
    pytest.importorskip("ray", reason="the ray extra is not installed")
    from radserve.bench.scale import run_scale_bench

    summary = run_scale_bench(n_studies=2, n_slices=40, cache_dir=tmp_path / "cache")
    runs = {r["executor"]: r for r in summary["runs"]}
    assert list(runs) == ["inprocess", "ray-1", "ray-2"]
    for run in runs.values():
        assert run["studies"] == 2 and run["batches"] > 0 and run["studies_per_hour"] > 0
        assert 0 < run["device_busy_fraction"] <= 1.0
        assert set(run["tat_by_class"]) == {"URGENT", "OUTPATIENT"}
    assert [w["worker"] for w in runs["ray-2"]["per_worker"]] == ["ray-cpu0", "ray-cpu1"]
    assert all(w["batches"] > 0 for w in runs["ray-2"]["per_worker"])  # both used
    assert isinstance(summary["ray_overhead_per_batch_ms"], float)


def test_nnunet_scenario_times_radserve_and_nnunet_on_the_same_labels(tmp_path: Path) -> None:
    pytest.importorskip("nnunetv2", reason="the nnunet extra is not installed")
    from radserve.bench.nnunet import run_nnunet_bench

    summary = run_nnunet_bench(size="ci", work_dir=tmp_path, log=lambda _msg: None)
    assert summary["radserve_s"] > 0 and summary["nnunet_s"] > 0 and summary["patches"] > 1
    # decisive logits: the network trained briefly to the CT's intensity classes
    assert summary["weights"] == "trained" and summary["train_steps"] > 0
    assert summary["label_agreement"] >= 0.999
    # the same run's nnU-Net sliding window again, from its recorded patch logits, with
    # float32 sums: radserve agrees with that too (no second network pass)
    assert summary["label_agreement_nnunet_fp32_sums"] >= 0.999
    assert len(summary["labels_present"]) >= 3  # not an all-background comparison
    assert summary["nnunet_network_s"] > 0 and summary["radserve_stages_s"]["infer"] > 0
    assert summary["radserve_peak_rss_mb"] >= 0 and summary["nnunet_peak_rss_mb"] >= 0
    # what each cost in CPU seconds (the figure a loaded host does not move much)
    assert summary["radserve_cpu_s"] > 0 and summary["nnunet_cpu_s"] > 0
    assert summary["cpu_speedup"] == summary["nnunet_cpu_s"] / summary["radserve_cpu_s"]
    # no GPU here: nnU-Net runs on the CPU, once each (a GPU host runs each twice, warm compared)
    assert summary["device"] == "cpu"
    assert summary["radserve_cold_s"] is None and summary["nnunet_cold_s"] is None
