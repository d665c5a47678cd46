"""Precision variants and their accuracy gate, on a tiny hand-wired segmentation ONNX.

The network maps normalised intensity to three classes (background ~0, organ ~0.5,
lesion ~1) through Conv, Relu, MaxPool, ConvTranspose, Concat and a 1x1 head: the ops of
the reference U-Nets. "Damaged" copies get perturbed head weights.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import cc3d
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests.factories.bundles import write_classifier_bundle
from tests.factories.onnx_models import max_classifier_model, threshold_model
from tests.factories.syncs import logged_syncs

from radserve.domain.volume import Volume
from radserve.errors import ModelError, VariantRejectedError
from radserve.evaluation.agreement import CLASS_ANSWER, AgreementCounter, StepOutput
from radserve.evaluation.gate import GateDecision, gate_decision
from radserve.evaluation.lesions import GtLesion
from radserve.evaluation.pipeline_runs import (
    organ_label_values,
    pipeline_predictor,
    record_model_inputs,
)
from radserve.evaluation.publish import to_json, to_markdown
from radserve.evaluation.runner import GroundTruth, evaluate
from radserve.evaluation.summary import EvalSummary
from radserve.inference import choose_runtime
from radserve.models.gate import read_gate_report
from radserve.models.manifest import GateSpec, load_manifest
from radserve.models.registry import ModelRegistry
from radserve.pipeline import SessionPool, run_volume
from radserve.pipeline.spec import PipelineSpec, Step
from radserve.variants import (
    build_and_gate,
    build_fp16,
    build_int8,
    declare_files,
    measure_speed,
)

SIZES_MM = {"<5": 4, "5-10": 8, "10-20": 14, ">20": 24}
CENTRES = {"<5": (10, 10), "5-10": (10, 30), "10-20": (30, 12), ">20": (32, 33)}


# --- the tiny model ---------------------------------------------------------------------
def tiny_seg_model(path: Path, *, lesion_gain: float = 1.0, background_bias: float = 0.1) -> Path:
    w1 = np.zeros((4, 1, 3, 3), np.float32)
    w1[:, 0, 1, 1] = [1.0, 1.0, -1.0, 1.0]
    b1 = np.array([-0.25, -0.75, 0.25, 0.0], np.float32)
    wt = np.zeros((4, 4, 2, 2), np.float32)
    for c in range(4):
        wt[c, c] = 1.0
    wh = np.zeros((3, 8, 1, 1), np.float32)
    wh[0, 2, 0, 0] = 4.0  # background: relu(0.25 - x)
    wh[1, 0, 0, 0], wh[1, 1, 0, 0] = 4.0, -8.0  # organ: relu(x - 0.25) - 2 relu(x - 0.75)
    wh[2, 1, 0, 0] = 8.0 * lesion_gain  # lesion: relu(x - 0.75)
    wh[:, 7, 0, 0] = [0.01, 0.0, -0.01]  # a touch of the pooled/upsampled path
    bh = np.array([background_bias, 0.0, 0.0], np.float32)
    inits = [
        numpy_helper.from_array(a, n)
        for a, n in [(w1, "w1"), (b1, "b1"), (wt, "wt"), (wh, "wh"), (bh, "bh")]
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("ConvTranspose", ["p1", "wt"], ["u1"], strides=[2, 2]),
        helper.make_node("Concat", ["r1", "u1"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "wh", "bh"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_seg",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, "H", "W"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


MODEL_YAML = """\
# tiny test bundle
name: tiny
version: 1.0.0
task: segmentation
modality: CT
input:
  mode: 2d
  spacing: [null, 1.0, 1.0]
  normalisation: {kind: ct_window, center: 50, width: 100}
  divisible_by: 16
  batch_size: 3
labels:
  - value: 1
    name: liver
    concept: {value: "10200004", meaning: Liver}
    category: {value: "123037004", meaning: Anatomical structure}
  - value: 2
    name: liver_lesion
    kind: lesion
    concept: {value: "300331000", meaning: Lesion of liver}
    category: {value: "49755003", meaning: Morphologically abnormal structure}
files:
  fp32: model.onnx
gate:
  max_dice_drop: 0.01
  max_recall_drop_points: 2.0
