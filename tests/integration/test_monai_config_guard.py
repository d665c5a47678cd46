"""A MONAI bundle config is code to MONAI's ``ConfigParser`` (``$`` expressions are
``eval``-ed, ``_target_`` names any callable): ``radserve models import monai-bundle``
checks each expression and component before MONAI evaluates it, so a config that would
write a file is refused and the file is never written, while the zoo's own expressions
still pass. Needs the ``monai`` extra."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.factories.monai_bundle import PRE, write_monai_bundle

from radserve.importers import ImportRefusedError
from radserve.importers.monai_bundle import import_monai
from radserve.importers.monai_config_guard import check_expression

pytest.importorskip("monai", reason="the monai extra is not installed")


def _refused_without_writing(tmp_path: Path, transform: dict, marker: Path, reason: str) -> None:
    folder = write_monai_bundle(tmp_path / "bundle", pre=[*PRE[:-1], transform, PRE[-1]])
    with pytest.raises(ImportRefusedError, match=reason):
        import_monai(folder, tmp_path / "models")
    assert not marker.exists()
    assert not (tmp_path / "models").exists()


def test_an_expression_that_would_write_a_file_is_never_evaluated(tmp_path):
    marker = tmp_path / "ran"
    hostile = {
        "_target_": "EnsureTyped",
        "keys": "image",
        "dtype": f"$open({str(marker)!r}, 'w') and torch.float32",
    }
    _refused_without_writing(tmp_path, hostile, marker, "calls 'open'")


def test_a_target_that_is_a_function_is_never_called(tmp_path):
    marker = tmp_path / "ran"
    hostile = {"_target_": "monai.networks.utils.save_state", "src": {}, "path": str(marker)}
    _refused_without_writing(tmp_path, hostile, marker, "a function, not a class")


def test_a_target_outside_the_allowed_packages_is_refused(tmp_path):
    marker = tmp_path / "ran"
    hostile = {"_target_": "pathlib.Path.touch", "self": str(marker)}
    _refused_without_writing(tmp_path, hostile, marker, "instantiates 'pathlib.Path.touch'")


@pytest.mark.parametrize(
    ("target", "options"),
    [
        ("monai.apps.auto3dseg.AutoRunner", {"work_dir": "{marker}"}),
        ("monai.apps.nnunet.nnUNetV2Runner", {"input_config": {}, "work_dir": "{marker}"}),
        ("monai.apps.MedNISTDataset", {"root_dir": "{marker}", "download": True}),
    ],
)
def test_a_monai_apps_class_that_acts_when_built_is_refused(tmp_path, target, options):
    """monai.apps' runners make their work folders and write there when built, its
    datasets download: before session 35 AutoRunner wrote cache.yaml during an import."""
    marker = tmp_path / "ran"
    options = {k: str(marker) if v == "{marker}" else v for k, v in options.items()}
    hostile = {"_target_": target, **options}
    _refused_without_writing(tmp_path, hostile, marker, "writes files or downloads")


ZOO_EXPRESSIONS = [
    "torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
    "import os",
    "import glob",
    "__local_refs['bundle_root'] + '/models/model.pt'",
    "[{'image': i} for i in __local_refs['datalist']]",
    "numpy.float32",
    "torch.load(__local_refs['arch_ckpt_path'], map_location=torch.device('cuda'))",
    "torch.from_numpy(__local_refs['arch_ckpt']['node_a'])",
    "list(sorted(glob.glob(__local_refs['dataset_dir'] + '/*.nii.gz')))",
    "lambda x: torch.where(x[[2]] > 0, 4, torch.where(x[[0]] > 0, 1, 0))",
]


@pytest.mark.parametrize("expression", ZOO_EXPRESSIONS)
def test_the_zoo_expressions_pass(expression):
    check_expression(expression, "item")


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os').system('id')", "__import__"),
        ("().__class__.__bases__[0].__subclasses__()", "__subclasses__"),
        ("torch.load(__local_refs['p'], weights_only=False)", "weights_only=False"),
        ("import subprocess", "imports 'subprocess'"),
        ("(lambda: 1)()", "calls 'lambda: 1'"),
        ("lambda x: open(x)", "calls 'open'"),
        ("eval('1')", "eval"),
        ("os.system('id')", "calls 'os.system'"),
        ("numpy.load(__local_refs['p'], allow_pickle=True)", "calls 'numpy.load'"),
        ("torch.load(**__local_refs['kwargs'])", "passes"),
        ("[x := 1]", "NamedExpr"),
    ],
)
def test_expressions_outside_the_grammar_are_refused(expression, reason):
    with pytest.raises(ImportRefusedError, match=reason):
        check_expression(expression, "item")


@pytest.mark.parametrize(
    ("expression", "limit"),
    [
        ("10**10**10", "MAX_INT_BITS"),
        ("[0]*999999999 and torch.float32", "MAX_ELEMENTS"),
        ("list(range(10**12)) and torch.float32", "MAX_ELEMENTS"),
        ("[0 for a in range(9999) for b in range(9999)] and torch.float32", "MAX_ELEMENTS"),
        ("@bundle_root * 999999999 and torch.float32", "MAX_ELEMENTS"),  # a plain value
    ],
)
def test_an_expression_that_would_exhaust_the_importer_is_refused_by_its_limit(
    tmp_path, expression, limit
):
    """In the grammar, but its size is unbounded: refused naming the limit, not run."""
    folder = write_monai_bundle(
        tmp_path / "bundle",
        pre=[
            *PRE[:-1],
            {"_target_": "EnsureTyped", "keys": "image", "dtype": f"${expression}"},
            PRE[-1],
        ],
    )
    with pytest.raises(ImportRefusedError, match=f"would make .*the limit {limit}"):
        import_monai(folder, tmp_path / "models")
    assert not (tmp_path / "models").exists()


def test_torchscript_is_refused_unless_trusted_by_flag(tmp_path):
    """A model.ts is code (TorchScript runs what it holds): the CLI refuses it, saying so,
    unless --trust-torchscript is given; the refusal comes before the file is opened."""
    from click.testing import CliRunner

    from radserve.cli import cli

    folder = write_monai_bundle(tmp_path / "bundle")
    (folder / "models" / "model.pt").unlink()
    (folder / "models" / "model.ts").write_bytes(b"not opened")
    models = tmp_path / "models"
    args = ["models", "import", "monai-bundle", str(folder), "--models-dir", str(models)]
    refused = CliRunner().invoke(cli, args)
    assert refused.exit_code == 1
    assert "runs the code it holds" in refused.output
    assert "--trust-torchscript" in refused.output
    assert not models.exists()
    trusted = CliRunner().invoke(cli, [*args, "--trust-torchscript"])
    assert "--trust-torchscript" not in trusted.output  # past the refusal: torch reads the file
    assert not models.exists()
