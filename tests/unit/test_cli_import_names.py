"""``models import monai-bundle`` is the documented name; ``monai`` still runs the same importer."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from radserve.cli import cli


def test_help_lists_monai_bundle_not_the_alias() -> None:
    result = CliRunner().invoke(cli, ["models", "import", "--help"])
    assert result.exit_code == 0, result.output
    commands = result.output.split("Commands:")[1].split()
    assert "monai-bundle" in commands and "nnunet" in commands
    assert "monai" not in commands  # the alias is hidden


@pytest.mark.parametrize("name", ["monai-bundle", "monai"])
def test_both_names_run_the_monai_importer(tmp_path: Path, name: str) -> None:
    """A folder that is not a bundle gets the importer's refusal under either name."""
    (tmp_path / "not-a-bundle").mkdir()
    args = ["models", "import", name, str(tmp_path / "not-a-bundle"), "--models-dir"]
    result = CliRunner().invoke(cli, [*args, str(tmp_path / "models")])
    assert result.exit_code == 1
    assert "is not a MONAI bundle (no configs/ folder)" in result.output
    assert not (tmp_path / "models").exists()


def test_the_models_group_loads_no_variant_building() -> None:
    """`radserve models` adds build-variants to its group; what that command runs (ONNX,
    SciPy, the phantom evaluation: ~1.3 CPU-s) is imported when it runs, not by every
    `radserve models ...` command (a refused import, a list)."""
    import subprocess
    import sys

    code = (
        "import sys, radserve.commands.models; "
        "print(sorted(m for m in ('onnx', 'scipy', 'radserve.evaluation', 'radserve.variants') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("name", "version"), [("../../../escaped", "1.0.0"), ("ok", "../../escaped"), (".staging", "1")]
)
def test_an_import_named_outside_the_models_folder_writes_nothing(
    tmp_path: Path, name: str, version: str
) -> None:
    """The folder an importer writes is models/<name>/<version>, and the name may come from
    the folder imported (an nnU-Net plans file's dataset_name): before session 35 a name
    ``../../../x`` wrote the bundle outside --models-dir, then failed, leaving it there."""
    from radserve.importers import ImportRefusedError
    from radserve.importers.common import staged_bundle

    models = tmp_path / "deep" / "er" / "models"
    with (
        pytest.raises(ImportRefusedError, match="must name one folder"),
        staged_bundle(models, name, version) as bundle,
    ):
        (bundle / "model.yaml").write_text("x")
    assert not list(tmp_path.rglob("model.yaml"))
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "deep" / "escaped").exists()