"""


def _case(seed: int) -> GroundTruth:
    """3 x 48 x 48 study: an organ (50 HU) holding one lesion (100 HU) per size stratum."""
    shape = (3, 48, 48)
    ct = np.zeros(shape, np.int16)
    ct[:, 2:46, 2:46] = 50
    lesions = np.zeros(shape, np.uint16)
    yy, xx = np.mgrid[:48, :48]
    gt_list = []
    for i, (stratum, d) in enumerate(SIZES_MM.items(), start=1):
        cy, cx = CENTRES[stratum]
        disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= (d / 2) ** 2
        lesions[:, disc] = i
        ct[:, disc] = 100
        gt_list.append(GtLesion(i, (float(cx), float(cy), 3.0), float(d), "liver_hypodense"))
    rng = np.random.default_rng(seed)
    ct = (ct + rng.integers(-2, 3, shape)).astype(np.int16)
    organs = (ct > 25).astype(np.uint8)  # liver = 1, lesions included
    grid = Volume.from_geometry(ct, spacing=(3.0, 1.0, 1.0))  # axial, as the models read
    return GroundTruth(seed, grid, organs, {"liver": 1}, lesions, tuple(gt_list))


def _slices(ct: Volume) -> np.ndarray:
    return (np.clip(ct.array, 0, 100) / 100.0).astype(np.float32)[:, None]


def _predictor(paths: dict[str, Path]):
    sessions = {
        p: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for p, path in paths.items()
    }

    def predict(ct: Volume, precision: str):
        logits = sessions[precision].run(None, {"image": _slices(ct)})[0]
        classes = logits.argmax(axis=1).astype(np.uint8)
        organ = (classes > 0).astype(np.uint8)
        lesions = cc3d.connected_components(classes == 2, connectivity=26).astype(np.uint16)
        return organ, lesions, []

    return predict


def _summary(**changes) -> EvalSummary:
    base = dict(
        variant="fp32",
        n_studies=2,
        seeds=[0, 1],
        dice_mean=0.90,
        dice={"liver": 0.90},
        hd95={"liver": 3.0},
        recall_by_size={"<5": 0.50, "5-10": 0.80, "10-20": 0.95, ">20": None},
        recall_by_type={"liver_hypodense": 0.8},
        n_lesions_by_size={"<5": 20, "5-10": 50, "10-20": 40, ">20": 0},
        n_detected_by_size={"<5": 10, "5-10": 40, "10-20": 38, ">20": 0},
        n_lesions_by_type={"liver_hypodense": 110},
        precision=0.9,
        fp_per_study=0.5,
    )
    base.update(changes)
    return EvalSummary(**base)


# --- gate_decision (pure) ---------------------------------------------------------------
def test_gate_accepts_small_drops_and_notes_empty_strata():
    fp32 = _summary()
    variant = _summary(
        variant="int8",
        dice_mean=0.891,
        recall_by_size={"<5": 0.48, "5-10": 0.80, "10-20": 0.95, ">20": None},
    )
    decision = gate_decision(fp32, variant, GateSpec())
    assert decision.accepted, decision.reasons
    assert decision.recall_drop_points["<5"] == pytest.approx(2.0)
    assert decision.recall_drop_points[">20"] is None
    assert any(">20 mm: no GT lesions" in n for n in decision.notes)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"dice_mean": 0.885}, r"mean Dice dropped 0\.0150 > 0\.01"),
        (
            {"recall_by_size": {"<5": 0.50, "5-10": 0.758, "10-20": 0.95, ">20": None}},
            r"recall 5-10 mm dropped 4\.2 points > 2\.0",
        ),
        ({"seeds": [0, 2]}, r"same studies"),
    ],
)
def test_gate_rejects_with_a_reason_naming_the_metric(changes, reason):
    decision = gate_decision(_summary(), _summary(variant="fp16", **changes), GateSpec())
    assert not decision.accepted
    assert any(re.search(reason, r) for r in decision.reasons), decision.reasons


def test_gate_records_a_false_positive_rise_and_gates_it_when_asked():
    fp32, variant = _summary(), _summary(variant="int8", fp_per_study=0.9)
    default = gate_decision(fp32, variant, GateSpec())
    assert default.accepted and default.fp_per_study_increase == pytest.approx(0.4)
    assert any("0.50 -> 0.90 (not gated)" in n for n in default.notes), default.notes
    strict = gate_decision(fp32, variant, GateSpec(max_fp_per_study_increase=0.25))
    assert not strict.accepted
    assert any("rose 0.40 > 0.25" in r for r in strict.reasons), strict.reasons
    assert gate_decision(fp32, variant, GateSpec(max_fp_per_study_increase=0.5)).accepted


# --- variants on the tiny model ---------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_seg_model(tmp_path_factory.mktemp("tiny") / "model.onnx")


def _calibration():
    return [_slices(_case(s).ct) for s in (1000, 1001)]


def test_fp16_and_int8_build_loadable_models_with_close_outputs(tiny, tmp_path):
    fp16 = build_fp16(tiny, tmp_path / "model.fp16.onnx")
    int8 = build_int8(tiny, tmp_path / "model.int8.onnx", _calibration)
    x = _slices(_case(0).ct)
    outputs = {}
    for path in (tiny, fp16, int8):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert session.get_inputs()[0].type == "tensor(float)"  # IO stays float32
        outputs[path.name] = session.run(None, {"image": x})[0]
    ref = outputs["model.onnx"]
    assert np.abs(outputs["model.fp16.onnx"] - ref).max() < 1e-2
    assert np.abs(outputs["model.int8.onnx"] - ref).max() < 0.1
    assert (outputs["model.int8.onnx"].argmax(1) == ref.argmax(1)).mean() > 0.99
    ops = {n.op_type for n in onnx.load(str(int8)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    head = next(n for n in onnx.load(str(int8)).graph.node if "logits" in n.output)
    assert head.op_type == "Conv"  # the logits head is kept in float


def _gate_on_tiny(tmp_path: Path, **damage) -> GateDecision:
    paths = {
        "fp32": tiny_seg_model(tmp_path / "good.onnx"),
        "int8": tiny_seg_model(tmp_path / "damaged.onnx", **damage),
    }
    out = evaluate(
        _predictor(paths),
        seeds=[0, 1],
        organ_labels={"liver": 1},
        precisions=["fp32", "int8"],
        truth=_case,
    )
    assert out["fp32"].recall_by_size == {k: 1.0 for k in SIZES_MM}
    assert out["fp32"].dice_mean == pytest.approx(1.0, abs=1e-3)
    return gate_decision(out["fp32"], out["int8"], GateSpec())


def test_gate_rejects_a_variant_that_loses_lesions(tmp_path):
    decision = _gate_on_tiny(tmp_path, lesion_gain=0.3)
    assert not decision.accepted
    assert any(r.startswith("recall <5 mm dropped 100.0 points > 2.0") for r in decision.reasons)
    assert len(decision.reasons) == 4  # every stratum; organ Dice is untouched


def test_gate_rejects_a_variant_that_loses_the_organ(tmp_path):
    decision = _gate_on_tiny(tmp_path, background_bias=1.3)
    assert not decision.accepted
    assert any(r.startswith("mean Dice dropped") for r in decision.reasons), decision.reasons


def test_speed_is_measured_through_the_serving_session(tiny):
    spec = load_manifest(_write_bundle(tiny.parent / "b")[1] / "model.yaml")
    speed = measure_speed(tiny, spec, _slices(_case(0).ct), threads=1, repeats=2, warmup=1)
    assert speed.batch_size == 3 and speed.ms_per_batch > 0
    assert speed.ms_per_slice == pytest.approx(speed.ms_per_batch / 3)


def _write_bundle(root: Path) -> tuple[Path, Path]:
    directory = root / "tiny" / "1.0.0"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.yaml").write_text(MODEL_YAML)
    tiny_seg_model(directory / "model.onnx")
    return root, directory


RUNS_BF16 = choose_runtime(threads=1).runs_bf16


def test_build_and_gate_through_the_pipeline_writes_gate_json_and_serves_passing_variants(
    tmp_path,
):
    root, directory = _write_bundle(tmp_path / "models")
    pipeline = PipelineSpec(name="tiny-pipeline", version="1", steps=(Step(model="tiny"),))
    registry = ModelRegistry([root])
    batches = record_model_inputs(registry, pipeline, "tiny", [_case(1000).ct, _case(1001).ct])
    # The pipeline's own batches: model.yaml's 3, capped at 2 on a CPU device.
    assert batches and batches[0].shape == (2, 1, 48, 48)

    def evaluate_precisions(precisions):
        ungated = ModelRegistry([root], allow_ungated=True)
        predict = pipeline_predictor(ungated, pipeline, vary="tiny")
        return evaluate(
            predict, seeds=[0, 1], organ_labels={"liver": 1}, precisions=precisions, truth=_case
        )

    report = build_and_gate(
        registry.get("tiny"),
        evaluate_precisions=evaluate_precisions,
        calibration=lambda: batches,
        speed_batch=batches[0],
        threads=1,
        calibration_seeds=[1000, 1001],
        repeats=2,
    )
    assert {p: v.accepted for p, v in report.variants.items()} == {"fp16": True, "int8": True}
    assert report.variants["int8"].speed.ratio_vs_fp32 > 0
    assert report.fp32_metrics.recall_by_size == {k: 1.0 for k in SIZES_MM}
    raw = json.loads((directory / "gate.json").read_text())
    assert raw["variants"]["int8"]["metrics"]["recall_by_size"]["<5"] == 1.0
    assert raw["seeds"] == [0, 1] and raw["calibration_seeds"] == [1000, 1001]
    assert read_gate_report(directory) == report

    text = (directory / "model.yaml").read_text()
    assert text.startswith("# tiny test bundle")  # comments kept
    assert "max_recall_drop_points" in text  # the section after files kept
    served = ModelRegistry([root]).get("tiny")
    assert served.spec.files == {
        "fp32": "model.onnx",
        "fp16": "model.fp16.onnx",
        "int8": "model.int8.onnx",
    }
    assert served.available_precisions() == ["fp32", "fp16", "int8"]
    assert served.onnx_path("int8") == directory / "model.int8.onnx"

    # Served through a provider its gate did not evaluate: allowed, said in the report.
    gated_on = report.variants["int8"].providers
    assert gated_on and served.gate_coverage("int8", gated_on[0]) is None
    assert "does not cover" in (served.gate_coverage("int8", "CUDAExecutionProvider") or "")
    assert served.gate_coverage("fp32", "CUDAExecutionProvider") is None
    if gated_on != ["CPUExecutionProvider"]:
        cpu = SessionPool(choose_runtime(prefer=["CPUExecutionProvider"], threads=1))
        result = run_volume(
            _case(0).ct, pipeline, registry=ModelRegistry([root]), sessions=cpu, precision="int8"
        )
        [warning] = result.gate_warnings
        assert "CPUExecutionProvider" in warning and "does not cover" in warning

    # a file swapped after gating is refused
    tiny_seg_model(directory / "model.int8.onnx", lesion_gain=0.3)
    with pytest.raises(VariantRejectedError, match="changed since it was gated"):
        ModelRegistry([root]).get("tiny").onnx_path("int8")

    if not RUNS_BF16:
        return
    # bf16 alone: no new file; the fp16 record (file unchanged) is kept, the swapped
    # int8 file's record is dropped rather than carried over
    tiny_seg_model(directory / "model.int8.onnx")
    report = build_and_gate(
        ModelRegistry([root]).get("tiny"),
        evaluate_precisions=evaluate_precisions,
        calibration=lambda: batches,
        speed_batch=batches[0],
        threads=1,
        precisions=("bf16",),
        repeats=2,
    )
    assert set(report.variants) == {"fp16", "bf16"}
    bf16 = report.variants["bf16"]
    assert bf16.accepted and bf16.file == "model.onnx"
    assert bf16.providers == ["OpenVINOExecutionProvider"]
    assert bf16.speed.provider == "OpenVINOExecutionProvider"
    assert report.variants["fp16"] == read_gate_report(directory).variants["fp16"]
    served = ModelRegistry([root]).get("tiny")
    assert served.onnx_path("bf16") == directory / "model.onnx"
    assert "was gated" not in (served.rejection("bf16") or "")


@pytest.mark.parametrize(
    "files_block",
    ["files:\n  fp32: model.onnx\n", "files: {fp32: model.onnx}\n", ""],
)
def test_declare_files_rewrites_only_the_files_block(tmp_path, files_block):
    text = MODEL_YAML.replace("files:\n  fp32: model.onnx\n", files_block)
    manifest = tmp_path / "model.yaml"
    manifest.write_text(text)
    declare_files(manifest, {"fp32": "model.onnx", "int8": "model.int8.onnx"})
    spec = load_manifest(manifest)
    assert spec.files == {"fp32": "model.onnx", "int8": "model.int8.onnx"}
    assert spec.gate == GateSpec() and manifest.read_text().startswith("# tiny test bundle")


def test_declare_files_refuses_a_manifest_it_would_break_and_leaves_it_as_it_was(tmp_path):
    """Before, the new text was written first and checked after: a refused block left a
    model.yaml no precision of the bundle could load."""
    manifest = tmp_path / "model.yaml"
    manifest.write_text(MODEL_YAML)
    with pytest.raises(ModelError, match="invalid model manifest"):
        declare_files(manifest, {"fp32": "model.onnx", "fp64": "model.fp64.onnx"})
    assert manifest.read_text() == MODEL_YAML


def test_build_and_gate_replaces_each_file_whole_and_writes_gate_json_once_last(
    tmp_path, monkeypatch
):
    """``gate.json`` is written once, replaced whole, after every file it vouches for:
    the variants and model.yaml are replaced whole too (each written to a temporary
    name, fsynced, renamed), so a crash at any point leaves each file before or after,
    never cut off, and a gate.json that describes the files beside it or refuses them
    by hash. Before, model.yaml and the variant files were rewritten in place: a crash
    mid-write left a cut-off model.yaml (no precision of the bundle loaded) or a
    half-written variant."""
    root, directory = _write_bundle(tmp_path / "models")
    (directory / "model.yaml").chmod(0o640)
    pipeline = PipelineSpec(name="tiny-pipeline", version="1", steps=(Step(model="tiny"),))
    registry = ModelRegistry([root])
    batches = record_model_inputs(registry, pipeline, "tiny", [_case(1000).ct])

    def evaluate_precisions(precisions):
        ungated = ModelRegistry([root], allow_ungated=True)
        predict = pipeline_predictor(ungated, pipeline, vary="tiny")
        return evaluate(
            predict, seeds=[0], organ_labels={"liver": 1}, precisions=precisions, truth=_case
        )

    log = logged_syncs(monkeypatch)
    build_and_gate(
        registry.get("tiny"),
        evaluate_precisions=evaluate_precisions,
        calibration=lambda: batches,
        speed_batch=batches[0],
        threads=1,
        repeats=1,
    )
    replaced = [Path(entry[1]).name for entry in log if entry[0] == "replace"]
    assert replaced.count("gate.json") == 1
    assert replaced[-1] == "gate.json"
    for name in ("model.fp16.onnx", "model.int8.onnx", "model.yaml"):
        assert name in replaced, (name, replaced)
        fsynced = [i for i, e in enumerate(log) if e[0] == "fsync" and f".{name}." in e[1]]
        assert fsynced and fsynced[0] < log.index(("replace", str(directory / name)))
    assert (directory / "model.yaml").stat().st_mode & 0o777 == 0o640  # kept
    assert not [p.name for p in directory.iterdir() if p.name.startswith(".")]
    assert ModelRegistry([root]).get("tiny").available_precisions() == ["fp32", "fp16", "int8"]


def test_json_summary_has_fp32_at_top_and_variants_with_gates():
    fp32, int8 = _summary(), _summary(variant="int8", dice_mean=0.5)
    gate = gate_decision(fp32, int8, GateSpec())
    out = json.loads(json.dumps(to_json({"fp32": fp32, "int8": int8}, gates={"int8": gate})))
    assert out["dice_mean"] == 0.9 and out["recall_by_size"][">20"] is None
    assert set(out["recall_by_size"]) == {"<5", "5-10", "10-20", ">20"}
    assert out["variants"]["int8"]["gate"]["accepted"] is False
    assert "mean Dice dropped" in out["variants"]["int8"]["gate"]["reasons"][0]
    markdown = to_markdown({"fp32": fp32, "int8": int8}, {"int8": gate})
    assert "| liver |" in markdown and "REJECTED" in markdown


# --- agreement with the FP32 model's own output -----------------------------------------
def test_agreement_pools_each_labels_dice_over_the_studies():
    names = {1: "liver", 2: "spleen", 3: "kidney"}
    rng = np.random.default_rng(0)
    # 40 slices: more than one of the counter's slabs; value 3 never drawn
    studies = [
        (rng.integers(0, 3, (40, 6, 5), dtype=np.uint8), rng.integers(0, 3, (40, 6, 5), np.uint8))
        for _ in range(2)
    ]
    counter = AgreementCounter(names)
    for fp32, variant in studies:
        counter.add(StepOutput(labels=fp32), StepOutput(labels=variant))
    expected: dict[str, float | None] = {}
    for value, name in names.items():
        both = sum(int(((a == value) & (b == value)).sum()) for a, b in studies)
        size = sum(int((a == value).sum() + (b == value).sum()) for a, b in studies)
        expected[name] = 2 * both / size if size else None
    result = counter.result()
    assert result.keys() == expected.keys() and result["kidney"] is None
    for name in ("liver", "spleen"):
        assert result[name] == pytest.approx(expected[name], abs=1e-6)
        assert 0.2 < result[name] < 0.6  # independent random maps: about 1/3


def test_agreement_of_a_classification_step_is_its_share_of_studies_answered_alike():
    counter = AgreementCounter({1: "bleed"})
    counter.add(StepOutput(answer=("bleed", True)), StepOutput(answer=("bleed", True)))
    counter.add(StepOutput(answer=("bleed", True)), StepOutput(answer=("bleed", False)))
    assert counter.result() == {CLASS_ANSWER: 0.5}  # no label map was compared


@pytest.mark.parametrize(
    ("variant", "error"),
    [
        (StepOutput(labels=np.zeros((2, 3, 3), np.uint8)), "cannot be compared"),
        (StepOutput(), "a label map and the other none"),
        (StepOutput(labels=np.full((2, 4, 4), 5000, np.uint16)), "not a model's class label"),
    ],
)
def test_agreement_refuses_maps_it_cannot_compare(variant, error):
    with pytest.raises(ValueError, match=error):
        AgreementCounter().add(StepOutput(labels=np.zeros((2, 4, 4), np.uint8)), variant)


@pytest.mark.parametrize(
    ("agreement", "spec", "reason"),
    [
        (
            {"liver": 0.93, "spleen": 0.99},
            GateSpec(),
            r"^liver agrees with fp32 at 0\.9300 < 0\.95 \(Dice\)",
        ),
        (
            {"liver": 0.97},
            GateSpec(min_agreement=0.98),
            r"^liver agrees with fp32 at 0\.9700 < 0\.98",
        ),
        (
            {CLASS_ANSWER: 0.9},
            GateSpec(),
            r"^class answer agrees .* \(share of studies answered alike\)",
        ),
        (
            {"liver": None, "spleen": None},
            GateSpec(),
            r"^nothing to compare: .*\['liver', 'spleen'\]",
        ),
    ],
)
def test_gate_rejects_a_variant_that_does_not_reproduce_fp32(agreement, spec, reason):
    variant = _summary(variant="int8", agreement_vs_fp32=agreement)
    decision = gate_decision(_summary(), variant, spec)
    assert not decision.accepted
    assert [r for r in decision.reasons if re.search(reason, r)], decision.reasons


def test_gate_accepts_agreement_at_its_floor_and_skips_it_where_unmeasured():
    at_floor = _summary(variant="int8", agreement_vs_fp32={"liver": 0.95, "spleen": None})
    assert gate_decision(_summary(), at_floor, GateSpec()).accepted
    assert gate_decision(_summary(), _summary(variant="int8"), GateSpec()).accepted


def _gate_through_pipeline(root: Path, model: str) -> dict[str, object]:
    """``build_and_gate`` for the one-step pipeline running ``model``, evaluated as
    ``build_and_gate_on_phantoms`` evaluates (its labels named, every other label map
    scored against the test studies' truth)."""
    pipeline = PipelineSpec(name="one-step", version="1", steps=(Step(model=model),))
    registry = ModelRegistry([root])
    batches = record_model_inputs(registry, pipeline, model, [_case(1000).ct])
    spec = registry.get(model).spec

    def evaluate_precisions(precisions):
        ungated = ModelRegistry([root], allow_ungated=True)
        return evaluate(
            pipeline_predictor(ungated, pipeline, vary=model),
            seeds=[0, 1],
            organ_labels=organ_label_values([spec]),
            precisions=precisions,
            truth=_case,
            step_labels={label.value: label.name for label in spec.labels},
        )

    report = build_and_gate(
        registry.get(model),
        evaluate_precisions=evaluate_precisions,
        calibration=lambda: batches,
        speed_batch=batches[0],
        threads=1,
        repeats=1,
    )
    return report.variants


def test_a_variant_of_a_model_the_phantoms_cannot_score_is_gated_on_fp32s_labels(tmp_path):
    """The test studies' truth knows "liver", not this model's "structure_a", and the
    model finds no lesion: organ Dice and lesion recall measure nothing. Its FP16 file
    (logits scaled past float16's range) labels no voxel; before the agreement check the
    gate accepted it, as it accepted anything for such a model."""
    folder = tmp_path / "models" / "anatomy" / "1.0.0"
    folder.mkdir(parents=True)
    manifest = MODEL_YAML.replace("name: tiny", "name: anatomy").replace(
        "name: liver\n", "name: structure_a\n"
    )
    manifest = manifest[: manifest.index("  - value: 2")] + manifest[manifest.index("files:") :]
    (folder / "model.yaml").write_text(manifest)
    threshold_model(folder / "model.onnx", level=0.05, scale=2e6)
    variants = _gate_through_pipeline(tmp_path / "models", "anatomy")

    fp16, int8 = variants["fp16"], variants["int8"]
    assert fp16.metrics.dice_mean is None and any("Dice check skipped" in n for n in fp16.notes)
    assert not fp16.accepted
    assert fp16.reasons == ["structure_a agrees with fp32 at 0.0000 < 0.95 (Dice)"]
    assert int8.accepted and int8.metrics.agreement_vs_fp32 == {"structure_a": 1.0}
    assert (
        fp16.metrics.agreement_vs_fp32
        == read_gate_report(folder).variants["fp16"].metrics.agreement_vs_fp32
    )


def test_a_classification_variant_that_changes_the_answer_is_rejected(tmp_path):
    folder = write_classifier_bundle(tmp_path / "models", "bright-spot", 80.0, roi_labels=())
    max_classifier_model(folder / "model.onnx", level=0.08, scale=2e6)  # FP16 overflows
    variants = _gate_through_pipeline(tmp_path / "models", "bright-spot")
    assert variants["int8"].accepted
    assert variants["int8"].metrics.agreement_vs_fp32 == {CLASS_ANSWER: 1.0}
    assert not variants["fp16"].accepted
    assert variants["fp16"].reasons == [
        "class answer agrees with fp32 at 0.0000 < 0.95 (share of studies answered alike)"
    ]


def test_no_variant_is_gated_without_its_agreement_with_fp32(tmp_path):
    """An evaluation that does not compare the varied model's own output (here: no model
    named as varied) cannot gate: the one check that measures every model is never
    skipped, and no gate.json is written."""
    root, directory = _write_bundle(tmp_path / "models")
    pipeline = PipelineSpec(name="tiny-pipeline", version="1", steps=(Step(model="tiny"),))
    registry = ModelRegistry([root])
    batches = record_model_inputs(registry, pipeline, "tiny", [_case(1000).ct])

    def evaluate_whole_pipeline(precisions):
        ungated = ModelRegistry([root], allow_ungated=True)
        return evaluate(
            pipeline_predictor(ungated, pipeline),
            seeds=[0],
            organ_labels={"liver": 1},
            precisions=precisions,
            truth=_case,
        )

    with pytest.raises(ModelError, match=r"did not compare \['fp16'\] with fp32's own output"):
        build_and_gate(
            registry.get("tiny"),
            evaluate_precisions=evaluate_whole_pipeline,
            calibration=lambda: batches,
            speed_batch=batches[0],
            threads=1,
            precisions=("fp16",),
            repeats=1,
        )
    assert not (directory / "gate.json").exists()
