"""Model registry: discovery, latest version, did-you-mean, and variant gating."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radserve import host
from radserve.errors import ModelError, UnknownModelError, VariantRejectedError
from radserve.evaluation.summary import EvalSummary
from radserve.host import cpu_kernel
from radserve.models.gate import GateReport, VariantGate, file_sha256, write_gate_report
from radserve.models.manifest import GateSpec
from radserve.models.registry import ModelRegistry, bundled_model_dir, version_key

YAML = """\
name: {name}
version: "{version}"
task: segmentation
modality: CT
input:
  mode: 2d
  spacing: [null, 1.5, 1.5]
  normalisation: {{kind: ct_window, center: 40, width: 400}}
labels:
  - value: 1
    name: liver
    concept: {{value: "10200004", meaning: Liver}}
    category: {{value: "123037004", meaning: Anatomical structure}}
files:
{files}
"""


def make_bundle(root: Path, name: str, version: str, files=("fp32", "int8")) -> Path:
    directory = root / name / version
    directory.mkdir(parents=True)
    names = {"fp32": "model.onnx", "fp16": "model.fp16.onnx", "int8": "model.int8.onnx"}
    lines = "\n".join(f"  {p}: {names[p]}" for p in files)
    (directory / "model.yaml").write_text(YAML.format(name=name, version=version, files=lines))
    for p in files:
        (directory / names[p]).write_bytes(f"{name}-{version}-{p}".encode())
    return directory


def _metrics(variant: str) -> EvalSummary:
    return EvalSummary(
        variant=variant,
        n_studies=1,
        seeds=[0],
        dice_mean=0.9,
        dice={"liver": 0.9},
        hd95={"liver": 2.0},
        recall_by_size={"<5": None, "5-10": 1.0, "10-20": 1.0, ">20": None},
        recall_by_type={},
        n_lesions_by_size={"<5": 0, "5-10": 1, "10-20": 1, ">20": 0},
        n_detected_by_size={"<5": 0, "5-10": 1, "10-20": 1, ">20": 0},
        n_lesions_by_type={},
        fp_per_study=0.0,
    )


def write_gate(
    directory: Path,
    *,
    accepted: bool,
    reasons=(),
    providers=("OpenVINOExecutionProvider",),
    kernel: str | None = None,
) -> None:
    """An int8 gate record; by default measured through OpenVINO on this very CPU."""
    path = directory / "model.int8.onnx"
    write_gate_report(
        directory,
        GateReport(
            model=directory.parent.name,
            version=directory.name,
            gate=GateSpec(),
            seeds=[0],
            fp32_file="model.onnx",
            fp32_sha256=file_sha256(directory / "model.onnx"),
            fp32_metrics=_metrics("fp32"),
            variants={
                "int8": VariantGate(
                    file=path.name,
                    sha256=file_sha256(path),
                    accepted=accepted,
                    reasons=list(reasons),
                    metrics=_metrics("int8"),
                    providers=list(providers),
                    cpu_kernel=kernel if kernel is not None else cpu_kernel("int8"),
                )
            },
        ),
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for version in ("1.2.0", "1.10.0", "1.10.0-rc.1", "0.9"):
        make_bundle(tmp_path, "organs", version)
    make_bundle(tmp_path, "lesions", "1.0.0")
    return tmp_path


def test_list_and_latest_semantic_version(root):
    registry = ModelRegistry([root])
    infos = registry.list()
    assert [(i.name, i.version) for i in infos] == [
        ("lesions", "1.0.0"),
        ("organs", "0.9"),
        ("organs", "1.2.0"),
        ("organs", "1.10.0-rc.1"),
        ("organs", "1.10.0"),
    ]
    assert infos[0].declared == ("fp32", "int8") and infos[0].servable == ("fp32",)
    bundle = registry.get("organs")
    assert bundle.spec.version == "1.10.0"
    assert registry.get("organs", "1.2.0").directory == root / "organs" / "1.2.0"
    assert version_key("2.0.0") > version_key("2.0.0-beta.11") > version_key("2.0.0-beta.2")


def test_unknown_model_suggests_and_lists_what_exists(root):
    registry = ModelRegistry([root])
    with pytest.raises(UnknownModelError, match=r"did you mean 'organs'\?.*lesions \(1\.0\.0\)"):
        registry.get("organz")
    with pytest.raises(UnknownModelError, match=r"no version '1\.3\.0'.*1\.10\.0"):
        registry.get("organs", "1.3.0")
    # with nothing close to suggest, the list is its own sentence (it read "... version
    # '9.9.9' Available versions: ...", `radserve models deploy lesions 9.9.9`)
    with pytest.raises(UnknownModelError, match=r"no version '9\.9\.9'\. Available versions: "):
        registry.get("organs", "9.9.9")
    with pytest.raises(UnknownModelError, match=r"unknown model 'zzzzzz'\. Available: "):
        registry.get("zzzzzz")


def test_earlier_root_wins_and_default_root_is_the_package(root, tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    override = make_bundle(site, "lesions", "1.0.0", files=("fp32",))
    registry = ModelRegistry([site, root])
    assert registry.get("lesions").directory == override
    assert ModelRegistry().roots == (bundled_model_dir(),)
    assert bundled_model_dir().parts[-3:] == ("radserve", "assets", "models")


def test_fp32_always_serves_and_hash_is_of_the_file(root):
    bundle = ModelRegistry([root]).get("lesions")
    path = bundle.onnx_path("fp32")
    assert path.name == "model.onnx"
    assert bundle.sha256("fp32") == file_sha256(path)
    with pytest.raises(ModelError, match="did you mean 'fp16'"):
        bundle.onnx_path("fp61")


def test_variant_without_gate_report_is_refused(root):
    bundle = ModelRegistry([root]).get("lesions")
    with pytest.raises(VariantRejectedError, match="no gate report"):
        bundle.onnx_path("int8")
    with pytest.raises(VariantRejectedError, match="has no fp16 file"):
        bundle.onnx_path("fp16")
    assert bundle.available_precisions() == ["fp32"]
    # the variant builder may look at the candidate before it is gated
    ungated = ModelRegistry([root], allow_ungated=True).get("lesions")
    assert ungated.onnx_path("int8").name == "model.int8.onnx"


def test_rejected_variant_is_refused_with_the_gates_reasons(root):
    directory = root / "lesions" / "1.0.0"
    write_gate(directory, accepted=False, reasons=["recall 5-10 mm dropped 4.2 points > 2.0"])
    bundle = ModelRegistry([root]).get("lesions")
    with pytest.raises(VariantRejectedError, match=r"rejected .*recall 5-10 mm dropped 4\.2"):
        bundle.onnx_path("int8")


def test_accepted_variant_serves_until_its_file_changes(root):
    directory = root / "lesions" / "1.0.0"
    write_gate(directory, accepted=True)
    bundle = ModelRegistry([root]).get("lesions")
    assert bundle.onnx_path("int8") == directory / "model.int8.onnx"
    assert bundle.available_precisions() == ["fp32", "int8"]
    (directory / "model.int8.onnx").write_bytes(b"retrained")
    with pytest.raises(VariantRejectedError, match="changed since it was gated"):
        ModelRegistry([root]).get("lesions").onnx_path("int8")


def _cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: str) -> None:
    """This process's CPU, as /proc/cpuinfo would describe one with ``flags``."""
    info = tmp_path / f"cpuinfo-{len(flags)}-{abs(hash(flags))}"
    info.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 {flags}\n\n")
    monkeypatch.setattr(host, "CPUINFO", info)


