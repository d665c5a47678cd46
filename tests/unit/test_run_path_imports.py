"""What the run path leaves unimported: every module loaded stays resident in every
serving, CLI and bench process, so what only other commands (or only studies with
findings) use is imported where it is used. Checked in fresh interpreters."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests.factories.imports import loaded_after

# Loaded by other commands (server, gateway, store, DICOM and FHIR writers), by
# training, or only when a study has findings (scipy.spatial's convex hull).
NOT_ON_THE_RUN_PATH = (
    "sqlalchemy",
    "alembic",
    "fastapi",
    "starlette",
    "uvicorn",
    "pynetdicom",
    "highdicom",
    "fhir",
    "ray",
    "torch",
    "scipy.spatial",
)


def _loaded(*modules: str) -> list[str]:
    return loaded_after(NOT_ON_THE_RUN_PATH, modules)


@pytest.mark.parametrize(
    "modules",
    [
        # what the bench child and the scheduler's stages import to run a study
        ("radserve.pipeline.study", "radserve.pipeline.work", "radserve.models.registry"),
        ("radserve.bench.child",),
        # `radserve run`: the click group imports a command when it is looked up
        ("radserve.cli", "radserve.commands.run"),
    ],
    ids=["pipeline", "bench-child", "cli-run"],
)
def test_the_run_path_leaves_other_commands_libraries_unloaded(modules: tuple[str, ...]) -> None:
    assert _loaded(*modules) == []


def test_the_probe_sees_a_loaded_module() -> None:
    """The check above can fail: the gateway command does load pynetdicom (its SCP and
    SCU); SQLAlchemy and highdicom only once it stores or writes something."""
    loaded = _loaded("radserve.cli", "radserve.commands.gateway")
    assert "pynetdicom" in loaded
    assert "sqlalchemy" not in loaded and "highdicom" not in loaded


def test_radserve_run_is_looked_up_without_importing_the_other_commands() -> None:
    script = (
        "import json, sys\n"
        "from click.testing import CliRunner\n"
        "from radserve.cli import _COMMANDS, cli\n"
        "result = CliRunner().invoke(cli, ['run', '--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "names = [f'radserve.commands.{name}' for name, _ in _COMMANDS]\n"
        "print(json.dumps([m for m in names if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # config: the --config option every command shares
    assert json.loads(out.stdout) == ["radserve.commands.run", "radserve.commands.config"]