VNNI = "avx2 avx512f avx512bw avx512_vnni"
AMX = "avx2 avx512f avx512bw avx512_vnni amx_tile amx_int8 amx_bf16 avx512_bf16"
AVX2 = "avx2 fma"


@pytest.mark.parametrize(
    ("gated_on", "served_on", "serves"),
    [
        (AMX, VNNI, True),  # both sum int8 products exactly into 32 bits
        (VNNI, AMX, True),
        (AMX, AVX2, False),  # AVX2 sums product pairs into 16 bits: other numbers
        (AVX2, AMX, False),
        (AVX2, "avx2 avx512f avx512bw", True),  # both without VNNI
    ],
)
def test_a_cpu_gate_holds_only_where_the_cpu_computes_the_same_int8_numbers(
    root, tmp_path, monkeypatch, gated_on, served_on, serves
):
    directory = root / "lesions" / "1.0.0"
    _cpu(tmp_path, monkeypatch, gated_on)
    write_gate(directory, accepted=True)
    _cpu(tmp_path, monkeypatch, served_on)
    bundle = ModelRegistry([root]).get("lesions")
    if serves:
        assert bundle.onnx_path("int8") == directory / "model.int8.onnx"
        return
    assert bundle.available_precisions() == ["fp32"]
    with pytest.raises(VariantRejectedError) as caught:
        bundle.onnx_path("int8")
    message = str(caught.value)
    assert cpu_kernel("int8") in message and "build-variants --model lesions" in message
    assert message.count("no VNNI") == 1 and message.count("AMX or VNNI") == 1


def test_an_older_cpu_gate_without_its_kernel_serves_int8_nowhere_but_fp16_everywhere(
    root, tmp_path, monkeypatch
):
    """A record from before kernels were recorded cannot say which int8 numbers it
    measured; fp16 is computed in float32 by the CPU providers, whatever the CPU."""
    directory = root / "lesions" / "1.0.0"
    _cpu(tmp_path, monkeypatch, AMX)
    write_gate(directory, accepted=True, providers=(), kernel="")
    report = json.loads((directory / "gate.json").read_text())
    del report["variants"]["int8"]["cpu_kernel"]
    (directory / "gate.json").write_text(json.dumps(report))
    with pytest.raises(VariantRejectedError, match="before radserve recorded which CPU kernels"):
        ModelRegistry([root]).get("lesions").onnx_path("int8")


def test_a_gpu_gate_is_left_to_the_coverage_warning(root, tmp_path, monkeypatch):
    directory = root / "lesions" / "1.0.0"
    _cpu(tmp_path, monkeypatch, AVX2)
    write_gate(directory, accepted=True, providers=("CUDAExecutionProvider",), kernel="")
    bundle = ModelRegistry([root]).get("lesions")
    assert bundle.onnx_path("int8") == directory / "model.int8.onnx"
    assert "CUDAExecutionProvider" in (
        bundle.gate_coverage("int8", "OpenVINOExecutionProvider") or ""
    )


def test_the_shipped_variants_name_the_cpu_they_were_gated_on():
    """organs 1.0.0 and lesions 1.2.0 were gated through OpenVINO on an AMX CPU (their
    bf16 ran at 0.36-0.38x fp32's time, which only AMX gave)."""
    registry = ModelRegistry([bundled_model_dir()])
    for name, version in (("organs", "1.0.0"), ("lesions", "1.2.0")):
        report = registry.get(name, version).gate_report()
        assert report is not None
        kernels = {p: v.cpu_kernel for p, v in report.variants.items()}
        assert kernels == {"fp16": "float32", "int8": "amx_int8", "bf16": "amx_bf16"}


def test_corrupt_gate_report_refuses_variants_not_fp32(root):
    directory = root / "lesions" / "1.0.0"
    (directory / "gate.json").write_text(json.dumps({"model": "lesions"}))
    bundle = ModelRegistry([root]).get("lesions")
    with pytest.raises(VariantRejectedError, match="unreadable gate report"):
        bundle.onnx_path("int8")
    assert bundle.onnx_path("fp32").name == "model.onnx"


def test_bundle_folder_must_match_its_manifest(tmp_path):
    directory = make_bundle(tmp_path, "organs", "1.0.0")
    (directory / "model.yaml").write_text(
        (directory / "model.yaml").read_text().replace('version: "1.0.0"', 'version: "2.0.0"')
    )
    registry = ModelRegistry([tmp_path])
    with pytest.raises(
        ModelError,
        match=r"declares organs/2\.0\.0 but lies in folder organs/1\.0\.0",
    ):
        registry.get("organs")
    assert registry.list() == []


def test_bundles_are_cached_until_their_manifest_changes(root):
    registry = ModelRegistry([root])
    first = registry.get("lesions")
    assert registry.get("lesions") is first
    manifest = first.directory / "model.yaml"
    manifest.write_text(manifest.read_text() + "description: edited\n")
    assert registry.get("lesions").spec.description == "edited"


def test_variants_gated_against_an_older_fp32_are_refused(root):
    directory = root / "lesions" / "1.0.0"
    write_gate(directory, accepted=True)
    (directory / "model.onnx").write_bytes(b"retrained fp32")
    with pytest.raises(VariantRejectedError, match="gated against another fp32 model"):
        ModelRegistry([root]).get("lesions").onnx_path("int8")
